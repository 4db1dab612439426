import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Checks a mount point before mounting, so a stale, busy or unsuitable one gets a clear error instead of libfuse's.
package enum MountPoint {
    /// The mount point as an given path, once it is an empty directory with nothing mounted on it, outside the device root.
    package static func check(_ path: String, deviceRoot: String) throws -> String {
        let given = URL(fileURLWithPath: path).standardizedFileURL.path
        var info = stat()
        if stat(given, &info) != 0 {
            let errno = Errno(rawValue: Foundation.errno)
            switch errno {
            case .socketNotConnected:
                throw ProtectedStoreError(.io, path: given, problem: "a FUSE file system whose program has stopped is still mounted there (stale mount)",
                                          remedy: "Unmount it with `fusermount3 -u \(given)` and mount again", errno: errno)
            case .noSuchFileOrDirectory:
                throw ProtectedStoreError(.notFound, path: given, problem: "the mount point does not exist", remedy: "Create an empty directory there (mkdir -p \(given))")
            default:
                throw ProtectedStoreError.io(errno, path: given, doing: "look up the mount point")
            }
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw ProtectedStoreError(.invalidArgument, path: given, problem: "the mount point is not a directory", remedy: "Give an empty directory")
        }
        // The mount table names real paths: a mount point reached through a symlink is checked (and mounted) as its target.
        let absolute = URL(fileURLWithPath: given).resolvingSymlinksInPath().path
        if let mounted = mountedFileSystem(at: absolute) {
            throw ProtectedStoreError(.io, path: absolute, problem: "\(mounted) is already mounted there (busy)",
                                      remedy: "Unmount it first (`fusermount3 -u \(absolute)`, or `umount` for other file systems), or choose another directory",
                                      errno: .resourceBusy)
        }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: absolute)) ?? []
        guard entries.isEmpty else {
            throw ProtectedStoreError(.invalidArgument, path: absolute, problem: "the mount point is not empty (\(entries.count) entries would be hidden)",
                                      remedy: "Choose an empty directory")
        }
        let realRoot = URL(fileURLWithPath: deviceRoot).resolvingSymlinksInPath().path
        guard absolute != realRoot, !absolute.hasPrefix(realRoot + "/") else {
            throw ProtectedStoreError(.invalidArgument, path: absolute, problem: "the mount point is inside the device root \(realRoot), whose files it would serve",
                                      remedy: "Choose a directory outside the device root")
        }
        return absolute
    }

    /// What /proc/self/mountinfo says is mounted at `path`, if anything ("fuse.sshfs", "tmpfs"…).
    static func mountedFileSystem(at path: String) -> String? { mountInfo(at: path)?.type }

    /// The device ("major:minor") of what is mounted at `path`, read without touching the mount itself.
    static func mountedDevice(at path: String) -> String? { mountInfo(at: path)?.device }

    private static func mountInfo(at path: String) -> (device: String, type: String)? {
        guard let table = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return nil }
        // The last entry wins: a later mount hides an earlier one on the same directory.
        var found: (device: String, type: String)?
        for line in table.split(separator: "\n") {
            // "id parent major:minor root mount-point options [optional…] - type source super-options"
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard fields.count > 4, unescape(fields[4]) == path, let separator = fields.firstIndex(of: "-"), separator + 1 < fields.count else { continue }
            found = (String(fields[2]), String(fields[separator + 1]))
        }
        return found
    }

    /// mountinfo writes space, tab, newline and backslash as three octal digits after a backslash.
    private static func unescape(_ field: Substring) -> String {
        var bytes: [UInt8] = []
        var utf8 = Array(field.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "\\"), utf8.count >= 3, let value = UInt8(String(decoding: utf8.prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(value)
                utf8 = utf8.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
