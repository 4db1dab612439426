import Foundation

/// The processes of a launched app: everything in the PID namespace whose first process is the sandbox's, found
/// through `/proc` (`ns/pid` names the namespace), so a signal reaches the app and its children and nothing else.
package enum AppProcesses {
    private static func namespace(of pid: pid_t) -> String? {
        try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/ns/pid")
    }

    private static func parent(of pid: pid_t) -> pid_t? {
        let status = String(decoding: FileHandle(forReadingAtPath: "/proc/\(pid)/status")?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
        return status.split(separator: "\n").first { $0.hasPrefix("PPid:") }.flatMap { pid_t($0.dropFirst(5).trimmingCharacters(in: .whitespaces)) }
    }

    /// Whether `pid` is in a PID namespace other than this process's, and descends from `launcher`.
    package static func isSandbox(_ pid: pid_t, startedBy launcher: pid_t) -> Bool {
        guard let namespace = namespace(of: pid), namespace != Self.namespace(of: getpid()) else { return false }
        var current = pid
        for _ in 0..<64 {
            guard let parent = parent(of: current), parent > 0 else { return false }
            if parent == launcher { return true }
            current = parent
        }
        return false
    }

    /// The sandbox's first process (from outside), then every other process in its PID namespace; nothing if that
    /// pid is now in this process's own namespace (it ended and the number was reused).
    package static func inSandbox(of sandboxPID: pid_t) -> [pid_t] {
        guard let namespace = namespace(of: sandboxPID), namespace != Self.namespace(of: getpid()) else { return [] }
        let others = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }.filter { pid in
            pid != sandboxPID && (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/ns/pid")) == namespace
        }
        return [sandboxPID] + others
    }

    /// Sends `signal` to every process of the sandbox, scanning again until a scan finds none it had not signalled
    /// (a process forked during a scan).
    package static func signal(_ signal: Int32, inSandboxOf sandboxPID: pid_t) {
        var signalled: Set<pid_t> = []
        for _ in 0..<8 {
            let found = Set(inSandbox(of: sandboxPID)).subtracting(signalled)
            if found.isEmpty { return }
            for process in found { kill(process, signal) }
            signalled.formUnion(found)
        }
    }
}
