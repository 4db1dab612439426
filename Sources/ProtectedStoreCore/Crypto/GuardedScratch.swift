import CSodium
import Foundation

/// Guarded memory for key material that lives for one operation (an AES-256-GCM block key and its expanded state):
/// fixed-size slots carved from `sodium_malloc` regions, zeroed as they are given back and kept for reuse, so a
/// per-block key costs no allocation and never touches ordinary memory.
final class GuardedScratch: @unchecked Sendable {
    static let shared = GuardedScratch()
    /// Bytes per slot; slots start 1024-byte aligned, as libsodium's AES state (16-byte aligned) needs.
    static let slotSize = 1024
    private static let slotsPerRegion = 64

    private let lock = NSLock()
    private var free: [UnsafeMutableRawPointer] = []

    /// A zeroed slot of `slotSize` bytes; give it back with `release`.
    func acquire() -> UnsafeMutableRawPointer {
        lock.withLock {
            if free.isEmpty { addRegion() }
            return free.removeLast()
        }
    }

    /// Zeroes the slot and returns it to the pool.
    func release(_ slot: UnsafeMutableRawPointer) {
        sodium_memzero(slot, Self.slotSize)
        lock.withLock { free.append(slot) }
    }

    /// Regions are never freed: the pool only grows to the most slots ever in use at once (a few per thread).
    private func addRegion() {
        Sodium.ensureInitialised()
        let size = Self.slotSize * Self.slotsPerRegion
        // sodium_malloc places the region against its trailing guard page; a size that is a multiple of the slot size
        // keeps every slot aligned.
        guard let region = sodium_malloc(size) else {
            fatalError("sodium_malloc(\(size)) failed: out of memory or mlock limit reached (raise `ulimit -l`)")
        }
        sodium_memzero(region, size)
        for index in 0..<Self.slotsPerRegion { free.append(region + index * Self.slotSize) }
    }
}
