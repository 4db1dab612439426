import Foundation

/// A value behind a pthread mutex (NSLock). Not the standard library's `Mutex`: on Linux that one waits on a raw
/// futex, which ThreadSanitizer can't see, so every contended access under it was reported as a race.
package final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    package init(_ value: Value) { self.value = value }

    package func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
