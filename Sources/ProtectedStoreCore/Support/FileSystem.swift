import Foundation
import SystemPackage

/// Small POSIX helpers with errors that name the path. Whole small files are written by `writeAtomically`; every
/// change to durable state goes through `DurableIO`.
package enum FileSystem {
    /// The name in a directory entry from `readdir`, read as the C string it is. The kernel's record can end before
    /// `dirent` does, so copying the whole 256-byte `d_name` field reads past it (found by AddressSanitizer).
    package static func name(of entry: UnsafePointer<dirent>) -> String {
        let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        return String(cString: (UnsafeRawPointer(entry) + offset).assumingMemoryBound(to: CChar.self))
    }

    /// Writes `bytes` so that a crash at any instant leaves either the old file or the new one: temporary file in
    /// the same directory, fsync, rename (with `replacing` false, one that refuses an existing file), fsync of the directory.
    package static func writeAtomically(_ bytes: [UInt8], to location: FileLocation, replacing: Bool, permissions: FilePermissions = [.ownerReadWrite]) throws {
        let temporary = location.temporarySibling()
        let fd = try temporary.open(.writeOnly, options: [.create, .exclusiveCreate], permissions: permissions, doing: "create a temporary file")
        do {
            try mappingErrno(path: location.displayPath, doing: "write") {
                try fd.closeAfter {
                    try bytes.withUnsafeBytes { try DurableIO.write($0, at: 0, to: fd, path: location.displayPath) }
                    try DurableIO.synchronize(fd, path: location.displayPath)
                }
            }
            try temporary.rename(to: location, replacing: replacing)
        } catch {
            temporary.unlink()
            throw error
        }
        try location.synchronizeDirectory()
    }

    /// Names starting with this are files being written, hidden from container listings.
    package static let temporaryPrefix = ".sandboxctl-tmp-"

    package static func fileSize(_ fd: FileDescriptor, path: String) throws -> Int {
        var info = stat()
        guard fstat(fd.rawValue, &info) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "stat") }
        return Int(info.st_size)
    }

    /// Makes a rename or unlink in `directory` durable.
    package static func synchronizeDirectory(_ directory: String) throws {
        let fd = try FileLocation(path: directory).open(.readOnly, options: [.directory], doing: "open the directory")
        try fd.closeAfter { try DurableIO.synchronize(fd, path: directory) }
    }

    /// Whether anything is at `path`; any answer other than "no such file" (e.g. permission denied) is an error.
    package static func exists(_ path: String) throws -> Bool {
        var info = stat()
        if lstat(path, &info) == 0 { return true }
        let errno = Errno(rawValue: Foundation.errno)
        if errno == .noSuchFileOrDirectory { return false }
        throw ProtectedStoreError.io(errno, path: path, doing: "look up")
    }

    /// `name` in the first absolute folder of PATH that has it as an executable. Relative folders are skipped: they
    /// would make the answer depend on the working directory, which is no place to find a program to trust.
    package static func executable(named name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").filter { $0.hasPrefix("/") }.map { "\($0)/\(name)" }.first { access($0, X_OK) == 0 }
    }

    /// Creates `path` and missing parents with mode 0700, each through `DurableIO`.
    package static func createDirectories(_ path: String) throws {
        var info = stat()
        if stat(path, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw ProtectedStoreError(.invalidArgument, path: path, problem: "cannot create the directory: a file is in the way",
                                          remedy: "Move the file away or choose another path")
            }
            return
        }
        let parent = (path as NSString).deletingLastPathComponent
        if !parent.isEmpty && parent != path { try createDirectories(parent) }
        // EEXIST: another process made it meanwhile.
        guard DurableIO.makeDirectory(path, relativeTo: AT_FDCWD, mode: 0o700) == 0 || Foundation.errno == EEXIST else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "create the directory")
        }
    }

    /// Runs `body`, turning a thrown `Errno` into an error that names `path`.
    package static func mappingErrno<R>(path: String, doing action: String, _ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch let errno as Errno {
            throw ProtectedStoreError.io(errno, path: path, doing: action)
        }
    }
}

extension Collection<UInt8> {
    /// Lowercase hexadecimal, for ids in names and messages (never for secrets).
    package var hex: String { map { String(format: "%02x", $0) }.joined() }
}
