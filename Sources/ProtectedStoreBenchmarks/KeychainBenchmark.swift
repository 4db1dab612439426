import CSQLite
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import ProtectedStoreDaemon

/// Keychain adds and finds, in this process and through the key daemon, for a small and a large keychain, beside the
/// floor measured in the same run: the same rows in a plain SQLite table (default VFS, the same rollback journal and
/// synchronous = FULL, nothing sealed), one transaction per insert, one indexed SELECT per lookup.
public struct KeychainBenchmark: Sendable {
    /// One keychain size's figures, each a mean in microseconds per call.
    public struct Size: Sendable, Codable {
        public var items: Int
        public var finds: Int
        public var sqliteInsertMicroseconds: Double
        public var sqliteLookupMicroseconds: Double
        public var inProcess: Figures
        /// This process opens the database; the daemon unwraps each item's key (`Keychain(device:)` on an attached device).
        public var attached: Figures
        /// The daemon does everything; each call is one keychain request (what a launched app does).
        public var throughDaemon: Figures
    }

    public struct Figures: Sendable, Codable {
        public var addMicroseconds: Double
        public var findMicroseconds: Double
    }

    public struct Result: Sendable, Codable {
        public var sizes: [Size]
    }

    public var sizes: [Int]
    public var finds: Int
    /// Directory for the temporary devices and databases (removed afterwards).
    public var directory: String

    public init(sizes: [Int] = [10, 10_000], finds: Int = 1_000, directory: String) {
        self.sizes = sizes
        self.finds = finds
        self.directory = directory
    }

    public func run() throws -> Result {
        let base = (directory as NSString).appendingPathComponent("sandboxctl-bench-keychain-\(Random.bytes(4).hex)")
        try FileSystem.createDirectories(base)
        defer { try? FileManager.default.removeItem(atPath: base) }
        var results: [Size] = []
        for (index, items) in sizes.enumerated() {
            let folder = (base as NSString).appendingPathComponent("\(index)")
            try FileSystem.createDirectories(folder)
            let (insert, lookup) = try plainSQLite(items: items, folder: folder)
            let inProcess = try measure(items: items, folder: folder, name: "in-process") { device in try Keychain(device: device) }
            let attached = try measureThroughDaemon(items: items, folder: folder, name: "attached") { device in try Keychain(device: device) }
            let through = try measureThroughDaemon(items: items, folder: folder, name: "daemon") { device in try Keychain(daemonOf: device) }
            results.append(Size(items: items, finds: finds, sqliteInsertMicroseconds: insert, sqliteLookupMicroseconds: lookup,
                                inProcess: inProcess, attached: attached, throughDaemon: through))
        }
        return Result(sizes: results)
    }

    /// `items` adds into an empty keychain, then `finds` lookups of random items with their secrets.
    private func exercise(_ keychain: Keychain, items: Int) throws -> Figures {
        let secret = Data(repeating: 0x5a, count: 64)
        let adding = try microseconds {
            for item in 0..<items { try keychain.add(.genericPassword(service: "bench", account: "account \(item)", secret: secret, accessGroup: "com.example.bench")) }
        }
        var generator = SystemRandomNumberGenerator()
        let accounts = (0..<finds).map { _ in "account \(Int.random(in: 0..<items, using: &generator))" }
        let finding = try microseconds {
            for account in accounts { _ = try keychain.secret(matching: .genericPassword(service: "bench", account: account)) }
        }
        return Figures(addMicroseconds: adding / Double(items), findMicroseconds: finding / Double(finds))
    }

    private func measure(items: Int, folder: String, name: String, _ keychain: (Device) throws -> Keychain) throws -> Figures {
        let (root, secret) = paths(folder, name)
        let device = try Device.create(root: root, deviceSecretPath: secret, passcode: try Passcode("benchmark"), kdf: .fast, notificationCenter: NotificationCenter())
        defer { device.powerOff() }
        return try exercise(try keychain(device), items: items)
    }

    private func measureThroughDaemon(items: Int, folder: String, name: String, _ keychain: (Device) throws -> Keychain) throws -> Figures {
        let (root, secret) = paths(folder, name)
        try Device.create(root: root, deviceSecretPath: secret, passcode: try Passcode("benchmark"), kdf: .fast, notificationCenter: NotificationCenter()).powerOff()
        let daemon = try KeyDaemon.start(root: root, deviceSecretPath: secret, logger: .init(label: "bench", factory: { _ in SwiftLogNoOpLogHandler() }))
        defer { daemon.stop() }
        let device = try Device.attach(root: root, socketPath: daemon.socketPath, notificationCenter: NotificationCenter())
        defer { device.powerOff() }
        try device.unlock(passcode: try Passcode("benchmark"))
        return try exercise(try keychain(device), items: items)
    }

    private func paths(_ folder: String, _ name: String) -> (String, String) {
        ((folder as NSString).appendingPathComponent("\(name)-device"), (folder as NSString).appendingPathComponent("\(name).secret"))
    }

    /// The floor: inserts and lookups of the same rows, unsealed, in a plain SQLite table.
    private func plainSQLite(items: Int, folder: String) throws -> (insert: Double, lookup: Double) {
        var connection: OpaquePointer?
        let path = (folder as NSString).appendingPathComponent("plain.sqlite")
        guard sqlite3_open(path, &connection) == SQLITE_OK else { throw failure(connection, "open \(path)") }
        defer { sqlite3_close(connection) }
        func execute(_ sql: String) throws {
            guard sqlite3_exec(connection, sql, nil, nil, nil) == SQLITE_OK else { throw failure(connection, sql) }
        }
        try execute("PRAGMA journal_mode = TRUNCATE; PRAGMA synchronous = FULL; CREATE TABLE items (service TEXT, account TEXT, secret BLOB, PRIMARY KEY (service, account))")
        func prepare(_ sql: String) throws -> OpaquePointer? {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(connection, sql, -1, &statement, nil) == SQLITE_OK else { throw failure(connection, sql) }
            return statement
        }
        let insert = try prepare("INSERT INTO items VALUES ('bench', ?, ?)")
        defer { sqlite3_finalize(insert) }
        let secret = [UInt8](repeating: 0x5a, count: 64)
        let inserting = try microseconds {
            for item in 0..<items {
                try execute("BEGIN IMMEDIATE")
                sqlite3_bind_text(insert, 1, "account \(item)", -1, transient)
                sqlite3_bind_blob(insert, 2, secret, Int32(secret.count), transient)
                guard sqlite3_step(insert) == SQLITE_DONE else { throw failure(connection, "insert") }
                sqlite3_reset(insert)
                try execute("COMMIT")
            }
        }
        let lookup = try prepare("SELECT secret FROM items WHERE service = 'bench' AND account = ?")
        defer { sqlite3_finalize(lookup) }
        var generator = SystemRandomNumberGenerator()
        let accounts = (0..<finds).map { _ in "account \(Int.random(in: 0..<items, using: &generator))" }
        let looking = try microseconds {
            for account in accounts {
                sqlite3_bind_text(lookup, 1, account, -1, transient)
                guard sqlite3_step(lookup) == SQLITE_ROW, sqlite3_column_bytes(lookup, 0) == 64 else { throw failure(connection, "lookup") }
                sqlite3_reset(lookup)
            }
        }
        return (inserting / Double(items), looking / Double(finds))
    }

    private func failure(_ connection: OpaquePointer?, _ what: String) -> ProtectedStoreError {
        ProtectedStoreError(.io, problem: "SQLite could not \(what): \(connection.map { String(cString: sqlite3_errmsg($0)) } ?? "no connection")",
                            remedy: "Check the benchmark directory and the free space")
    }

    private func microseconds(_ body: () throws -> Void) rethrows -> Double {
        let start = ContinuousClock.now
        try body()
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) * 1e6 + Double(elapsed.components.attoseconds) / 1e12
    }
}

/// SQLite's SQLITE_TRANSIENT: it copies the bound bytes before the call returns.
private let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
