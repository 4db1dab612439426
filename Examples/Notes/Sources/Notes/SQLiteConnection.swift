import CSQLite
import Foundation

/// A value bound to or read from a SQL statement.
enum SQLValue: Equatable {
    case text(String)
    case real(Double)
    case null
}

/// One SQLite connection through a `ContainerVFS`: the few calls the notes store needs, each error turned into the
/// VFS's own (a data-protection denial stays a `CocoaError`) or a `NotesStoreError` naming the database.
final class SQLiteConnection {
    let path: String
    private let vfs: ContainerVFS
    private var handle: OpaquePointer?

    init(path: String, vfs: ContainerVFS) throws {
        self.path = path
        self.vfs = vfs
        _ = vfs.takeLastFailure()
        let status = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, vfs.name)
        guard status == SQLITE_OK else {
            let error = failure(status, doing: "open the database")
            sqlite3_close_v2(handle)
            handle = nil
            throw error
        }
        sqlite3_extended_result_codes(handle, 1)
    }

    deinit { close() }

    /// Closes the connection; a transaction left open is rolled back (now, or from its journal at the next open).
    func close() {
        guard let handle else { return }
        sqlite3_close_v2(handle)
        self.handle = nil
    }

    /// Runs statements that return no rows.
    func execute(_ sql: String) throws {
        _ = vfs.takeLastFailure()
        let status = sqlite3_exec(handle, sql, nil, nil, nil)
        guard status == SQLITE_OK else { throw failure(status, doing: "run \(sql)") }
    }

    /// Runs one statement with `bindings`, returning its rows.
    @discardableResult
    func run(_ sql: String, _ bindings: [SQLValue] = []) throws -> [[SQLValue]] {
        try query(sql, bindings) { row in (0..<row.columnCount).map(row.value) }
    }

    /// Runs one statement with `bindings`, turning each row into a value in place (no intermediate row arrays).
    func query<Row>(_ sql: String, _ bindings: [SQLValue] = [], row decode: (SQLRow) throws -> Row) throws -> [Row] {
        _ = vfs.takeLastFailure()
        var statement: OpaquePointer?
        var status = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard status == SQLITE_OK else { throw failure(status, doing: "prepare \(sql)") }
        defer { sqlite3_finalize(statement) }
        for (index, value) in bindings.enumerated() {
            let position = Int32(index + 1)
            switch value {
            case .text(let text): sqlite3_bind_text(statement, position, text, -1, sqliteTransient)
            case .real(let number): sqlite3_bind_double(statement, position, number)
            case .null: sqlite3_bind_null(statement, position)
            }
        }
        var rows: [Row] = []
        while true {
            status = sqlite3_step(statement)
            if status == SQLITE_DONE { return rows }
            guard status == SQLITE_ROW else { throw failure(status, doing: "run \(sql)") }
            rows.append(try decode(SQLRow(statement: statement)))
        }
    }

    /// The error for a failed call: what the VFS saw (a locked device's denial, a full disk) if it saw anything,
    /// else SQLite's own message.
    private func failure(_ status: Int32, doing action: String) -> any Error {
        if let underlying = vfs.takeLastFailure() { return underlying }
        let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(status))
        return NotesStoreError(problem: "SQLite could not \(action): \(message) (code \(status))", path: path,
                               remedy: status & 0xff == SQLITE_CORRUPT ? "Restore the database from a backup" : "Check the database file and the free space")
    }
}

/// The current row of a statement being stepped; valid only inside `query`'s closure.
struct SQLRow {
    fileprivate let statement: OpaquePointer?

    var columnCount: Int32 { sqlite3_column_count(statement) }

    /// The column's value: integers read as reals, anything else not NULL as text.
    func value(_ column: Int32) -> SQLValue {
        switch sqlite3_column_type(statement, column) {
        case SQLITE_NULL: .null
        case SQLITE_FLOAT, SQLITE_INTEGER: .real(sqlite3_column_double(statement, column))
        default: .text(String(cString: sqlite3_column_text(statement, column)))
        }
    }

    /// The column as text; nil if it is NULL.
    func text(_ column: Int32) -> String? {
        sqlite3_column_text(statement, column).map { String(cString: $0) }
    }

    /// The column as a real, if it is a number.
    func real(_ column: Int32) -> Double? {
        let type = sqlite3_column_type(statement, column)
        return type == SQLITE_FLOAT || type == SQLITE_INTEGER ? sqlite3_column_double(statement, column) : nil
    }
}

/// SQLite's SQLITE_TRANSIENT: it copies the bound text before the call returns.
private let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
