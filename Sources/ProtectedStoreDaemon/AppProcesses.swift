import Foundation

/// The processes of a launched app: everything in the PID namespace whose first process is the sandbox's, found
/// through `/proc` (`ns/pid` names the namespace), so a signal reaches the app and its children and nothing else.
package enum AppProcesses {
    /// The sandbox's first process (from outside), then every other process in its PID namespace.
    package static func inSandbox(of sandboxPID: pid_t) -> [pid_t] {
        guard let namespace = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(sandboxPID)/ns/pid") else { return [] }
        let others = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }.filter { pid in
            pid != sandboxPID && (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/ns/pid")) == namespace
        }
        return [sandboxPID] + others
    }

    /// Sends `signal` to every process of the sandbox.
    package static func signal(_ signal: Int32, inSandboxOf sandboxPID: pid_t) {
        for process in inSandbox(of: sandboxPID) { kill(process, signal) }
    }
}
