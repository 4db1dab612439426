import Foundation
import ProtectedStore
import ProtectedStoreCore

/// A file or directory in a recording: its kernel identity plus how many times that identity was created during the
/// recording, because the kernel reuses the inode of a removed file for the next one.
struct RecordedNode: Hashable, Sendable, CustomStringConvertible {
    let identity: FileIdentity
    let generation: Int

    var description: String { generation == 0 ? "\(identity)" : "\(identity)#\(generation)" }
}

/// What the disk saw, in order, between `start` and `stop`, with the marks the workload set (`mark`) between the
/// operations, so a check can tell what the program had been told was durable at any cut.
package final class PowerCutRecording: DurableOperationRecorder, @unchecked Sendable {
    enum Step: Sendable {
        case write(RecordedNode, offset: Int64, bytes: [UInt8])
        case truncate(RecordedNode, size: Int64)
        case synchronize(RecordedNode)
        case create(directory: RecordedNode, name: String, RecordedNode, isDirectory: Bool)
        case rename(fromDirectory: RecordedNode, fromName: String, toDirectory: RecordedNode, toName: String)
        case unlink(directory: RecordedNode, name: String)
        case mark(Int)
    }

    /// The folder whose contents the recording rebuilds.
    package let root: String
    let baseline: TreeSnapshot
    private let mutex = NSLock()
    private var recordedSteps: [Step] = []
    private var generations: [FileIdentity: Int] = [:]
    /// Files and directories under the root: operations on anything else (other code in the process) are not recorded.
    private var known: Set<FileIdentity>
    private var isStopped = false

    private init(root: String, baseline: TreeSnapshot) {
        self.root = root
        self.baseline = baseline
        known = Set(baseline.entries.keys.map(\.identity)).union(baseline.files.keys.map(\.identity))
    }

    /// Takes a snapshot of everything under `root` (the state as of the last fsync: the caller syncs before) and
    /// records every durable operation on it from now on. Recordings of other folders may run at the same time.
    package static func start(root: String) throws -> PowerCutRecording {
        let recording = PowerCutRecording(root: root, baseline: try TreeSnapshot(root: root))
        DurableIO.add(recording)
        return recording
    }

    /// Stops recording; the steps so far are what `check` replays.
    package func stop() {
        mutex.withLock { isStopped = true }
        DurableIO.remove(self)
    }

    /// Adds a mark between operations: the workload's note of something it was told (a write returned, an fsync
    /// completed), which its check reads back at every cut after this point.
    package func mark(_ label: Int) {
        mutex.withLock { if !isStopped { recordedSteps.append(.mark(label)) } }
    }

    var steps: [Step] { mutex.withLock { recordedSteps } }

    package func record(_ operation: DurableOperation) {
        mutex.withLock {
            guard !isStopped, concernsRoot(operation) else { return }
            recordedSteps.append(step(for: operation))
        }
    }

    private func concernsRoot(_ operation: DurableOperation) -> Bool {
        switch operation {
        case .write(let file, _, _), .truncate(let file, _), .synchronize(let file): return known.contains(file)
        case .create(let directory, _, let file, _):
            guard known.contains(directory) else {
                // The kernel reused the inode of a file of this root that is gone, for a file elsewhere (another
                // recording's, say): it is not this root's any more.
                known.remove(file)
                return false
            }
            known.insert(file)
            return true
        case .rename(let fromDirectory, _, let toDirectory, _): return known.contains(fromDirectory) || known.contains(toDirectory)
        case .unlink(let directory, _): return known.contains(directory)
        case .link(let directory, _, let file): return known.contains(directory) && known.contains(file)
        }
    }

    private func node(_ identity: FileIdentity) -> RecordedNode {
        RecordedNode(identity: identity, generation: generations[identity] ?? 0)
    }

    private func step(for operation: DurableOperation) -> Step {
        switch operation {
        case .write(let file, let offset, let bytes): return .write(node(file), offset: offset, bytes: bytes)
        case .truncate(let file, let size): return .truncate(node(file), size: size)
        case .synchronize(let file): return .synchronize(node(file))
        case .create(let directory, let name, let file, let isDirectory):
            let parent = node(directory)
            // A new file: if its inode belonged to a removed file, it starts a new generation of that identity.
            generations[file] = (generations[file] ?? 0) + 1
            return .create(directory: parent, name: name, node(file), isDirectory: isDirectory)
        case .rename(let fromDirectory, let fromName, let toDirectory, let toName):
            return .rename(fromDirectory: node(fromDirectory), fromName: fromName, toDirectory: node(toDirectory), toName: toName)
        case .unlink(let directory, let name): return .unlink(directory: node(directory), name: name)
        // Another name for a file already known: the same node, no new generation.
        case .link(let directory, let name, let file): return .create(directory: node(directory), name: name, node(file), isDirectory: false)
        }
    }
}

/// The regular files and directories under a folder, by identity: what a power-cut state is rebuilt from.
struct TreeSnapshot: Sendable {
    let root: RecordedNode
    var files: [RecordedNode: [UInt8]] = [:]
    var entries: [RecordedNode: [String: RecordedNode]] = [:]

    init(root path: String) throws {
        guard let identity = DurableIO.identity(ofPath: path) else {
            throw ProtectedStoreError(.io, path: path, problem: "cannot stat the folder to record", remedy: "Create it before recording")
        }
        root = RecordedNode(identity: identity, generation: 0)
        try capture(directory: root, path: path)
    }

    private mutating func capture(directory: RecordedNode, path: String) throws {
        var names: [String: RecordedNode] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: path) {
            let child = (path as NSString).appendingPathComponent(name)
            var info = stat()
            guard lstat(child, &info) == 0 else { continue }
            let node = RecordedNode(identity: FileIdentity(info), generation: 0)
            switch info.st_mode & S_IFMT {
            case S_IFDIR:
                names[name] = node
                try capture(directory: node, path: child)
            case S_IFREG:
                names[name] = node
                files[node] = Array(FileManager.default.contents(atPath: child) ?? Data())
            default:
                continue  // sockets, FIFOs and links carry no data a power cut could damage
            }
        }
        entries[directory] = names
    }
}
