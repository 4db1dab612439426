import ArgumentParser
import Foundation
import ProtectedStore
import ProtectedStoreCore
import ProtectedStoreTesting

/// The power-cut harness: each crash kind's operations recorded through the store's I/O layer, then every state a power
/// cut between two of those operations could leave rebuilt and checked as the crash harness checks a killed worker.
struct PowerCutCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "powercut",
        abstract: "Record each kind of operation and check every state a power cut could leave (lost, kept and torn writes).",
        discussion: """
            The crash kinds (whole-file writes, overwrites, moves, class changes, passcode changes, Inbox deliveries) are \
            run in this process under a recording of every write, truncate, fsync and name change. At each point between \
            two operations the harness rebuilds the states a power cut could leave (docs/SECURITY.md, "Power cuts") and \
            opens each as a device: files hold their old or new content, the keybag opens with the old or the new passcode, \
            every acknowledged Inbox delivery is there once with its event pending. The growth kind appends and shrinks \
            through an open handle, fsyncing after each call: every synced byte must survive. The names kind makes, fills, \
            renames and removes folders and files with short and long (encrypted) names: every directory must list, and \
            every acknowledged item be there. The v1-growth kind does the \
            same appends in format version 1's layout, which re-encrypts the synced final block: there the harness must find \
            violations, to show it can. Exits 1 on a violation elsewhere, or if v1-growth finds none.
            """)

    @Option(help: "Operations recorded per kind.") var operations = 8
    @Option(help: "Random power-cut states checked at each point between two operations (plus all-lost and all-kept).") var statesPerCut = 40
    @Flag(help: "Quick mode: 3 operations per kind, 8 states per point.") var quick = false
    @Option(help: "Seed of the lost, kept and torn choices; printed so a run replays.") var seed = UInt64.random(in: 1...UInt64.max)
    @Flag(help: "Print the tally as JSON.") var json = false

    func validate() throws {
        guard operations >= 1, operations <= 1000 else { throw ValidationError("--operations must be 1…1000") }
        guard statesPerCut >= 0, statesPerCut <= 10_000 else { throw ValidationError("--states-per-cut must be 0…10000") }
    }

    func run() throws {
        let (count, states) = quick ? (3, 8) : (operations, statesPerCut)
        if !json { emitLine("power cuts: \(count) operations per kind, \(states) random states per point between two (seed \(seed))") }
        var tallies: [PowerCutTally] = []
        for kind in CrashKind.allCases {
            let tally = try PowerCutRun(kind: kind.rawValue, operations: count, statesPerCut: states, seed: seed).run { device, container, recording in
                try PowerCutRun.record(kind, operations: count, device: device, container: container, recording: recording)
            }
            tallies.append(tally)
            if !json { emitLine(tally.line) }
        }
        let growth = try PowerCutRun.growth(operations: count, statesPerCut: states, seed: seed)
        tallies.append(growth)
        if !json { emitLine(growth.line) }
        let names = try PowerCutRun.names(operations: count, statesPerCut: states, seed: seed)
        tallies.append(names)
        if !json { emitLine(names.line) }
        let version1 = try PowerCutRun.version1Growth(operations: count, statesPerCut: states, seed: seed)
        tallies.append(version1)
        if !json { emitLine(version1.line + " (format version 1's hazard: violations expected)") }
        let unexpected = tallies.filter { $0.kind != PowerCutRun.version1Kind }.flatMap(\.violations)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            emitLine(String(decoding: try encoder.encode(tallies), as: UTF8.self))
        } else {
            for violation in unexpected.prefix(20) { emitLine("  violation: \(violation)") }
            let total = tallies.map(\.states).reduce(0, +)
            emitLine(unexpected.isEmpty ? "power cuts: no violation in \(total) states (v1-growth: \(version1.violations.count) found, as expected)"
                                        : "power cuts: \(unexpected.count) violations in \(total) states")
            if version1.violations.isEmpty { emitLine("power cuts: the v1-growth kind found no violation: the check cannot fail") }
        }
        if !unexpected.isEmpty || version1.violations.isEmpty { throw ExitCode(1) }
    }
}

/// What one kind's power-cut states showed.
struct PowerCutTally: Codable {
    var kind: String
    var operations: Int
    var states: Int
    var violations: [String]

    var line: String {
        "  \(kind.padding(toLength: 11, withPad: " ", startingAt: 0)) \(operations) ops, \(states) states checked, violations \(violations.count)"
    }
}

/// One kind's device, recording and check.
struct PowerCutRun {
    static let growthKind = "growth"
    static let version1Kind = "v1-growth"
    static let growthPath = "Documents/growth.bin"

    let kind: String
    let operations: Int
    let statesPerCut: Int
    let seed: UInt64

    /// Prepares a device, records `workload` on it, and checks every rebuilt state with `check` (default: the crash
    /// harness's check of that kind, given the last acknowledged version).
    func run(_ workload: (Device, Container, PowerCutRecording) throws -> Void, prepare: (Container) throws -> Void = { _ in },
             check: ((PowerCutState, ScratchDevice) -> [String])? = nil) throws -> PowerCutTally {
        let (scratch, device, container) = try ScratchDevice.create(label: "powercut-\(kind)", passcode: CrashKind.passcode(version: 0))
        defer { scratch.remove() }
        if let crashKind = CrashKind(rawValue: kind) { try CrashRun(kind: crashKind, trials: 0, maxDelayMicroseconds: 0).prepare(container) }
        try prepare(container)
        // Everything before the recording is the durable starting point.
        sync()
        // A passcode change writes the binding beside the device secret, outside the root: that kind records the
        // whole scratch folder, so its states hold the secret's folder as the cut left it.
        let recordsSecret = kind == CrashKind.passcode.rawValue
        let recording = try PowerCutRecording.start(root: recordsSecret ? scratch.folder : scratch.root)
        do {
            try workload(device, container, recording)
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        device.powerOff()
        let states = (scratch.folder as NSString).appendingPathComponent("states")
        let report = try recording.check(workload: kind, statesPerCut: statesPerCut, seed: seed, scratch: states) { state in
            let rebuilt = ScratchDevice(folder: recordsSecret ? state.path : (state.path as NSString).deletingLastPathComponent)
            if !recordsSecret {
                do {
                    try FileManager.default.copyItem(atPath: scratch.secretPath, toPath: rebuilt.secretPath)
                    // The passcode binding lies beside the secret, outside the recorded root, and goes with it.
                    try FileManager.default.copyItem(atPath: PasscodeBinding.path(forSecretAt: scratch.secretPath), toPath: PasscodeBinding.path(forSecretAt: rebuilt.secretPath))
                } catch {
                    return ["cannot set up the rebuilt device: \(error)"]
                }
            }
            if let check { return check(state, rebuilt) }
            return crashCheck(state, rebuilt)
        }
        return PowerCutTally(kind: kind, operations: operations, states: report.statesChecked, violations: report.violations)
    }

    private func crashCheck(_ state: PowerCutState, _ rebuilt: ScratchDevice) -> [String] {
        guard let crashKind = CrashKind(rawValue: kind) else { return ["no check for \(kind)"] }
        var mustDeliver = Set<String>(), mayDeliver = Set<String>()
        do {
            _ = try CrashRun(kind: crashKind, trials: 0, maxDelayMicroseconds: 0)
                .check(trial: 0, acknowledged: state.marks.last ?? 0, scratch: rebuilt, state: CrashRun.State(),
                       mustDeliver: &mustDeliver, mayDeliver: &mayDeliver)
            return []
        } catch let violation as CrashRun.Violation {
            return [violation.message]
        } catch {
            return ["\(error)"]
        }
    }

    /// Performs `operations` operations of a crash kind, marking each version once its call returned.
    static func record(_ kind: CrashKind, operations: Int, device: Device, container: Container, recording: PowerCutRecording) throws {
        let sources = FileManager.default.temporaryDirectory.appendingPathComponent("ps-verify-sources-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: sources, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: sources) }
        var passcode = CrashKind.passcode(version: 0)
        for version in 1...operations {
            try kind.perform(version: version, trial: 0, device: device, container: container, passcode: &passcode, sources: sources)
            recording.mark(version)
        }
    }

    /// Appends whole blocks through an open handle with an fsync after each, and shrinks by a few bytes now and then:
    /// the pattern that made format version 1 re-encrypt the synced final block before each append.
    static func growth(operations: Int, statesPerCut: Int, seed: UInt64) throws -> PowerCutTally {
        let blockSize = EncryptedFile.defaultBlockSize
        let initial = [UInt8]((0..<2 * blockSize).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        var history: EncryptedFileHistory?
        let run = PowerCutRun(kind: growthKind, operations: operations, statesPerCut: statesPerCut, seed: seed)
        return try run.run({ device, container, recording in
            let name = String(try container.storedPath(growthPath).dropFirst(device.root.count + 1))
            let model = EncryptedFileHistory(name: name, initialContent: initial, recording: recording)
            history = model
            let handle = try container.fileHandle(forUpdatingAtPath: growthPath)
            defer { try? handle.close() }
            for operation in 1...operations {
                if operation % 3 == 0 {
                    let size = Int64(handle.size) - 100
                    model.truncate(to: size)
                    try handle.truncate(atOffset: UInt64(size))
                } else {
                    let bytes = [UInt8]((0..<blockSize).map { UInt8(truncatingIfNeeded: $0 &+ operation) })
                    let offset = Int64(handle.size)
                    model.write(bytes, at: offset)
                    try handle.write(contentsOf: Data(bytes), atOffset: UInt64(offset))
                }
                model.completed()
                try handle.synchronize()
                model.synchronized()
            }
        }, prepare: { container in
            try container.write(Data(initial), toPath: growthPath, options: .completeFileProtectionUntilFirstUserAuthentication)
        }, check: { state, rebuilt in
            guard let history else { return ["the workload did not start"] }
            do {
                let device = try rebuilt.open()
                defer { device.powerOff() }
                try device.unlock(passcode: try Passcode(CrashKind.passcode(version: 0)))
                return history.check(state, keys: device)
            } catch {
                return ["the device does not open: \(error)"]
            }
        })
    }

    static let namesKind = "names"

    /// Operation `version` of the names kind: a folder (long-named every other time) with a long-named file in it; the
    /// previous folder renamed to a long name, and the one before removed.
    static func namesFolder(_ version: Int) -> String {
        "Documents/" + (version % 2 == 0 ? "folder \(version)" : String(repeating: "ф", count: 90) + " \(version)")
    }
    static func namesMoved(_ version: Int) -> String { namesFolder(version) + String(repeating: " moved", count: 10) }
    static func namesFile(_ version: Int) -> String { String(repeating: "n", count: 150) + "-\(version).txt" }

    /// Names at rest through power cuts: each operation makes a folder with its IV, a long-named file in it (whose
    /// encrypted name is written first), renames the previous folder to a long name and removes the one before. Every
    /// state must list every directory without an integrity error and hold every acknowledged operation's result.
    static func names(operations: Int, statesPerCut: Int, seed: UInt64) throws -> PowerCutTally {
        let run = PowerCutRun(kind: namesKind, operations: operations, statesPerCut: statesPerCut, seed: seed)
        return try run.run({ _, container, recording in
            for version in 1...operations {
                try container.createDirectory(atPath: namesFolder(version))
                try container.write(Data("content \(version)".utf8), toPath: namesFolder(version) + "/" + namesFile(version), options: .noFileProtection)
                if version >= 2 { try container.moveItem(atPath: namesFolder(version - 1), toPath: namesMoved(version - 1)) }
                if version >= 3 { try container.removeItem(atPath: namesMoved(version - 2)) }
                recording.mark(version)
            }
        }, check: { state, rebuilt in
            let acknowledged = state.marks.last ?? 0
            do {
                let device = try rebuilt.open()
                defer { device.powerOff() }
                let container = try device.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
                func listEverything(_ path: String) throws {
                    for item in try container.contentsOfDirectory(atPath: path) where item.type == .typeDirectory {
                        try listEverything(path.isEmpty ? item.name : path + "/" + item.name)
                    }
                }
                try listEverything("")
                var violations: [String] = []
                // The operation in flight may have gone on to move the last folder and remove the one before it.
                if acknowledged >= 1 {
                    let file = "/" + namesFile(acknowledged)
                    let found = [namesFolder(acknowledged), namesMoved(acknowledged)].compactMap { try? container.contents(atPath: $0 + file) }
                    if found != [Data("content \(acknowledged)".utf8)] {
                        violations.append("operation \(acknowledged) was acknowledged, but its file is missing, wrong or in two places")
                    }
                }
                if acknowledged >= 2, container.fileExists(atPath: namesFolder(acknowledged - 1)) {
                    violations.append("operation \(acknowledged) moved folder \(acknowledged - 1), but it is still at its old name")
                }
                if acknowledged >= 3, container.fileExists(atPath: namesMoved(acknowledged - 2)) {
                    violations.append("operation \(acknowledged) removed folder \(acknowledged - 2), but it is still there")
                }
                return violations
            } catch {
                return ["a directory does not list or open: \(error)"]
            }
        })
    }

    /// The same appends in format version 1's layout, on a file of its own with a key of its own: the simulator must
    /// find the hazard there.
    static func version1Growth(operations: Int, statesPerCut: Int, seed: UInt64) throws -> PowerCutTally {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("ps-verify-v1-\(UUID().uuidString.prefix(8))").path
        let root = (folder as NSString).appendingPathComponent("root")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let path = (root as NSString).appendingPathComponent("growth.bin")
        let key = SecureBytes.random(count: 32), fileID = Random.bytes(16)
        let blockSize = EncryptedFile.defaultBlockSize
        let initial = [UInt8]((0..<2 * blockSize).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try Version1GrowthFile.create(at: path, content: initial, key: key, fileID: fileID).close()
        sync()
        let recording = try PowerCutRecording.start(root: root)
        let history = EncryptedFileHistory(name: "growth.bin", initialContent: initial, recording: recording)
        do {
            let file = try Version1GrowthFile.open(at: path, key: key, fileID: fileID)
            defer { try? file.close() }
            for operation in 1...operations {
                let bytes = [UInt8]((0..<blockSize).map { UInt8(truncatingIfNeeded: $0 &+ operation) })
                history.write(bytes, at: file.size)
                try file.append(bytes)
                history.completed()
                try file.synchronize()
                history.synchronized()
            }
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        let report = try recording.check(workload: version1Kind, statesPerCut: statesPerCut, seed: seed,
                                         scratch: (folder as NSString).appendingPathComponent("states")) { state in
            history.check(state) { try Version1GrowthFile.open(at: $0, key: key, fileID: fileID) }
        }
        return PowerCutTally(kind: version1Kind, operations: operations, states: report.statesChecked, violations: report.violations)
    }
}
