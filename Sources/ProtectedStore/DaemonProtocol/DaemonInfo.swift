import Foundation
import ProtectedStoreCore

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
}
