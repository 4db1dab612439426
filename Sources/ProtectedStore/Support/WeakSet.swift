import Foundation
import ProtectedStoreCore

/// Objects held weakly, for registries that must not keep their members alive.
final class WeakSet<Element: AnyObject>: @unchecked Sendable {
    private struct Entry {
        weak var element: Element?
    }

    private let mutex = NSLock()
    private var entries: [ObjectIdentifier: Entry] = [:]

    func insert(_ element: Element) { mutex.withLock { entries[ObjectIdentifier(element)] = Entry(element: element) } }

    /// The members still alive; the dead are dropped. Weak references are loaded outside the mutex: loading one can
    /// make this the last strong reference, and the member's deinit must not run under it.
    var members: [Element] {
        let snapshot = mutex.withLock { entries }
        let alive = snapshot.compactMapValues(\.element)
        if alive.count < snapshot.count {
            mutex.withLock { entries = entries.filter { alive[$0.key] != nil || snapshot[$0.key] == nil } }
        }
        return Array(alive.values)
    }
}
