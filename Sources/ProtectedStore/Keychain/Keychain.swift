import Foundation
import ProtectedStoreCore

/// Which access groups a keychain's caller may see: every group (the device's owner, in process or attached to the
/// daemon) or a list (an app: its bundle identifier and the groups it was given).
public enum KeychainAccessGroups: Sendable, Equatable {
    /// Every item of the device.
    case all
    /// Only items of these groups; the first is where an item added without a group goes.
    case only([String])
}

/// What a keychain does, wherever its items are opened: in this process (`KeychainStore`) or by the key daemon for a
/// launched app, across its app socket.
package protocol KeychainBackend: Sendable {
    func add(_ item: KeychainItem) throws -> KeychainItem
    func items(matching query: KeychainQuery, includingSecrets: Bool) throws -> [KeychainItem]
    func update(matching query: KeychainQuery, with changes: KeychainChanges) throws
    func delete(matching query: KeychainQuery) throws
    func list(matching query: KeychainQuery) throws -> (items: [KeychainItem], unavailable: Int)
}

/// A device's keychain: generic and internet passwords sealed under the protection class their accessibility names,
/// with iOS's rules (a "when unlocked" item is refused while locked with `errSecInteractionNotAllowed`, an "after first
/// unlock" one stays available through later locks) and Security.framework's status codes in every `KeychainError`.
///
/// A program of the device's owner makes one from its `Device` (embedded, or attached to the daemon) and sees every
/// group it is given; an app launched by `sandboxctl launch` gets its own from `Application.keychain`, limited to its
/// groups, the daemon opening the items for it.
public final class Keychain: Sendable {
    private let backend: any KeychainBackend

    /// The keychain of `device` as a caller entitled to `accessGroups` sees it (every group unless given). Nothing is
    /// read until the first call.
    public convenience init(device: Device, accessGroups: KeychainAccessGroups = .all) throws {
        self.init(backend: try KeychainStore(device: device, accessGroups: accessGroups))
    }

    package init(backend: any KeychainBackend) {
        self.backend = backend
    }

    /// The keychain's folder in a device's folder (docs/FORMAT.md §9).
    public static func folder(root: String) -> String { (root as NSString).appendingPathComponent("keychain") }

    /// Adds `item` (`SecItemAdd`) and returns it as stored, with its group, dates and persistent reference, without its
    /// secret. Throws `duplicateItem` if its primary key is taken, `interactionNotAllowed` if its class key is
    /// unavailable now.
    @discardableResult
    public func add(_ item: KeychainItem) throws -> KeychainItem { try backend.add(item) }

    /// The items matching `query` (`SecItemCopyMatching`): the first, or all with `limit: .all`, with their secrets when
    /// `includingSecrets`. Throws `itemNotFound` when nothing matches, `interactionNotAllowed` when an item that might
    /// match cannot be opened now: never "not found" for an item that is only locked.
    public func items(matching query: KeychainQuery, includingSecrets: Bool = true) throws -> [KeychainItem] {
        try backend.items(matching: query, includingSecrets: includingSecrets)
    }

    /// The secret of the first item matching `query`.
    public func secret(matching query: KeychainQuery) throws -> Data {
        var first = query
        first.limit = .one
        return try items(matching: first)[0].secret ?? Data()
    }

    /// Changes every item matching `query` (`SecItemUpdate`) as `changes` says; all of them or none. Throws
    /// `duplicateItem` if two items would share a primary key, `interactionNotAllowed` if a match cannot be opened now.
    public func update(matching query: KeychainQuery, with changes: KeychainChanges) throws {
        try backend.update(matching: query, with: changes)
    }

    /// Removes every item matching `query` (`SecItemDelete`), whatever its `limit`; throws `itemNotFound` when nothing
    /// matches, `interactionNotAllowed` (removing nothing) when a match cannot be opened now.
    public func delete(matching query: KeychainQuery) throws { try backend.delete(matching: query) }

    /// The attributes of the matching items that can be opened now, and how many more there are whose class key is
    /// unavailable (a listing while locked). Never throws `itemNotFound`.
    public func list(matching query: KeychainQuery) throws -> (items: [KeychainItem], unavailable: Int) {
        try backend.list(matching: query)
    }
}
