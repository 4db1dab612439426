import Dispatch
import Foundation

/// Delivers protected-data events to the three kinds of observer and tells the caller when all are done.
///
/// Every observer gets its events in order, each on its own queue, so one slow observer delays nobody else's delivery.
final class EventDispatcher: @unchecked Sendable {
    private struct DelegateEntry {
        /// Identity at registration, so `remove` never has to load the weak reference.
        let identity: ObjectIdentifier
        weak var delegate: (any ProtectedDataDelegate)?
        let queue: DispatchQueue
    }

    private struct SubscriptionEntry {
        weak var subscription: EventSubscription?
    }

    let notificationCenter: NotificationCenter
    private let mutex = NSLock()
    // Keyed by a counter, never by address: a dead observer's address can be reused by a new one.
    private var nextToken: UInt64 = 0
    private var delegates: [UInt64: DelegateEntry] = [:]
    private var subscriptions: [UInt64: SubscriptionEntry] = [:]
    private var handlers: [UInt64: Handler] = [:]
    private let notificationQueue = DispatchQueue(label: "ProtectedStore.notifications")

    init(notificationCenter: NotificationCenter) { self.notificationCenter = notificationCenter }

    func add(_ delegate: any ProtectedDataDelegate) {
        let entry = DelegateEntry(identity: ObjectIdentifier(delegate), delegate: delegate, queue: DispatchQueue(label: "ProtectedStore.delegate"))
        mutex.withLock {
            // Adding a delegate twice registers it once, as NotificationCenter-style APIs users expect.
            delegates = delegates.filter { $0.value.identity != entry.identity }
            nextToken += 1
            delegates[nextToken] = entry
        }
    }

    func remove(_ delegate: any ProtectedDataDelegate) {
        let identity = ObjectIdentifier(delegate)
        mutex.withLock { delegates = delegates.filter { $0.value.identity != identity } }
    }

    /// An in-library observer (the key daemon) that is handed each event synchronously and must not block. It calls
    /// `handedOver` once it has passed the event on (to every remote subscriber's socket) and `done` when it has
    /// finished with it (for a lock: when every remote subscriber has acknowledged).
    typealias Handler = @Sendable (ProtectedDataEvent, _ handedOver: @escaping @Sendable () -> Void, _ done: @escaping @Sendable () -> Void) -> Void

    func addHandler(_ handler: @escaping Handler) {
        mutex.withLock {
            nextToken += 1
            handlers[nextToken] = handler
        }
    }

    func subscribe() -> EventSubscription {
        let token: UInt64 = mutex.withLock {
            nextToken += 1
            return nextToken
        }
        let subscription = EventSubscription { [weak self] in
            guard let self else { return }
            _ = mutex.withLock { self.subscriptions.removeValue(forKey: token) }
        }
        mutex.withLock { subscriptions[token] = SubscriptionEntry(subscription: subscription) }
        return subscription
    }

    /// Hands `event` to every observer now. `handedOver` is left once every observer has been given the event
    /// (its delegate method entered, its notification being posted, or the event queued in its sequence);
    /// `done` once every observer has finished handling it.
    func deliver(_ event: ProtectedDataEvent, from device: Device) -> (handedOver: DispatchGroup, done: DispatchGroup) {
        let handedOver = DispatchGroup()
        let done = DispatchGroup()
        // Weak references are loaded outside the mutex: loading one can make this the last strong reference,
        // and the observer's deinit (ending a subscription, removing a delegate) takes the mutex itself.
        let (delegateEntries, subscriptionEntries, handlerEntries) = mutex.withLock { (delegates, subscriptions, handlers) }
        var gone: [UInt64] = []
        for (id, entry) in delegateEntries {
            guard let delegate = entry.delegate else {
                gone.append(id)
                continue
            }
            handedOver.enter()
            done.enter()
            entry.queue.async {
                handedOver.leave()
                switch event {
                case .willBecomeUnavailable: delegate.protectedDataWillBecomeUnavailable(device)
                case .didBecomeAvailable: delegate.protectedDataDidBecomeAvailable(device)
                }
                done.leave()
            }
        }
        for (id, entry) in subscriptionEntries {
            guard let subscription = entry.subscription else {
                gone.append(id)
                continue
            }
            done.enter()
            subscription.enqueue(event) { done.leave() }
        }
        for handler in handlerEntries.values {
            handedOver.enter()
            done.enter()
            let passedOn = OnceFlag(), finished = OnceFlag()
            handler(event, { if passedOn.claim() { handedOver.leave() } }, { if finished.claim() { done.leave() } })
        }
        handedOver.enter()
        done.enter()
        let center = notificationCenter
        notificationQueue.async {
            handedOver.leave()
            let name = event == .willBecomeUnavailable ? Device.protectedDataWillBecomeUnavailableNotification : Device.protectedDataDidBecomeAvailableNotification
            center.post(name: name, object: device)
            done.leave()
        }
        if !gone.isEmpty {
            mutex.withLock {
                for id in gone {
                    delegates.removeValue(forKey: id)
                    subscriptions.removeValue(forKey: id)
                }
            }
        }
        return (handedOver, done)
    }
}

/// True for the first caller of `claim()` only.
final class OnceFlag: @unchecked Sendable {
    private let mutex = NSLock()
    private var claimed = false

    func claim() -> Bool {
        mutex.withLock {
            defer { claimed = true }
            return !claimed
        }
    }
}
