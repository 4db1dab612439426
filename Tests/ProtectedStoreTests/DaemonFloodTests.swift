import Foundation
@testable import ProtectedStore
import Testing
import SuiteThreads

/// The owner's `lock`, `unlock` and `status` against a program of the same uid flooding the daemon's socket with
/// connections (`ps-verify flood`): silent, idle or subscribed, at the rate this machine allows (docs/PROTOCOL.md §1).
@Suite("daemon floods", .ownThread) struct DaemonFloodTests {
    /// `ps-verify flood` on `socket`, running until `stop`.
    final class Flood {
        let spawned: SpawnedProcess

        init(_ socket: String, mode: String, open: Int, total: Int = 1_000_000, threads: Int = 4) throws {
            spawned = try SpawnedProcess(SpawnedProcess.builtExecutable("ps-verify"),
                                         ["flood", "--socket", socket, "--mode", mode, "--open", "\(open)", "--total", "\(total)", "--threads", "\(threads)"])
        }

        /// Ends the flood; its report: connections made, connects that failed, and the rate.
        func stop() throws -> (connections: Int, failed: Int, perSecond: Double) {
            spawned.closeInput()
            let line = try #require(spawned.nextLine(timeout: 60), "the flood printed no report: \(spawned.standardError)")
            let report = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            return (report["connections"] as? Int ?? 0, report["failed"] as? Int ?? 0, report["perSecond"] as? Double ?? 0)
        }
    }

    /// Rounds of unlock, lock and status as the owner types them; each must succeed (exit 0). Returns the slowest one's
    /// seconds, for the figures.
    static func ownerGetsThrough(_ test: TestDevice, rounds: Int, timeout: TimeInterval = 20) throws -> Double {
        var slowest = 0.0
        for _ in 0..<rounds {
            for (arguments, stdin) in [(["unlock", "--passcode-stdin"], TestDevice.passcode as String?), (["lock"], nil), (["status"], nil)] {
                let start = Date()
                #expect(try DaemonResilienceTests.sandboxctl(test, arguments, stdin: stdin, timeout: timeout) == 0, "\(arguments[0]) did not get through")
                slowest = max(slowest, Date().timeIntervalSince(start))
            }
        }
        return slowest
    }

    @Test("lock, unlock and status get through a flood of connections that say hello and nothing more, and of ones that send nothing", arguments: ["idle", "silent"])
    func idleAndSilentFloods(mode: String) throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0)
        let flood = try Flood(DaemonInfo.defaultSocketPath(root: test.root), mode: mode, open: 4000)
        // The flood is under way before the owner starts: some thousands of connections.
        #expect(eventually(timeout: 30) { (try? daemonConnections(daemon.pid)) ?? 0 >= 500 })
        let slowest = try Self.ownerGetsThrough(test, rounds: 6)
        let report = try flood.stop()
        print("daemon floods: \(mode): \(report.connections) connections at \(Int(report.perSecond)) a second (\(report.failed) connects failed); 18 owner commands, the slowest \(String(format: "%.2f", slowest)) s")
        #expect(report.connections >= 1000, "the flood made only \(report.connections) connections: it tested nothing")
        #expect(kill(daemon.pid, 0) == 0)
    }

    @Test("2,000 subscribers on a daemon started with 1,024 descriptors: it raises its limit, takes them all, and the owner still gets through",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit"), "needs prlimit (util-linux)"))
    func twoThousandSubscribers() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0, descriptorLimit: "1024:8192")
        let flood = try Flood(DaemonInfo.defaultSocketPath(root: test.root), mode: "subscribed", open: 2000, total: 2000)
        #expect(eventually(timeout: 60) { (try? Device.attach(root: test.root).daemonStatus()?.subscribers) ?? 0 >= 2001 })
        let slowest = try Self.ownerGetsThrough(test, rounds: 6)
        let report = try flood.stop()
        print("daemon floods: \(report.connections) subscribers held (daemon started at 1,024 descriptors); 18 owner commands, the slowest \(String(format: "%.2f", slowest)) s")
        #expect(report.connections == 2000)
        #expect(kill(daemon.pid, 0) == 0)
    }

    @Test("subscribers beyond what the descriptors allow are refused with busy, their connections still serve requests, and the owner gets through",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit"), "needs prlimit (util-linux)"))
    func subscribersBeyondTheLimit() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        // 400 descriptors, soft and hard: at most 200 subscribers.
        let daemon = try DaemonProcess(test, grace: 0, descriptorLimit: "400")
        let flood = try Flood(DaemonInfo.defaultSocketPath(root: test.root), mode: "subscribed", open: 1000, total: 1000)
        #expect(eventually(timeout: 60) { (try? Device.attach(root: test.root).daemonStatus()?.subscribers) ?? 0 >= 200 })
        let slowest = try Self.ownerGetsThrough(test, rounds: 4)
        // A client past the limit is told so and still works, unsubscribed.
        let late = try Device.attach(root: test.root)
        #expect(try late.daemonStatus()?.subscribers ?? 0 <= 201)
        let report = try flood.stop()
        print("daemon floods: \(report.connections) subscribing connections against 400 descriptors; 12 owner commands, the slowest \(String(format: "%.2f", slowest)) s")
        #expect(kill(daemon.pid, 0) == 0)
    }
}

/// The daemon's open connections: its socket descriptors, from /proc.
func daemonConnections(_ pid: Int32) throws -> Int {
    try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)"))?.hasPrefix("socket:") == true
    }
}
