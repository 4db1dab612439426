import Foundation
import SystemPackage

/// Small POSIX helpers with errors that name the path; every durable write goes through `writeAtomically`.
enum FileSystem {
    /// Writes `bytes` so that a crash at any instant leaves either the old file or the new one:
    /// temporary file, fsync, rename (or link when `replacing` is false, so an existing file is never clobbered), fsync of the directory.
    static func writeAtomically(_ bytes: [UInt8], to path: String, replacing: Bool, permissions: FilePermissions = [.ownerReadWrite]) throws {
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = temporarySibling(of: path)
        let fd = try open(temporary, .writeOnly, options: [.create, .exclusiveCreate], permissions: permissions, doing: "create a temporary file")
        do {
            try fd.closeAfter {
                try bytes.withUnsafeBytes { buffer in
                    _ = try mappingErrno(path: temporary, doing: "write") { try fd.writeAll(toAbsoluteOffset: 0, buffer) }
                }
                try synchronize(fd, path: temporary)
            }
            if replacing {
                guard Foundation.rename(temporary, path) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "replace the file") }
            } else {
                guard Foundation.link(temporary, path) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "create the file") }
                unlink(temporary)
            }
        } catch {
            unlink(temporary)
            throw error
        }
        try synchronizeDirectory(directory)
    }

    static func open(_ path: String, _ mode: FileDescriptor.AccessMode, options: FileDescriptor.OpenOptions = [],
                     permissions: FilePermissions? = nil, doing action: String) throws -> FileDescriptor {
        do {
            return try FileDescriptor.open(FilePath(path), mode, options: options.union(.closeOnExec), permissions: permissions, retryOnInterrupt: true)
        } catch let errno as Errno {
            throw ProtectedStoreError.io(errno, path: path, doing: action)
        }
    }

    static func fileSize(_ fd: FileDescriptor, path: String) throws -> Int {
        var info = stat()
        guard fstat(fd.rawValue, &info) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "stat") }
        return Int(info.st_size)
    }

    static func synchronize(_ fd: FileDescriptor, path: String) throws {
        guard fsync(fd.rawValue) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "fsync") }
    }

    /// Makes a rename or unlink in `directory` durable.
    static func synchronizeDirectory(_ directory: String) throws {
        let fd = try open(directory, .readOnly, options: [.directory], doing: "open the directory")
        try fd.closeAfter { try synchronize(fd, path: directory) }
    }

    /// Whether anything is at `path`; any answer other than "no such file" (e.g. permission denied) is an error.
    static func exists(_ path: String) throws -> Bool {
        var info = stat()
        if lstat(path, &info) == 0 { return true }
        let errno = Errno(rawValue: Foundation.errno)
        if errno == .noSuchFileOrDirectory { return false }
        throw ProtectedStoreError.io(errno, path: path, doing: "look up")
    }

    /// A fresh hidden name beside `path`, for writing a file before renaming it into place.
    static func temporarySibling(of path: String) -> String {
        let directory = (path as NSString).deletingLastPathComponent
        return (directory as NSString).appendingPathComponent(".\((path as NSString).lastPathComponent).tmp-\(Random.bytes(6).hex)")
    }

    /// Creates `path` and missing parents with mode 0700.
    static func createDirectories(_ path: String) throws {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw ProtectedStoreError(.io, path: path, problem: "cannot create the directory (\(error.localizedDescription))",
                                      remedy: "Check the permissions of its parent directories")
        }
    }

    /// Runs `body`, turning a thrown `Errno` into an error that names `path`.
    static func mappingErrno<R>(path: String, doing action: String, _ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch let errno as Errno {
            throw ProtectedStoreError.io(errno, path: path, doing: action)
        }
    }
}

extension Collection<UInt8> {
    /// Lowercase hexadecimal, for ids in names and messages (never for secrets).
    var hex: String { map { String(format: "%02x", $0) }.joined() }
}

extension FileSystem {
    /// The first `count` bytes of a file (fewer if it is shorter).
    static func readPrefix(_ path: String, count: Int, what: String) throws -> [UInt8] {
        try FileLocation(path: path).readPrefix(count: count, what: what)
    }
}
