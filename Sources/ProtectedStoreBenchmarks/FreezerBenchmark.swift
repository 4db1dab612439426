import Foundation
import ProtectedStoreDaemon

/// Suspend and resume latency of a launched app's processes, the cgroup freezer beside SIGSTOP in the same run: apps of
/// 1 and of 100 processes, each in a PID namespace of its own (as bubblewrap makes one), through `AppFreezer` as the
/// daemon uses it. A suspension counts until the kernel reports the group frozen (cgroup) or every process stopped
/// (signals); a resume until the group is thawed or no process is stopped.
public struct FreezerBenchmark: Sendable {
    public struct Row: Sendable, Codable {
        public var processes: Int
        /// `cgroup` or `sigstop`.
        public var mechanism: String
        public var suspendMilliseconds: Double
        public var resumeMilliseconds: Double
    }

    public struct Result: Sendable, Codable {
        public var rounds: Int
        public var rows: [Row]
        /// Why the cgroup freezer could not be measured, if it could not.
        public var cgroupUnavailable: String?
    }

    public var rounds: Int
    public var processCounts: [Int]

    public init(rounds: Int, processCounts: [Int] = [1, 100]) {
        self.rounds = rounds
        self.processCounts = processCounts
    }

    public func run() throws -> Result {
        var rows: [Row] = []
        var unavailable: String?
        for count in processCounts {
            let app = try NamespacedProcesses(count: count)
            var groups: [String] = []
            defer {
                app.end()
                // Empty once its processes are gone (the kernel may take a moment to say so).
                for group in groups { for _ in 0..<250 where rmdir(group) != 0 && errno == EBUSY { usleep(20_000) } }
            }
            for signalsOnly in [false, true] {
                let freezer = AppFreezer.make(bundle: "freezer-bench", sandboxPID: app.firstPID, signalsOnly: signalsOnly)
                if let group = freezer.cgroup { groups.append(group) }
                if !signalsOnly, freezer.mechanism != .cgroup {
                    unavailable = freezer.fallbackReason
                    continue
                }
                var suspends: [Double] = [], resumes: [Double] = []
                for _ in 0..<rounds {
                    suspends.append(Self.milliseconds {
                        freezer.freeze()
                        if freezer.mechanism == .cgroup { freezer.waitForFreezer(frozen: true) } else { app.waitUntilStopped(true) }
                    })
                    resumes.append(Self.milliseconds {
                        freezer.thaw()
                        if freezer.mechanism == .cgroup { freezer.waitForFreezer(frozen: false) } else { app.waitUntilStopped(false) }
                    })
                }
                rows.append(Row(processes: count, mechanism: freezer.mechanism.rawValue, suspendMilliseconds: Self.median(suspends),
                                resumeMilliseconds: Self.median(resumes)))
            }
        }
        return Result(rounds: rounds, rows: rows, cgroupUnavailable: unavailable)
    }

    private static func milliseconds(_ work: () -> Void) -> Double {
        let start = ContinuousClock.now
        work()
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) * 1_000 + Double(elapsed.components.attoseconds) / 1e15
    }

    private static func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
}

/// `count` sleeping processes in a new PID namespace (unshare(1); with a user namespace when not root), ended with it.
private final class NamespacedProcesses {
    let unshare: Process
    let firstPID: pid_t

    init(count: Int) throws {
        unshare = Process()
        unshare.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        let script = "i=1; while [ $i -lt \(count) ]; do sleep 100000 & i=$((i+1)); done; exec sleep 100000"
        unshare.arguments = (geteuid() == 0 ? [] : ["--user", "--map-root-user"]) + ["--pid", "--fork", "--kill-child", "/bin/sh", "-c", script]
        // --kill-child's own complaint about the signal mask it inherits says nothing about the figures.
        unshare.standardError = FileHandle.nullDevice
        try unshare.run()
        // The namespace's first process is unshare's child.
        var first: pid_t?
        for _ in 0..<2_000 {
            let children = (try? String(contentsOfFile: "/proc/\(unshare.processIdentifier)/task/\(unshare.processIdentifier)/children", encoding: .utf8)) ?? ""
            if let pid = children.split(separator: " ").first.flatMap({ pid_t($0) }), AppProcesses.inSandbox(of: pid).count == count {
                first = pid
                break
            }
            usleep(5_000)
        }
        guard let first else {
            unshare.terminate()
            throw BenchmarkError("the \(count) processes in a PID namespace of their own did not start (unshare --pid --fork)")
        }
        firstPID = first
    }

    /// Waits until every process is stopped (`T`), or none is.
    func waitUntilStopped(_ stopped: Bool) {
        for _ in 0..<100_000 {
            let states = AppProcesses.inSandbox(of: firstPID).map { pid in
                ((try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? "").split(separator: ")").last?.dropFirst().first
            }
            if stopped ? states.allSatisfy({ $0 == "T" }) : !states.contains(where: { $0 == "T" }) { return }
        }
    }

    func end() {
        kill(firstPID, SIGKILL)
        unshare.waitUntilExit()
    }
}

private struct BenchmarkError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
