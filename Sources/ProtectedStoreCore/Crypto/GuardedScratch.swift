import CSodium
import Foundation

/// Guarded memory handed out in fixed-size slots carved from `sodium_malloc` regions (guard pages around each region,
/// mlocked, excluded from core dumps), zeroed as they are given back and kept for reuse. Two pools: one for the
/// key material of one operation (an AES-256-GCM block key and its expanded state), and one for small secrets such
/// as file keys, which a mount opens and drops by the thousand: a `sodium_malloc` of its own for each cost an mmap,
/// four mprotects, an mlock and an munmap, whose TLB shoot-down interrupts every core.
final class GuardedScratch: @unchecked Sendable {
    /// Slots of 1024 bytes, 1024-byte aligned, as libsodium's AES state (16-byte aligned) needs.
    static let shared = GuardedScratch(slotSize: 1024, slotsPerRegion: 64)
    /// Slots of 64 bytes for `SecureBytes` of at most that many bytes (keys, seeds, derived subkeys).
    static let smallSecrets = GuardedScratch(slotSize: 64, slotsPerRegion: 256)

    /// Bytes per slot.
    let slotSize: Int
    private let slotsPerRegion: Int
    private let lock = NSLock()
    private var free: [UnsafeMutableRawPointer] = []

    init(slotSize: Int, slotsPerRegion: Int) {
        self.slotSize = slotSize
        self.slotsPerRegion = slotsPerRegion
    }

    /// A zeroed slot of `slotSize` bytes; give it back with `release`.
    func acquire() -> UnsafeMutableRawPointer {
        lock.withLock {
            if free.isEmpty { addRegion() }
            return free.removeLast()
        }
    }

    /// Zeroes the slot and returns it to the pool.
    func release(_ slot: UnsafeMutableRawPointer) {
        sodium_memzero(slot, slotSize)
        lock.withLock { free.append(slot) }
    }

    /// Regions are never freed: a pool only grows to the most slots ever in use at once (a few per thread for block
    /// keys; one per open file for file keys, 64 bytes each, where a `sodium_malloc` of its own locked a page).
    private func addRegion() {
        Sodium.ensureInitialised()
        let size = slotSize * slotsPerRegion
        // sodium_malloc places the region against its trailing guard page; a size that is a multiple of the slot size
        // keeps every slot aligned.
        guard let region = sodium_malloc(size) else {
            fatalError("sodium_malloc(\(size)) failed: out of memory or mlock limit reached (raise `ulimit -l`)")
        }
        sodium_memzero(region, size)
        for index in 0..<slotsPerRegion { free.append(region + index * slotSize) }
    }
}
