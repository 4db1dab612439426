import Dispatch
import Foundation

/// Delivers protected-data events to the three kinds of observer and tells the caller when all are done.
///
/// Every observer gets its events in order, each on its own queue, so one slow observer delays nobody else's delivery.
final class EventDispatcher: @unchecked Sendable {
    private struct DelegateEntry {
        weak var delegate: (any ProtectedDataDelegate)?
        let queue: DispatchQueue
    }

    private struct SubscriptionEntry {
        weak var subscription: EventSubscription?
    }

    let notificationCenter: NotificationCenter
    private let mutex = NSLock()
    private var delegates: [ObjectIdentifier: DelegateEntry] = [:]
    private var subscriptions: [ObjectIdentifier: SubscriptionEntry] = [:]
    private let notificationQueue = DispatchQueue(label: "ProtectedStore.notifications")

    init(notificationCenter: NotificationCenter) { self.notificationCenter = notificationCenter }

    func add(_ delegate: any ProtectedDataDelegate) {
        mutex.withLock {
            delegates[ObjectIdentifier(delegate)] = DelegateEntry(delegate: delegate, queue: DispatchQueue(label: "ProtectedStore.delegate"))
        }
    }

    func remove(_ delegate: any ProtectedDataDelegate) {
        _ = mutex.withLock { delegates.removeValue(forKey: ObjectIdentifier(delegate)) }
    }

    func subscribe() -> EventSubscription {
        let subscription = EventSubscription { [weak self] id in
            guard let self else { return }
            _ = mutex.withLock { self.subscriptions.removeValue(forKey: id) }
        }
        mutex.withLock { subscriptions[ObjectIdentifier(subscription)] = SubscriptionEntry(subscription: subscription) }
        return subscription
    }

    /// Hands `event` to every observer now; the returned group is left by each observer once it has handled it.
    func deliver(_ event: ProtectedDataEvent, from device: Device) -> DispatchGroup {
        let group = DispatchGroup()
        let (delegates, subscriptions) = mutex.withLock {
            self.delegates = self.delegates.filter { $0.value.delegate != nil }
            self.subscriptions = self.subscriptions.filter { $0.value.subscription != nil }
            return (Array(self.delegates.values), self.subscriptions.values.compactMap(\.subscription))
        }
        for entry in delegates {
            guard let delegate = entry.delegate else { continue }
            group.enter()
            entry.queue.async {
                switch event {
                case .willBecomeUnavailable: delegate.protectedDataWillBecomeUnavailable(device)
                case .didBecomeAvailable: delegate.protectedDataDidBecomeAvailable(device)
                }
                group.leave()
            }
        }
        for subscription in subscriptions {
            group.enter()
            subscription.enqueue(event) { group.leave() }
        }
        group.enter()
        let center = notificationCenter
        notificationQueue.async {
            let name = event == .willBecomeUnavailable ? Device.protectedDataWillBecomeUnavailableNotification : Device.protectedDataDidBecomeAvailableNotification
            center.post(name: name, object: device)
            group.leave()
        }
        return group
    }
}
