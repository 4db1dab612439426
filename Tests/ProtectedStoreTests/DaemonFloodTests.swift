import Foundation
@testable import ProtectedStore
import Testing
import SuiteThreads

/// The owner's `lock`, `unlock` and `status` against a program of the same uid flooding the daemon's socket with
/// connections (`ps-verify flood`): silent, idle or subscribed, at the rate this machine allows (docs/PROTOCOL.md §1).
@Suite("daemon floods", .ownThread) struct DaemonFloodTests {
    /// The daemon as it ships when `make test` built it: a flood measures the daemon's speed, which a debug build's halves.
    static var daemonExecutable: URL { DaemonProcess.releaseExecutable ?? SpawnedProcess.builtExecutable("sandboxctl") }

    /// `ps-verify flood` on `socket`, running until `stop`.
    final class Flood {
        let spawned: SpawnedProcess

        init(_ socket: String, mode: String, open: Int, total: Int = 1_000_000, threads: Int = 2) throws {
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

    /// The slowest of the owner's commands (starting `sandboxctl` included), and the slowest answer to a new
    /// connection's hello, subscribe and status, measured here without starting a process.
    struct Slowest: CustomStringConvertible {
        var command = 0.0, answer = 0.0
        var description: String { String(format: "the slowest command %.2f s, the slowest answer to a new connection %.3f s", command, answer) }
    }

    /// Rounds of unlock, lock and status as the owner types them, each of which must succeed (exit 0), and of a new
    /// connection asking for the status.
    static func ownerGetsThrough(_ test: TestDevice, rounds: Int, timeout: TimeInterval = 20) throws -> Slowest {
        var slowest = Slowest()
        for _ in 0..<rounds {
            for (arguments, stdin) in [(["unlock", "--passcode-stdin"], TestDevice.passcode as String?), (["lock"], nil), (["status"], nil)] {
                let start = Date()
                #expect(try DaemonResilienceTests.sandboxctl(test, arguments, stdin: stdin, timeout: timeout) == 0, "\(arguments[0]) did not get through")
                slowest.command = max(slowest.command, Date().timeIntervalSince(start))
            }
            let start = Date()
            let device = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
            #expect(try device.daemonStatus() != nil)
            slowest.answer = max(slowest.answer, Date().timeIntervalSince(start))
            device.powerOff()
        }
        return slowest
    }

    @Test("lock, unlock and status get through a flood of connections that say hello and nothing more, and of ones that send nothing", arguments: ["idle", "silent"])
    func idleAndSilentFloods(mode: String) throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0, executable: Self.daemonExecutable)
        let flood = try Flood(DaemonInfo.defaultSocketPath(root: test.root), mode: mode, open: 4000)
        // The flood is under way before the owner starts: some thousands of connections.
        #expect(eventually(timeout: 30) { (try? daemonConnections(daemon.pid)) ?? 0 >= 500 })
        let slowest = try Self.ownerGetsThrough(test, rounds: 3)
        let report = try flood.stop()
        print("daemon floods: \(mode): \(report.connections) connections at \(Int(report.perSecond)) a second (\(report.failed) connects failed); 9 owner commands and 3 new connections, \(slowest)")
        #expect(report.connections >= 1000, "the flood made only \(report.connections) connections: it tested nothing")
        #expect(kill(daemon.pid, 0) == 0)
    }

    @Test("2,000 subscribers on a daemon started with 1,024 descriptors: it raises its limit, takes them all, and the owner still gets through",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit"), "needs prlimit (util-linux)"))
    func twoThousandSubscribers() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0, executable: Self.daemonExecutable, descriptorLimit: "1024:8192")
        let flood = try Flood(DaemonInfo.defaultSocketPath(root: test.root), mode: "subscribed", open: 2000, total: 2000)
        #expect(eventually(timeout: 60) { (try? Device.attach(root: test.root).daemonStatus()?.subscribers) ?? 0 >= 2001 })
        let slowest = try Self.ownerGetsThrough(test, rounds: 3)
        let report = try flood.stop()
        print("daemon floods: \(report.connections) subscribers held (daemon started at 1,024 descriptors); 9 owner commands and 3 new connections, \(slowest)")
        #expect(report.connections == 2000)
        #expect(kill(daemon.pid, 0) == 0)
    }

    @Test("subscribers beyond what the descriptors allow are refused with busy, their connections still serve requests, and the owner gets through",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit"), "needs prlimit (util-linux)"))
    func subscribersBeyondTheLimit() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        // 400 descriptors, soft and hard: at most 200 subscribers.
        let daemon = try DaemonProcess(test, grace: 0, executable: Self.daemonExecutable, descriptorLimit: "400")
        let flood = try Flood(DaemonInfo.defaultSocketPath(root: test.root), mode: "subscribed", open: 1000, total: 1000)
        #expect(eventually(timeout: 60) { (try? Device.attach(root: test.root).daemonStatus()?.subscribers) ?? 0 >= 200 })
        let slowest = try Self.ownerGetsThrough(test, rounds: 3)
        // A client past the limit is told so and still works, unsubscribed.
        let late = try Device.attach(root: test.root)
        #expect(try late.daemonStatus()?.subscribers ?? 0 <= 201)
        let report = try flood.stop()
        print("daemon floods: \(report.connections) subscribing connections against 400 descriptors; 9 owner commands and 3 new connections, \(slowest)")
        #expect(kill(daemon.pid, 0) == 0)
    }
}

/// The daemon's open connections: its socket descriptors, from /proc.
func daemonConnections(_ pid: Int32) throws -> Int {
    try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)"))?.hasPrefix("socket:") == true
    }
}

@Suite("parallel guesses", .ownThread) struct ParallelGuessTests {
    @Test("64 wrong passcodes in parallel, then the right one: 5 are evaluated, the rest throttled, and the owner is unlocked at the first try after the throttle's wait")
    func parallelGuessesNeverStallTheOwner() throws {
        // 4 free attempts, then 2 s: the fifth wrong guess starts the wait.
        let test = try TestDevice(policy: PasscodePolicy(freeAttempts: 4, delays: [2]))
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0, executable: DaemonFloodTests.daemonExecutable)
        let guessers = try (0..<64).map { _ in try Device.attach(root: test.root, notificationCenter: NotificationCenter()) }
        let owner = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        defer { (guessers + [owner]).forEach { $0.powerOff() } }
        let answered = DispatchGroup()
        let verdicts = Verdicts()
        // The guesses must not take a thread each in the daemon: that is how they once starved the check holding the lock.
        let threadsBefore = Self.threads(of: daemon.pid)
        let sampling = ThreadSampler(pid: daemon.pid)
        for guesser in guessers {
            answered.enter()
            Thread {
                defer { answered.leave() }
                let verdict: String
                do {
                    try guesser.unlock(passcode: try Passcode("wrong"))
                    verdict = "unlocked"
                } catch let error as ProtectedStoreError {
                    verdict = "\(error.kind)"
                } catch {
                    verdict = "\(error)"
                }
                verdicts.add(verdict)
            }.start()
        }
        // The owner's, while the guesses are in flight: throttled once (the wait it names), then unlocked.
        let start = Date()
        var tries = 0, waited = 0.0
        while tries < 3 {
            tries += 1
            do {
                try owner.unlock(passcode: try Passcode(TestDevice.passcode))
                break
            } catch let error as ProtectedStoreError where error.kind == .throttled {
                let seconds = Double(error.problem.split(separator: " ").reversed().dropFirst().first.map(String.init) ?? "") ?? 1
                waited += seconds
                Thread.sleep(forTimeInterval: seconds)
            }
        }
        let elapsed = Date().timeIntervalSince(start)
        #expect(answered.wait(timeout: .now() + 60) == .success, "the guesses were not all answered")
        let threadsAtMost = sampling.stop()
        #expect(threadsAtMost - threadsBefore <= 8, "the daemon went from \(threadsBefore) threads to \(threadsAtMost) for the guesses")
        #expect(owner.state == .unlocked && tries <= 2, "the owner took \(tries) tries")
        let counts = verdicts.counts
        #expect(counts == ["wrongPasscode": 5, "throttled": 59], "\(counts)")
        print("parallel guesses: 64 wrong passcodes (\(counts)); the owner unlocked after \(String(format: "%.2f", elapsed)) s, \(String(format: "%.2f", waited)) s of it the throttle's wait, in \(tries) tries; the daemon's threads \(threadsBefore) → at most \(threadsAtMost)")
        #expect(kill(daemon.pid, 0) == 0)
    }

    static func threads(of pid: Int32) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        return status.split(separator: "\n").first { $0.hasPrefix("Threads:") }.flatMap { Int($0.dropFirst(8).trimmingCharacters(in: .whitespaces)) } ?? 0
    }
}

/// The most threads a process had, sampled until `stop`.
private final class ThreadSampler: @unchecked Sendable {
    private let mutex = NSLock()
    private var most = 0
    private var running = true
    private let finished = DispatchSemaphore(value: 0)

    init(pid: Int32) {
        Thread { [self] in
            while mutex.withLock({ running }) {
                let count = ParallelGuessTests.threads(of: pid)
                mutex.withLock { most = max(most, count) }
                usleep(5_000)
            }
            finished.signal()
        }.start()
    }

    func stop() -> Int {
        mutex.withLock { running = false }
        finished.wait()
        return mutex.withLock { most }
    }
}

/// The guesses' outcomes, from their threads.
private final class Verdicts: @unchecked Sendable {
    private let mutex = NSLock()
    private var all: [String] = []

    func add(_ verdict: String) { mutex.withLock { all.append(verdict) } }
    var counts: [String: Int] { mutex.withLock { Dictionary(all.map { ($0, 1) }, uniquingKeysWith: +) } }
}
