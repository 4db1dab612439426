import CSodium

/// Secret bytes (keys, passcodes) in libsodium's guarded memory: guard pages around, mlocked, zeroed when discarded or freed.
///
/// It deliberately has no `==`, no printable contents and no way to copy the bytes out into ordinary memory
/// except inside `withUnsafeBytes`; compare with `constantTimeEquals(_:)`.
public final class SecureBytes: @unchecked Sendable {
    /// Number of secret bytes.
    public let count: Int
    private let storage: UnsafeMutableRawPointer
    // Readers are the crypto calls; the writer is `discard()`, so a lock never zeroes a key mid-operation.
    private let lock = ReadWriteLock()
    private var discarded = false

    /// Allocates `count` zeroed bytes of guarded memory.
    init(count: Int) {
        precondition(count > 0, "SecureBytes needs at least one byte")
        Sodium.ensureInitialised()
        guard let pointer = sodium_malloc(count) else {
            fatalError("sodium_malloc(\(count)) failed: out of memory or mlock limit reached (raise `ulimit -l`)")
        }
        sodium_memzero(pointer, count)
        self.count = count
        self.storage = pointer
    }

    /// Allocates guarded memory and lets `initialiser` fill it, so the secret never sits in ordinary memory.
    package init(count: Int, initialiser: (UnsafeMutableRawBufferPointer) throws -> Void) rethrows {
        precondition(count > 0, "SecureBytes needs at least one byte")
        Sodium.ensureInitialised()
        guard let pointer = sodium_malloc(count) else {
            fatalError("sodium_malloc(\(count)) failed: out of memory or mlock limit reached (raise `ulimit -l`)")
        }
        self.count = count
        self.storage = pointer
        try initialiser(UnsafeMutableRawBufferPointer(start: pointer, count: count))
    }

    /// Fresh random bytes, e.g. a new key.
    package static func random(count: Int) -> SecureBytes {
        SecureBytes(count: count) { Random.fill($0) }
    }

    deinit {
        // sodium_free zeroes the region before unmapping it.
        sodium_free(storage)
    }

    /// Whether `discard()` has zeroed this secret.
    public var isDiscarded: Bool { lock.withReadLock { discarded } }

    /// Runs `body` with the secret bytes; throws `SecureBytes.Discarded` once the secret was discarded.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        try lock.withReadLock {
            if discarded { throw Discarded() }
            return try body(UnsafeRawBufferPointer(start: storage, count: count))
        }
    }

    /// Zeroes the secret now, waiting for operations in flight; later uses throw `Discarded`.
    public func discard() {
        lock.withWriteLock {
            sodium_memzero(storage, count)
            discarded = true
        }
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
