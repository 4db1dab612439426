import Foundation
import ProtectedStore
import ProtectedStoreCore

/// One state a power cut could leave, rebuilt as a folder that stands in for the recorded root.
package struct PowerCutState: Sendable {
    /// The rebuilt root folder, named `root` inside a folder of its own that the check may use too (for a device
    /// secret kept beside the root, say); both are removed after the check returns.
    package let path: String
    /// How many recorded operations had been issued when the power went.
    package let cut: Int
    /// The workload's marks set before the cut, in order.
    package let marks: [Int]
    /// What the cut lost, kept and tore, for a report that can be replayed.
    package let description: String
}

/// Names one state a recording can leave: the point of the cut (how many recorded operations were issued) and which
/// of the states at that point (0: everything pending lost, 1: everything kept, 2…: random mixtures drawn from
/// `seed`). Its text form, `seed:cut:sample`, is what a failure reports and a replay takes.
public struct PowerCutStateID: Hashable, Sendable, CustomStringConvertible, LosslessStringConvertible {
    /// The seed the random mixtures of lost, kept and torn writes are drawn from.
    public let seed: UInt64
    /// How many recorded operations were issued before the power went.
    public let cut: Int
    /// Which state at that point: 0 loses everything pending, 1 keeps it all, 2 and up are random mixtures.
    public let sample: Int

    package init(seed: UInt64, cut: Int, sample: Int) {
        self.seed = seed
        self.cut = cut
        self.sample = sample
    }

    public init?(_ description: String) {
        let parts = description.split(separator: ":")
        guard parts.count == 3, let seed = UInt64(parts[0]), let cut = Int(parts[1]), let sample = Int(parts[2]), cut >= 0, sample >= 0 else { return nil }
        self.init(seed: seed, cut: cut, sample: sample)
    }

    public var description: String { "\(seed):\(cut):\(sample)" }

    /// The generator of this state's random fates: its own, so any state can be rebuilt without the others.
    var random: SplitMix64 {
        SplitMix64(seed: seed ^ (UInt64(cut) &* 0x9E37_79B9_7F4A_7C15) ^ (UInt64(sample) &* 0xBF58_476D_1CE4_E5B9))
    }
}

/// What checking a recording found.
package struct PowerCutReport: Sendable, CustomStringConvertible {
    package let workload: String
    package let seed: UInt64
    package var statesChecked = 0
    package var violations: [String] = []

    package var description: String {
        "\(workload): \(statesChecked) power-cut states, \(violations.count) violation(s) (seed \(seed))"
            + violations.prefix(3).map { "\n  - \($0)" }.joined()
    }
}

/// The power-cut model (docs/SECURITY.md, "Power cuts"): after a file's last completed fsync, each later write to it may be
/// lost, kept, or torn at 512-byte sectors (some new, some old), each truncate lost or kept, and writes to different
/// files are unordered. Name operations (create, rename, unlink) persist in the order they were made, all of those up
/// to the last fsync of a directory they touch for certain, later ones possibly.
extension PowerCutRecording {
    static let sectorSize: Int64 = 512

    /// Every state the recording can leave as this checker samples them: at each point between two recorded
    /// operations, everything pending lost, everything kept, and `randomPerCut` random mixtures.
    package func stateIDs(randomPerCut: Int, seed: UInt64) -> [PowerCutStateID] {
        let steps = self.steps
        return (0...steps.count).flatMap { cut -> [PowerCutStateID] in
            if cut > 0, case .mark = steps[cut - 1] { return [] }
            return (0..<(randomPerCut + 2)).map { PowerCutStateID(seed: seed, cut: cut, sample: $0) }
        }
    }

    /// Rebuilds state `id` as the folder `root` inside `folder` (which must not exist yet).
    package func materialize(_ id: PowerCutStateID, in folder: String) throws -> PowerCutState {
        let steps = self.steps
        let cut = min(id.cut, steps.count)
        let prefix = Array(steps[0..<cut])
        let marks = prefix.compactMap { step -> Int? in if case .mark(let label) = step { label } else { nil } }
        let policy: CutPolicy = id.sample == 0 ? .loseAll : id.sample == 1 ? .keepAll : .random
        var random = id.random
        var fates: [String] = []
        let tree = rebuild(prefix, policy: policy, random: &random, fates: &fates)
        let path = (folder as NSString).appendingPathComponent("root")
        try tree.materialize(at: path)
        return PowerCutState(path: path, cut: cut, marks: marks, description: fates.isEmpty ? "nothing pending" : fates.joined(separator: ", "))
    }

    /// Rebuilds `statesPerCut` random states (plus "everything after the fsyncs lost" and "everything kept") at every
    /// point between two recorded operations, and runs `check` on each; `check` returns the problems it found.
    package func check(workload: String, statesPerCut: Int, seed: UInt64, scratch: String,
                       _ check: (PowerCutState) throws -> [String]) throws -> PowerCutReport {
        var report = PowerCutReport(workload: workload, seed: seed)
        for id in stateIDs(randomPerCut: statesPerCut, seed: seed) {
            let folder = (scratch as NSString).appendingPathComponent("state-\(id.cut)-\(id.sample)")
            defer { try? FileManager.default.removeItem(atPath: folder) }
            let state = try materialize(id, in: folder)
            report.statesChecked += 1
            for problem in try check(state) {
                report.violations.append("after operation \(id.cut) (\(state.description)): \(problem)")
            }
        }
        return report
    }

    private enum CutPolicy { case loseAll, keepAll, random }

    private func rebuild(_ prefix: [Step], policy: CutPolicy, random: inout SplitMix64, fates: inout [String]) -> RebuiltTree {
        var lastSync: [RecordedNode: Int] = [:]
        for (index, step) in prefix.enumerated() { if case .synchronize(let node) = step { lastSync[node] = index } }

        // Name operations persist as a prefix of their order: at least up to the last one a directory fsync covers.
        let nameOperations = prefix.indices.filter { prefix[$0].isNameOperation }
        var required = 0
        for (position, index) in nameOperations.enumerated() where prefix[index].directories.contains(where: { (lastSync[$0] ?? -1) > index }) {
            required = position + 1
        }
        let persisted: Int = switch policy {
        case .loseAll: required
        case .keepAll: nameOperations.count
        case .random: Int.random(in: required...nameOperations.count, using: &random)
        }
        if persisted < nameOperations.count { fates.append("names after #\(persisted) lost") }
        let persistedNames = Set(nameOperations.prefix(persisted))

        var tree = RebuiltTree(baseline: baseline)
        for (index, step) in prefix.enumerated() {
            switch step {
            case .write(let node, let offset, let bytes):
                guard (lastSync[node] ?? -1) < index else {
                    tree.write(node, offset: offset, bytes: bytes)
                    continue
                }
                let fate = policy == .loseAll ? 0 : policy == .keepAll ? 1 : Int.random(in: 0..<3, using: &random)
                switch fate {
                case 0: fates.append("write #\(index) lost")
                case 1: tree.write(node, offset: offset, bytes: bytes)
                default:
                    var kept: [Int64] = []
                    var sector = offset / Self.sectorSize * Self.sectorSize
                    while sector < offset + Int64(bytes.count) {
                        if Bool.random(using: &random) {
                            kept.append(sector)
                            let from = max(sector, offset), to = min(sector + Self.sectorSize, offset + Int64(bytes.count))
                            tree.write(node, offset: from, bytes: Array(bytes[Int(from - offset)..<Int(to - offset)]))
                        }
                        sector += Self.sectorSize
                    }
                    // The size change of an extending write may reach the disk without its data (zeros show).
                    tree.extend(node, to: offset + Int64(bytes.count))
                    fates.append("write #\(index) torn (sectors kept: \(kept.map { "\($0)" }.joined(separator: " ")))")
                }
            case .truncate(let node, let size):
                if (lastSync[node] ?? -1) > index || policy == .keepAll || (policy == .random && Bool.random(using: &random)) {
                    tree.truncate(node, to: size)
                } else {
                    fates.append("truncate #\(index) lost")
                }
            case .create, .rename, .unlink:
                if persistedNames.contains(index) { tree.apply(step) }
            case .synchronize, .mark:
                continue
            }
        }
        return tree
    }
}

extension PowerCutRecording.Step {
    var isNameOperation: Bool {
        switch self {
        case .create, .rename, .unlink: true
        default: false
        }
    }

    /// The directories whose fsync makes this name operation durable.
    var directories: [RecordedNode] {
        switch self {
        case .create(let directory, _, _, _), .unlink(let directory, _): [directory]
        case .rename(let from, _, let to, _): [from, to]
        default: []
        }
    }
}

/// The contents and names one power-cut state holds, before it is written out as a folder.
struct RebuiltTree {
    let root: RecordedNode
    var files: [RecordedNode: [UInt8]]
    var entries: [RecordedNode: [String: RecordedNode]]
    var directories: Set<RecordedNode>

    init(baseline: TreeSnapshot) {
        root = baseline.root
        files = baseline.files
        entries = baseline.entries
        directories = Set(baseline.entries.keys)
    }

    mutating func write(_ node: RecordedNode, offset: Int64, bytes: [UInt8]) {
        var content = files[node] ?? []
        let end = Int(offset) + bytes.count
        if content.count < end { content += [UInt8](repeating: 0, count: end - content.count) }
        content.replaceSubrange(Int(offset)..<end, with: bytes)
        files[node] = content
    }

    mutating func extend(_ node: RecordedNode, to size: Int64) {
        let content = files[node] ?? []
        if content.count < Int(size) { files[node] = content + [UInt8](repeating: 0, count: Int(size) - content.count) }
    }

    mutating func truncate(_ node: RecordedNode, to size: Int64) {
        var content = files[node] ?? []
        if content.count > Int(size) { content.removeLast(content.count - Int(size)) } else { content += [UInt8](repeating: 0, count: Int(size) - content.count) }
        files[node] = content
    }

    mutating func apply(_ step: PowerCutRecording.Step) {
        switch step {
        case .create(let directory, let name, let node, let isDirectory):
            entries[directory, default: [:]][name] = node
            if isDirectory {
                directories.insert(node)
                entries[node] = entries[node] ?? [:]
            }
        case .rename(let fromDirectory, let fromName, let toDirectory, let toName):
            guard let node = entries[fromDirectory]?[fromName] else { return }
            entries[fromDirectory]?[fromName] = nil
            entries[toDirectory, default: [:]][toName] = node
        case .unlink(let directory, let name):
            entries[directory]?[name] = nil
        default:
            break
        }
    }

    /// Writes the state out under `path` (which must not exist).
    func materialize(at path: String) throws {
        var written: [RecordedNode: String] = [:]
        try materialize(directory: root, at: path, written: &written)
    }

    private func materialize(directory: RecordedNode, at path: String, written: inout [RecordedNode: String]) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        for (name, node) in entries[directory] ?? [:] {
            let child = (path as NSString).appendingPathComponent(name)
            if directories.contains(node) {
                try materialize(directory: node, at: child, written: &written)
            } else if let first = written[node] {
                // A hard link: the state holds one file under both names.
                guard link(first, child) == 0 else {
                    throw ProtectedStoreError(.io, path: child, problem: "cannot link a rebuilt power-cut state's second name", remedy: "Check the scratch folder")
                }
            } else {
                written[node] = child
                guard FileManager.default.createFile(atPath: child, contents: Data(files[node] ?? []), attributes: [.posixPermissions: 0o600]) else {
                    throw ProtectedStoreError(.io, path: child, problem: "cannot write a rebuilt power-cut state", remedy: "Check the scratch folder's free space")
                }
            }
        }
    }
}

/// SplitMix64: a small, fast, seeded generator, so a reported seed replays the same states, content or operations
/// (the power-cut simulator, `ps-verify` and the tests use it).
package struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    package init(seed: UInt64) { state = seed }

    package mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
