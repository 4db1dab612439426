import Foundation
import ProtectedStoreCore

/// A launched app's keychain: each call a request on the app's own socket (docs/PROTOCOL.md §7), which the key
/// daemon answers for the app's access groups only. Secrets cross as attachments, never in the JSON.
final class AppSocketKeychain: KeychainBackend {
    private let link: DaemonLink

    init(link: DaemonLink) { self.link = link }

    func add(_ item: KeychainItem) throws -> KeychainItem {
        var request = DaemonRequest(id: 0, op: .keychainAdd)
        request.keychainItem = KeychainItemMessage(item)
        let secret = KeychainSecrets.pack(item.secret.map { [$0] } ?? [])
        defer { secret.discard() }
        let (reply, _) = try link.call(request, attachment: item.secret == nil ? nil : secret)
        guard let added = reply.keychainItems?.first?.item() else { throw Self.malformed() }
        return added
    }

    func items(matching query: KeychainQuery, includingSecrets: Bool) throws -> [KeychainItem] {
        var request = DaemonRequest(id: 0, op: .keychainFind)
        request.keychainQuery = KeychainQueryMessage(query)
        request.returnSecrets = includingSecrets
        let (reply, attachment) = try link.call(request)
        defer { attachment?.discard() }
        guard var items = reply.keychainItems.map({ $0.compactMap { $0.item() } }), items.count == reply.keychainItems?.count,
              let secrets = try KeychainSecrets.unpack(attachment), secrets.count == (includingSecrets ? items.count : 0) else { throw Self.malformed() }
        for index in secrets.indices { items[index].secret = secrets[index] }
        return items
    }

    func update(matching query: KeychainQuery, with changes: KeychainChanges) throws {
        var request = DaemonRequest(id: 0, op: .keychainUpdate)
        request.keychainQuery = KeychainQueryMessage(query)
        request.keychainChanges = KeychainChangesMessage(changes)
        let secret = KeychainSecrets.pack(changes.secret.map { [$0] } ?? [])
        defer { secret.discard() }
        _ = try link.call(request, attachment: changes.secret == nil ? nil : secret)
    }

    func delete(matching query: KeychainQuery) throws {
        var request = DaemonRequest(id: 0, op: .keychainDelete)
        request.keychainQuery = KeychainQueryMessage(query)
        _ = try link.call(request)
    }

    func list(matching query: KeychainQuery) throws -> (items: [KeychainItem], unavailable: Int) {
        var request = DaemonRequest(id: 0, op: .keychainList)
        request.keychainQuery = KeychainQueryMessage(query)
        let (reply, _) = try link.call(request)
        guard let items = reply.keychainItems.map({ $0.compactMap { $0.item() } }), items.count == reply.keychainItems?.count else { throw Self.malformed() }
        return (items, reply.unavailable ?? 0)
    }

    private static func malformed() -> KeychainError {
        KeychainError(.decode, problem: "the key daemon's keychain reply does not parse", remedy: "Use a library of the daemon's version")
    }
}
