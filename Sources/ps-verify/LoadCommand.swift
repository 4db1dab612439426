import ArgumentParser
import Foundation
import ProtectedStore

/// The load test: client processes doing mixed operations through the key daemon while the device locks and unlocks
/// on a timer; afterwards every file must hold what its client last wrote, and every refusal must be data protection.
struct LoadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "load",
        abstract: "Client processes doing mixed operations through the daemon while the device locks and unlocks on a timer.",
        discussion: """
            Starts `sandboxctl daemon` (built beside this program) on a throwaway device, then CLIENTS processes, each doing \
            OPERATIONS random operations on its own files in all four classes: whole-file writes, reads checked against what \
            it wrote, appends through a handle, moves, deletes, listings and class changes. Meanwhile the device locks and \
            unlocks every TOGGLE milliseconds. The same clients first run once on a device that never locks, as the \
            baseline the throughput is compared with. Passes when no process crashes, every failure is a data-protection refusal, \
            no read returns wrong bytes, and after a last unlock every file holds exactly what its client last wrote.
            """)

    @Option(help: "Client processes.") var clients = 8
    @Option(help: "Operations per client.") var operations = 1000
    @Option(help: "Milliseconds between a lock and the next unlock, and back.") var toggleMs = 50
    @Option(help: "Seed of the clients' choices and contents (the interleaving with locks still varies).") var seed = UInt64.random(in: 1...UInt64.max)
    @Flag(help: "Print the results as JSON.") var json = false

    func validate() throws {
        guard clients >= 1, clients <= 64 else { throw ValidationError("--clients must be 1…64") }
        guard operations >= 1 else { throw ValidationError("--operations must be at least 1") }
        guard toggleMs >= 1 else { throw ValidationError("--toggle-ms must be at least 1") }
    }

    func run() async throws {
        signal(SIGPIPE, SIG_IGN)  // a client that dies early must not take the test with it
        let passcode = "load-passcode"
        let (scratch, device, container) = try ScratchDevice.create(label: "load", passcode: passcode)
        defer { scratch.remove() }
        for folder in 0..<2 * clients { try container.createDirectory(atPath: LoadClientCommand.folder(folder)) }
        device.powerOff()

        let daemon = try startDaemon(scratch)
        defer { daemon.kill(SIGTERM); daemon.wait() }
        let controller = try Device.attach(root: scratch.root, notificationCenter: NotificationCenter())
        try controller.unlock(passcode: try Passcode(passcode))

        // The same clients with the same seeds on an unlocked device first: the baseline the toggling run is compared with.
        let baseline = try await round(scratch: scratch, controller: controller, passcode: passcode, firstFolder: clients, toggling: false)
        let loaded = try await round(scratch: scratch, controller: controller, passcode: passcode, firstFolder: 0, toggling: true)
        var result = loaded
        result.baselineSeconds = baseline.seconds
        result.baselineOperationsPerSecond = baseline.operationsPerSecond
        result.violations += baseline.violations.map { "baseline: \($0)" }
        if !daemon.process.isRunning {
            result.violations.append("the daemon ended during the test (\(daemon.wait())): \((try? String(contentsOfFile: scratch.folder + "/daemon.log", encoding: .utf8)) ?? "no log")")
        }
        if baseline.refusals.values.reduce(0, +) > 0 { result.violations.append("baseline: refusals on an unlocked device: \(baseline.refusals)") }
        controller.powerOff()
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            emitLine(String(decoding: try encoder.encode(result), as: UTF8.self))
        } else {
            emitLine(result.text)
        }
        if !result.violations.isEmpty { throw ExitCode(1) }
    }

    /// One run of every client, on folders `firstFolder…`, with the device toggling or not; checks their files after.
    private func round(scratch: ScratchDevice, controller: Device, passcode: String, firstFolder: Int, toggling: Bool) async throws -> LoadResult {
        let started = Date()
        let children = try (0..<clients).map { client in
            try ChildProcess(arguments: ["load-client", "--root", scratch.root, "--client", String(firstFolder + client), "--operations", String(operations),
                                         "--seed", String(seed &+ UInt64(client))], firstLine: "")
        }
        let outcomes = ClientOutcomes(count: clients)
        let finished = DispatchGroup()
        for (index, child) in children.enumerated() {
            finished.enter()
            Thread.detachNewThread {
                let lines = child.remainingLines()
                outcomes.set(index, status: child.wait(), report: lines.last)
                finished.leave()
            }
        }
        var toggles = 0
        while toggling && finished.wait(timeout: .now()) == .timedOut {
            try await Task.sleep(nanoseconds: UInt64(toggleMs) * 1_000_000)
            if toggles % 2 == 0 { await controller.lock() } else { try controller.unlock(passcode: try Passcode(passcode)) }
            toggles += 1
        }
        finished.wait()
        let elapsed = Date().timeIntervalSince(started)
        try controller.unlock(passcode: try Passcode(passcode))

        var result = LoadResult(clients: clients, operationsPerClient: operations, toggleMilliseconds: toggleMs, seed: seed,
                                seconds: elapsed, lockCycles: toggles / 2, operationsPerSecond: Double(clients * operations) / elapsed)
        let checker = try controller.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
        for client in 0..<clients {
            let (status, line) = outcomes.get(client)
            guard status == "exit 0", let line, let report = try? JSONDecoder().decode(LoadClientReport.self, from: Data(line.utf8)) else {
                result.violations.append("client \(firstFolder + client) ended with \(status) and no report")
                continue
            }
            result.add(report)
            result.violations += report.violations.map { "client \(client): \($0)" }
            result.violations += verify(report, client: firstFolder + client, in: checker)
        }
        return result
    }

    private func startDaemon(_ scratch: ScratchDevice) throws -> ChildProcess {
        let sandboxctl = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent("sandboxctl")
        guard FileManager.default.isExecutableFile(atPath: sandboxctl.path) else {
            throw ValidationError("\(sandboxctl.path) is missing: build it first (`swift build --product sandboxctl`; `make verify` does)")
        }
        // Its log (a line per lock and unlock) goes to a file beside the device, shown if it fails to start or dies.
        let logPath = scratch.folder + "/daemon.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let daemon = try ChildProcess(executable: sandboxctl, arguments: ["daemon", "--root", scratch.root, "--device-secret", scratch.secretPath, "--grace", "0.02"],
                                      errors: FileHandle(forWritingAtPath: logPath))
        let deadline = Date().addingTimeInterval(20)
        while !Device.isDaemonRunning(root: scratch.root) {
            guard daemon.process.isRunning, Date() < deadline else {
                daemon.kill(SIGKILL)
                daemon.wait()
                throw ValidationError("the daemon did not start: \((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "no log")")
            }
            usleep(20_000)
        }
        return daemon
    }

    /// Every file the client believes it has holds exactly that, and it has no other file.
    private func verify(_ report: LoadClientReport, client: Int, in container: Container) -> [String] {
        var problems: [String] = []
        let folder = LoadClientCommand.folder(client)
        do {
            let present = Set(try container.contentsOfDirectory(atPath: folder).map(\.name))
            let expected = Set(report.files.keys)
            for name in present.subtracting(expected) { problems.append("client \(client): \(name) exists but its client deleted or moved it") }
            for name in expected.subtracting(present) { problems.append("client \(client): \(name) was lost") }
            for (name, segments) in report.files where present.contains(name) {
                if try container.contents(atPath: "\(folder)/\(name)") != LoadClientCommand.content(of: segments) {
                    problems.append("client \(client): \(name) does not hold what was last written (corrupt or lost write)")
                }
            }
        } catch {
            problems.append("client \(client): checking its files failed: \(error)")
        }
        return problems
    }
}

/// The clients' ends, filled by their reader threads.
final class ClientOutcomes: @unchecked Sendable {
    private let lock = NSLock()
    private var outcomes: [(String, String?)]
    init(count: Int) { outcomes = Array(repeating: ("not finished", nil), count: count) }
    func set(_ index: Int, status: String, report: String?) { lock.withLock { outcomes[index] = (status, report) } }
    func get(_ index: Int) -> (String, String?) { lock.withLock { outcomes[index] } }
}

/// The load test's figures.
struct LoadResult: Codable {
    var clients: Int
    var operationsPerClient: Int
    var toggleMilliseconds: Int
    var seed: UInt64
    var seconds: Double
    var lockCycles: Int
    var operationsPerSecond: Double
    /// The same operations with no lock at all, measured in the same run.
    var baselineSeconds = 0.0
    var baselineOperationsPerSecond = 0.0
    var succeeded = 0
    /// Refusals by operation and Cocoa code; every one must be a data-protection refusal.
    var refusals: [String: Int] = [:]
    var violations: [String] = []


    mutating func add(_ report: LoadClientReport) {
        succeeded += report.succeeded
        refusals.merge(report.refusals, uniquingKeysWith: +)
    }

    var text: String {
        let total = clients * operationsPerClient
        let refused = refusals.values.reduce(0, +)
        var lines = ["load: \(clients) clients × \(operationsPerClient) operations through the daemon, lock/unlock every \(toggleMilliseconds) ms (seed \(seed))",
                     String(format: "  %d operations in %.2f s: %.0f operations/s; %d lock/unlock cycles", total, seconds, operationsPerSecond, lockCycles),
                     String(format: "  baseline, never locked: %.2f s, %.0f operations/s (toggling/baseline throughput %.2f)",
                            baselineSeconds, baselineOperationsPerSecond, operationsPerSecond / max(baselineOperationsPerSecond, 1)),
                     "  succeeded \(succeeded), refused \(refused) (\(String(format: "%.1f", 100 * Double(refused) / Double(max(total, 1))))%)"]
        for (label, count) in refusals.sorted(by: { $0.key < $1.key }) { lines.append("    \(label): \(count)") }
        lines += violations.prefix(20).map { "  violation: \($0)" }
        lines.append(violations.isEmpty ? "load: no crash, no lost or corrupt write, every refusal a data-protection error" : "load: \(violations.count) violations")
        return lines.joined(separator: "\n")
    }
}
