import Foundation
import ProtectedStoreCore

/// A change of protected-data availability, named after UIApplication's.
public enum ProtectedDataEvent: String, Sendable, CustomStringConvertible {
    /// The device is locking: close protected files now; keys are discarded when every observer is done or the grace period ends.
    case willBecomeUnavailable
    /// The device was unlocked and every class key is usable again.
    case didBecomeAvailable

    public var description: String { rawValue }
}

/// Receives protected-data events, like UIApplicationDelegate's two methods. Called on a private serial queue per
/// delegate; returning from `protectedDataWillBecomeUnavailable(_:)` tells the device this delegate is done.
public protocol ProtectedDataDelegate: AnyObject, Sendable {
    /// The device is locking: close class A files and finish class A writes; the keys go once every observer returned.
    func protectedDataWillBecomeUnavailable(_ device: Device)
    /// The device was unlocked: class A files can be opened again.
    func protectedDataDidBecomeAvailable(_ device: Device)
}

extension Device {
    /// Posted (object: the device) when protected data will become unavailable; raw value as UIKit's.
    /// Observers run one after another on a private queue; the lock waits for the last one to return.
    public static let protectedDataWillBecomeUnavailableNotification = Notification.Name("UIApplicationProtectedDataWillBecomeUnavailable")
    /// Posted (object: the device) once protected data is available again; raw value as UIKit's.
    public static let protectedDataDidBecomeAvailableNotification = Notification.Name("UIApplicationProtectedDataDidBecomeAvailable")
}

/// The events of one device as an `AsyncSequence`, subscribed from the moment it was made.
///
/// Asking for the next event (or leaving the loop) tells the device that the previous one has been handled, so a
/// `for await` loop that closes its files in the loop body lets a lock proceed as soon as the body ends.
/// One consumer per sequence; make another sequence for another consumer.
public struct ProtectedDataEvents: AsyncSequence, Sendable {
    public typealias Element = ProtectedDataEvent
    let subscription: EventSubscription<ProtectedDataEvent>

    public func makeAsyncIterator() -> Iterator { Iterator(subscription: subscription, end: IterationEnd(subscription)) }

    /// Gives the events in order; asking for the next one acknowledges the previous one.
    public struct Iterator: AsyncIteratorProtocol {
        let subscription: EventSubscription<ProtectedDataEvent>
        let end: IterationEnd<ProtectedDataEvent>

        /// The next event; nil once the task is cancelled.
        public mutating func next() async -> ProtectedDataEvent? { await subscription.next() }
    }
}

/// One subscriber's buffer of undelivered events and the acknowledgement of the event it is handling.
final class EventSubscription<Event: Sendable>: @unchecked Sendable {
    private let mutex = NSLock()
    /// `handled(taken)`: taken is false for an event the consumer never received (the subscription ended first).
    typealias Handled = @Sendable (_ taken: Bool) -> Void
    private var buffered: [(event: Event, handled: Handled)] = []
    private var handling: Handled?
    private var waiter: CheckedContinuation<Event?, Never>?
    private var finished = false
    private let onEnd: @Sendable () -> Void

    init(onEnd: @escaping @Sendable () -> Void) { self.onEnd = onEnd }

    deinit {
        finish()
    }

    func enqueue(_ event: Event, handled: @escaping Handled) {
        let delivered: Bool = mutex.withLock {
            guard !finished else { return false }
            if let waiter {
                self.waiter = nil
                handling = handled
                waiter.resume(returning: event)
            } else {
                buffered.append((event, handled))
            }
            return true
        }
        if !delivered { handled(false) }
    }

    func next() async -> Event? {
        mutex.withLock { handling.take() }?(true)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                mutex.withLock {
                    if !buffered.isEmpty {
                        let first = buffered.removeFirst()
                        handling = first.handled
                        continuation.resume(returning: first.event)
                    } else if finished || Task.isCancelled {
                        continuation.resume(returning: nil)
                    } else {
                        precondition(waiter == nil, "an event sequence has one consumer; make another sequence for another consumer")
                        waiter = continuation
                    }
                }
            }
        } onCancel: {
            finish()
        }
    }

    /// The consumer stopped iterating (left its loop): the event it was handling is done.
    func endIteration() { mutex.withLock { handling.take() }?(true) }

    /// Ends the subscription: releases a waiting consumer and counts every pending event as handled (the one being
    /// handled as taken, the buffered ones as never received).
    func finish() {
        let ended: (unreceived: [Handled], current: Handled?, waiter: CheckedContinuation<Event?, Never>?)? = mutex.withLock {
            guard !finished else { return nil }
            finished = true
            defer { buffered = [] }
            return (buffered.map(\.handled), handling.take(), waiter.take())
        }
        guard let ended else { return }
        ended.waiter?.resume(returning: nil)
        ended.current?(true)
        ended.unreceived.forEach { $0(false) }
        onEnd()
    }
}

/// Dropped with its iterator: a loop that breaks or returns has handled the event it was given.
final class IterationEnd<Event: Sendable>: Sendable {
    private let subscription: EventSubscription<Event>

    init(_ subscription: EventSubscription<Event>) { self.subscription = subscription }

    deinit { subscription.endIteration() }
}
