import Foundation
import Synchronization
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
}

/// Receives every durable operation while it is installed (the power-cut simulator's recorder).
package protocol DurableOperationRecorder: AnyObject, Sendable {
    func record(_ operation: DurableOperation)
}

/// The one layer through which the store changes durable state. Each call is the plain system call; while a recorder
/// is installed, each successful call is also reported to it, so a power-cut simulator can replay what the disk saw.
package enum DurableIO {
    private static let recorder = Mutex<(any DurableOperationRecorder)?>(nil)

    /// Installs `newRecorder` (nil removes it); returns the one it replaced.
    @discardableResult
    package static func install(_ newRecorder: (any DurableOperationRecorder)?) -> (any DurableOperationRecorder)? {
        recorder.withLock { current in
            let previous = current
            current = newRecorder
            return previous
        }
    }

    private static var activeRecorder: (any DurableOperationRecorder)? { recorder.withLock { $0 } }

    /// pwrite of all of `bytes` at `offset`.
    package static func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64, to descriptor: FileDescriptor, path: String) throws {
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

    /// fsync: a file's data and size, or a directory's names, survive a power cut once this returns.
    package static func synchronize(_ descriptor: FileDescriptor, path: String) throws {
        guard fsync(descriptor.rawValue) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "fsync") }
        if let recording = activeRecorder, let identity = identity(of: descriptor) { recording.record(.synchronize(identity)) }
    }

    /// Reports a name that `open(O_CREAT)` or `mkdir` made; `descriptor` is the new file (or directory).
    package static func recordCreation(of descriptor: FileDescriptor, named name: String, in directory: FileIdentity?, isDirectory: Bool) {
        guard let recording = activeRecorder, let directory, let identity = identity(of: descriptor) else { return }
        recording.record(.create(directory: directory, name: name, identity, isDirectory: isDirectory))
    }

    /// Reports a directory that `mkdir` made at `path`.
    package static func recordDirectoryCreation(atPath path: String) {
        guard let recording = activeRecorder, let created = identity(ofPath: path),
              let parent = identity(ofPath: (path as NSString).deletingLastPathComponent) else { return }
        recording.record(.create(directory: parent, name: (path as NSString).lastPathComponent, created, isDirectory: true))
    }

    /// Reports a directory that `mkdirat` made as `name` in `directory`.
    package static func recordDirectoryCreation(named name: String, in directory: FileDescriptor) {
        var info = stat()
        guard let recording = activeRecorder, let parent = identity(of: directory),
              fstatat(directory.rawValue, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else { return }
        recording.record(.create(directory: parent, name: name, FileIdentity(info), isDirectory: true))
    }

    /// Reports a rename that succeeded.
    package static func recordRename(from source: (FileIdentity?, String), to target: (FileIdentity?, String)) {
        guard let recording = activeRecorder, let fromDirectory = source.0, let toDirectory = target.0 else { return }
        recording.record(.rename(fromDirectory: fromDirectory, fromName: source.1, toDirectory: toDirectory, toName: target.1))
    }

    /// Reports an unlink that succeeded.
    package static func recordUnlink(of name: String, in directory: FileIdentity?) {
        guard let recording = activeRecorder, let directory else { return }
        recording.record(.unlink(directory: directory, name: name))
    }

    /// Whether a recorder is listening: callers skip the extra stat calls that identify directories when none is.
    package static var isRecording: Bool { activeRecorder != nil }

    package static func identity(of descriptor: FileDescriptor) -> FileIdentity? {
        var info = stat()
        return fstat(descriptor.rawValue, &info) == 0 ? FileIdentity(info) : nil
    }

    package static func identity(ofPath path: String) -> FileIdentity? {
        var info = stat()
        return fstatat(AT_FDCWD, path, &info, 0) == 0 ? FileIdentity(info) : nil
    }
}
