import Foundation
import ProtectedStoreCore
import SystemPackage

/// What a running daemon records in its root, so clients find its socket (`daemon.json`); written by the daemon,
/// read by every client, so it lives with the protocol rather than with either side.
package struct DaemonInfo: Codable, Sendable {
    package var pid: Int32
    package var socketPath: String
    package var protocolVersion: Int

    package init(pid: Int32, socketPath: String, protocolVersion: Int) {
        self.pid = pid
        self.socketPath = socketPath
        self.protocolVersion = protocolVersion
    }

    /// The socket path used when none is given: inside the root, which only its owner can enter.
    package static func defaultSocketPath(root: String) -> String {
        (Device.absolute(root) as NSString).appendingPathComponent("daemon.sock")
    }

    package static func path(root: String) -> String { (root as NSString).appendingPathComponent("daemon.json") }

    package static func load(root: String) -> DaemonInfo? {
        try? FileLocation(path: path(root: root)).readJSON(DaemonInfo.self, what: "daemon record")
    }

    /// The root's daemon lock (`daemon.lock`), taken without waiting: held, no daemon serves the device and none can
    /// start. A daemon holds it for its life; a migration for its own. Busy: `.alreadyExists`, naming the daemon and
    /// `remedy`. Returns the descriptor, whose closing lets go.
    package static func takeLock(root: String, remedy: String) throws -> Int32 {
        let path = (root as NSString).appendingPathComponent("daemon.lock")
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw ProtectedStoreError.io(Errno(rawValue: errno), path: path, doing: "open the daemon lock file") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let busy = errno == EWOULDBLOCK
            let error = Errno(rawValue: errno)
            close(fd)
            guard busy else { throw ProtectedStoreError.io(error, path: path, doing: "lock the daemon lock file") }
            let pid = load(root: root).map { " (pid \($0.pid), socket \($0.socketPath))" } ?? ""
            throw ProtectedStoreError(.alreadyExists, path: root, problem: "a key daemon already serves this device\(pid)", remedy: remedy)
        }
        return fd
    }
}
