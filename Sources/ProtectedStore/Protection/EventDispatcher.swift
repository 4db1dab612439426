import Dispatch
import Foundation
import ProtectedStoreCore

/// Delivers events from `Source` (a device's protected-data events, a container's open-URL events) to the three kinds
/// of observer (delegates, `AsyncSequence` subscriptions, notifications) and tells the caller when all are done.
///
/// Every observer gets its events in order, each on its own queue, so one slow observer delays nobody else's delivery.
package final class EventDispatcher<Event: Sendable, Source: AnyObject & Sendable>: @unchecked Sendable {
    /// Calls the delegate method for an event.
    typealias DelegateCall = @Sendable (_ delegate: any AnyObject & Sendable, Event, Source) -> Void
    /// Posts the notification for an event.
    typealias Post = @Sendable (NotificationCenter, Event, Source) -> Void

    private struct DelegateEntry {
        /// Identity at registration, so `remove` never has to load the weak reference.
        let identity: ObjectIdentifier
        weak var delegate: (any AnyObject & Sendable)?
        let queue: DispatchQueue
    }

    private struct SubscriptionEntry {
        weak var subscription: EventSubscription<Event>?
    }

    let notificationCenter: NotificationCenter
    private let callDelegate: DelegateCall
    private let post: Post
    private var isPostingNotifications: Bool
    private let mutex = NSLock()
    // Keyed by a counter, never by address: a dead observer's address can be reused by a new one.
    private var nextToken: UInt64 = 0
    private var delegates: [UInt64: DelegateEntry] = [:]
    private var subscriptions: [UInt64: SubscriptionEntry] = [:]
    private var handlers: [UInt64: Handler] = [:]
    private let notificationQueue = DispatchQueue(label: "ProtectedStore.notifications")
    /// Entered per delivery until every observer is done with it, so a test can wait for the observers to settle.
    private let inFlight = DispatchGroup()

    /// `postingNotifications` false: notifications start with `startPostingNotifications()`.
    init(notificationCenter: NotificationCenter, postingNotifications: Bool, callDelegate: @escaping DelegateCall, post: @escaping Post) {
        self.notificationCenter = notificationCenter
        self.isPostingNotifications = postingNotifications
        self.callDelegate = callDelegate
        self.post = post
    }

    func startPostingNotifications() { mutex.withLock { isPostingNotifications = true } }

    /// Whether anyone is listening: a live delegate or subscription, or notifications being posted.
    var hasObservers: Bool {
        let (delegateEntries, subscriptionEntries, posting) = mutex.withLock { (delegates, subscriptions, isPostingNotifications) }
        return posting || delegateEntries.values.contains { $0.delegate != nil } || subscriptionEntries.values.contains { $0.subscription != nil }
    }

    func add(_ delegate: any AnyObject & Sendable) {
        let entry = DelegateEntry(identity: ObjectIdentifier(delegate), delegate: delegate, queue: DispatchQueue(label: "ProtectedStore.delegate"))
        mutex.withLock {
            // Adding a delegate twice registers it once, as NotificationCenter-style APIs users expect.
            delegates = delegates.filter { $0.value.identity != entry.identity }
            nextToken += 1
            delegates[nextToken] = entry
        }
    }

    func remove(_ delegate: any AnyObject & Sendable) {
        let identity = ObjectIdentifier(delegate)
        mutex.withLock { delegates = delegates.filter { $0.value.identity != identity } }
    }

    /// An in-library observer (the key daemon) that is handed each event synchronously and must not block. It calls
    /// `handedOver` once it has passed the event on (to every remote subscriber's socket) and `done` when it has
    /// finished with it (for a lock: when every remote subscriber has acknowledged).
    package typealias Handler = @Sendable (Event, _ handedOver: @escaping @Sendable () -> Void, _ done: @escaping @Sendable () -> Void) -> Void

    package func addHandler(_ handler: @escaping Handler) {
        mutex.withLock {
            nextToken += 1
            handlers[nextToken] = handler
        }
    }

    /// Returns once every event delivered so far has been handled by every observer, or after `timeout` seconds;
    /// true if they were.
    func waitUntilIdle(timeout: TimeInterval) async -> Bool { await inFlight.settled(timeout: timeout) }

    func subscribe() -> EventSubscription<Event> {
        let token: UInt64 = mutex.withLock {
            nextToken += 1
            return nextToken
        }
        let subscription = EventSubscription<Event> { [weak self] in
            guard let self else { return }
            _ = mutex.withLock { self.subscriptions.removeValue(forKey: token) }
        }
        mutex.withLock { subscriptions[token] = SubscriptionEntry(subscription: subscription) }
        return subscription
    }

    /// Hands `event` to every observer now. `handedOver` is left once every observer has been given the event
    /// (its delegate method entered, its notification being posted, or the event queued in its sequence);
    /// `done` once every observer has finished handling it. `taken` counts, once `done`, the observers that actually
    /// received it (a subscription that ended with the event still buffered did not).
    @discardableResult
    func deliver(_ event: Event, from source: Source) -> (handedOver: DispatchGroup, done: DispatchGroup, taken: Counter) {
        let handedOver = DispatchGroup()
        let done = DispatchGroup()
        inFlight.enter()
        defer { done.notify(queue: .global()) { [inFlight] in inFlight.leave() } }
        // Weak references are loaded outside the mutex: loading one can make this the last strong reference,
        // and the observer's deinit (ending a subscription, removing a delegate) takes the mutex itself.
        let (delegateEntries, subscriptionEntries, handlerEntries, posting) = mutex.withLock { (delegates, subscriptions, handlers, isPostingNotifications) }
        var gone: [UInt64] = []
        let taken = Counter()
        for (id, entry) in delegateEntries {
            guard let delegate = entry.delegate else {
                gone.append(id)
                continue
            }
            handedOver.enter()
            done.enter()
            let callDelegate = callDelegate
            entry.queue.async {
                handedOver.leave()
                taken.increment()
                callDelegate(delegate, event, source)
                done.leave()
            }
        }
        for (id, entry) in subscriptionEntries {
            guard let subscription = entry.subscription else {
                gone.append(id)
                continue
            }
            done.enter()
            subscription.enqueue(event) { received in
                if received { taken.increment() }
                done.leave()
            }
        }
        for handler in handlerEntries.values {
            taken.increment()
            handedOver.enter()
            done.enter()
            let passedOn = OnceFlag(), finished = OnceFlag()
            handler(event, { if passedOn.claim() { handedOver.leave() } }, { if finished.claim() { done.leave() } })
        }
        if posting {
            taken.increment()
            handedOver.enter()
            done.enter()
            let center = notificationCenter, post = post
            notificationQueue.async {
                handedOver.leave()
                post(center, event, source)
                done.leave()
            }
        }
        if !gone.isEmpty {
            mutex.withLock {
                for id in gone {
                    delegates.removeValue(forKey: id)
                    subscriptions.removeValue(forKey: id)
                }
            }
        }
        return (handedOver, done, taken)
    }
}

extension DispatchGroup {
    /// Calls `body` once, without blocking a thread: with true when the group empties, or with false after `timeout`
    /// seconds if it has not by then (never, for an infinite timeout).
    func notify(timeout: TimeInterval, _ body: @escaping @Sendable (_ emptied: Bool) -> Void) {
        let once = OnceFlag()
        notify(queue: lockTimers) { if once.claim() { body(true) } }
        if timeout.isFinite {
            lockTimers.asyncAfter(deadline: .now() + timeout) { if once.claim() { body(false) } }
        }
    }

    /// Returns once the group is empty (at once if it already is), or after `timeout` seconds; true if it emptied.
    @discardableResult
    func settled(timeout: TimeInterval = .infinity) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            notify(timeout: timeout) { continuation.resume(returning: $0) }
        }
    }
}

/// A count shared between threads.
final class Counter: @unchecked Sendable {
    private let mutex = NSLock()
    private var count = 0

    func increment() { mutex.withLock { count += 1 } }
    var value: Int { mutex.withLock { count } }
}

/// True for the first caller of `claim()` only.
package final class OnceFlag: @unchecked Sendable {
    private let mutex = NSLock()
    private var claimed = false

    package init() {}

    package func claim() -> Bool {
        mutex.withLock {
            defer { claimed = true }
            return !claimed
        }
    }
}

/// Where the waits for observers end: a queue of its own, with a thread of its own, so a deadline holds when the global
/// pool is busy (on Linux it has a thread per core, and blocked or CPU-bound work from observers and big file
/// operations queues ahead of anything sent there). Only quick steps run here; a device's lock steps have its own.
let lockTimers = DispatchQueue(label: "ProtectedStore.lock-timers", qos: .userInitiated)
