import CSodium
import Synchronization

/// Secret bytes (keys, passcodes) in libsodium's guarded memory: guard pages around, mlocked, zeroed when discarded or freed.
/// Up to 64 bytes take a slot of a shared guarded region (`GuardedScratch.smallSecrets`), larger ones a
/// `sodium_malloc` of their own.
///
/// It deliberately has no `==`, no printable contents and no way to copy the bytes out into ordinary memory
/// except inside `withUnsafeBytes`; compare with `constantTimeEquals(_:)`.
public final class SecureBytes: @unchecked Sendable {
    /// Number of secret bytes.
    public let count: Int
    private let storage: UnsafeMutableRawPointer
    // Readers are the crypto calls; the writer is `discard()`, so a lock never zeroes a key mid-operation.
    private let lock = ReadWriteLock()
    // Set before `discard()` waits for the uses in flight; uses that begin after it throw at once. glibc's rwlock
    // prefers readers, so without it a stream of overlapping reads could hold a device lock's discard off for ever.
    private let discardRequested = Atomic<Bool>(false)

    /// Allocates `count` zeroed bytes of guarded memory.
    init(count: Int) {
        self.count = count
        storage = Self.allocate(count)
        sodium_memzero(storage, count)
    }

    /// Allocates guarded memory and lets `initialiser` fill it, so the secret never sits in ordinary memory.
    package init(count: Int, initialiser: (UnsafeMutableRawBufferPointer) throws -> Void) rethrows {
        self.count = count
        storage = Self.allocate(count)
        // Every stored property is set, so if this throws, deinit frees the memory (freeing it here too would put
        // one slot in the pool twice).
        try initialiser(UnsafeMutableRawBufferPointer(start: storage, count: count))
    }

    private static func allocate(_ count: Int) -> UnsafeMutableRawPointer {
        precondition(count > 0, "SecureBytes needs at least one byte")
        if count <= GuardedScratch.smallSecrets.slotSize { return GuardedScratch.smallSecrets.acquire() }
        Sodium.ensureInitialised()
        guard let pointer = sodium_malloc(count) else {
            fatalError("sodium_malloc(\(count)) failed: out of memory or mlock limit reached (raise `ulimit -l`)")
        }
        return pointer
    }

    /// Zeroes and frees (sodium_free zeroes the region before unmapping it).
    private static func deallocate(_ storage: UnsafeMutableRawPointer, count: Int) {
        if count <= GuardedScratch.smallSecrets.slotSize {
            GuardedScratch.smallSecrets.release(storage)
        } else {
            sodium_free(storage)
        }
    }

    /// Fresh random bytes, e.g. a new key.
    package static func random(count: Int) -> SecureBytes {
        SecureBytes(count: count) { Random.fill($0) }
    }

    deinit { Self.deallocate(storage, count: count) }

    /// Whether `discard()` has zeroed this secret or is waiting to.
    public var isDiscarded: Bool { discardRequested.load(ordering: .acquiring) }

    /// Runs `body` with the secret bytes; throws `SecureBytes.Discarded` once `discard()` was called.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        if discardRequested.load(ordering: .acquiring) { throw Discarded() }
        return try lock.withReadLock {
            // Asked again: the discard may have come between the first look and the lock, and zeroed the bytes.
            if discardRequested.load(ordering: .acquiring) { throw Discarded() }
            return try body(UnsafeRawBufferPointer(start: storage, count: count))
        }
    }

    /// Zeroes the secret now, waiting for operations in flight; uses that begin from now on throw `Discarded`.
    public func discard() {
        discardRequested.store(true, ordering: .releasing)
        lock.withWriteLock { sodium_memzero(storage, count) }
    }

    /// Compares two secrets in time independent of their contents.
    public func constantTimeEquals(_ other: SecureBytes) throws -> Bool {
        try withUnsafeBytes { mine in
            try other.withUnsafeBytes { theirs in constantTimeEqual(mine, theirs) }
        }
    }

    /// Thrown by `withUnsafeBytes` after `discard()`.
    public struct Discarded: Error, CustomStringConvertible {
        public var description: String { "the key was discarded (the device locked)" }
    }
}

extension SecureBytes: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String { "SecureBytes(\(count) bytes, redacted)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: [], displayStyle: .class) }
}
