import Foundation

/// Objects held weakly, for registries that must not keep their members alive.
final class WeakSet<Element: AnyObject>: @unchecked Sendable {
    private struct Entry {
        weak var element: Element?
    }

    private let mutex = NSLock()
    private var entries: [ObjectIdentifier: Entry] = [:]

    func insert(_ element: Element) { mutex.withLock { entries[ObjectIdentifier(element)] = Entry(element: element) } }

    func remove(_ element: Element) { _ = mutex.withLock { entries.removeValue(forKey: ObjectIdentifier(element)) } }

    /// The members still alive; the dead are dropped.
    var members: [Element] {
        mutex.withLock {
            entries = entries.filter { $0.value.element != nil }
            return entries.values.compactMap(\.element)
        }
    }
}
