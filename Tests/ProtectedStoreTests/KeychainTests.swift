import CSQLite
import Foundation
@testable import ProtectedStore
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// The kit's device (the suite has a smaller one of its own by the same name).
private typealias KitDevice = ProtectedStoreTesting.TestDevice

/// The keychain's rules as iOS enforces them (KEYCHAIN.md): each accessibility value in each lock state, the status
/// codes, access groups, and what a damaged store reports.
@Suite("Keychain", .ownThread)
struct KeychainTests {
    enum Phase: String, CaseIterable, CustomTestStringConvertible {
        case unlocked, locked, beforeFirstUnlock
        /// Rebooted, unlocked once, locked again: "after first unlock" items are back, "when unlocked" ones are not.
        case lockedAfterReboot
        var testDescription: String { rawValue }
    }

    static func allowed(_ accessible: KeychainAccessibility, _ phase: Phase) -> Bool {
        switch phase {
        case .unlocked: true
        case .beforeFirstUnlock: false
        case .locked, .lockedAfterReboot: accessible.protectionClass == .completeUntilFirstUserAuthentication
        }
    }

    static func secret(_ text: String) -> Data { Data(text.utf8) }

    static func expectStatus(_ code: KeychainError.Code, _ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            try body()
            Issue.record("expected \(code.name) (\(code.rawValue)), the call succeeded", sourceLocation: sourceLocation)
        } catch let error as KeychainError {
            #expect(error.code == code, "expected \(code.name), got \(error)", sourceLocation: sourceLocation)
            #expect(error.description.contains("\(code.name) (\(code.rawValue))"), "\(error)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("expected a KeychainError \(code.name), got \(error)", sourceLocation: sourceLocation)
        }
    }

    @Test("accessibility × lock state × read, add, update, delete", arguments: KeychainAccessibility.allCases, Phase.allCases)
    func matrix(accessible: KeychainAccessibility, phase: Phase) async throws {
        let test = try KitDevice()
        for account in ["read", "update", "delete"] {
            try test.keychain.add(.genericPassword(service: "matrix", account: account, secret: Self.secret("old \(account)"), accessible: accessible))
        }
        switch phase {
        case .unlocked: break
        case .locked: await test.lock()
        case .beforeFirstUnlock: try test.reboot()
        case .lockedAfterReboot:
            try test.reboot()
            try await test.unlock()
            await test.lock()
        }
        let keychain = try test.keychain
        let allowed = Self.allowed(accessible, phase)
        let operations: [(String, () throws -> Void)] = [
            ("read", {
                let secret = try keychain.secret(matching: .genericPassword(service: "matrix", account: "read"))
                #expect(secret == Self.secret("old read"))
            }),
            ("add", { try keychain.add(.genericPassword(service: "matrix", account: "added", secret: Self.secret("new"), accessible: accessible)) }),
            ("update", { try keychain.update(matching: .genericPassword(service: "matrix", account: "update"), with: KeychainChanges(secret: Self.secret("new update"))) }),
            ("delete", { try keychain.delete(matching: .genericPassword(service: "matrix", account: "delete")) }),
        ]
        for (name, operation) in operations {
            if allowed {
                do { try operation() } catch { Issue.record("\(name) of a \(accessible) item \(phase): \(error)") }
            } else {
                Self.expectStatus(.interactionNotAllowed, operation)
            }
        }
        // What was refused changed nothing; what was allowed holds after the unlock.
        if phase != .unlocked { try await test.unlock() }
        let after = try test.keychain
        let accounts = try after.items(matching: .genericPassword(service: "matrix", limit: .all)).map(\.account!).sorted()
        #expect(accounts == (allowed ? ["added", "read", "update"] : ["delete", "read", "update"]))
        #expect(try after.secret(matching: .genericPassword(service: "matrix", account: "update")) == Self.secret(allowed ? "new update" : "old update"))
        #expect(try after.items(matching: .genericPassword(service: "matrix", account: "read"))[0].accessible == accessible)
    }

    @Test("the same rules through a key daemon: the client unwraps nothing itself")
    func throughDaemon() async throws {
        let test = try KitDevice(keyHolder: .daemon)
        try test.keychain.add(.genericPassword(service: "daemon", account: "a", secret: Self.secret("class A")))
        try test.keychain.add(.genericPassword(service: "daemon", account: "c", secret: Self.secret("class C"), accessible: .afterFirstUnlock))
        await test.lock()
        Self.expectStatus(.interactionNotAllowed) { _ = try test.keychain.secret(matching: .genericPassword(service: "daemon", account: "a")) }
        #expect(try test.keychain.secret(matching: .genericPassword(service: "daemon", account: "c")) == Self.secret("class C"))
        let listing = try test.keychain.list(matching: .genericPassword(service: "daemon", limit: .all))
        #expect(listing.items.map(\.account) == ["c"] && listing.unavailable == 1)
        try await test.unlock()
        #expect(try test.keychain.secret(matching: .genericPassword(service: "daemon", account: "a")) == Self.secret("class A"))
    }

    @Test("status codes: duplicate, not found, bad parameters with their limits, missing entitlement")
    func statusCodes() throws {
        let test = try KitDevice()
        let keychain = try test.keychain
        // The first call of a new keychain finds nothing (the database it made stays made).
        Self.expectStatus(.itemNotFound) { _ = try keychain.items(matching: .genericPassword(service: "s")) }
        let added = try keychain.add(.genericPassword(service: "s", account: "a", secret: Self.secret("one"), label: "first"))
        #expect(added.accessGroup == KitDevice.defaultBundleIdentifier && added.persistentReference?.count == 16 && added.secret == nil)
        Self.expectStatus(.duplicateItem) { try keychain.add(.genericPassword(service: "s", account: "a", secret: Self.secret("two"))) }
        // Another class, or another account, is another primary key.
        try keychain.add(.internetPassword(server: "s", account: "a", secret: Self.secret("inet"), protocol: "htps", port: 443))
        try keychain.add(.genericPassword(service: "s", account: "b", secret: Self.secret("b")))
        Self.expectStatus(.itemNotFound) { _ = try keychain.items(matching: .genericPassword(service: "s", account: "missing")) }
        Self.expectStatus(.itemNotFound) { try keychain.delete(matching: .genericPassword(service: "nothing")) }
        Self.expectStatus(.itemNotFound) { try keychain.update(matching: .genericPassword(service: "nothing"), with: KeychainChanges(label: "x")) }
        // An absent account and an empty one are one primary key, and one query.
        try keychain.add(.genericPassword(service: "no account", account: "", secret: Self.secret("empty")))
        Self.expectStatus(.duplicateItem) { try keychain.add(KeychainItem(itemClass: .genericPassword, service: "no account", secret: Data())) }
        #expect(try keychain.secret(matching: .genericPassword(service: "no account", account: "")) == Self.secret("empty"))
        // By persistent reference, by label, and all of one service.
        #expect(try keychain.items(matching: KeychainQuery(itemClass: .genericPassword, persistentReference: added.persistentReference))[0].secret == Self.secret("one"))
        #expect(try keychain.items(matching: KeychainQuery(itemClass: .genericPassword, label: "first", limit: .all)).count == 1)
        #expect(try keychain.items(matching: .genericPassword(service: "s", limit: .all)).count == 2)
        #expect(try keychain.items(matching: KeychainQuery(itemClass: .internetPassword, server: "s", port: 443))[0].protocol == "htps")
        Self.expectStatus(.itemNotFound) { _ = try keychain.items(matching: KeychainQuery(itemClass: .internetPassword, server: "s", port: 80)) }

        func expectParam(_ mentioning: String, _ body: () throws -> Void) {
            do {
                try body()
                Issue.record("expected errSecParam mentioning \(mentioning)")
            } catch let error as KeychainError {
                #expect(error.code == .param && error.description.contains(mentioning), "\(error)")
            } catch {
                Issue.record("\(error)")
            }
        }
        expectParam("at most 16384 bytes") { try keychain.add(.genericPassword(service: "big", account: "a", secret: Data(count: 16 * 1024 + 1))) }
        expectParam("at most 1024 bytes") { try keychain.add(.genericPassword(service: String(repeating: "s", count: 1025), account: "a", secret: Data())) }
        expectParam("at most 4096") { try keychain.add(.genericPassword(service: "g", account: "a", secret: Data(), generic: Data(count: 4097))) }
        expectParam("not between 0 and 65535") { try keychain.add(.internetPassword(server: "x", account: "a", secret: Data(), port: 70_000)) }
        expectParam("no service attribute") { try keychain.add(KeychainItem(itemClass: .internetPassword, service: "s", secret: Data())) }
        expectParam("no port attribute") { try keychain.add(KeychainItem(itemClass: .genericPassword, port: 1, secret: Data())) }
        expectParam("needs its secret") { try keychain.add(KeychainItem(itemClass: .genericPassword, service: "no secret")) }
        expectParam("persistent reference is 16 bytes") { _ = try keychain.items(matching: KeychainQuery(itemClass: .genericPassword, persistentReference: Data([1]))) }
        expectParam("changes no attribute") { try keychain.update(matching: .genericPassword(service: "s", account: "a"), with: KeychainChanges()) }
        expectParam("no port attribute") { try keychain.update(matching: .genericPassword(service: "s", account: "a"), with: KeychainChanges(port: 443)) }
        // An update that would make a duplicate changes nothing.
        Self.expectStatus(.duplicateItem) { try keychain.update(matching: .genericPassword(service: "s", account: "b"), with: KeychainChanges(account: "a")) }
        #expect(try keychain.secret(matching: .genericPassword(service: "s", account: "b")) == Self.secret("b"))
        #expect(try keychain.secret(matching: .genericPassword(service: "s", account: "a")) == Self.secret("one"))

        Self.expectStatus(.missingEntitlement) { _ = try keychain.items(matching: .genericPassword(service: "s", accessGroup: "com.example.other")) }
        Self.expectStatus(.missingEntitlement) { try keychain.add(.genericPassword(service: "s", account: "a", secret: Data(), accessGroup: "com.example.other")) }
        Self.expectStatus(.param) { try test.keychain(accessGroups: .all).add(.genericPassword(service: "s", account: "a", secret: Data())) }
    }

    @Test("access groups: an app sees its own groups only; the owner sees every group")
    func accessGroups() throws {
        let test = try KitDevice()
        let first = try test.keychain(accessGroups: .only(["com.example.first", "group.shared"]))
        let second = try test.keychain(accessGroups: .only(["com.example.second", "group.shared"]))
        try first.add(.genericPassword(service: "token", account: "me", secret: Self.secret("first's")))
        try second.add(.genericPassword(service: "token", account: "me", secret: Self.secret("second's")))
        try first.add(.genericPassword(service: "shared", account: "me", secret: Self.secret("both"), accessGroup: "group.shared"))
        #expect(try first.secret(matching: .genericPassword(service: "token", account: "me")) == Self.secret("first's"))
        #expect(try second.secret(matching: .genericPassword(service: "token", account: "me")) == Self.secret("second's"))
        #expect(try second.secret(matching: .genericPassword(service: "shared")) == Self.secret("both"))
        Self.expectStatus(.missingEntitlement) { _ = try second.items(matching: .genericPassword(service: "token", accessGroup: "com.example.first")) }
        try second.delete(matching: .genericPassword(service: "token"))
        #expect(try first.secret(matching: .genericPassword(service: "token", account: "me")) == Self.secret("first's"), "another app's delete reached no item of this one")
        let owner = try test.keychain(accessGroups: .all)
        #expect(try owner.items(matching: .genericPassword(service: "token", limit: .all)).map(\.accessGroup) == ["com.example.first"])
        #expect(try owner.items(matching: KeychainQuery(itemClass: .genericPassword, limit: .all)).count == 2)
    }

    @Test("items survive a reboot and are bound to their row: a moved key, a changed byte, a removed row or an emptied store is errSecDecode")
    func tampering() async throws {
        let test = try KitDevice()
        try test.keychain.add(.genericPassword(service: "t", account: "one", secret: Self.secret("1")))
        try test.keychain.add(.genericPassword(service: "t", account: "two", secret: Self.secret("2")))
        try test.keychain.add(.genericPassword(service: "t", account: "three", secret: Self.secret("3"), accessible: .afterFirstUnlock))
        let database = (Keychain.folder(root: test.root) as NSString).appendingPathComponent("keychain.sqlite")
        #expect(try Data(contentsOf: URL(fileURLWithPath: database)).range(of: Data("three".utf8)) == nil, "an attribute in clear on disk")

        func freshKeychain() throws -> Keychain { try Keychain(device: test.device, accessGroups: .only([KitDevice.defaultBundleIdentifier])) }
        func tamper(_ sql: String) throws {
            var connection: OpaquePointer?
            try #require(sqlite3_open(database, &connection) == SQLITE_OK)
            defer { sqlite3_close(connection) }
            try #require(sqlite3_exec(connection, sql, nil, nil, nil) == SQLITE_OK, "\(String(cString: sqlite3_errmsg(connection)))")
        }
        let backup = try Data(contentsOf: URL(fileURLWithPath: database))
        func restore() throws { try backup.write(to: URL(fileURLWithPath: database)) }

        // A body byte changed: that item reads as damaged, the others still read.
        try tamper("UPDATE items SET body = substr(body, 1, 40) || X'00' || substr(body, 42) WHERE rowid = 1")
        Self.expectStatus(.decode) { _ = try test.keychain.items(matching: .genericPassword(service: "t", account: "one")) }
        try restore()
        // Two rows' keys swapped.
        try tamper("UPDATE items SET wrapped_key = (SELECT wrapped_key FROM items WHERE rowid = 2) WHERE rowid = 1")
        Self.expectStatus(.decode) { _ = try freshKeychain().items(matching: .genericPassword(service: "t", account: "one")) }
        try restore()
        // A row removed: seen by a keychain opened afterwards, and by one already open at its next miss.
        let open = try freshKeychain()
        _ = try open.items(matching: .genericPassword(service: "t", account: "one"))
        try tamper("DELETE FROM items WHERE rowid = 2")
        Self.expectStatus(.decode) { _ = try freshKeychain().items(matching: .genericPassword(service: "t", account: "one")) }
        Self.expectStatus(.decode) { _ = try open.items(matching: .genericPassword(service: "t", account: "two")) }
        try restore()
        // A digest made up (another count) fails its MAC.
        try tamper("UPDATE meta SET value = substr(value, 1, 32) || X'0200000000000000' || substr(value, 41) WHERE name = CAST('digest' AS BLOB)")
        Self.expectStatus(.decode) { _ = try freshKeychain().items(matching: .genericPassword(service: "t", account: "one")) }
        try restore()
        // The database emptied, or removed: damage, never an empty keychain.
        try Data().write(to: URL(fileURLWithPath: database))
        Self.expectStatus(.decode) { _ = try freshKeychain().items(matching: .genericPassword(service: "t")) }
        try FileManager.default.removeItem(atPath: database)
        Self.expectStatus(.decode) { try freshKeychain().add(.genericPassword(service: "t", account: "four", secret: Data())) }
        try restore()
        // Garbage where the database was.
        try Data(repeating: 0x5a, count: 8192).write(to: URL(fileURLWithPath: database))
        Self.expectStatus(.decode) { _ = try freshKeychain().items(matching: .genericPassword(service: "t")) }
        try restore()

        try test.reboot()
        Self.expectStatus(.interactionNotAllowed) { _ = try test.keychain.items(matching: .genericPassword(service: "t", account: "three")) }
        try await test.unlock()
        #expect(try test.keychain.items(matching: .genericPassword(service: "t", limit: .all)).map(\.account) == ["one", "two", "three"])
    }

    @Test("a full disk during an add fails it with errSecDiskFull and keeps every item; the add works once there is room")
    func fullDisk() async throws {
        let test = try KitDevice()
        let keychain = try test.keychain
        for index in 0..<20 { try keychain.add(.genericPassword(service: "disk", account: "\(index)", secret: Data(count: 2000))) }
        await test.failingWrites(after: 0) {
            Self.expectStatus(.diskFull) { try keychain.add(.genericPassword(service: "disk", account: "new", secret: Data(count: 8000))) }
            Self.expectStatus(.diskFull) { try keychain.update(matching: .genericPassword(service: "disk", account: "3"), with: KeychainChanges(secret: Data(count: 9000))) }
        }
        #expect(try keychain.items(matching: .genericPassword(service: "disk", limit: .all)).count == 20)
        #expect(try keychain.secret(matching: .genericPassword(service: "disk", account: "3")).count == 2000)
        try keychain.add(.genericPassword(service: "disk", account: "new", secret: Data(count: 8000)))
        #expect(try Keychain(device: test.device, accessGroups: .all).items(matching: .genericPassword(service: "disk", limit: .all)).count == 21)
    }

    @Test("a power cut during an add, an update or a delete leaves the keychain before or after it, whole; once it returned, after")
    func powerCuts() async throws {
        let test = try KitDevice()
        try test.keychain.add(.genericPassword(service: "cut", account: "kept", secret: Self.secret("kept"), accessible: .afterFirstUnlock))
        try test.keychain.add(.genericPassword(service: "cut", account: "changed", secret: Self.secret("before")))
        typealias State = [String: String]
        func state(of device: KitDevice) async throws -> State {
            try await device.unlock()
            let items = try device.keychain.items(matching: .genericPassword(service: "cut", limit: .all))
            return Dictionary(uniqueKeysWithValues: items.map { ($0.account!, String(decoding: $0.secret!, as: UTF8.self)) })
        }
        func expectEveryCut(seed: UInt64, before: State, after: State, _ change: @escaping () throws -> Void) async throws {
            let summary = try await test.everyPowerCut(maxStates: runsUnderSanitizer ? 40 : 150, seed: seed, during: { try change() }, afterReboot: { rebooted in
                let found = try await state(of: rebooted)
                let allowed = rebooted.powerCut?.operationHadReturned == true ? [after] : [before, after]
                #expect(allowed.contains(found), "after the cut: \(found)")
            })
            print("keychain power cuts: \(summary)")
        }
        let start: State = ["kept": "kept", "changed": "before"]
        try await expectEveryCut(seed: 21, before: start, after: start.merging(["new": "added"]) { $1 }) {
            try test.keychain.add(.genericPassword(service: "cut", account: "new", secret: Self.secret("added")))
        }
        let added = start.merging(["new": "added"]) { $1 }
        try await expectEveryCut(seed: 22, before: added, after: added.merging(["changed": "after"]) { $1 }) {
            try test.keychain.update(matching: .genericPassword(service: "cut", account: "changed"), with: KeychainChanges(secret: Self.secret("after")))
        }
        var deleted = added.merging(["changed": "after"]) { $1 }
        let beforeDelete = deleted
        deleted["new"] = nil
        try await expectEveryCut(seed: 23, before: beforeDelete, after: deleted) {
            try test.keychain.delete(matching: .genericPassword(service: "cut", account: "new"))
        }
    }
}
