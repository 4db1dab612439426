import CSupport
import Foundation
import SystemPackage

/// A file named relative to an open directory (or the working directory), with the path errors should show.
///
/// Inside a container every lookup is relative to a directory descriptor and never follows a symlink in the
/// last component, so nothing can redirect a file operation out of the container.
package struct FileLocation: Sendable {
    /// The directory `name` is relative to; nil for an ordinary path.
    let directory: FileDescriptor?
    package let name: String
    /// What error messages call the file.
    package let displayPath: String

    /// An ordinary path, resolved by the kernel (symlinks followed), as the standalone file API uses.
    package init(path: String) {
        directory = nil
        name = path
        displayPath = path
    }

    /// `name` inside `directory`; a symlink in that place is refused rather than followed.
    package init(directory: FileDescriptor, name: String, displayPath: String) {
        self.directory = directory
        self.name = name
        self.displayPath = displayPath
    }

    private init(directory: FileDescriptor?, name: String, displayPath: String) {
        self.directory = directory
        self.name = name
        self.displayPath = displayPath
    }

    /// A fresh hidden name in the same directory, for writing a file before renaming it into place. Fixed-length,
    /// so it fits whatever the final name's length; errors still name the final file.
    package func temporarySibling() -> FileLocation {
        let temporaryName = "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)"
        guard directory == nil else { return FileLocation(directory: directory, name: temporaryName, displayPath: displayPath) }
        return FileLocation(directory: nil, name: (parentPath as NSString).appendingPathComponent(temporaryName), displayPath: displayPath)
    }

    /// The directory holding a plain path.
    private var parentPath: String {
        let parent = (name as NSString).deletingLastPathComponent
        return parent.isEmpty ? "." : parent
    }

    /// Renames this file to `target` in the same file system, replacing an existing one or refusing it (EEXIST).
    package func rename(to target: FileLocation, replacing: Bool) throws {
        guard DurableIO.rename(name, relativeTo: directoryDescriptor, to: target.name, relativeTo: target.directoryDescriptor, replacing: replacing) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: target.displayPath, doing: replacing ? "put the new file in place" : "create the file")
        }
    }

    /// Makes a rename or unlink of this name durable: fsync of the directory holding it.
    package func synchronizeDirectory() throws {
        if let directory {
            try DurableIO.synchronize(directory, path: displayPath)
        } else {
            try FileSystem.synchronizeDirectory(parentPath)
        }
    }

    /// Where the symbolic link at this location points.
    package func readLink() throws -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlinkat(directoryDescriptor, name, &buffer, buffer.count - 1)
        guard length >= 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "read the symbolic link") }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// A small JSON file (settings, counters, descriptions) decoded as `T`; nil if its contents don't decode.
    package func readJSON<T: Decodable>(_ type: T.Type, what: String, decoder: JSONDecoder = JSONDecoder()) throws -> T? {
        try? decoder.decode(type, from: Data(readPrefix(count: 64 * 1024, what: what)))
    }

    package var directoryDescriptor: Int32 { directory?.rawValue ?? AT_FDCWD }
    private var noFollow: Int32 { directory == nil ? 0 : O_NOFOLLOW }

    package func open(_ mode: FileDescriptor.AccessMode, options: FileDescriptor.OpenOptions = [], permissions: FilePermissions? = nil,
              doing action: String) throws -> FileDescriptor {
        let flags = mode.rawValue | options.rawValue | O_CLOEXEC | noFollow
        while true {
            let fd = openat(directoryDescriptor, name, flags, permissions?.rawValue ?? 0)
            if fd >= 0 {
                let descriptor = FileDescriptor(rawValue: fd)
                // Only an exclusive create is sure to have made a new file; a plain O_CREAT may have opened an old one.
                if options.contains(.exclusiveCreate) { DurableIO.recordCreation(of: descriptor, named: name, relativeTo: directoryDescriptor) }
                return descriptor
            }
            if Foundation.errno != EINTR { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: action) }
        }
    }

    /// Opens an existing regular file; a directory, device or socket gets a clear error instead of a confusing read failure.
    package func openRegularFile(_ mode: FileDescriptor.AccessMode, doing action: String) throws -> FileDescriptor {
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

    package func unlink() {
        _ = DurableIO.unlink(name, relativeTo: directoryDescriptor)
    }

    /// lstat (symlinks not followed); nil if nothing is there.
    package func status() throws -> stat? {
        var info = stat()
        if fstatat(directoryDescriptor, name, &info, AT_SYMLINK_NOFOLLOW) == 0 { return info }
        if Foundation.errno == ENOENT { return nil }
        throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "look up")
    }

    /// The first `count` bytes of the file (fewer if it is shorter).
    package func readPrefix(count: Int, what: String) throws -> [UInt8] {
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
