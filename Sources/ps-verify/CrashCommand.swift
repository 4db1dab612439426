import ArgumentParser
import Foundation
import ProtectedStore
import ProtectedStoreTesting

/// The crash-consistency harness: for each kind, runs a worker process that performs operations back to back and
/// SIGKILLs it at a random instant, then checks that the device holds the old or the new version and nothing else.
struct CrashCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash",
        abstract: "SIGKILL a writer at random instants during each kind of operation and check what survives.",
        discussion: """
            Kinds: whole-file writes, overwrites, moves, class changes, passcode changes and Inbox deliveries. After every \
            kill: each file holds exactly its old or its new content, the keybag opens with the old or the new passcode, and \
            every delivered Inbox item has exactly one pending event. At the end, a receiver takes every Inbox event and each \
            item must arrive exactly once. Prints a tally; exits 1 on any violation.
            """)

    @Option(help: "Kills per kind (the issue's bar is 200).") var trials = 200
    @Flag(help: "Quick mode: 20 kills per kind.") var quick = false
    @Option(name: .customLong("kind"), help: "Only this kind (repeatable); default every kind.") var kinds: [CrashKind] = []
    @Option(help: "Longest wait, in milliseconds, between the worker's `ready` and the kill.") var maxDelayMs = 25
    @Option(help: "Seed of the kill instants (the worker's own timing still varies between runs).") var seed = UInt64.random(in: 1...UInt64.max)
    @Flag(help: "Print the tally as JSON.") var json = false

    func validate() throws {
        guard trials >= 1 else { throw ValidationError("--trials must be at least 1") }
        // Longer, and a fast kind could fill the worker's output pipe before the kill, which would then land between operations.
        guard maxDelayMs >= 0 && maxDelayMs <= 1000 else { throw ValidationError("--max-delay-ms must be 0…1000") }
    }

    func run() throws {
        signal(SIGPIPE, SIG_IGN)  // a worker that dies before reading its passcode must not take the harness with it
        let count = quick ? 20 : trials
        var random = SplitMix64(seed: seed)
        var tallies: [CrashTally] = []
        if !json { emitLine("crash consistency: \(count) SIGKILLs per kind, 0–\(maxDelayMs) ms after the worker is ready (seed \(seed))") }
        for kind in kinds.isEmpty ? CrashKind.allCases : kinds {
            let tally = try CrashRun(kind: kind, trials: count, maxDelayMicroseconds: maxDelayMs * 1000).run(random: &random)
            tallies.append(tally)
            if !json { emitLine(tally.line) }
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            emitLine(String(decoding: try encoder.encode(tallies), as: UTF8.self))
        } else {
            let violations = tallies.flatMap(\.violations)
            for violation in violations.prefix(20) { emitLine("  violation: \(violation)") }
            emitLine(violations.isEmpty ? "crash consistency: no violation in \(tallies.map(\.trials).reduce(0, +)) kills"
                                     : "crash consistency: \(violations.count) violations")
        }
        if tallies.contains(where: { !$0.violations.isEmpty }) { throw ExitCode(1) }
    }
}

/// What one kind's trials found.
struct CrashTally: Codable {
    var kind: String
    var trials = 0
    /// Operations completed across all trials before their kills.
    var completedOperations = 0
    /// Trials after which the device held the last acknowledged version / the one in flight.
    var foundOld = 0
    var foundNew = 0
    /// Temporary files the kills left behind (hidden, never read; nothing sweeps them yet).
    var temporariesLeft = 0
    /// Inbox only: open-URL events delivered at the end, and items that had to have one.
    var eventsDelivered: Int?
    var itemsDelivered: Int?
    var violations: [String] = []

    var line: String {
        let events = eventsDelivered.map { ", \($0) events for \(itemsDelivered ?? 0) items" } ?? ""
        return "  \(kind.padding(toLength: 11, withPad: " ", startingAt: 0)) \(trials) kills, \(completedOperations) ops done; "
            + "found old \(foundOld), new \(foundNew); temp files left \(temporariesLeft)\(events); "
            + "violations \(violations.count)"
    }
}

/// One kind's device and trials.
struct CrashRun {
    let kind: CrashKind
    let trials: Int
    let maxDelayMicroseconds: Int

    /// The version the device holds now, and the passcode's (it changes only in passcode trials).
    final class State { var version = 0; var passcodeVersion = 0 }

    func run(random: inout SplitMix64) throws -> CrashTally {
        let (scratch, device, container) = try ScratchDevice.create(label: kind.rawValue, passcode: CrashKind.passcode(version: 0))
        defer { scratch.remove() }
        try prepare(container)
        device.powerOff()
        var tally = CrashTally(kind: kind.rawValue)
        let state = State()
        /// Inbox items whose event the final receiver must deliver, and the in-flight ones that may also have one.
        var mustDeliver = Set<String>(), mayDeliver = Set<String>()
        for trial in 0..<trials {
            let locked = kind == .inbox && trial % 2 == 0
            let child = try ChildProcess(
                arguments: ["crash-worker", "--root", scratch.root, "--device-secret", scratch.secretPath, "--kind", kind.rawValue,
                            "--trial", String(trial), "--version", String(kind == .inbox ? 0 : state.version)] + (locked ? ["--locked"] : []),
                firstLine: CrashKind.passcode(version: state.passcodeVersion))
            guard child.nextLine() == "ready" else {
                child.kill()
                tally.violations.append("\(kind) trial \(trial): the worker did not start (\(child.wait()))")
                continue
            }
            usleep(useconds_t(Int.random(in: 0...maxDelayMicroseconds, using: &random)))
            child.kill()
            let status = child.wait()
            let done = child.remainingLines().compactMap { $0.hasPrefix("done ") ? Int($0.dropFirst(5)) : nil }
            if status != "signal \(SIGKILL)" {
                tally.violations.append("\(kind) trial \(trial): the worker ended by itself (\(status)) before the kill")
            }
            let start = kind == .inbox ? 0 : state.version
            let acknowledged = done.last ?? start
            tally.trials += 1
            tally.completedOperations += acknowledged - start
            do {
                let foundNew = try check(trial: trial, acknowledged: acknowledged, scratch: scratch, state: state,
                                         mustDeliver: &mustDeliver, mayDeliver: &mayDeliver)
                if foundNew { tally.foundNew += 1 } else { tally.foundOld += 1 }
            } catch let violation as Violation {
                tally.violations.append("\(kind) trial \(trial) (acknowledged \(acknowledged)): \(violation.message)")
                // Carry on from what is there, so one violation does not make every later trial fail.
                state.version = max(state.version, acknowledged)
            } catch {
                tally.violations.append("\(kind) trial \(trial) (acknowledged \(acknowledged)): \(error)")
            }
        }
        tally.temporariesLeft = temporaryFiles(under: scratch.root).count
        if kind == .inbox {
            let receiver = try scratch.open()
            defer { receiver.powerOff() }
            try receiver.unlock(passcode: try Passcode(CrashKind.passcode(version: state.passcodeVersion)))
            let container = try receiver.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
            tally.eventsDelivered = try deliverEvents(container, mustDeliver: mustDeliver, mayDeliver: mayDeliver, violations: &tally.violations)
            tally.itemsDelivered = mustDeliver.count
        }
        return tally
    }

    func prepare(_ container: Container) throws {
        switch kind {
        case .write: try container.createDirectory(atPath: CrashKind.writeFolder)
        case .overwrite: try container.write(CrashKind.overwriteContent(version: 0), toPath: CrashKind.overwritePath)
        case .move: try container.write(CrashKind.fixedContent, toPath: CrashKind.movePaths[0])
        case .protection: try container.write(CrashKind.fixedContent, toPath: CrashKind.protectionPath)
        case .passcode:
            for check in CrashKind.passcodeChecks { try container.write(CrashKind.fixedContent, toPath: check.path, options: check.option) }
        case .inbox: break
        }
    }

    struct Violation: Error { let message: String }

    /// Checks the device after trial `trial`'s kill; returns whether it holds the version in flight (else the acknowledged one).
    func check(trial: Int, acknowledged: Int, scratch: ScratchDevice, state: State,
                       mustDeliver: inout Set<String>, mayDeliver: inout Set<String>) throws -> Bool {
        let device = try scratch.open()
        defer { device.powerOff() }
        let inFlight = acknowledged + 1
        if kind == .passcode {
            // The old passcode first: a wrong guess counts as an attempt, and the right one resets the count.
            let candidates = [acknowledged, inFlight]
            guard let opened = candidates.first(where: { (try? device.unlock(passcode: try Passcode(CrashKind.passcode(version: $0)))) != nil }) else {
                throw Violation(message: "the keybag opens with neither the old passcode (\(acknowledged)) nor the new one (\(inFlight))")
            }
            state.passcodeVersion = opened
            state.version = opened
            let container = try device.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
            for check in CrashKind.passcodeChecks where try container.contents(atPath: check.path) != CrashKind.fixedContent {
                throw Violation(message: "\(check.path) no longer reads back after the passcode change")
            }
            return opened == inFlight
        }
        try device.unlock(passcode: try Passcode(CrashKind.passcode(version: state.passcodeVersion)))
        let container = try device.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
        switch kind {
        case .write:
            let names = Set(try container.contentsOfDirectory(atPath: CrashKind.writeFolder).map(\.name))
            let mine = names.filter { $0.hasPrefix("t\(trial)-") }
            for version in 1...max(1, inFlight) where version <= acknowledged || mine.contains(CrashKind.writeName(trial: trial, version: version)) {
                let name = CrashKind.writeName(trial: trial, version: version)
                guard mine.contains(name) else { throw Violation(message: "acknowledged file \(name) is missing") }
                guard try container.contents(atPath: "\(CrashKind.writeFolder)/\(name)") == CrashKind.writeContent(trial: trial, version: version) else {
                    throw Violation(message: "\(name) holds neither its new content nor nothing")
                }
            }
            let expected = Set((1...max(1, inFlight)).map { CrashKind.writeName(trial: trial, version: $0) })
            if let stray = mine.subtracting(expected).first { throw Violation(message: "unexpected file \(stray)") }
            return mine.contains(CrashKind.writeName(trial: trial, version: inFlight))
        case .overwrite:
            let content = try container.contents(atPath: CrashKind.overwritePath)
            if content == CrashKind.overwriteContent(version: inFlight) { state.version = inFlight; return true }
            guard content == CrashKind.overwriteContent(version: acknowledged) else {
                throw Violation(message: "the file holds \(content.count) bytes that are neither version \(acknowledged) nor \(inFlight)")
            }
            state.version = acknowledged
            return false
        case .move:
            let present = CrashKind.movePaths.map { container.fileExists(atPath: $0) }
            guard present.filter({ $0 }).count == 1, let index = present.firstIndex(of: true) else {
                throw Violation(message: present.contains(true) ? "the file is at both places" : "the file is at neither place")
            }
            guard try container.contents(atPath: CrashKind.movePaths[index]) == CrashKind.fixedContent else {
                throw Violation(message: "the moved file's content changed")
            }
            let isNew = index == inFlight % 2
            state.version = isNew ? inFlight : acknowledged
            return isNew
        case .protection:
            let protection = try container.attributesOfItem(atPath: CrashKind.protectionPath)[.protectionKey] as? FileProtectionType
            guard try container.contents(atPath: CrashKind.protectionPath) == CrashKind.fixedContent else {
                throw Violation(message: "the file's content changed with its class")
            }
            if protection?.rawValue == CrashKind.protectionCycle[inFlight % 4].rawValue { state.version = inFlight; return true }
            guard protection?.rawValue == CrashKind.protectionCycle[acknowledged % 4].rawValue else {
                throw Violation(message: "the class is \(protection?.rawValue ?? "unreadable"), neither the old nor the new one")
            }
            state.version = acknowledged
            return false
        case .inbox:
            let items = try container.inboxItems().filter { $0.name.hasPrefix("t\(trial)-") }
            var seen = Set<String>()
            for item in items {
                guard seen.insert(item.name).inserted else { throw Violation(message: "\(item.name) is listed twice") }
                guard let version = (1...inFlight).first(where: { CrashKind.inboxName(trial: trial, version: $0) == item.name }) else {
                    throw Violation(message: "unexpected Inbox item \(item.name) (a delivery done twice?)")
                }
                guard item.state == .pendingEvent else {
                    throw Violation(message: "\(item.name) is \(item.state.rawValue): its open-URL event was lost")
                }
                guard try container.contents(atPath: item.path) == CrashKind.inboxContent(trial: trial, version: version) else {
                    throw Violation(message: "\(item.name) does not hold what was delivered")
                }
            }
            for version in stride(from: 1, through: acknowledged, by: 1) where !seen.contains(CrashKind.inboxName(trial: trial, version: version)) {
                throw Violation(message: "acknowledged delivery \(CrashKind.inboxName(trial: trial, version: version)) is missing")
            }
            mustDeliver.formUnion(seen)
            // A delivery recorded but not yet renamed is finished by the receiver, so its event may come too.
            let inFlightName = CrashKind.inboxName(trial: trial, version: inFlight)
            if !seen.contains(inFlightName) { mayDeliver.insert(inFlightName) }
            return seen.contains(inFlightName)
        case .passcode:
            fatalError("handled above")
        }
    }

    /// Makes this program the receiver and takes every pending open-URL event: each item exactly once.
    private func deliverEvents(_ container: Container, mustDeliver: Set<String>, mayDeliver: Set<String>, violations: inout [String]) throws -> Int {
        let collector = EventCollector()
        container.addOpenURLDelegate(collector)
        defer { container.removeOpenURLDelegate(collector) }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            let pending = try container.inboxItems().filter { $0.state != .delivered }
            if pending.isEmpty && collector.names.count >= mustDeliver.count { break }
            usleep(50_000)
        }
        usleep(500_000)  // room for a duplicate to show up
        let names = collector.names
        var counts: [String: Int] = [:]
        for name in names { counts[name, default: 0] += 1 }
        for (name, count) in counts where count > 1 { violations.append("inbox: \(name) was delivered \(count) times") }
        for name in mustDeliver where counts[name] == nil { violations.append("inbox: \(name) never got its open-URL event") }
        for name in counts.keys where !mustDeliver.contains(name) && !mayDeliver.contains(name) {
            violations.append("inbox: an event for \(name), which was never delivered")
        }
        return names.count
    }
}

/// Collects the names of opened Inbox items.
final class EventCollector: OpenURLDelegate, @unchecked Sendable {
    private let lock = NSLock()
    private var received: [String] = []
    var names: [String] { lock.withLock { received } }
    func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {
        lock.withLock { received.append(url.lastPathComponent) }
    }
}
