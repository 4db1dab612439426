import Foundation
import ProtectedStoreCore

/// The keychain as stored on a device (docs/FORMAT.md §9): what `Keychain` does in this process, and what the key
/// daemon does for a launched app. One database per device, `keychain/` in the device's folder, shared by every
/// process of the device's owner: each call is one transaction under a lock held across processes. Item keys are
/// unwrapped by the device's key holder (this process, or the key daemon), used for the one call and zeroed.
package final class KeychainStore: KeychainBackend, @unchecked Sendable {
    /// The device whose class keys seal the items.
    package let device: Device
    /// The groups this keychain's caller may see.
    package let accessGroups: KeychainAccessGroups

    private let database: KeychainDatabase
    private let mutex = NSLock()
    /// Derived from the lookup key once it is unwrapped (after first unlock); kept, as iOS keeps class C keys, until the
    /// device is back before first unlock.
    private var keys: ItemSeal.Keys?

    /// The keychain of `device` as a caller entitled to `accessGroups` sees it. Nothing is read until the first call.
    package init(device: Device, accessGroups: KeychainAccessGroups) throws {
        self.device = device
        self.accessGroups = accessGroups
        database = try KeychainDatabase(folder: Keychain.folder(root: device.root))
    }

    deinit { keys?.discard() }

    // MARK: The four calls

    /// Adds `item` (`SecItemAdd`) and returns it as stored, with its dates and persistent reference, without its secret.
    /// Throws `duplicateItem` if its primary key is taken, `interactionNotAllowed` if its class key is unavailable now.
    @discardableResult
    package func add(_ item: KeychainItem) throws -> KeychainItem {
        try ItemSeal.validate(item, adding: true)
        var stored = item
        stored.accessGroup = try groupForAdding(item)
        let now = Date()
        stored.creationDate = now
        stored.modificationDate = now
        return try transaction(writing: true) { session, keys, digest in
            let row = try seal(stored, reference: Random.bytes(ItemSeal.referenceBytes), keys: keys)
            do {
                try session.insert(row)
            } catch is DuplicateRow {
                throw KeychainError(.duplicateItem, problem: "the keychain already holds a \(item.itemClass) with \(Self.describe(item)) in group \(stored.accessGroup!)",
                                    remedy: "Update the existing item (SecItemUpdate), or delete it first")
            }
            try digest.add(row, keys: keys)
            stored.persistentReference = Data(row.reference)
            stored.secret = nil
            return stored
        }
    }

    /// The items matching `query` (`SecItemCopyMatching`): the first, or all with `limit: .all`, with their secrets when
    /// `includingSecrets`. Throws `itemNotFound` when nothing matches, `interactionNotAllowed` when an item that might
    /// match cannot be opened now.
    package func items(matching query: KeychainQuery, includingSecrets: Bool) throws -> [KeychainItem] {
        try validate(query)
        return try transaction(writing: false) { session, keys, _ in
            var found = try candidates(query, session: session, keys: keys, stopAtFirst: query.limit == .one)
            defer { found.scrubSecrets() }
            if !found.matches.isEmpty && (query.limit == .one || found.unavailable == nil) {
                let matches = query.limit == .one ? Array(found.matches.prefix(1)) : found.matches
                return matches.map { includingSecrets ? $0.item : $0.item.withoutSecret }
            }
            try throwUnlessFound(found, query: query, session: session, keys: keys)
            return []
        }
    }

    /// Changes every item matching `query` (`SecItemUpdate`) as `changes` says. All of it happens or none:
    /// `duplicateItem` if it would give two items one primary key, `interactionNotAllowed` if a match cannot be opened now.
    package func update(matching query: KeychainQuery, with changes: KeychainChanges) throws {
        try validate(query)
        guard !changes.isEmpty else {
            throw KeychainError(.param, problem: "the update changes no attribute", remedy: "Give at least one attribute to change (attributesToUpdate)")
        }
        try transaction(writing: true) { session, keys, digest in
            var found = try candidates(query, session: session, keys: keys, stopAtFirst: false)
            defer { found.scrubSecrets() }
            guard found.unavailable == nil, !found.matches.isEmpty else { return try throwUnlessFound(found, query: query, session: session, keys: keys) }
            let now = Date()
            for match in found.matches {
                var updated = match.item
                changes.apply(to: &updated)
                try ItemSeal.validate(updated, adding: false)
                if updated.accessGroup != match.item.accessGroup { try checkEntitled(updated.accessGroup!) }
                updated.modificationDate = now
                let row = try seal(updated, reference: match.row.reference, keys: keys)
                try session.delete(reference: match.row.reference)
                do {
                    try session.insert(row)
                } catch is DuplicateRow {
                    throw KeychainError(.duplicateItem, problem: "the update would give a second \(updated.itemClass) \(Self.describe(updated)) in group \(updated.accessGroup ?? "")",
                                        remedy: "Delete the other item first, or change another attribute; nothing was changed")
                }
                try digest.replace(match.row, with: row, keys: keys)
            }
        }
    }

    /// Removes every item matching `query` (`SecItemDelete`), whatever its `limit`. Throws `itemNotFound` when nothing
    /// matches, `interactionNotAllowed` (removing nothing) when a match cannot be opened now.
    package func delete(matching query: KeychainQuery) throws {
        try validate(query)
        try transaction(writing: true) { session, keys, digest in
            var found = try candidates(query, session: session, keys: keys, stopAtFirst: false)
            defer { found.scrubSecrets() }
            guard found.unavailable == nil, !found.matches.isEmpty else { return try throwUnlessFound(found, query: query, session: session, keys: keys) }
            for match in found.matches {
                try session.delete(reference: match.row.reference)
                try digest.remove(match.row, keys: keys)
            }
        }
    }

    /// The attributes of every item matching `query` that can be opened now, and how many more there are whose class
    /// key is unavailable (`sandboxctl keychain list` while locked). Never throws `itemNotFound`.
    package func list(matching query: KeychainQuery) throws -> (items: [KeychainItem], unavailable: Int) {
        try validate(query)
        return try transaction(writing: false) { session, keys, _ in
            var found = try candidates(query, session: session, keys: keys, stopAtFirst: false)
            defer { found.scrubSecrets() }
            if found.matches.isEmpty && found.unavailable == nil { try checkRowCount(session, keys: keys) }
            return (found.matches.map(\.item.withoutSecret), found.unavailableCount)
        }
    }

    // MARK: Matching

    private struct Match {
        let row: StoredRow
        var item: KeychainItem
    }

    private struct Candidates {
        var matches: [Match] = []
        /// The first candidate whose class key was unavailable, and how many there were.
        var unavailable: KeychainError?
        var unavailableCount = 0

        /// Zeroes the opened secrets no caller holds (a copy returned keeps its bytes), so none lingers in freed memory.
        mutating func scrubSecrets() {
            for index in matches.indices { matches[index].item.scrubSecret() }
        }
    }

    /// The rows the query's clear tags select, opened and matched on every attribute. A row whose class key is
    /// unavailable cannot be matched, so it is counted, not skipped silently.
    private func candidates(_ query: KeychainQuery, session: KeychainDatabase.Session, keys: ItemSeal.Keys, stopAtFirst: Bool) throws -> Candidates {
        var conditions = ["kind = ?"]
        var bindings: [SQLBinding] = [.integer(Int64(query.itemClass.rawValue))]
        if let groups = try visibleGroups(query) {
            conditions.append("group_tag IN (\(groups.map { _ in "?" }.joined(separator: ", ")))")
            bindings += try groups.map { .blob(try keys.groupTag($0)) }
        }
        for (column, name, value) in [("service_tag", "service", query.service), ("account_tag", "account", query.account), ("server_tag", "server", query.server)] {
            if let value {
                conditions.append("\(column) = ?")
                bindings.append(.blob(try keys.attributeTag(name, value)))
            }
        }
        if let accessible = query.accessible {
            conditions.append("accessible = ?")
            bindings.append(.integer(Int64(accessible.rawValue)))
        }
        if let reference = query.persistentReference {
            conditions.append("ref = ?")
            bindings.append(.blob(Array(reference)))
        }
        var found = Candidates()
        for row in try session.items(where: conditions.joined(separator: " AND "), bindings) {
            do {
                var item = try open(row, keys: keys)
                if query.matches(item) {
                    found.matches.append(Match(row: row, item: item))
                } else {
                    item.scrubSecret()
                }
            } catch let error as KeychainError where error.code == .interactionNotAllowed {
                found.unavailable = found.unavailable ?? error
                found.unavailableCount += 1
            }
            if stopAtFirst && !found.matches.isEmpty { break }
        }
        return found
    }

    /// `interactionNotAllowed` if an unopened row might have matched, else `itemNotFound` (after checking no row was
    /// removed behind the keychain's back).
    private func throwUnlessFound(_ found: Candidates, query: KeychainQuery, session: KeychainDatabase.Session, keys: ItemSeal.Keys) throws {
        if let unavailable = found.unavailable {
            throw KeychainError(.interactionNotAllowed, problem: "\(found.unavailableCount == 1 ? "an item" : "\(found.unavailableCount) items") that may match \(Self.describe(query)) cannot be opened: \(unavailable.problem)",
                                remedy: "Keep the credential and try again after the unlock (protectedDataDidBecomeAvailable); it was not lost")
        }
        try checkRowCount(session, keys: keys)
        throw KeychainError(.itemNotFound, problem: "no \(query.itemClass) matches \(Self.describe(query))", remedy: "Add the item first (SecItemAdd)")
    }

    private func checkRowCount(_ session: KeychainDatabase.Session, keys: ItemSeal.Keys) throws {
        let recorded = try Digest(session: session, keys: keys).count
        let stored = try session.count()
        guard recorded == stored else {
            throw KeychainError(.decode, problem: "the keychain's database holds \(stored) items where its digest records \(recorded): rows were removed or added outside the keychain",
                                remedy: "The keychain store was tampered with or damaged; restore the device folder from a backup", path: database.databasePath)
        }
    }

    /// The groups a query may see; nil for every group.
    private func visibleGroups(_ query: KeychainQuery) throws -> [String]? {
        if let group = query.accessGroup {
            try checkEntitled(group)
            return [group]
        }
        if case .only(let groups) = accessGroups { return groups }
        return nil
    }

    private func groupForAdding(_ item: KeychainItem) throws -> String {
        if let group = item.accessGroup {
            try checkEntitled(group)
            return group
        }
        guard case .only(let groups) = accessGroups, let first = groups.first else {
            throw KeychainError(.param, problem: "the item names no access group (kSecAttrAccessGroup), and this keychain sees every group, so it has no default",
                                remedy: "Name the item's access group, such as the app's bundle identifier")
        }
        return first
    }

    private func checkEntitled(_ group: String) throws {
        guard case .only(let groups) = accessGroups, !groups.contains(group) else { return }
        throw KeychainError(.missingEntitlement, problem: "access group \(group) is not one of this caller's (\(groups.joined(separator: ", ")))",
                            remedy: "Use one of the caller's groups, or launch the app with --keychain-group \(group)")
    }

    private func validate(_ query: KeychainQuery) throws {
        let probe = KeychainItem(itemClass: query.itemClass, service: query.service, account: query.account, server: query.server, protocol: query.protocol,
                                 port: query.port, path: query.path, label: query.label, accessGroup: query.accessGroup)
        try ItemSeal.validate(probe, adding: false)
        if let reference = query.persistentReference, reference.count != ItemSeal.referenceBytes {
            throw KeychainError(.param, problem: "a persistent reference is \(ItemSeal.referenceBytes) bytes; this one is \(reference.count)",
                                remedy: "Pass a reference the keychain returned (kSecReturnPersistentRef)")
        }
    }

    // MARK: Sealing

    private func seal(_ item: KeychainItem, reference: [UInt8], keys: ItemSeal.Keys) throws -> StoredRow {
        let group = item.accessGroup!
        var row = StoredRow(reference: reference, kind: item.itemClass.rawValue, accessible: item.accessible.rawValue, groupTag: try keys.groupTag(group),
                            primaryTag: try keys.primaryTag(of: item, group: group), serviceTag: try keys.attributeTag("service", item.service),
                            accountTag: try keys.attributeTag("account", item.account), serverTag: try keys.attributeTag("server", item.server),
                            wrappedKey: [], body: [])
        let itemKey = SecureBytes.random(count: AEAD.keyBytes)
        defer { itemKey.discard() }
        row.wrappedKey = try device.wrapFileKey(itemKey, for: item.accessible.protectionClass,
                                                associatedData: ItemSeal.keyAssociatedData(keybagID: device.keybagID, reference: reference, kind: row.kind, accessible: row.accessible))
        var plaintext = ItemSeal.encodeBody(item, group: group)
        defer { ItemSeal.scrub(&plaintext) }
        row.body = try ItemSeal.sealBody(plaintext, key: itemKey, associatedData: ItemSeal.bodyAssociatedData(row))
        return row
    }

    /// The item a row holds, its secret included; `interactionNotAllowed` while its class key is unavailable,
    /// `decode` if anything of it fails authentication.
    private func open(_ row: StoredRow, keys: ItemSeal.Keys) throws -> KeychainItem {
        func damaged(_ what: String) -> KeychainError {
            KeychainError(.decode, problem: "keychain item \(row.reference.hex): \(what)",
                          remedy: "The keychain store was tampered with or damaged; delete the item (it cannot be read) or restore the device folder from a backup",
                          path: database.databasePath)
        }
        guard let itemClass = KeychainItemClass(rawValue: row.kind), let accessible = KeychainAccessibility(rawValue: row.accessible),
              row.reference.count == ItemSeal.referenceBytes else { throw damaged("its class or accessibility byte is not one this build knows") }
        let wrapped = WrappedFileKey(protectionClass: accessible.protectionClass,
                                     associatedData: ItemSeal.keyAssociatedData(keybagID: device.keybagID, reference: row.reference, kind: row.kind, accessible: row.accessible),
                                     ephemeralPublicKey: ItemSeal.noEphemeralKey, sealed: row.wrappedKey)
        guard let itemKey = try unwrap(wrapped) else { throw damaged("its key fails authentication (moved from another row, class or device, or changed)") }
        defer { itemKey.discard() }
        guard var plaintext = try ItemSeal.openBody(row.body, key: itemKey, associatedData: ItemSeal.bodyAssociatedData(row)) else {
            throw damaged("its attributes and secret fail authentication")
        }
        defer { ItemSeal.scrub(&plaintext) }
        guard let item = ItemSeal.decodeBody(plaintext, itemClass: itemClass, accessible: accessible, reference: row.reference), let group = item.accessGroup,
              try keys.groupTag(group) == row.groupTag, try keys.primaryTag(of: item, group: group) == row.primaryTag,
              try keys.attributeTag("service", item.service) == row.serviceTag, try keys.attributeTag("account", item.account) == row.accountTag,
              try keys.attributeTag("server", item.server) == row.serverTag else {
            throw damaged("its sealed attributes do not agree with its row")
        }
        return item
    }

    /// The key a seal holds; nil if the seal fails authentication, `interactionNotAllowed` while its class is unavailable.
    private func unwrap(_ wrapped: WrappedFileKey) throws -> SecureBytes? {
        do {
            return try device.unwrapFileKey(wrapped)
        } catch {
            throw KeychainError(error, path: nil)
        }
    }

    // MARK: Transactions

    /// Runs `body` in one database transaction with the keys, serialised in this process and across processes.
    private func transaction<R>(writing: Bool, _ body: (KeychainDatabase.Session, ItemSeal.Keys, inout Digest) throws -> R) throws -> R {
        try mutex.withLock {
            do {
                try checkFirstUnlock()
                return try database.transaction(writing: writing, create: createDatabase) { session in
                    let keys = try currentKeys(session: session)
                    // A read changes no row, so it needs the digest only to tell a miss from a removed row
                    // (`checkRowCount` reads it then).
                    var digest = writing ? try Digest(session: session, keys: keys) : Digest()
                    let before = digest
                    let result = try body(session, keys, &digest)
                    if writing && digest != before { try digest.store(in: session, keys: keys) }
                    return result
                }
            } catch let error as KeychainError {
                throw error
            } catch {
                throw KeychainError(error, path: database.databasePath)
            }
        }
    }

    /// Before first unlock the lookup key (class C) cannot be opened, so nothing can be found or stored.
    private func checkFirstUnlock() throws {
        guard device.state != .beforeFirstUnlock else {
            keys?.discard()
            keys = nil
            throw KeychainError(.interactionNotAllowed, problem: "the keychain of \(device.root) cannot be used before first unlock",
                                remedy: "Unlock the device once after it starts; items stay available from then on as their accessibility allows")
        }
    }

    /// Makes the tables, a new lookup key sealed under class C, and the empty row set's digest.
    private func createDatabase(session: KeychainDatabase.Session) throws {
        try session.createTables()
        let lookupKey = SecureBytes.random(count: AEAD.keyBytes)
        defer { lookupKey.discard() }
        let wrapped = try device.wrapFileKey(lookupKey, for: .completeUntilFirstUserAuthentication, associatedData: ItemSeal.lookupAssociatedData(keybagID: device.keybagID))
        try session.setMeta("format", [KeychainDatabase.formatVersion])
        try session.setMeta("lookup", wrapped)
        let derived = try ItemSeal.Keys(lookupKey: lookupKey)
        try Digest().store(in: session, keys: derived)
        keys?.discard()
        keys = derived
    }

    /// The tag and digest keys: unwrapped from the database's lookup key (class C) the first time, when the whole
    /// row set is checked against its digest.
    private func currentKeys(session: KeychainDatabase.Session) throws -> ItemSeal.Keys {
        if let keys { return keys }
        guard let format = try session.meta("format"), let wrapped = try session.meta("lookup") else {
            throw KeychainError(.decode, problem: "the keychain's database has no format or lookup key record", remedy: "The keychain store was damaged; restore the device folder from a backup",
                                path: database.databasePath)
        }
        guard format == [KeychainDatabase.formatVersion] else {
            throw KeychainError(.decode, problem: "the keychain's database is format \(format.first.map(String.init) ?? "?"); this build reads format \(KeychainDatabase.formatVersion)",
                                remedy: "Use the sandboxctl that made it", path: database.databasePath)
        }
        guard let lookupKey = try unwrap(WrappedFileKey(protectionClass: .completeUntilFirstUserAuthentication, associatedData: ItemSeal.lookupAssociatedData(keybagID: device.keybagID),
                                                        ephemeralPublicKey: ItemSeal.noEphemeralKey, sealed: wrapped)) else {
            throw KeychainError(.decode, problem: "the keychain's lookup key fails authentication: the database is another device's, or was changed",
                                remedy: "Restore the device folder from a backup", path: database.databasePath)
        }
        defer { lookupKey.discard() }
        let derived = try ItemSeal.Keys(lookupKey: lookupKey)
        try verifyRowSet(session: session, keys: derived)
        keys = derived
        return derived
    }

    /// Checks every row against the digest: a row removed, added, replaced by an older copy or moved in shows here.
    private func verifyRowSet(session: KeychainDatabase.Session, keys: ItemSeal.Keys) throws {
        var computed = Digest()
        for row in try session.items() { try computed.add(row, keys: keys) }
        guard computed == (try Digest(session: session, keys: keys)) else {
            throw KeychainError(.decode, problem: "the keychain's rows do not match its digest: items were removed, added or changed outside the keychain",
                                remedy: "The keychain store was tampered with or damaged; restore the device folder from a backup", path: database.databasePath)
        }
    }

    static func describe(_ item: KeychainItem) -> String {
        switch item.itemClass {
        case .genericPassword: "service \(item.service ?? "\"\"") and account \(item.account ?? "\"\"")"
        case .internetPassword: "server \(item.server ?? "\"\"") and account \(item.account ?? "\"\"")"
        }
    }

    static func describe(_ query: KeychainQuery) -> String {
        let parts = [("service", query.service), ("account", query.account), ("server", query.server), ("label", query.label), ("group", query.accessGroup)]
            .compactMap { name, value in value.map { "\(name) \($0)" } }
        return parts.isEmpty ? "the query" : parts.joined(separator: ", ")
    }
}

/// The `meta` table's record of the row set: the XOR of every row's MAC and the row count.
private struct Digest: Equatable {
    var xor = [UInt8](repeating: 0, count: Blake2b.outputBytes)
    var count: Int64 = 0

    init() {}

    /// The stored record, its MAC checked: a digest made up from others (their XOR, another count) is damage.
    init(session: KeychainDatabase.Session, keys: ItemSeal.Keys) throws {
        let size = Blake2b.outputBytes + 8 + Blake2b.outputBytes
        guard let stored = try session.meta("digest"), stored.count == size else {
            throw KeychainError(.decode, problem: "the keychain's digest record is missing or malformed", remedy: "Restore the device folder from a backup")
        }
        xor = Array(stored.prefix(Blake2b.outputBytes))
        count = Int64(bitPattern: stored[Blake2b.outputBytes..<Blake2b.outputBytes + 8].reversed().reduce(0) { $0 << 8 | UInt64($1) })
        guard try keys.digestMAC(xor: xor, count: count) == Array(stored.suffix(Blake2b.outputBytes)) else {
            throw KeychainError(.decode, problem: "the keychain's digest record fails authentication: it was changed outside the keychain",
                                remedy: "The keychain store was tampered with or damaged; restore the device folder from a backup")
        }
    }

    func store(in session: KeychainDatabase.Session, keys: ItemSeal.Keys) throws {
        let countBytes = withUnsafeBytes(of: UInt64(bitPattern: count).littleEndian, Array.init)
        try session.setMeta("digest", xor + countBytes + keys.digestMAC(xor: xor, count: count))
    }

    mutating func add(_ row: StoredRow, keys: ItemSeal.Keys) throws {
        toggle(try keys.rowMAC(row))
        count += 1
    }

    mutating func remove(_ row: StoredRow, keys: ItemSeal.Keys) throws {
        toggle(try keys.rowMAC(row))
        count -= 1
    }

    mutating func replace(_ old: StoredRow, with new: StoredRow, keys: ItemSeal.Keys) throws {
        toggle(try keys.rowMAC(old))
        toggle(try keys.rowMAC(new))
    }

    private mutating func toggle(_ mac: [UInt8]) {
        for index in xor.indices { xor[index] ^= mac[index] }
    }
}

extension KeychainItem {
    /// Zeroes the secret's bytes and drops it: for a secret that passed through a process that is not its owner
    /// (the key daemon), so nothing of it stays in freed memory. Copies made elsewhere keep their own bytes.
    package mutating func scrubSecret() {
        guard var bytes = secret else { return }
        secret = nil
        bytes.resetBytes(in: 0..<bytes.count)
    }

    var withoutSecret: KeychainItem {
        var copy = self
        copy.secret = nil
        return copy
    }
}
