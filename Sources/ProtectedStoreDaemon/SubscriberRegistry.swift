import ProtectedStore
import ProtectedStoreCore

/// The daemon's subscribers and what each has been told, with at most one unacknowledged event per subscriber.
///
/// A subscriber that does not acknowledge (slow, or stopped with SIGSTOP) is sent nothing more; what happens meanwhile
/// is folded into its record, and when it acknowledges it gets one event per kind for the net change, as iOS coalesces
/// the notifications of a suspended app. So memory per subscriber is constant, whatever it misses.
package struct SubscriberRegistry {
    package typealias ID = UInt64

    /// What a subscriber is sent: the device's protection events, and a launched app's lifecycle events.
    package enum Event: Equatable {
        case protection(ProtectedDataEvent)
        case lifecycle(LifecycleEvent)
        case openURL(OpenURLPayload)

        package var wireName: String {
            switch self {
            case .protection(let event): event.wireName
            case .lifecycle(let event): event.wireName
            case .openURL: "open-url"
            }
        }

        package var isLifecycle: Bool {
            if case .lifecycle = self { true } else { false }
        }

        /// Sent before the protection events a subscriber missed and before open-URL events: every lifecycle event
        /// but *did become active*, which comes last (after *will enter foreground*, the net change, then URLs to open).
        package var goesFirst: Bool { isLifecycle && self != .lifecycle(.didBecomeActive) }

        /// A launched app's own event (lifecycle or open-URL), which the daemon waits for per app.
        package var isAppEvent: Bool {
            if case .protection = self { false } else { true }
        }
    }

    /// An event to send now.
    package struct Delivery: Equatable {
        package let subscriber: ID
        package let event: Event
        package let seq: UInt64
    }

    private struct Subscriber {
        /// The last protection event sent: what the subscriber believes.
        var view: ProtectedDataEvent
        var outstanding: (seq: UInt64, event: Event)?
        /// A lock began after `view` was sent while the subscriber was busy; its open class A handles died with it.
        var missedLock = false
        /// App events (lifecycle, open-URL) waiting for the outstanding one's acknowledgement, lifecycle ones first;
        /// they go before any protection event.
        var pendingAppEvents: [Event] = []
        /// Its app is suspended (stopped): protection events are folded, not sent, and no lock waits for it.
        var suspended = false
        /// Its app was suspended since `view` was sent: its catch-up is the reference's, one event for the net change.
        var suspendedSinceView = false
    }

    private var subscribers: [ID: Subscriber] = [:]
    private var latest: ProtectedDataEvent?
    private var nextSeq: UInt64 = 0
    /// Subscribers present at the last *will become unavailable* that have not acknowledged it; nil when no lock waits.
    private var awaiting: Set<ID>?

    package init() {}

    package var count: Int { subscribers.count }

    /// True once every subscriber present at the last *will become unavailable* has acknowledged it (or left).
    package var lockAcknowledged: Bool { awaiting?.isEmpty ?? false }

    /// Forgets that a lock waits for acknowledgements (the caller has been told it completed).
    package mutating func lockCompleted() { awaiting = nil }

    /// Adds a subscriber that knows whether data is available now.
    package mutating func add(_ id: ID, available: Bool) {
        subscribers[id] = Subscriber(view: available ? .didBecomeAvailable : .willBecomeUnavailable)
    }

    package mutating func remove(_ id: ID) {
        subscribers.removeValue(forKey: id)
        awaiting?.remove(id)
    }

    /// A new event: sent at once to every idle subscriber, folded into the record of busy or suspended ones.
    package mutating func broadcast(_ event: ProtectedDataEvent) -> [Delivery] {
        latest = event
        // Not those it sends nothing to now and whose own handler may run long: a suspended app, one in the middle of
        // a lifecycle or open-URL event (its background time has its own limit). A subscriber only slow to acknowledge
        // an earlier protection event is waited for: its *will* follows at once.
        awaiting = event == .willBecomeUnavailable
            ? Set(subscribers.filter { !$0.value.suspended && !($0.value.outstanding?.event.isAppEvent ?? false) }.keys) : nil
        var deliveries: [Delivery] = []
        for (id, subscriber) in subscribers {
            if subscriber.outstanding == nil && !subscriber.suspended {
                deliveries.append(send(.protection(event), to: id))
            } else if event == .willBecomeUnavailable {
                subscribers[id]?.missedLock = true
            }
        }
        return deliveries
    }

    /// A lifecycle event for `ids` (one app's subscribers): sent now to those with nothing outstanding, else right
    /// after their acknowledgement, before open-URL and protection events.
    package mutating func send(_ event: LifecycleEvent, to ids: [ID]) -> [Delivery] {
        sendAppEvent(.lifecycle(event), to: ids)
    }

    /// An open-URL event for `ids`: sent now to those with nothing outstanding that are not suspended, else queued
    /// behind their lifecycle events and the protection events they missed.
    package mutating func send(_ payload: OpenURLPayload, to ids: [ID]) -> [Delivery] {
        sendAppEvent(.openURL(payload), to: ids)
    }

    private mutating func sendAppEvent(_ event: Event, to ids: [ID]) -> [Delivery] {
        ids.compactMap { id in
            guard let subscriber = subscribers[id] else { return nil }
            // Lifecycle events are sent around a suspension by the caller; nothing else reaches a stopped app.
            guard subscriber.outstanding == nil, event.isLifecycle || !subscriber.suspended else {
                var queue = subscriber.pendingAppEvents
                let position = event.goesFirst ? (queue.firstIndex { !$0.goesFirst } ?? queue.count) : queue.count
                queue.insert(event, at: position)
                subscribers[id]?.pendingAppEvents = queue
                return nil
            }
            return send(event, to: id)
        }
    }

    /// Marks a subscriber's app suspended or resumed. A suspended one is not waited for by a lock.
    package mutating func setSuspended(_ id: ID, _ suspended: Bool) {
        subscribers[id]?.suspended = suspended
        if suspended {
            subscribers[id]?.suspendedSinceView = true
            awaiting?.remove(id)
        }
    }

    /// The subscriber handled event `seq`: which event that was, and what to send it next (a waiting lifecycle event;
    /// else, unless its app is suspended, the next coalesced protection event if its view is behind, else a waiting
    /// open-URL event).
    package mutating func acknowledge(_ id: ID, seq: UInt64) -> (handled: Event?, next: [Delivery]) {
        guard var subscriber = subscribers[id], let outstanding = subscriber.outstanding, outstanding.seq == seq else { return (nil, []) }
        subscriber.outstanding = nil
        subscribers[id] = subscriber
        // Its view is *will* (this event, or one before it): it has closed what a lock needs closed.
        if subscriber.view == .willBecomeUnavailable { awaiting?.remove(id) }
        // Lifecycle events first, then the protection events it missed, then open-URL events and *did become active*:
        // after *will enter foreground* the net change comes before a URL to open (docs/DESIGN.md, "The app lifecycle").
        if let next = subscriber.pendingAppEvents.first, next.goesFirst {
            subscribers[id]?.pendingAppEvents.removeFirst()
            return (outstanding.event, [send(next, to: id)])
        }
        guard !subscriber.suspended else { return (outstanding.event, []) }
        let missed = catchUp(id)
        if !missed.isEmpty { return (outstanding.event, missed) }
        if let next = subscriber.pendingAppEvents.first {
            subscribers[id]?.pendingAppEvents.removeFirst()
            return (outstanding.event, [send(next, to: id)])
        }
        return (outstanding.event, [])
    }

    /// The protection event that brings the subscriber's view up to date, if any (one per kind, as iOS coalesces).
    /// A suspended app gets one event for the net change (the reference's rule for suspended apps): a lock and an
    /// unlock while it was stopped give *did become available* alone, which tells it to reopen what the lock revoked.
    /// A subscriber that was only slow gets *will*, then *did* (docs/PROTOCOL.md §4).
    private mutating func catchUp(_ id: ID) -> [Delivery] {
        guard let subscriber = subscribers[id] else { return [] }
        let available = (latest ?? subscriber.view) == .didBecomeAvailable
        if subscriber.view == .didBecomeAvailable && subscriber.missedLock {
            return [send(.protection(subscriber.suspendedSinceView && available ? .didBecomeAvailable : .willBecomeUnavailable), to: id)]
        }
        if subscriber.view == .willBecomeUnavailable && available {
            return [send(.protection(.didBecomeAvailable), to: id)]
        }
        return []
    }

    private mutating func send(_ event: Event, to id: ID) -> Delivery {
        nextSeq += 1
        if case .protection(let protection) = event {
            subscribers[id]?.view = protection
            subscribers[id]?.missedLock = false
            let suspended = subscribers[id]?.suspended ?? false
            subscribers[id]?.suspendedSinceView = suspended
        }
        subscribers[id]?.outstanding = (nextSeq, event)
        return Delivery(subscriber: id, event: event, seq: nextSeq)
    }
}
