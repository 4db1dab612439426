import ProtectedStore
import ProtectedStoreCore

/// The daemon's subscribers and what each has been told, with at most one unacknowledged event per subscriber.
///
/// A subscriber that does not acknowledge (slow, or stopped with SIGSTOP) is sent nothing more; what happens meanwhile
/// is folded into its record, and when it acknowledges it gets one event per kind for the net change, as iOS coalesces
/// the notifications of a suspended app. So memory per subscriber is constant, whatever it misses.
package struct SubscriberRegistry {
    typealias ID = UInt64

    /// An event to send now.
    struct Delivery: Equatable {
        let subscriber: ID
        let event: ProtectedDataEvent
        let seq: UInt64
    }

    private struct Subscriber {
        /// The last event sent: what the subscriber believes.
        var view: ProtectedDataEvent
        var outstanding: UInt64?
        /// A lock began after `view` was sent while the subscriber was busy; its open class A handles died with it.
        var missedLock = false
    }

    private var subscribers: [ID: Subscriber] = [:]
    private var latest: ProtectedDataEvent?
    private var nextSeq: UInt64 = 0
    /// Subscribers present at the last *will become unavailable* that have not acknowledged it; nil when no lock waits.
    private var awaiting: Set<ID>?

    var count: Int { subscribers.count }

    /// True once every subscriber present at the last *will become unavailable* has acknowledged it (or left).
    var lockAcknowledged: Bool { awaiting?.isEmpty ?? false }

    /// Forgets that a lock waits for acknowledgements (the caller has been told it completed).
    mutating func lockCompleted() { awaiting = nil }

    /// Adds a subscriber that knows whether data is available now.
    mutating func add(_ id: ID, available: Bool) {
        subscribers[id] = Subscriber(view: available ? .didBecomeAvailable : .willBecomeUnavailable)
    }

    mutating func remove(_ id: ID) {
        subscribers.removeValue(forKey: id)
        awaiting?.remove(id)
    }

    /// A new event: sent at once to every idle subscriber, folded into the record of busy ones.
    mutating func broadcast(_ event: ProtectedDataEvent) -> [Delivery] {
        latest = event
        awaiting = event == .willBecomeUnavailable ? Set(subscribers.keys) : nil
        var deliveries: [Delivery] = []
        for (id, subscriber) in subscribers {
            if subscriber.outstanding == nil {
                deliveries.append(send(event, to: id))
            } else if event == .willBecomeUnavailable {
                subscribers[id]?.missedLock = true
            }
        }
        return deliveries
    }

    /// The subscriber handled event `seq`: the next coalesced event, if its view is behind.
    mutating func acknowledge(_ id: ID, seq: UInt64) -> [Delivery] {
        guard var subscriber = subscribers[id], subscriber.outstanding == seq else { return [] }
        subscriber.outstanding = nil
        subscribers[id] = subscriber
        if subscriber.view == .willBecomeUnavailable { awaiting?.remove(id) }
        let available = (latest ?? subscriber.view) == .didBecomeAvailable
        if subscriber.view == .didBecomeAvailable && subscriber.missedLock {
            return [send(.willBecomeUnavailable, to: id)]
        }
        if subscriber.view == .willBecomeUnavailable && available {
            return [send(.didBecomeAvailable, to: id)]
        }
        return []
    }

    private mutating func send(_ event: ProtectedDataEvent, to id: ID) -> Delivery {
        nextSeq += 1
        subscribers[id]?.view = event
        subscribers[id]?.outstanding = nextSeq
        subscribers[id]?.missedLock = false
        return Delivery(subscriber: id, event: event, seq: nextSeq)
    }
}
