import CSQLite
import CSupport
import Foundation
import ProtectedStoreCore
import SystemPackage

/// A SQLite VFS over plain files whose every change goes through `DurableIO`, so the power-cut simulator replays what
/// the database did and the testing kit's injected faults (a full disk, a failing fsync) reach it, as they reach the
/// store's own files. The keychain seals each row itself (docs/FORMAT.md §9), so the pages need no encryption here.
///
/// Locking is the caller's: the keychain holds an flock on a lock file beside the database for every transaction, so
/// one connection at a time, in any process, uses the database; the lock methods keep no state. Sleeping, randomness
/// and time stay the platform's.
final class DurableVFS: @unchecked Sendable {
    /// The name to pass to `sqlite3_open_v2`.
    let name: String
    private let vfs: UnsafeMutablePointer<sqlite3_vfs>
    private let cName: UnsafeMutablePointer<CChar>
    private let failure = Locked<(any Error)?>(nil)

    init() throws {
        guard let base = sqlite3_vfs_find(nil) else {
            throw ProtectedStoreError(.unsupportedFormat, problem: "SQLite has no default VFS to build on", remedy: "Use a SQLite build with the unix VFS")
        }
        name = "protectedstore-durable-\(UUID().uuidString)"
        cName = strdup(name)
        vfs = .allocate(capacity: 1)
        var methods = base.pointee
        methods.iVersion = 2
        methods.szOsFile = Int32(MemoryLayout<ps_sqlite_file>.size)
        methods.mxPathname = Int32(PATH_MAX)
        methods.pNext = nil
        methods.zName = UnsafePointer(cName)
        methods.xOpen = durableOpen
        methods.xDelete = durableDelete
        methods.xAccess = durableAccess
        methods.xFullPathname = durableFullPathname
        methods.xGetLastError = durableGetLastError
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
    func takeLastFailure() -> (any Error)? { failure.withLock { $0.take() } }

    fileprivate func fail(_ error: any Error, code: Int32) -> Int32 {
        failure.withLock { $0 = error }
        return code
    }

    fileprivate var lastFailureDescription: String { failure.withLock { $0.map { "\($0)" } ?? "" } }

    fileprivate static func from(_ vfs: UnsafeMutablePointer<sqlite3_vfs>?) -> DurableVFS {
        Unmanaged<DurableVFS>.fromOpaque(vfs!.pointee.pAppData).takeUnretainedValue()
    }
}

/// One file SQLite opened.
private final class DurableFile {
    let descriptor: FileDescriptor
    let path: String
    let vfs: DurableVFS
    /// Made by this open: its name is durable only once its folder is synced, which the first sync does (as SQLite's
    /// unix VFS does for a new journal).
    var folderNeedsSync: Bool

    init(descriptor: FileDescriptor, path: String, created: Bool, vfs: DurableVFS) {
        self.descriptor = descriptor
        self.path = path
        folderNeedsSync = created
        self.vfs = vfs
    }

    static func from(_ file: UnsafeMutablePointer<sqlite3_file>?) -> DurableFile {
        let wrapper = UnsafeMutableRawPointer(file!).assumingMemoryBound(to: ps_sqlite_file.self)
        return Unmanaged<DurableFile>.fromOpaque(wrapper.pointee.handle).takeUnretainedValue()
    }

    /// Runs an I/O method, turning a thrown error into `code` and remembering it for the keychain's message.
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

private let durableOpen: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, UnsafeMutablePointer<sqlite3_file>?, Int32, UnsafeMutablePointer<Int32>?) -> Int32 = { vfs, name, file, flags, outFlags in
    let context = DurableVFS.from(vfs)
    let wrapper = UnsafeMutableRawPointer(file!).assumingMemoryBound(to: ps_sqlite_file.self)
    wrapper.pointee.base.pMethods = nil
    // The keychain keeps SQLite's temporary files in memory (temp_store = MEMORY); a named file is all it opens.
    guard let name else { return context.fail(ProtectedStoreError(.invalidArgument, problem: "the keychain's SQLite asked for a temporary file", remedy: "Keep temp_store = MEMORY"), code: SQLITE_CANTOPEN) }
    let path = String(cString: name)
    var created = false
    var descriptor = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
    if descriptor < 0, errno == ENOENT, flags & SQLITE_OPEN_CREATE != 0 {
        descriptor = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        created = descriptor >= 0
    }
    guard descriptor >= 0 else {
        return context.fail(ProtectedStoreError.io(Errno(rawValue: errno), path: path, doing: "open"), code: SQLITE_CANTOPEN)
    }
    if created { DurableIO.recordCreation(of: FileDescriptor(rawValue: descriptor), named: path, relativeTo: AT_FDCWD) }
    let opened = DurableFile(descriptor: FileDescriptor(rawValue: descriptor), path: path, created: created, vfs: context)
    wrapper.pointee.handle = Unmanaged.passRetained(opened).toOpaque()
    wrapper.pointee.base.pMethods = UnsafePointer(durableIOMethods)
    outFlags?.pointee = flags
    return SQLITE_OK
}

private let durableDelete: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, Int32) -> Int32 = { vfs, name, syncFolder in
    let context = DurableVFS.from(vfs)
    let path = String(cString: name!)
    guard DurableIO.unlink(path, relativeTo: AT_FDCWD) == 0 else {
        if errno == ENOENT { return PS_SQLITE_IOERR_DELETE_NOENT }
        return context.fail(ProtectedStoreError.io(Errno(rawValue: errno), path: path, doing: "remove"), code: PS_SQLITE_IOERR_DELETE)
    }
    guard syncFolder != 0 else { return SQLITE_OK }
    do {
        try FileSystem.synchronizeDirectory((path as NSString).deletingLastPathComponent)
        return SQLITE_OK
    } catch {
        return context.fail(error, code: PS_SQLITE_IOERR_DIR_FSYNC)
    }
}

private let durableAccess: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, Int32, UnsafeMutablePointer<Int32>?) -> Int32 = { _, name, flags, result in
    var info = stat()
    let found = stat(name!, &info) == 0
    // As SQLite's unix VFS: an empty regular file does not exist (an empty journal is no journal).
    result?.pointee = found && (flags != SQLITE_ACCESS_EXISTS || info.st_mode & S_IFMT != S_IFREG || info.st_size > 0) ? 1 : 0
    return SQLITE_OK
}

private let durableFullPathname: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, Int32, UnsafeMutablePointer<CChar>?) -> Int32 = { _, name, size, out in
    // The keychain opens its database by absolute path.
    let length = strlen(name!)
    guard name!.pointee == CChar(UInt8(ascii: "/")), length < Int(size) else { return SQLITE_CANTOPEN }
    memcpy(out!, name!, length + 1)
    return SQLITE_OK
}

private let durableGetLastError: @convention(c) (UnsafeMutablePointer<sqlite3_vfs>?, Int32, UnsafeMutablePointer<CChar>?) -> Int32 = { vfs, size, out in
    guard let out, size > 0 else { return 0 }
    let message = Array(DurableVFS.from(vfs).lastFailureDescription.utf8CString.prefix(Int(size) - 1)) + [0]
    message.withUnsafeBufferPointer { _ = memcpy(out, $0.baseAddress!, $0.count) }
    return 0
}

// MARK: I/O methods

/// Version 1: no shared memory (so no WAL), no memory mapping, so every change is a `DurableIO` call.
nonisolated(unsafe) private let durableIOMethods: UnsafeMutablePointer<sqlite3_io_methods> = {
    var methods = sqlite3_io_methods()
    methods.iVersion = 1
    methods.xClose = { file in
        let wrapper = UnsafeMutableRawPointer(file!).assumingMemoryBound(to: ps_sqlite_file.self)
        let opened = Unmanaged<DurableFile>.fromOpaque(wrapper.pointee.handle).takeRetainedValue()
        wrapper.pointee.handle = nil
        return opened.run(PS_SQLITE_IOERR_CLOSE) { try opened.descriptor.close() }
    }
    methods.xRead = { file, buffer, amount, offset in
        let opened = DurableFile.from(file)
        var read = 0
        let status = opened.run(PS_SQLITE_IOERR_READ) {
            try FaultInjection.checkRead(opened.descriptor, path: opened.path)
            read = try FileSystem.mappingErrno(path: opened.path, doing: "read") {
                try opened.descriptor.read(fromAbsoluteOffset: offset, into: UnsafeMutableRawBufferPointer(start: buffer, count: Int(amount)), retryOnInterrupt: true)
            }
            // pread may return less than asked before the end of the file only at the end; keep reading to be sure.
            while read < Int(amount) {
                let more = try FileSystem.mappingErrno(path: opened.path, doing: "read") {
                    try opened.descriptor.read(fromAbsoluteOffset: offset + Int64(read), into: UnsafeMutableRawBufferPointer(start: buffer! + read, count: Int(amount) - read), retryOnInterrupt: true)
                }
                if more == 0 { break }
                read += more
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
        let opened = DurableFile.from(file)
        return opened.run(PS_SQLITE_IOERR_WRITE) {
            try DurableIO.write(UnsafeRawBufferPointer(start: buffer, count: Int(amount)), at: offset, to: opened.descriptor, path: opened.path)
        }
    }
    methods.xTruncate = { file, size in
        let opened = DurableFile.from(file)
        return opened.run(PS_SQLITE_IOERR_TRUNCATE) { try DurableIO.truncate(opened.descriptor, to: size, path: opened.path) }
    }
    methods.xSync = { file, _ in
        let opened = DurableFile.from(file)
        return opened.run(PS_SQLITE_IOERR_FSYNC) {
            try DurableIO.synchronize(opened.descriptor, path: opened.path)
            if opened.folderNeedsSync {
                try FileSystem.synchronizeDirectory((opened.path as NSString).deletingLastPathComponent)
                opened.folderNeedsSync = false
            }
        }
    }
    methods.xFileSize = { file, size in
        let opened = DurableFile.from(file)
        return opened.run(PS_SQLITE_IOERR_FSTAT) { size?.pointee = sqlite3_int64(try FileSystem.fileSize(opened.descriptor, path: opened.path)) }
    }
    // The keychain's flock admits one connection at a time (see DurableVFS): the lock levels need no bookkeeping,
    // and a non-empty journal found under it is one a crash left.
    methods.xLock = { _, _ in SQLITE_OK }
    methods.xUnlock = { _, _ in SQLITE_OK }
    methods.xCheckReservedLock = { _, result in
        result?.pointee = 0
        return SQLITE_OK
    }
    methods.xFileControl = { _, _, _ in SQLITE_NOTFOUND }
    methods.xSectorSize = { _ in 4096 }
    methods.xDeviceCharacteristics = { _ in 0 }
    let pointer = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
    pointer.initialize(to: methods)
    return pointer
}()
