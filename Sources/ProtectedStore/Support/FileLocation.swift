import Foundation
import SystemPackage

/// A file named relative to an open directory (or the working directory), with the path errors should show.
///
/// Inside a container every lookup is relative to a directory descriptor and never follows a symlink in the
/// last component, so nothing can redirect a file operation out of the container.
struct FileLocation: Sendable {
    /// The directory `name` is relative to; nil for an ordinary path.
    let directory: FileDescriptor?
    let name: String
    /// What error messages call the file.
    let displayPath: String

    /// An ordinary path, resolved by the kernel (symlinks followed), as the standalone file API uses.
    init(path: String) {
        directory = nil
        name = path
        displayPath = path
    }

    /// `name` inside `directory`; a symlink in that place is refused rather than followed.
    init(directory: FileDescriptor, name: String, displayPath: String) {
        self.directory = directory
        self.name = name
        self.displayPath = displayPath
    }

    private var directoryDescriptor: Int32 { directory?.rawValue ?? AT_FDCWD }
    private var noFollow: Int32 { directory == nil ? 0 : O_NOFOLLOW }

    func open(_ mode: FileDescriptor.AccessMode, options: FileDescriptor.OpenOptions = [], permissions: FilePermissions? = nil,
              doing action: String) throws -> FileDescriptor {
        let flags = mode.rawValue | options.rawValue | O_CLOEXEC | noFollow
        while true {
            let fd = openat(directoryDescriptor, name, flags, permissions?.rawValue ?? 0)
            if fd >= 0 { return FileDescriptor(rawValue: fd) }
            if Foundation.errno != EINTR { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: action) }
        }
    }

    /// Opens an existing regular file; a directory, device or socket gets a clear error instead of a confusing read failure.
    func openRegularFile(_ mode: FileDescriptor.AccessMode, doing action: String) throws -> FileDescriptor {
        // Non-blocking so a FIFO planted in place of a file can't hang the open.
        let fd = try open(mode, options: [.nonBlocking], doing: action)
        var info = stat()
        guard fstat(fd.rawValue, &info) == 0 else {
            let errno = Errno(rawValue: Foundation.errno)
            try? fd.close()
            throw ProtectedStoreError.io(errno, path: displayPath, doing: "stat")
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            try? fd.close()
            let what = info.st_mode & S_IFMT == S_IFDIR ? "a directory" : "not a regular file"
            throw ProtectedStoreError(.invalidArgument, path: displayPath, problem: "it is \(what)", remedy: "Give the path of a file")
        }
        return fd
    }

    func unlink() { unlinkat(directoryDescriptor, name, 0) }

    /// lstat (symlinks not followed); nil if nothing is there.
    func status() throws -> stat? {
        var info = stat()
        if fstatat(directoryDescriptor, name, &info, AT_SYMLINK_NOFOLLOW) == 0 { return info }
        if Foundation.errno == ENOENT { return nil }
        throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "look up")
    }

    /// The first `count` bytes of the file (fewer if it is shorter).
    func readPrefix(count: Int, what: String) throws -> [UInt8] {
        let fd = try openRegularFile(.readOnly, doing: "open the \(what)")
        return try fd.closeAfter {
            var bytes = [UInt8](repeating: 0, count: count)
            let read = try bytes.withUnsafeMutableBytes { buffer in
                try FileSystem.mappingErrno(path: displayPath, doing: "read the \(what)") { try fd.read(fromAbsoluteOffset: 0, into: buffer) }
            }
            return Array(bytes[0..<read])
        }
    }
}
