import CSQLite
import CSupport
import Foundation
import ProtectedStoreCore
import SystemPackage

/// The keychain's SQLite database (docs/FORMAT.md §9) in `<device>/keychain/`: one connection, through `DurableVFS`,
/// each transaction under an exclusive flock of `keychain.lock`, so every process of the device's owner (and the
/// daemon) uses it one transaction at a time and a crashed one leaves a journal the next plays back.
final class KeychainDatabase: @unchecked Sendable {
    /// The format version in the `meta` table.
    static let formatVersion: UInt8 = 1

    let folder: String
    let databasePath: String
    /// Written once the database first holds its tables: from then on a missing or empty database is damage, not a
    /// keychain never used.
    private var createdMarkerPath: String { (folder as NSString).appendingPathComponent("created") }
    private var lockPath: String { (folder as NSString).appendingPathComponent("keychain.lock") }

    private let vfs: DurableVFS
    private var connection: OpaquePointer?
    private var lockDescriptor: Int32 = -1
    /// The `created` marker was looked for (and written if missing) since the connection opened.
    private var markerChecked = false

    init(folder: String) throws {
        self.folder = folder
        databasePath = (folder as NSString).appendingPathComponent("keychain.sqlite")
        vfs = try DurableVFS()
    }

    deinit {
        sqlite3_close_v2(connection)
        if lockDescriptor >= 0 { close(lockDescriptor) }
    }

    /// Runs `body` in one transaction under the flock; rolled back if it throws, so a failed call changes nothing.
    /// A database without tables yet is first made by `create`, in a transaction of its own, committed whatever
    /// `body` then does. The caller serialises calls.
    func transaction<R>(writing: Bool, create: (_ session: Session) throws -> Void, _ body: (_ session: Session) throws -> R) throws -> R {
        try lockExclusively()
        defer { flock(lockDescriptor, LOCK_UN) }
        let session = Session(database: self)
        if try openIfNeeded() {
            try inTransaction(session, writing: true) { try create(session) }
            // Committed is done: a marker not written now (a full disk, a power cut) is written at a later open.
            try? markCreated()
        }
        return try inTransaction(session, writing: writing) { try body(session) }
    }

    private func inTransaction<R>(_ session: Session, writing: Bool, _ body: () throws -> R) throws -> R {
        try session.execute(writing ? "BEGIN IMMEDIATE" : "BEGIN")
        do {
            let result = try body()
            try session.execute("COMMIT")
            return result
        } catch {
            try? session.execute("ROLLBACK")
            throw error
        }
    }

    private func lockExclusively() throws {
        if lockDescriptor < 0 {
            var info = stat()
            if stat(folder, &info) != 0 {
                // The folder's own name must survive a power cut once the first add has returned.
                try FileSystem.createDirectories(folder)
                try FileSystem.synchronizeDirectory((folder as NSString).deletingLastPathComponent)
            }
            lockDescriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard lockDescriptor >= 0 else { throw storageError(.io, "cannot open the keychain's lock file (\(String(cString: strerror(errno))))", path: lockPath) }
        }
        while flock(lockDescriptor, LOCK_EX) != 0 {
            guard errno == EINTR else { throw storageError(.io, "cannot lock the keychain (\(String(cString: strerror(errno))))", path: lockPath) }
        }
    }

    /// Opens the connection if it is not; true when the database has no tables yet and may be made. A database that
    /// has gone missing or empty after it was made is damage (`errSecDecode`), never a fresh, empty keychain.
    private func openIfNeeded() throws -> Bool {
        if connection == nil {
            let status = sqlite3_open_v2(databasePath, &connection, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, vfs.name)
            guard status == SQLITE_OK else {
                let error = failure(status, doing: "open the database")
                sqlite3_close_v2(connection)
                connection = nil
                throw error
            }
            sqlite3_extended_result_codes(connection, 1)
            // A rollback journal emptied, not removed, at each commit: fewer directory changes for a power cut to lose.
            try Session(database: self).execute("PRAGMA journal_mode = TRUNCATE; PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY; PRAGMA secure_delete = ON")
        }
        let tables = try Session(database: self).rows("SELECT count(*) FROM sqlite_master") { $0.integer(0) }
        guard tables.first == 0 else {
            if !markerChecked {
                try? markCreated()
                markerChecked = true
            }
            return false
        }
        var info = stat()
        if stat(createdMarkerPath, &info) == 0 {
            throw storageError(.decode, "the keychain's database is missing or empty, though one was made on this device: it was removed or damaged", path: databasePath)
        }
        return true
    }

    private func markCreated() throws {
        var info = stat()
        guard stat(createdMarkerPath, &info) != 0 else { return }
        try FileSystem.writeAtomically(Array("1\n".utf8), to: FileLocation(path: createdMarkerPath), replacing: true)
    }

    fileprivate func failure(_ status: Int32, doing action: String) -> KeychainError {
        if let underlying = vfs.takeLastFailure() { return KeychainError(underlying, path: databasePath) }
        let message = connection.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(status))
        switch status & 0xff {
        case SQLITE_CORRUPT, SQLITE_NOTADB:
            return storageError(.decode, "SQLite could not \(action): \(message)", path: databasePath)
        case SQLITE_FULL:
            return storageError(.diskFull, "SQLite could not \(action): \(message)", path: databasePath)
        default:
            return storageError(.io, "SQLite could not \(action): \(message) (code \(status))", path: databasePath)
        }
    }

    fileprivate var handle: OpaquePointer? { connection }

    private func storageError(_ code: KeychainError.Code, _ problem: String, path: String) -> KeychainError {
        let remedy = switch code {
        case .decode: "The keychain store was tampered with or damaged; restore the device folder from a backup, or move keychain/ aside to start an empty keychain"
        case .diskFull: "Free space on the disk and try again; nothing was changed"
        default: "Check the device's folder and its permissions"
        }
        return KeychainError(code, problem: problem, remedy: remedy, path: path)
    }

    /// The calls of one transaction.
    struct Session {
        fileprivate let database: KeychainDatabase

        func execute(_ sql: String) throws {
            let status = sqlite3_exec(database.handle, sql, nil, nil, nil)
            guard status == SQLITE_OK else { throw database.failure(status, doing: "run \(sql.prefix(40))") }
        }

        /// Runs one statement with blob and integer bindings, decoding each row in place.
        @discardableResult
        func rows<Row>(_ sql: String, _ bindings: [SQLBinding] = [], row decode: (SQLRowView) throws -> Row) throws -> [Row] {
            var statement: OpaquePointer?
            var status = sqlite3_prepare_v2(database.handle, sql, -1, &statement, nil)
            guard status == SQLITE_OK else { throw database.failure(status, doing: "prepare a statement") }
            defer { sqlite3_finalize(statement) }
            for (index, binding) in bindings.enumerated() {
                let position = Int32(index + 1)
                switch binding {
                case .blob(let bytes): bytes.withUnsafeBytes { _ = sqlite3_bind_blob(statement, position, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count), sqliteTransient) }
                case .integer(let value): sqlite3_bind_int64(statement, position, value)
                }
            }
            var results: [Row] = []
            while true {
                status = sqlite3_step(statement)
                if status == SQLITE_DONE { return results }
                guard status == SQLITE_ROW else {
                    if status == PS_SQLITE_CONSTRAINT_UNIQUE || status == PS_SQLITE_CONSTRAINT_PRIMARYKEY { throw DuplicateRow() }
                    throw database.failure(status, doing: "run a statement")
                }
                results.append(try decode(SQLRowView(statement: statement)))
            }
        }

        func run(_ sql: String, _ bindings: [SQLBinding] = []) throws {
            try rows(sql, bindings) { _ in () }
        }

        func meta(_ name: String) throws -> [UInt8]? {
            try rows("SELECT value FROM meta WHERE name = ?", [.blob(Array(name.utf8))]) { $0.blob(0) }.first
        }

        func setMeta(_ name: String, _ value: [UInt8]) throws {
            try run("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", [.blob(Array(name.utf8)), .blob(value)])
        }

        func createTables() throws {
            try execute("""
                CREATE TABLE meta (name BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
                CREATE TABLE items (
                    ref BLOB PRIMARY KEY, kind INTEGER NOT NULL, accessible INTEGER NOT NULL, group_tag BLOB NOT NULL,
                    primary_tag BLOB NOT NULL UNIQUE, service_tag BLOB NOT NULL, account_tag BLOB NOT NULL, server_tag BLOB NOT NULL,
                    wrapped_key BLOB NOT NULL, body BLOB NOT NULL);
                CREATE INDEX items_by_service ON items (kind, service_tag);
                CREATE INDEX items_by_account ON items (kind, account_tag);
                CREATE INDEX items_by_server ON items (kind, server_tag);
                """)
        }

        static let rowColumns = "ref, kind, accessible, group_tag, primary_tag, service_tag, account_tag, server_tag, wrapped_key, body"

        /// Every row passing `condition` (SQL over the clear columns), in the order they were added.
        func items(where condition: String = "1", _ bindings: [SQLBinding] = []) throws -> [StoredRow] {
            try rows("SELECT \(Self.rowColumns) FROM items WHERE \(condition) ORDER BY rowid", bindings) { row in
                StoredRow(reference: row.blob(0), kind: UInt8(clamping: row.integer(1)), accessible: UInt8(clamping: row.integer(2)), groupTag: row.blob(3),
                          primaryTag: row.blob(4), serviceTag: row.blob(5), accountTag: row.blob(6), serverTag: row.blob(7), wrappedKey: row.blob(8), body: row.blob(9))
            }
        }

        /// Adds `row`; `DuplicateRow` if its primary tag or reference is taken.
        func insert(_ row: StoredRow) throws {
            try run("INSERT INTO items (\(Self.rowColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [.blob(row.reference), .integer(Int64(row.kind)), .integer(Int64(row.accessible)), .blob(row.groupTag), .blob(row.primaryTag),
                     .blob(row.serviceTag), .blob(row.accountTag), .blob(row.serverTag), .blob(row.wrappedKey), .blob(row.body)])
        }

        func delete(reference: [UInt8]) throws {
            try run("DELETE FROM items WHERE ref = ?", [.blob(reference)])
        }

        func count() throws -> Int64 {
            try rows("SELECT count(*) FROM items") { $0.integer(0) }.first ?? 0
        }
    }
}

/// A UNIQUE or PRIMARY KEY constraint refused an insert: the item exists.
struct DuplicateRow: Error {}

enum SQLBinding {
    case blob([UInt8])
    case integer(Int64)
}

/// The current row of a statement being stepped; valid only inside `rows`' closure.
struct SQLRowView {
    fileprivate let statement: OpaquePointer?

    func blob(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(statement, column))
        guard count > 0, let bytes = sqlite3_column_blob(statement, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: bytes, count: count))
    }

    func integer(_ column: Int32) -> Int64 { sqlite3_column_int64(statement, column) }
}

/// SQLite's SQLITE_TRANSIENT: it copies the bound bytes before the call returns.
private let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
