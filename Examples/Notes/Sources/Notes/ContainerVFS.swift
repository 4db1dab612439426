import CSQLite
import Foundation
import ProtectedStore

/// A SQLite VFS whose files are a container's protected files: SQLite's database, journal and temporary files go
/// through `Container`'s file API, so every page is encrypted under the file's class and a lock denies them as it
/// denies any class A file. File names are container paths (`Library/Application Support/<bundle>/Notes.sqlite`).
///
/// It serves one connection at a time per database (the notes store serialises its own), so locks are kept in
/// memory only (`NotesStore` refuses a second store on one database); it has no shared memory, so the database uses a
/// rollback journal, not WAL.
final class ContainerVFS: @unchecked Sendable {
    /// The name to pass to `sqlite3_open_v2`.
    let name: String
    let container: Container

    private let vfs: UnsafeMutablePointer<sqlite3_vfs>
    private let cName: UnsafeMutablePointer<CChar>
    private let mutex = NSLock()
    private var lastFailure: (any Error)?
    /// Databases whose rollback journal SQLite opened empty, until it removes it: that journal holds only this
    /// session's transaction, not one a crash interrupted.
    private var journalsOfThisSession: Set<String> = []

    init(container: Container) throws {
        guard let base = sqlite3_vfs_find(nil) else {
            throw NotesStoreError(problem: "SQLite has no default VFS to build on", path: nil, remedy: "Use a SQLite build with the unix VFS")
        }
        self.container = container
        name = "protectedstore-\(UUID().uuidString)"
        cName = strdup(name)
        vfs = .allocate(capacity: 1)
        // Sleeping, randomness, time and extension loading stay the platform's.
        var methods = base.pointee
        methods.iVersion = 2
        methods.szOsFile = Int32(MemoryLayout<ps_sqlite_file>.size)
        methods.mxPathname = 1024
        methods.pNext = nil
        methods.zName = UnsafePointer(cName)
        methods.xOpen = vfsOpen
        methods.xDelete = vfsDelete
        methods.xAccess = vfsAccess
        methods.xFullPathname = vfsFullPathname
        methods.xGetLastError = vfsGetLastError
        vfs.initialize(to: methods)
        vfs.pointee.pAppData = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_vfs_register(vfs, 0)
    }

    /// Call only once every connection using it is closed.
    deinit {
        sqlite3_vfs_unregister(vfs)
        vfs.deinitialize(count: 1)
        vfs.deallocate()
        free(cName)
    }

    /// The error behind SQLite's last I/O failure through this VFS, cleared as it is read.
    func takeLastFailure() -> (any Error)? { mutex.withLock { lastFailure.take() } }

    fileprivate func fail(_ error: any Error, code: Int32) -> Int32 {
        mutex.withLock { lastFailure = error }
        return code
    }

    fileprivate func noteOpened(journal handle: ProtectedFileHandle, of database: String) {
        guard handle.size == 0 else { return }
        mutex.withLock { _ = journalsOfThisSession.insert(database) }
    }

    fileprivate func noteDeleted(_ path: String) {
        guard path.hasSuffix("-journal") else { return }
        mutex.withLock { _ = journalsOfThisSession.remove(String(path.dropLast("-journal".count))) }
    }

    /// Whether the database has a rollback journal left by an interrupted transaction: one that is not empty and was
    /// not begun empty by this session (so it was there when the database was opened). Asked only when a block fails
    /// authentication, so the open path pays nothing for it. A plain stat of the stored journal, not the container's
    /// item lookup (which reads its header): past the 1 KiB header and length record means a non-empty journal.
    fileprivate func wasInterrupted(database path: String) -> Bool {
        guard !mutex.withLock({ journalsOfThisSession.contains(path) }) else { return false }
        var info = stat()
        guard let stored = try? container.storedPath("\(path)-journal"), stat(stored, &info) == 0 else { return false }
        return info.st_size > 1024
    }

    fileprivate var lastFailureDescription: String { mutex.withLock { lastFailure.map { "\($0)" } ?? "" } }

    fileprivate static func from(_ vfs: UnsafeMutablePointer<sqlite3_vfs>?) -> ContainerVFS {
        Unmanaged<ContainerVFS>.fromOpaque(vfs!.pointee.pAppData).takeUnretainedValue()
    }
}

/// One file SQLite opened.
private final class OpenFile {
    let handle: ProtectedFileHandle
    let path: String
    let deleteOnClose: Bool
    /// A rollback journal: a block of it that fails authentication was torn by a crash before SQLite synced it.
    let isJournal: Bool
    /// A main database: a block of it that fails authentication while a hot journal exists was torn by a crash in
    /// the middle of a transaction, and the journal holds the page as it was.
    let isMainDatabase: Bool
    let vfs: ContainerVFS
    /// A rollback journal's writes not yet stored, as one run of bytes from `pendingOffset`. SQLite writes a journal
    /// as a header and then records of a page number, a page and a checksum: small unaligned writes, each of which
    /// would re-seal a whole encrypted block and rewrite the length record. Kept here until SQLite syncs, reads, sizes,
    /// truncates or closes the journal, they are stored as one write (what a page cache does for a plain file). Nothing
    /// unsynced is promised durable, and SQLite writes the database only after syncing the journal.
    private var pending: [UInt8] = []
    private var pendingOffset: Int64 = 0
    /// Past this, pending bytes are stored at once, so a huge transaction runs in bounded memory.
    private static let pendingLimit = 1 << 20

    init(handle: ProtectedFileHandle, path: String, deleteOnClose: Bool, isJournal: Bool, isMainDatabase: Bool, vfs: ContainerVFS) {
        self.handle = handle
        self.path = path
        self.deleteOnClose = deleteOnClose
        self.isJournal = isJournal
        self.isMainDatabase = isMainDatabase
        self.vfs = vfs
    }

    /// Replaces with zeros each of the two blocks at the ends of `range` that fails authentication (cutting the file
    /// there if it is the last block): the ones a write of `range` must read.
    func clearTornBlocks(around range: Range<UInt64>) throws {
        let blockSize = UInt64(handle.blockSize)
        for start in Set([range.lowerBound / blockSize * blockSize, (range.upperBound - 1) / blockSize * blockSize]).sorted(by: >) {
            do {
                _ = try handle.read(upToCount: Int(blockSize), atOffset: start)
                continue
            } catch let error as CocoaError where error.code == .fileReadCorruptFile {}
            if start + blockSize <= handle.size {
                try handle.write(contentsOf: Data(count: Int(blockSize)), atOffset: start)
            } else {
                try handle.truncate(atOffset: start)
            }
        }
    }

    /// Writes `bytes` at `offset`: a journal's joins its pending run when it starts inside it or right after it,
    /// anything else is stored now (a journal's pending run first).
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        guard isJournal else { return try store(bytes, at: offset) }
        let pendingEnd = pendingOffset + Int64(pending.count)
        if pending.isEmpty || offset < pendingOffset || offset > pendingEnd {
            try storePending()
            pendingOffset = offset
        }
        let start = Int(offset - pendingOffset)
        if start + bytes.count > pending.count { pending += repeatElement(0, count: start + bytes.count - pending.count) }
        pending.withUnsafeMutableBytes { UnsafeMutableRawBufferPointer(rebasing: $0[start..<start + bytes.count]).copyMemory(from: bytes) }
        if pending.count >= Self.pendingLimit { try storePending() }
    }

    /// Stores the journal's pending bytes, if any, and forgets them (their plaintext zeroed).
    func storePending() throws {
        guard !pending.isEmpty else { return }
        defer { discardPending() }
        try pending.withUnsafeBytes { try store($0, at: pendingOffset) }
    }

    /// Forgets the pending bytes unstored (a journal deleted on close), zeroing their plaintext.
    func discardPending() {
        pending.withUnsafeMutableBytes { if let base = $0.baseAddress { explicit_bzero(base, $0.count) } }
        pending.removeAll()
    }

    private func store(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        let data = Data(bytes)
        do {
            try handle.write(contentsOf: data, atOffset: UInt64(offset))
        } catch let error as CocoaError where error.code == .fileReadCorruptFile && isJournal {
            // Writing part of a journal block means reading the rest of it first; a block a power cut tore holds
            // nothing this session wrote (its own writes leave whole blocks), only an old journal's bytes, which
            // SQLite ignores: replace them with zeros, as its checksums would reject them, and write again.
            try clearTornBlocks(around: UInt64(offset)..<UInt64(offset) + UInt64(bytes.count))
            try handle.write(contentsOf: data, atOffset: UInt64(offset))
        }
    }

    /// Whether a torn block of this file reads as zeros: always in a journal (SQLite's checksums reject it); in a
    /// database only while a rollback journal left by an interrupted transaction is there, until SQLite has played it
    /// back and removed it (the journal holds every page the transaction changed, as it was). Any other
    /// bad block is corruption, and is reported.
    func tornBlockReadsAsZeros() -> Bool {
        isJournal || isMainDatabase && vfs.wasInterrupted(database: path)
    }

    static func from(_ file: UnsafeMutablePointer<sqlite3_file>?) -> OpenFile {
        let wrapper = UnsafeMutableRawPointer(file!).assumingMemoryBound(to: ps_sqlite_file.self)
        return Unmanaged<OpenFile>.fromOpaque(wrapper.pointee.handle).takeUnretainedValue()
    }

    /// Runs an I/O method, turning a thrown error into `code` and remembering it for the store.
    func run(_ code: Int32, _ body: () throws -> Void) -> Int32 {
        do {
            try body()
            return SQLITE_OK
        } catch {
            return vfs.fail(error, code: code)
        }
    }
}

// MARK: VFS methods

private let vfsOpen: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, UnsafeMutablePointer<sqlite3_file>?, Int32, UnsafeMutablePointer<Int32>?) -> Int32 = { vfs, name, file, flags, outFlags in
    let context = ContainerVFS.from(vfs)
    let wrapper = UnsafeMutableRawPointer(file!).assumingMemoryBound(to: ps_sqlite_file.self)
    wrapper.pointee.base.pMethods = nil
    // SQLite's own temporary files (statement journals that spill, sorts) go to the container's tmp folder.
    let path = name.map { String(cString: $0) } ?? "tmp/sqlite-\(UUID().uuidString)"
    let container = context.container
    let isJournal = flags & SQLITE_OPEN_MAIN_JOURNAL != 0
    func openHandle() throws -> ProtectedFileHandle {
        if flags & SQLITE_OPEN_READONLY != 0 { return try container.fileHandle(forReadingAtPath: path) }
        if flags & SQLITE_OPEN_EXCLUSIVE != 0 || name == nil { return try container.createFile(atPath: path) }
        guard flags & SQLITE_OPEN_CREATE != 0 else { return try container.fileHandle(forUpdatingAtPath: path) }
        do {
            return try container.fileHandle(forUpdatingAtPath: path)
        } catch let error as CocoaError where error.protectedStoreError?.kind == .notFound {
            // New files take their folder's class, as any file created in the container does.
            return try container.createFile(atPath: path)
        }
    }
    do {
        let handle: ProtectedFileHandle
        do {
            handle = try openHandle()
        } catch let error as CocoaError where isJournal && error.code == .fileReadCorruptFile && name != nil {
            // A journal whose header was torn by a crash was never synced whole, and SQLite writes the database only
            // after syncing it: nothing in it is needed. An empty journal in its place is what SQLite sees after such a
            // crash on a plain file system (it then ignores and removes it).
            try container.removeItem(atPath: path)
            handle = try container.createFile(atPath: path)
        }
        let isMainDatabase = flags & SQLITE_OPEN_MAIN_DB != 0
        if isJournal, path.hasSuffix("-journal") { context.noteOpened(journal: handle, of: String(path.dropLast("-journal".count))) }
        let opened = OpenFile(handle: handle, path: path, deleteOnClose: flags & SQLITE_OPEN_DELETEONCLOSE != 0 || name == nil,
                              isJournal: isJournal, isMainDatabase: isMainDatabase, vfs: context)
        wrapper.pointee.handle = Unmanaged.passRetained(opened).toOpaque()
        wrapper.pointee.base.pMethods = UnsafePointer(ioMethods)
        outFlags?.pointee = flags
        return SQLITE_OK
    } catch {
        return context.fail(error, code: SQLITE_CANTOPEN)
    }
}

private let vfsDelete: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, Int32) -> Int32 = { vfs, name, _ in
    let context = ContainerVFS.from(vfs)
    do {
        // Removing makes the directory entry durable itself, so syncDir needs nothing more.
        let path = String(cString: name!)
        try context.container.removeItem(atPath: path)
        context.noteDeleted(path)
        return SQLITE_OK
    } catch let error as CocoaError where error.protectedStoreError?.kind == .notFound {
        return PS_SQLITE_IOERR_DELETE_NOENT
    } catch {
        return context.fail(error, code: PS_SQLITE_IOERR_DELETE)
    }
}

private let vfsAccess: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, Int32, UnsafeMutablePointer<Int32>?) -> Int32 = { vfs, name, flags, result in
    let context = ContainerVFS.from(vfs)
    do {
        // Listing needs no key: existence is answered even while locked, as the file system's would be. An empty
        // file does not count, as in SQLite's unix VFS: an empty journal is no journal.
        let item = try context.container.itemInfo(atPath: String(cString: name!))
        result?.pointee = flags == SQLITE_ACCESS_EXISTS && item.size == 0 ? 0 : 1
        return SQLITE_OK
    } catch let error as CocoaError where error.protectedStoreError?.kind == .notFound {
        result?.pointee = 0
        return SQLITE_OK
    } catch {
        return context.fail(error, code: PS_SQLITE_IOERR_ACCESS)
    }
}

private let vfsFullPathname: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, Int32, UnsafeMutablePointer<CChar>?) -> Int32 = { _, name, size, out in
    // Container paths are already absolute within the container.
    let length = strlen(name!)
    guard length < Int(size) else { return SQLITE_CANTOPEN }
    memcpy(out!, name!, length + 1)
    return SQLITE_OK
}

private let vfsGetLastError: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, Int32, UnsafeMutablePointer<CChar>?) -> Int32 = { vfs, size, out in
    guard let out, size > 0 else { return 0 }
    let message = Array(ContainerVFS.from(vfs).lastFailureDescription.utf8CString.prefix(Int(size) - 1)) + [0]
    message.withUnsafeBufferPointer { _ = memcpy(out, $0.baseAddress!, $0.count) }
    return 0
}

// MARK: I/O methods

/// The file methods, version 1: no shared memory (so no WAL) and no memory mapping, which would bypass encryption.
nonisolated(unsafe) private let ioMethods: UnsafeMutablePointer<sqlite3_io_methods> = {
    var methods = sqlite3_io_methods()
    methods.iVersion = 1
    methods.xClose = { file in
        let wrapper = UnsafeMutableRawPointer(file!).assumingMemoryBound(to: ps_sqlite_file.self)
        let opened = Unmanaged<OpenFile>.fromOpaque(wrapper.pointee.handle).takeRetainedValue()
        wrapper.pointee.handle = nil
        return opened.run(PS_SQLITE_IOERR_CLOSE) {
            if opened.deleteOnClose { opened.discardPending() } else { try opened.storePending() }
            try opened.handle.close()
            if opened.deleteOnClose { try opened.vfs.container.removeItem(atPath: opened.path) }
        }
    }
    methods.xRead = { file, buffer, amount, offset in
        let opened = OpenFile.from(file)
        var read = 0
        let status = opened.run(PS_SQLITE_IOERR_READ) {
            try opened.storePending()
            do {
                let data = try opened.handle.read(upToCount: Int(amount), atOffset: UInt64(offset))
                data.copyBytes(to: buffer!.assumingMemoryBound(to: UInt8.self), count: data.count)
                read = data.count
            } catch let error as CocoaError where error.code == .fileReadCorruptFile && opened.tornBlockReadsAsZeros() {
                // Torn by a power cut before SQLite synced it (see tornBlockReadsAsZeros): zeros, as a plain file
                // system could show; a journal's checksums then reject them, a database's journal rewrites them.
                let size = opened.handle.size
                read = opened.isJournal || offset >= size ? 0 : Int(min(UInt64(amount), size - UInt64(offset)))
                memset(buffer!, 0, read)
            }
        }
        guard status == SQLITE_OK else { return status }
        guard read == Int(amount) else {
            // SQLite requires the rest of a short read to be zeroed.
            memset(buffer! + read, 0, Int(amount) - read)
            return PS_SQLITE_IOERR_SHORT_READ
        }
        return SQLITE_OK
    }
    methods.xWrite = { file, buffer, amount, offset in
        let opened = OpenFile.from(file)
        return opened.run(PS_SQLITE_IOERR_WRITE) {
            try opened.write(UnsafeRawBufferPointer(start: buffer, count: Int(amount)), at: offset)
        }
    }
    methods.xTruncate = { file, size in
        let opened = OpenFile.from(file)
        return opened.run(PS_SQLITE_IOERR_TRUNCATE) {
            try opened.storePending()
            try opened.handle.truncate(atOffset: UInt64(size))
        }
    }
    methods.xSync = { file, _ in
        let opened = OpenFile.from(file)
        return opened.run(PS_SQLITE_IOERR_FSYNC) {
            try opened.storePending()
            try opened.handle.synchronize()
        }
    }
    methods.xFileSize = { file, size in
        let opened = OpenFile.from(file)
        return opened.run(PS_SQLITE_IOERR_FSTAT) {
            try opened.storePending()
            size?.pointee = sqlite3_int64(opened.handle.size)
        }
    }
    // One connection per database at a time (the store holds it): the lock levels need no bookkeeping.
    methods.xLock = { _, _ in SQLITE_OK }
    methods.xUnlock = { _, _ in SQLITE_OK }
    methods.xCheckReservedLock = { _, result in
        result?.pointee = 0
        return SQLITE_OK
    }
    methods.xFileControl = { _, _, _ in SQLITE_NOTFOUND }
    // A page of 4096 bytes is exactly one encrypted block, so a page write replaces whole blocks.
    methods.xSectorSize = { _ in Int32(EncryptedFile.defaultBlockSize) }
    methods.xDeviceCharacteristics = { _ in 0 }
    let pointer = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
    pointer.initialize(to: methods)
    return pointer
}()
