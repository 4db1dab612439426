import CSupport
import Foundation
import SystemPackage

/// A file or directory as the kernel knows it: stable across renames, so a recording can follow a file whatever its name.
package struct FileIdentity: Hashable, Sendable, CustomStringConvertible {
    package let device: UInt64
    package let inode: UInt64

    package init(_ info: stat) {
        device = UInt64(info.st_dev)
        inode = UInt64(info.st_ino)
    }

    package var description: String { "\(device):\(inode)" }
}

/// One change to durable state, as a power cut can lose, keep or tear it.
package enum DurableOperation: Sendable {
    case write(FileIdentity, offset: Int64, bytes: [UInt8])
    case truncate(FileIdentity, size: Int64)
    /// fsync of a file (its data and size) or of a directory (the names in it).
    case synchronize(FileIdentity)
    case create(directory: FileIdentity, name: String, FileIdentity, isDirectory: Bool)
    case rename(fromDirectory: FileIdentity, fromName: String, toDirectory: FileIdentity, toName: String)
    case unlink(directory: FileIdentity, name: String)
    /// A second name for an existing file (a hard link).
    case link(directory: FileIdentity, name: String, FileIdentity)
}

/// Receives every durable operation while it is installed (the power-cut simulator's recorder).
package protocol DurableOperationRecorder: AnyObject, Sendable {
    func record(_ operation: DurableOperation)
}

/// The one layer through which the store changes durable state. Each call is the plain system call; while a recorder
/// is installed, each successful call is also reported to it, so a power-cut simulator can replay what the disk saw.
package enum DurableIO {
    private static let recorders = Locked<[any DurableOperationRecorder]>([])

    /// Reports every later durable operation to `recorder` until `remove(_:)`. Several may listen at once (each keeps
    /// what concerns its own folder), so tests recording different devices run side by side.
    package static func add(_ recorder: any DurableOperationRecorder) {
        recorders.withLock { $0.append(recorder) }
    }

    package static func remove(_ recorder: any DurableOperationRecorder) {
        recorders.withLock { $0.removeAll { $0 === recorder } }
    }

    /// The recorders listening now, as one; nil (and no work) when none is.
    private static var activeRecorder: Listeners? {
        let listening = recorders.withLock { $0 }
        return listening.isEmpty ? nil : Listeners(recorders: listening)
    }

    private struct Listeners {
        let recorders: [any DurableOperationRecorder]
        func record(_ operation: DurableOperation) { recorders.forEach { $0.record(operation) } }
    }

    /// pwrite of all of `bytes` at `offset`.
    package static func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64, to descriptor: FileDescriptor, path: String) throws {
        try FaultInjection.checkWrite(descriptor, count: Int64(bytes.count), path: path)
        _ = try FileSystem.mappingErrno(path: path, doing: "write") { try descriptor.writeAll(toAbsoluteOffset: offset, bytes) }
        if let recording = activeRecorder, let identity = identity(of: descriptor) {
            recording.record(.write(identity, offset: offset, bytes: Array(bytes)))
        }
    }

    /// ftruncate to `size` bytes.
    package static func truncate(_ descriptor: FileDescriptor, to size: Int64, path: String) throws {
        try FileSystem.mappingErrno(path: path, doing: "truncate") { try descriptor.resize(to: size, retryOnInterrupt: true) }
        if let recording = activeRecorder, let identity = identity(of: descriptor) { recording.record(.truncate(identity, size: size)) }
    }

    /// fsync: a directory's names (or all of a file, timestamps included) survive a power cut once this returns.
    package static func synchronize(_ descriptor: FileDescriptor, path: String) throws {
        try synchronize(descriptor, path: path, call: "fsync", fsync)
    }

    /// fdatasync: a file's bytes and size survive a power cut once this returns. Its timestamps may not, which spares
    /// the file system a journal commit when the writes changed neither the size nor the allocation (a page rewritten
    /// in place): the store's format needs only the bytes and the size.
    package static func synchronizeContents(_ descriptor: FileDescriptor, path: String) throws {
        try synchronize(descriptor, path: path, call: "fdatasync", fdatasync)
    }

    private static func synchronize(_ descriptor: FileDescriptor, path: String, call: String, _ sync: (Int32) -> Int32) throws {
        try FaultInjection.checkSynchronize(descriptor, path: path)
        guard sync(descriptor.rawValue) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: call) }
        if let recording = activeRecorder, let identity = identity(of: descriptor) { recording.record(.synchronize(identity)) }
    }

    /// Reports the file an exclusive `openat(O_CREAT | O_EXCL)` just made as `name` relative to `directory`.
    package static func recordCreation(of descriptor: FileDescriptor, named name: String, relativeTo directory: Int32) {
        guard let recording = activeRecorder, let (parent, leaf) = place(of: name, relativeTo: directory), let created = identity(of: descriptor) else { return }
        recording.record(.create(directory: parent, name: leaf, created, isDirectory: false))
    }

    /// mkdirat; reported when it succeeds. Returns 0, or -1 with errno set, as mkdirat does.
    package static func makeDirectory(_ name: String, relativeTo directory: Int32, mode: mode_t) -> Int32 {
        let result = mkdirat(directory, name, mode)
        var info = stat()
        if result == 0, let recording = activeRecorder, let (parent, leaf) = place(of: name, relativeTo: directory),
           fstatat(directory, name, &info, AT_SYMLINK_NOFOLLOW) == 0 {
            recording.record(.create(directory: parent, name: leaf, FileIdentity(info), isDirectory: true))
        }
        return result
    }

    /// unlinkat (`AT_REMOVEDIR` in `flags` for a directory); reported when it succeeds. Returns 0, or -1 with errno set.
    package static func unlink(_ name: String, relativeTo directory: Int32, flags: Int32 = 0) -> Int32 {
        let result = unlinkat(directory, name, flags)
        if result == 0, let recording = activeRecorder, let (parent, leaf) = place(of: name, relativeTo: directory) {
            recording.record(.unlink(directory: parent, name: leaf))
        }
        return result
    }

    /// renameat, or renameat2 with RENAME_NOREPLACE when `replacing` is false; reported when it succeeds. Returns 0,
    /// or -1 with errno set (EEXIST when the target exists and may not be replaced).
    package static func rename(_ name: String, relativeTo directory: Int32, to newName: String, relativeTo newDirectory: Int32, replacing: Bool) -> Int32 {
        let result = replacing ? renameat(directory, name, newDirectory, newName) : ps_rename_noreplace(directory, name, newDirectory, newName)
        if result == 0, let recording = activeRecorder, let (from, fromLeaf) = place(of: name, relativeTo: directory),
           let (to, toLeaf) = place(of: newName, relativeTo: newDirectory) {
            recording.record(.rename(fromDirectory: from, fromName: fromLeaf, toDirectory: to, toName: toLeaf))
        }
        return result
    }

    /// linkat (a hard link, the symlink itself if `name` is one); reported when it succeeds. Returns 0, or -1 with errno set.
    package static func link(_ name: String, relativeTo directory: Int32, to newName: String, relativeTo newDirectory: Int32) -> Int32 {
        let result = linkat(directory, name, newDirectory, newName, 0)
        var info = stat()
        if result == 0, let recording = activeRecorder, let (parent, leaf) = place(of: newName, relativeTo: newDirectory),
           fstatat(newDirectory, newName, &info, AT_SYMLINK_NOFOLLOW) == 0 {
            recording.record(.link(directory: parent, name: leaf, FileIdentity(info)))
        }
        return result
    }

    /// mknodat of a FIFO or a socket. Not reported: such a name holds no data, so a power-cut state has nothing to
    /// rebuild for it. Returns 0, or -1 with errno set.
    package static func makeSpecialFile(_ name: String, relativeTo directory: Int32, mode: mode_t) -> Int32 {
        mknodat(directory, name, mode, 0)
    }

    /// The directory holding `name` and the name within it: `name` may be a whole path when `directory` is AT_FDCWD.
    private static func place(of name: String, relativeTo directory: Int32) -> (FileIdentity, String)? {
        guard directory == AT_FDCWD else { return identity(of: FileDescriptor(rawValue: directory)).map { ($0, name) } }
        let parent = (name as NSString).deletingLastPathComponent
        return identity(ofPath: parent.isEmpty ? "." : parent).map { ($0, (name as NSString).lastPathComponent) }
    }

    package static func identity(of descriptor: FileDescriptor) -> FileIdentity? {
        var info = stat()
        return fstat(descriptor.rawValue, &info) == 0 ? FileIdentity(info) : nil
    }

    package static func identity(ofPath path: String) -> FileIdentity? {
        var info = stat()
        return fstatat(AT_FDCWD, path, &info, 0) == 0 ? FileIdentity(info) : nil
    }
}
