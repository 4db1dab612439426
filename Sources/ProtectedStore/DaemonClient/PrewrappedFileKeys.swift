import Foundation
import ProtectedStoreCore

/// Keys for new files, sealed by the key daemon in batches (`wrap-batch`, docs/PROTOCOL.md §3): creating a file of
/// class A, C or D then costs no round trip to the daemon, except one per batch, and that one is made ahead: once half
/// of a batch is handed out, the next is fetched in the background, so a stream of creates (`tar -x`) seldom waits.
///
/// A batch is made for one class and one header prefix (everything the seal authenticates but the file id), so a key
/// is only ever handed to a header it was sealed for. Every batch is zeroed when this process locks, or loses its
/// daemon, with the per-file keys of open class A files, and a batch still on its way then is zeroed when it arrives:
/// no pre-sealed class A key is handed out after the lock, and none outlives it by more than that round trip.
final class PrewrappedFileKeys: @unchecked Sendable {
    /// Keys sealed per round trip: `tar -x` of thousands of files makes a few hundred trips instead of thousands.
    static let batchSize = 32

    private struct Template: Hashable {
        var protectionClass: ProtectionClass
        var headerPrefix: [UInt8]
    }

    /// Keys `next..<fileIDs.count` of `keys` (32 bytes each) are still to hand out; handed-out ones are zeroed.
    private final class Batch {
        let keys: SecureBytes
        let fileIDs: [[UInt8]]
        let sealed: [[UInt8]]
        var next = 0

        init(keys: SecureBytes, fileIDs: [[UInt8]], sealed: [[UInt8]]) {
            self.keys = keys
            self.fileIDs = fileIDs
            self.sealed = sealed
        }

        var remaining: Int { fileIDs.count - next }
    }

    /// A batch drawn here and not sealed by the daemon yet. Unchecked: it is handed whole to the one thread that has it
    /// sealed, and its keys are guarded memory of their own.
    private struct Draft: @unchecked Sendable {
        let keys: SecureBytes
        let fileIDs: [[UInt8]]
        let associatedData: [[UInt8]]

        init(associatedData: ([UInt8]) -> [UInt8]) {
            keys = SecureBytes.random(count: PrewrappedFileKeys.batchSize * FileHeader.fileKeyBytes)
            fileIDs = (0..<PrewrappedFileKeys.batchSize).map { _ in Random.bytes(FileHeader.idBytes) }
            self.associatedData = fileIDs.map(associatedData)
        }
    }

    /// What a create finds under the lock: a key (and whether it starts the next batch's fetch), everything discarded
    /// since it read the generation, or no batch and none on its way, so it fetches one itself.
    private enum Turn {
        case key(NewWrappedFileKey, startsFetch: Bool)
        case discarded
        case mustFetch
    }

    private let link: DaemonLink
    /// Guards everything below; signalled when a fetch ahead lands or fails, and when everything is discarded.
    private let condition = NSCondition()
    /// Per template, the batch handing out keys, then the one fetched ahead.
    private var batches: [Template: [Batch]] = [:]
    /// Templates whose next batch is on its way (fetched ahead, or by a create that found none), with the generation
    /// the fetch was started in.
    private var fetching: [Template: Int] = [:]
    /// Counts discards, so a batch sealed across a lock is not kept.
    private var generation = 0
    private var fetched = 0
    /// Whether the daemon serves `wrap-batch` (its `hello` says; a daemon of an earlier release does not).
    private var daemonSealsBatches: Bool

    init(link: DaemonLink, daemonSealsBatches: Bool) {
        self.link = link
        self.daemonSealsBatches = daemonSealsBatches
    }

    /// Batches fetched and kept, for tests that count round trips.
    var batchesFetched: Int { condition.withLock { fetched } }

    /// After a reconnection: the daemon now serving may be of another release.
    func daemonChanged(sealsBatches: Bool) {
        condition.withLock { daemonSealsBatches = sealsBatches }
        discardAll()
    }

    /// A key sealed for `protectionClass` and the header prefix `associatedData(fileID)`. Throws the data-protection
    /// error while the class is unavailable (class A once this process has locked), as a direct `wrap` would.
    func take(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8], device: Device) throws -> NewWrappedFileKey {
        let template = Template(protectionClass: protectionClass, headerPrefix: associatedData([UInt8](repeating: 0, count: FileHeader.idBytes)))
        // At most: a fetch, a discard that throws it away, and a second fetch.
        for _ in 0..<3 {
            // The generation first, then the state: a lock that completes after this read has discarded, so a batch
            // fetched meanwhile is not kept. (The state is read outside the lock: a lock discards under the device's.)
            let (startedAt, sealsBatches) = condition.withLock { (generation, daemonSealsBatches) }
            let state = device.state
            if protectionClass == .complete, state != .unlocked && state != .locking {
                throw Device.unavailableError(protectionClass, state: state)
            }
            guard sealsBatches else { break }
            let turn = try condition.withLock { () throws -> Turn in
                // A batch on its way is waited for rather than fetched twice.
                while batches[template] == nil, fetching[template] == generation { condition.wait() }
                // Discarded meanwhile (a lock): the state is read again.
                guard generation == startedAt else { return .discarded }
                guard let key = try handOut(template) else {
                    fetching[template] = generation
                    return .mustFetch
                }
                let left = batches[template]?.reduce(0) { $0 + $1.remaining } ?? 0
                guard left <= Self.batchSize / 2, fetching[template] == nil else { return .key(key, startsFetch: false) }
                fetching[template] = generation
                return .key(key, startsFetch: true)
            }
            switch turn {
            case .key(let key, let startsFetch):
                if startsFetch {
                    let draft = Draft(associatedData: associatedData)
                    DispatchQueue.global(qos: .userInitiated).async { [self] in
                        land(try? seal(draft, for: template), of: draft, for: template, startedAt: startedAt)
                    }
                }
                return key
            case .discarded:
                continue
            case .mustFetch:
                let draft = Draft(associatedData: associatedData)
                do {
                    land(try seal(draft, for: template), of: draft, for: template, startedAt: startedAt)
                } catch {
                    land(nil, of: draft, for: template, startedAt: startedAt)
                    throw error
                }
            }
        }
        // A daemon without batches, or discarded again and again: seal this one key alone.
        return try device.sealingNewFileKey(for: protectionClass, associatedData: associatedData)
    }

    /// Zeroes every key not handed out yet.
    func discardAll() {
        let discarded: [Batch] = condition.withLock {
            generation += 1
            defer {
                batches.removeAll()
                condition.broadcast()
            }
            return batches.values.flatMap { $0 }
        }
        discarded.forEach { $0.keys.discard() }
    }

    /// The next key of the template's batches, copied into guarded memory of its own and zeroed in the batch. Caller
    /// holds `condition`.
    private func handOut(_ template: Template) throws -> NewWrappedFileKey? {
        guard let batch = batches[template]?.first else { return nil }
        let index = batch.next
        batch.next += 1
        if batch.remaining == 0 {
            batches[template]!.removeFirst()
            if batches[template]!.isEmpty { batches[template] = nil }
        }
        let keyBytes = FileHeader.fileKeyBytes
        let fileKey = try batch.keys.withUnsafeBytes { all in
            SecureBytes(count: keyBytes) { out in
                out.copyMemory(from: UnsafeRawBufferPointer(rebasing: all[index * keyBytes..<(index + 1) * keyBytes]))
            }
        }
        try batch.keys.withUnsafeBytes { all in
            zeroize(UnsafeMutableRawPointer(mutating: all.baseAddress! + index * keyBytes), count: keyBytes)
        }
        if batch.remaining == 0 { batch.keys.discard() }
        return NewWrappedFileKey(fileKey: fileKey, fileID: batch.fileIDs[index], sealed: batch.sealed[index])
    }

    /// Ends the fetch of `draft` (started in generation `startedAt`): queues its batch (nil if it failed) behind the
    /// template's unless a discard came in between, else zeroes its keys, and wakes the creates waiting for it. A
    /// failure ahead of need is not reported: the create that then finds no key fetches one itself and reports that.
    private func land(_ batch: Batch?, of draft: Draft, for template: Template, startedAt: Int) {
        let kept = condition.withLock {
            defer { condition.broadcast() }
            if fetching[template] == startedAt { fetching[template] = nil }
            guard let batch, generation == startedAt else { return false }
            batches[template, default: []].append(batch)
            fetched += 1
            return true
        }
        if !kept { draft.keys.discard() }
    }

    /// Has the daemon seal the draft's keys, in one round trip. If it cannot, `land` zeroes them.
    private func seal(_ draft: Draft, for template: Template) throws -> Batch {
        let sealed = try link.wrapFileKeys(draft.keys, for: template.protectionClass, associatedData: draft.associatedData)
        return Batch(keys: draft.keys, fileIDs: draft.fileIDs, sealed: sealed)
    }
}
