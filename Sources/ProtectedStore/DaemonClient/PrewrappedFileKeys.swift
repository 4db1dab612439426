import Foundation
import ProtectedStoreCore

/// Keys for new files, sealed by the key daemon in batches (`wrap-batch`, docs/PROTOCOL.md §3): creating a file of
/// class A, C or D then costs no round trip to the daemon, except one per batch.
///
/// A batch is made for one class and one header prefix (everything the seal authenticates but the file id), so a key
/// is only ever handed to a header it was sealed for. Every batch is zeroed when this process locks, or loses its
/// daemon, with the per-file keys of open class A files: no pre-sealed class A key outlives the class key.
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
    }

    private let link: DaemonLink
    private let mutex = NSLock()
    private var batches: [Template: Batch] = [:]
    /// Counts discards, so a batch sealed across a lock is not kept.
    private var generation = 0
    private var fetched = 0
    /// Whether the daemon serves `wrap-batch` (its `hello` says; a daemon of an earlier release does not).
    private var daemonSealsBatches: Bool

    init(link: DaemonLink, daemonSealsBatches: Bool) {
        self.link = link
        self.daemonSealsBatches = daemonSealsBatches
    }

    /// Batches fetched, for tests that count round trips.
    var batchesFetched: Int { mutex.withLock { fetched } }

    /// After a reconnection: the daemon now serving may be of another release.
    func daemonChanged(sealsBatches: Bool) {
        mutex.withLock { daemonSealsBatches = sealsBatches }
        discardAll()
    }

    /// A key sealed for `protectionClass` and the header prefix `associatedData(fileID)`. Throws the data-protection
    /// error while the class is unavailable (class A once this process has locked), as a direct `wrap` would.
    func take(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8], device: Device) throws -> NewWrappedFileKey {
        let template = Template(protectionClass: protectionClass, headerPrefix: associatedData([UInt8](repeating: 0, count: FileHeader.idBytes)))
        for _ in 0..<2 {
            // The generation first, then the state: a lock that completes after this read has discarded, so a batch
            // fetched meanwhile is not kept. (The state is read outside `mutex`: a lock discards under the device's.)
            let (startedAt, sealsBatches) = mutex.withLock { (generation, daemonSealsBatches) }
            let state = device.state
            if protectionClass == .complete, state != .unlocked && state != .locking {
                throw Device.unavailableError(protectionClass, state: state)
            }
            guard sealsBatches else { break }
            if let key = try mutex.withLock({ try handOut(template) }) { return key }
            let batch = try fetch(template, associatedData: associatedData)
            let kept = mutex.withLock {
                guard generation == startedAt, batches[template] == nil else { return false }
                batches[template] = batch
                fetched += 1
                return true
            }
            if !kept { batch.keys.discard() }
        }
        // A daemon without batches, or raced by other creates twice: seal this one key alone.
        return try device.sealingNewFileKey(for: protectionClass, associatedData: associatedData)
    }

    /// Zeroes every key not handed out yet.
    func discardAll() {
        let discarded: [Batch] = mutex.withLock {
            generation += 1
            defer { batches.removeAll() }
            return Array(batches.values)
        }
        discarded.forEach { $0.keys.discard() }
    }

    /// The next key of the template's batch, copied into guarded memory of its own and zeroed in the batch. Caller
    /// holds `mutex`.
    private func handOut(_ template: Template) throws -> NewWrappedFileKey? {
        guard let batch = batches[template] else { return nil }
        let index = batch.next
        batch.next += 1
        if batch.next == batch.fileIDs.count { batches[template] = nil }
        let keyBytes = FileHeader.fileKeyBytes
        let fileKey = try batch.keys.withUnsafeBytes { all in
            SecureBytes(count: keyBytes) { out in
                out.copyMemory(from: UnsafeRawBufferPointer(rebasing: all[index * keyBytes..<(index + 1) * keyBytes]))
            }
        }
        try batch.keys.withUnsafeBytes { all in
            zeroize(UnsafeMutableRawPointer(mutating: all.baseAddress! + index * keyBytes), count: keyBytes)
        }
        if batches[template] == nil { batch.keys.discard() }
        return NewWrappedFileKey(fileKey: fileKey, fileID: batch.fileIDs[index], sealed: batch.sealed[index])
    }

    /// Draws a batch of keys and file ids and has the daemon seal them, in one round trip.
    private func fetch(_ template: Template, associatedData: ([UInt8]) -> [UInt8]) throws -> Batch {
        let count = Self.batchSize
        let keys = SecureBytes.random(count: count * FileHeader.fileKeyBytes)
        let fileIDs = (0..<count).map { _ in Random.bytes(FileHeader.idBytes) }
        do {
            let sealed = try link.wrapFileKeys(keys, for: template.protectionClass, associatedData: fileIDs.map(associatedData))
            return Batch(keys: keys, fileIDs: fileIDs, sealed: sealed)
        } catch {
            keys.discard()
            throw error
        }
    }
}
