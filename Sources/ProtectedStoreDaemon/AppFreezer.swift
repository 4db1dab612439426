import Foundation

/// How a launched app is suspended and ended: its own cgroup in the unified (v2) hierarchy, frozen with
/// `cgroup.freeze` and ended with `cgroup.kill`, so no process of it runs, none sees a signal and no fork escapes
/// (docs/DESIGN.md, "The app lifecycle"). Where no v2 cgroup can be made, SIGSTOP and SIGKILL to the processes of
/// its PID namespace, named as such in `ps` and the log.
package final class AppFreezer: @unchecked Sendable {
    package enum Mechanism: String, Sendable {
        /// `cgroup.freeze` of the app's own cgroup.
        case cgroup
        /// SIGSTOP to each process found in the app's PID namespace: the app sees SIGCONT at resume, and a fork
        /// between two scans can escape.
        case signals = "sigstop"
    }

    /// Longest wait for the kernel to report the group frozen before a suspension is answered anyway.
    static let freezeConfirmation: Duration = .seconds(2)

    package let mechanism: Mechanism
    /// The app's cgroup folder, for the cgroup mechanism.
    package let cgroup: String?
    /// Why the cgroup mechanism is not used, for the signal one.
    package let fallbackReason: String?
    private let sandboxPID: pid_t

    private init(sandboxPID: pid_t, cgroup: String?, fallbackReason: String?) {
        self.sandboxPID = sandboxPID
        self.cgroup = cgroup
        self.mechanism = cgroup == nil ? .signals : .cgroup
        self.fallbackReason = fallbackReason
    }

    /// Moves the sandbox (its first process, before it starts the program, and any other process already in its PID
    /// namespace) into a new cgroup below this daemon's own; falls back to signals, with the reason, where that fails.
    /// `signalsOnly` takes the fallback at once (the benchmark's baseline).
    package static func make(bundle: String, sandboxPID: pid_t, signalsOnly: Bool = false) -> AppFreezer {
        if signalsOnly { return AppFreezer(sandboxPID: sandboxPID, cgroup: nil, fallbackReason: "asked for signals") }
        do {
            let folder = try createGroup(named: "sandboxctl-app-\(bundle)-\(sandboxPID)")
            do {
                for process in AppProcesses.inSandbox(of: sandboxPID) { try write("\(process)", to: folder + "/cgroup.procs") }
                // The group of a daemon that died while the app was suspended: registered means running.
                try write("0", to: folder + "/cgroup.freeze")
            } catch {
                rmdir(folder)
                throw error
            }
            return AppFreezer(sandboxPID: sandboxPID, cgroup: folder, fallbackReason: nil)
        } catch {
            return AppFreezer(sandboxPID: sandboxPID, cgroup: nil, fallbackReason: "\(error)")
        }
    }

    /// Stops every process of the app (the kernel then freezes each as it reaches a point where it can).
    package func freeze() {
        guard let cgroup else { return AppProcesses.signal(SIGSTOP, inSandboxOf: sandboxPID) }
        try? Self.write("1", to: cgroup + "/cgroup.freeze")
    }

    /// Returns once the kernel reports the group frozen, or after `freezeConfirmation` (a process in the middle of a
    /// request to the app's own mount freezes when it returns); at once for the signal mechanism.
    package func waitUntilFrozen() { waitForFreezer(frozen: true) }

    /// Returns once the kernel reports the group frozen (`frozen` true) or thawed, within `freezeConfirmation`.
    package func waitForFreezer(frozen: Bool) {
        guard let cgroup else { return }
        waitForEvents(of: cgroup, until: frozen ? "frozen 1" : "frozen 0")
    }

    /// Lets the app run again.
    package func thaw() {
        guard let cgroup else { return AppProcesses.signal(SIGCONT, inSandboxOf: sandboxPID) }
        try? Self.write("0", to: cgroup + "/cgroup.freeze")
    }

    /// Ends every process of the app at once, without notice and without thawing it first (as iOS ends a suspended
    /// app): SIGKILL, which a frozen or stopped process can't catch.
    package func kill() {
        if let cgroup, (try? Self.write("1", to: cgroup + "/cgroup.kill")) != nil { return }
        // Killing the namespace's first process kills every process in it; checked first, since the number may have
        // been reused (the sandbox gone, a process of this namespace under that pid).
        if !AppProcesses.inSandbox(of: sandboxPID).isEmpty { Glibc.kill(sandboxPID, SIGKILL) }
    }

    /// Removes the cgroup once its processes are gone (tried again for a few seconds while they exit).
    package func remove() {
        guard let cgroup else { return }
        DispatchQueue.global().async {
            for _ in 0..<100 {
                if rmdir(cgroup) == 0 || errno == ENOENT { return }
                usleep(50_000)
            }
        }
    }

    private func waitForEvents(of cgroup: String, until line: String) {
        // cgroup.events signals a change with POLLPRI; the loop re-reads, since a change may come between read and poll.
        let descriptor = open(cgroup + "/cgroup.events", O_RDONLY | O_CLOEXEC)
        defer { if descriptor >= 0 { close(descriptor) } }
        let deadline = ContinuousClock.now + Self.freezeConfirmation
        while !Self.events(of: cgroup).contains(where: { $0 == line }), ContinuousClock.now < deadline, descriptor >= 0 {
            var entry = pollfd(fd: descriptor, events: Int16(POLLPRI), revents: 0)
            _ = poll(&entry, 1, 50)
        }
    }

    private static func events(of cgroup: String) -> [Substring] {
        ((try? String(contentsOfFile: cgroup + "/cgroup.events", encoding: .utf8)) ?? "").split(separator: "\n")
    }

    /// A new group below this process's own in the unified hierarchy (core files only, no controller: a group with
    /// processes may have such children).
    private static func createGroup(named name: String) throws -> String {
        guard let mount = unifiedMount() else {
            throw FreezerError("no cgroup v2 (unified) hierarchy is mounted")
        }
        let own = ((try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)) ?? "").split(separator: "\n")
            .first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) } ?? "/"
        let parent = own == "/" ? mount : mount + own
        let folder = parent + "/" + name
        guard mkdir(folder, 0o755) == 0 || errno == EEXIST else {
            throw FreezerError("cannot create the cgroup \(folder) (\(String(cString: strerror(errno)))): run the daemon as root, or as a systemd unit with Delegate=yes")
        }
        guard access(folder + "/cgroup.freeze", W_OK) == 0, access(folder + "/cgroup.procs", W_OK) == 0 else {
            rmdir(folder)
            throw FreezerError("the cgroup \(folder) has no writable cgroup.freeze (kernel before 5.2?)")
        }
        return folder
    }

    private static func unifiedMount() -> String? {
        let table = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        for line in table.split(separator: "\n") {
            // "... mountpoint options - fstype source superoptions": the type follows the separator.
            let halves = line.components(separatedBy: " - ")
            guard halves.count == 2, halves[1].hasPrefix("cgroup2 ") else { continue }
            let fields = halves[0].split(separator: " ")
            if fields.count > 4 { return String(fields[4]) }
        }
        return nil
    }

    private static func write(_ text: String, to path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw FreezerError("cannot open \(path) (\(String(cString: strerror(errno))))") }
        defer { close(descriptor) }
        let written = text.withCString { Glibc.write(descriptor, $0, strlen($0)) }
        guard written >= 0 else { throw FreezerError("cannot write \(path) (\(String(cString: strerror(errno))))") }
    }

    private struct FreezerError: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}
