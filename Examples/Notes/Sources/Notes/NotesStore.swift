import Foundation
import Logging
import ProtectedStore

/// A notes store on SQLite in `Library/Application Support/<bundle>/Notes.sqlite`, class A (complete protection),
/// written the way Apple advises for protected data:
///
/// - it closes its database on *will become unavailable* and reopens it on *did become available*;
/// - a change that arrives while the database is closed (locked, before first unlock, or when a lock took the keys
///   in the middle of a transaction) is written to a pending journal of class B files (complete unless open, which
///   can be created while locked) and folded into the database at the next unlock;
/// - an open-URL event moves its Inbox item out of the Inbox at once (no key needed) and imports it as a note as
///   soon as the database is open.
///
/// A change is accepted when the call returns: it is durable, and it reaches the database exactly once, across
/// locks, unlocks and reboots. Reads need the database, so `notes()` fails while locked with the `CocoaError` a
/// class A file gives (`.fileReadNoPermission` over `EPERM`).
public final class NotesStore: @unchecked Sendable, ProtectedDataDelegate, OpenURLDelegate {
    /// The container the store lives in.
    public let container: Container
    /// The database's container path.
    public let databasePath: String

    let pendingFolder: String
    let importsFolder: String
    let unreadableFolder: String
    private let vfs: ContainerVFS
    /// Serialises every use of the connection and the journal, so *will become unavailable* waits for the transaction
    /// in flight (within the grace period) before closing the database.
    private let mutex = NSLock()
    private var connection: SQLiteConnection?
    private var isClosed = false
    private var lastPendingSequence: UInt64 = 0
    /// Whether `Pending/` or `Imported/` may hold something to fold in. Only this store writes them (one store per
    /// database), so after a fold that emptied them an unlock skips listing them: most unlocks find nothing there.
    /// True at the start, for what an earlier process left.
    private var mayHaveStagedChanges = true
    private let logger = Logger(label: "Notes")

    /// Opens the store, creating its folders; the database opens now if protected data is available, else at the
    /// next unlock. Changes can be made either way.
    public init(container: Container) throws {
        self.container = container
        let folder = container.applicationSupportPath
        databasePath = "\(folder)/Notes.sqlite"
        pendingFolder = "\(folder)/Pending"
        importsFolder = "\(folder)/Imported"
        unreadableFolder = "\(folder)/Unreadable"
        try container.createDirectory(atPath: pendingFolder, withIntermediateDirectories: true,
                                      attributes: [.protectionKey: FileProtectionType.completeUnlessOpen])
        try container.createDirectory(atPath: importsFolder, withIntermediateDirectories: true)
        try OpenDatabases.claim("\(container.dataPath)/\(databasePath)")
        do {
            vfs = try ContainerVFS(container: container)
        } catch {
            OpenDatabases.release("\(container.dataPath)/\(databasePath)")
            throw error
        }
        do {
            lastPendingSequence = try pendingEntries().last?.sequence ?? 0
            container.device.addDelegate(self)
            container.addOpenURLDelegate(self)
            try mutex.withLock { try openIfAvailable() }
        } catch {
            close()
            throw error
        }
    }

    deinit { close() }

    /// Stops observing and closes the database; later calls throw. Another store can then open it.
    public func close() {
        container.device.removeDelegate(self)
        container.removeOpenURLDelegate(self)
        let wasOpen: Bool = mutex.withLock {
            defer { isClosed = true }
            dropConnection()
            return !isClosed
        }
        if wasOpen { OpenDatabases.release("\(container.dataPath)/\(databasePath)") }
    }

    // MARK: Writing

    /// Adds a note; accepted (durable) when it returns, whatever the lock state.
    @discardableResult
    public func add(title: String, body: String) throws -> Note {
        var added: Note?
        try transaction { added = $0.add(title: title, body: body) }
        return added!
    }

    /// Deletes a note; deleting one that does not exist does nothing.
    public func delete(id: UUID) throws {
        try transaction { $0.delete(id: id) }
    }

    /// Makes several changes as one: all are accepted when it returns, or none if `body` throws. Unlocked, they run
    /// inside one SQLite transaction; if a lock takes the keys part-way, the database rolls back (at once, or from its
    /// journal after the unlock) and the changes go to the pending journal instead, so the caller never sees it.
    public func transaction(_ body: (NotesTransaction) throws -> Void) throws {
        try mutex.withLock {
            try checkOpen()
            try openIfAvailable()
            let transaction = NotesTransaction(database: try beginTransaction())
            defer { transaction.finish() }
            do {
                try body(transaction)
                if let failure = transaction.failure { throw failure }
            } catch {
                try? connection?.execute("ROLLBACK")
                throw error
            }
            if let database = transaction.database {
                do {
                    try database.execute("COMMIT")
                    return
                } catch where Self.isDataProtectionDenial(error) {
                    // Whether or not SQLite reached its commit point, replaying the changes by id is harmless.
                } catch {
                    try? connection?.execute("ROLLBACK")
                    throw error
                }
            }
            // Locked, or a lock took the keys part-way: the journal takes the changes.
            dropConnection()
            guard !transaction.changes.isEmpty else { return }
            try appendPending(transaction.changes)
        }
    }

    /// The open connection inside a new transaction, or nil when the database is unavailable. Caller holds `mutex`.
    private func beginTransaction() throws -> SQLiteConnection? {
        guard let connection else { return nil }
        do {
            try connection.execute("BEGIN IMMEDIATE")
            return connection
        } catch where Self.isDataProtectionDenial(error) {
            dropConnection()
            return nil
        }
    }

    // MARK: Reading

    /// Every note, oldest first. Throws the container's data-protection `CocoaError` while protected data is unavailable.
    public func notes() throws -> [Note] {
        try mutex.withLock {
            try checkOpen()
            try openIfAvailable()
            guard let connection else { throw unavailable() }
            do {
                return try connection.query("SELECT id, title, body, created, imported_from FROM notes ORDER BY created, id", row: Self.note)
            } catch where Self.isDataProtectionDenial(error) {
                dropConnection()
                throw error
            }
        }
    }

    /// Runs SQLite's integrity check on the database; throws unless it reports "ok".
    public func verifyIntegrity() throws {
        try mutex.withLock {
            try checkOpen()
            try openIfAvailable()
            guard let connection else { throw unavailable() }
            let rows = try connection.run("PRAGMA integrity_check")
            guard rows == [[.text("ok")]] else {
                throw NotesStoreError(problem: "SQLite's integrity check failed: \(rows)", path: databasePath, remedy: "Restore the database from a backup")
            }
        }
    }

    /// Changes accepted while the database was closed, not yet folded in (listing them needs no key).
    public func pendingChangeCount() throws -> Int { try pendingEntries().count }

    /// Whether the database is open now.
    public var isDatabaseOpen: Bool { mutex.withLock { connection != nil } }

    // MARK: Protected-data events

    public func protectedDataWillBecomeUnavailable(_ device: Device) {
        mutex.withLock { dropConnection() }
    }

    public func protectedDataDidBecomeAvailable(_ device: Device) {
        mutex.withLock {
            // An event already queued when the store was closed must not open it again.
            guard !isClosed else { return }
            do {
                try openIfAvailable()
            } catch {
                logger.error("cannot reopen the notes database after unlock: \(error)")
            }
        }
    }

    // MARK: Open-URL events

    /// Moves the item out of the Inbox at once (a rename: no key needed), then imports it if the database is open;
    /// otherwise it waits in `Imported/` for the next unlock.
    public func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {
        let prefix = container.dataPath + "/"
        guard url.path.hasPrefix(prefix) else { return }
        let path = String(url.path.dropFirst(prefix.count))
        mutex.withLock {
            guard !isClosed else { return }
            do {
                let folder = "\(importsFolder)/\(UUID().uuidString)"
                mayHaveStagedChanges = true
                try container.createDirectory(atPath: folder)
                do {
                    try container.moveItem(atPath: path, toPath: "\(folder)/\((path as NSString).lastPathComponent)")
                } catch let error as CocoaError where error.protectedStoreError?.kind == .notFound {
                    // Imported before (an event delivered again after a crash) or deleted by the user.
                    try container.removeItem(atPath: folder)
                    return
                }
                try openIfAvailable()
                if let connection { try importStaged(into: connection) }
            } catch {
                logger.error("cannot import \(path) now; it waits in \(importsFolder) for the next unlock: \(error)")
            }
        }
    }

    // MARK: The database

    /// Opens the database if it is closed and the device unlocked, then folds in the pending journal and the staged
    /// imports. A lock racing with it leaves the database closed, for the next unlock. Caller holds `mutex`.
    private func openIfAvailable() throws {
        guard connection == nil, !isClosed, container.device.state == .unlocked else { return }
        var opened: SQLiteConnection?
        do {
            let connection = try SQLiteConnection(path: databasePath, vfs: vfs)
            opened = connection
            // One page is one encrypted block. DELETE, because its commit point (removing the journal) is one atomic
            // step; truncating an encrypted journal is two (rewrite its first block, then cut the file).
            try connection.execute("""
                PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE; PRAGMA synchronous = EXTRA; PRAGMA temp_store = MEMORY;
                CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL,
                                                  created REAL NOT NULL /* seconds since 2001, Date's own reference: exact round trips */, imported_from TEXT);
                """)
            // In use only once everything accepted while it was closed is in: a direct write before that could be
            // overtaken by an older journal entry replayed later.
            if mayHaveStagedChanges {
                try foldPending(into: connection)
                try importStaged(into: connection)
                mayHaveStagedChanges = false
            }
            self.connection = connection
        } catch {
            opened?.close()
            if !Self.isDataProtectionDenial(error) { throw error }
        }
    }

    /// Caller holds `mutex`.
    private func dropConnection() {
        guard let connection else { return }
        // A transaction cut short by the lock is rolled back here, or from its journal at the next open.
        try? connection.execute("ROLLBACK")
        connection.close()
        self.connection = nil
    }

    private func checkOpen() throws {
        guard !isClosed else {
            throw NotesStoreError(problem: "the notes store was closed", path: databasePath, remedy: "Make a new NotesStore")
        }
    }

    static func apply(_ change: NoteChange, to connection: SQLiteConnection) throws {
        switch change {
        case .save(let note):
            try connection.run("INSERT OR REPLACE INTO notes (id, title, body, created, imported_from) VALUES (?, ?, ?, ?, ?)",
                               [.text(note.id.uuidString), .text(note.title), .text(note.body), .real(note.created.timeIntervalSinceReferenceDate),
                                note.importedFrom.map(SQLValue.text) ?? .null])
        case .delete(let id):
            try connection.run("DELETE FROM notes WHERE id = ?", [.text(id.uuidString)])
        }
    }

    private func inTransaction(_ connection: SQLiteConnection, _ changes: [NoteChange]) throws {
        try connection.execute("BEGIN IMMEDIATE")
        do {
            for change in changes { try Self.apply(change, to: connection) }
            try connection.execute("COMMIT")
        } catch {
            try? connection.execute("ROLLBACK")
            throw error
        }
    }

    private static func note(_ row: SQLRow) throws -> Note {
        guard let id = row.text(0), let uuid = UUID(uuidString: id), let title = row.text(1), let body = row.text(2),
              let created = row.real(3) else {
            throw NotesStoreError(problem: "a row of the notes table has unexpected types", path: nil, remedy: "Restore the database from a backup")
        }
        return Note(id: uuid, title: title, body: body, created: Date(timeIntervalSinceReferenceDate: created), importedFrom: row.text(4))
    }

    // MARK: The pending journal

    /// One file per accepted batch, `Pending/<sequence>.json`, class B: it can be created while locked and is read
    /// back after the unlock. Each is written whole and renamed into place, so a crash leaves it complete or absent.
    private struct PendingEntry: Codable {
        var changes: [NoteChange]
    }

    private func appendPending(_ changes: [NoteChange]) throws {
        // Taken before writing, so a failed write never leaves later ones colliding with its name.
        lastPendingSequence += 1
        mayHaveStagedChanges = true
        let path = "\(pendingFolder)/\(String(format: "%016llu", lastPendingSequence)).json"
        do {
            try container.write(try JSONEncoder().encode(PendingEntry(changes: changes)), toPath: path,
                                options: [.completeFileProtectionUnlessOpen, .withoutOverwriting])
        } catch {
            // Renamed into place but not made durable (the directory fsync failed): undone, so the caller's error
            // means "not accepted" and a retry can't add the note twice.
            try? container.removeItem(atPath: path)
            throw error
        }
    }

    private func pendingEntries() throws -> [(sequence: UInt64, path: String)] {
        try container.contentsOfDirectory(atPath: pendingFolder).compactMap { item in
            guard item.name.hasSuffix(".json"), let sequence = UInt64(item.name.dropLast(5)) else { return nil }
            return (sequence, "\(pendingFolder)/\(item.name)")
        }.sorted { $0.sequence < $1.sequence }
    }

    /// Applies every pending entry, in order, in one transaction (one commit's fsyncs, not one per entry: a long lock
    /// can leave thousands), then removes them oldest first. A crash after the commit leaves a suffix of the entries,
    /// which the next open replays: that changes nothing, since every change is keyed by the note's id, so a note's
    /// last change in the suffix was its last change overall, and a note whose last change is gone is not touched.
    private func foldPending(into connection: SQLiteConnection) throws {
        var changes: [NoteChange] = []
        var folded: [String] = []
        for entry in try pendingEntries() {
            do {
                changes += try JSONDecoder().decode(PendingEntry.self, from: container.contents(atPath: entry.path)).changes
            } catch where Self.isUnreadableContent(error) {
                try setAside(entry.path, because: error)
                continue
            }
            folded.append(entry.path)
        }
        guard !folded.isEmpty else { return }
        try inTransaction(connection, changes)
        for path in folded { try container.removeItem(atPath: path) }
    }

    // MARK: Imports

    /// Imports every item staged in `Imported/<id>/<name>`: the id becomes the note's, so an import interrupted by a
    /// crash and run again adds the note once. Caller holds `mutex`.
    private func importStaged(into connection: SQLiteConnection) throws {
        for folder in try container.contentsOfDirectory(atPath: importsFolder) {
            let folderPath = "\(importsFolder)/\(folder.name)"
            guard let id = UUID(uuidString: folder.name), folder.type == .typeDirectory else { continue }
            guard let item = try container.contentsOfDirectory(atPath: folderPath).first else {
                try container.removeItem(atPath: folderPath)
                continue
            }
            let itemPath = "\(folderPath)/\(item.name)"
            let text: String
            do {
                guard let decoded = String(data: try container.contents(atPath: itemPath), encoding: .utf8) else {
                    try setAside(folderPath, because: NotesStoreError(problem: "the item is not UTF-8 text", path: itemPath, remedy: "Deliver notes as UTF-8 text files"))
                    continue
                }
                text = decoded
            } catch where Self.isUnreadableContent(error) {
                try setAside(folderPath, because: error)
                continue
            }
            let note = Note(id: id, title: (item.name as NSString).deletingPathExtension, body: text, importedFrom: item.name)
            try inTransaction(connection, [.save(note)])
            try container.removeItem(atPath: folderPath)
        }
    }

    /// Moves something that can't be read into `Unreadable/`, so it neither blocks the others nor gets lost.
    private func setAside(_ path: String, because error: any Error) throws {
        try container.createDirectory(atPath: unreadableFolder, withIntermediateDirectories: true)
        let destination = "\(unreadableFolder)/\(UUID().uuidString)-\((path as NSString).lastPathComponent)"
        try container.moveItem(atPath: path, toPath: destination)
        logger.error("set aside \(path) as \(destination): \(error)")
    }

    // MARK: Errors

    /// Content that will never read (it fails authentication, or does not decode), as opposed to a passing failure
    /// such as a full disk or a lock, which must not send an accepted change aside.
    static func isUnreadableContent(_ error: any Error) -> Bool {
        error is DecodingError || (error as? CocoaError)?.code == .fileReadCorruptFile
    }

    static func isDataProtectionDenial(_ error: any Error) -> Bool {
        (error as? CocoaError)?.isProtectedDataUnavailable == true || (error as? ProtectedStoreError)?.kind == .protectedDataUnavailable
    }

    /// The error reading a class A file gives while locked, for a read the closed database can't serve.
    private func unavailable() -> CocoaError {
        let reason = container.device.state == .beforeFirstUnlock ? "before first unlock" : "while the device is locked"
        return ProtectedStoreError(.protectedDataUnavailable, path: "\(container.bundleIdentifier):\(databasePath)",
                                   problem: "the notes database (class A) can't be read \(reason)", remedy: "Unlock the device, then read again")
            .cocoaError(writing: false)
    }
}

/// The changes of one `NotesStore.transaction`: applied to the database as they are made while it is open, and
/// kept, so they can go to the pending journal if a lock takes the database away part-way. Valid only inside its closure.
public final class NotesTransaction {
    private(set) var changes: [NoteChange] = []
    /// The connection the changes are applied to; nil once unavailable.
    private(set) var database: SQLiteConnection?
    /// A failure other than data protection: the transaction is rolled back and the caller gets it.
    private(set) var failure: (any Error)?

    init(database: SQLiteConnection?) { self.database = database }

    /// Adds a note.
    @discardableResult
    public func add(title: String, body: String) -> Note {
        let note = Note(title: title, body: body)
        record(.save(note))
        return note
    }

    /// Deletes a note.
    public func delete(id: UUID) { record(.delete(id)) }

    /// Ends its use: a transaction kept past its closure would write outside the store's lock.
    func finish() { isFinished = true }
    private var isFinished = false

    private func record(_ change: NoteChange) {
        precondition(!isFinished, "a NotesTransaction is used only inside the closure passed to NotesStore.transaction")
        changes.append(change)
        guard let database, failure == nil else { return }
        do {
            try NotesStore.apply(change, to: database)
        } catch {
            // The lock took the keys: the rest is only kept, for the journal. Anything else fails the transaction.
            self.database = nil
            if !NotesStore.isDataProtectionDenial(error) { failure = error }
        }
    }
}

/// The databases open in this process: the VFS keeps its locks in memory, so a second connection to the same file
/// (a second store on one container) would not be excluded by SQLite and could overwrite the first's pages.
private enum OpenDatabases {
    nonisolated(unsafe) private static var paths: Set<String> = []
    private static let mutex = NSLock()

    static func claim(_ path: String) throws {
        try mutex.withLock {
            guard paths.insert(path).inserted else {
                throw NotesStoreError(problem: "another NotesStore of this process has this database open", path: path,
                                      remedy: "Use that store, or close() it before opening a new one")
            }
        }
    }

    static func release(_ path: String) { _ = mutex.withLock { paths.remove(path) } }
}
