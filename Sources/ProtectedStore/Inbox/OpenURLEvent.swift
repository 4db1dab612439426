import Foundation
import ProtectedStoreCore

/// A file handed to the app through its Inbox: what UIKit passes to `application(_:open:sourceApplication:annotation:)`.
public struct OpenURLRequest: Sendable, Equatable, CustomStringConvertible {
    /// The item on disk (inside the container's data directory); open it through the container with `path`.
    public let url: URL
    /// The item's path relative to the container, `Documents/Inbox/<name>`.
    public let path: String
    /// The sending app's bundle identifier, if the sender gave one.
    public let sourceApplication: String?
    /// The sender's annotation as JSON text (a value that fits a property list), if any.
    public let annotationJSON: String?
    /// The delivery's position in the container's Inbox order.
    public let sequenceNumber: UInt64

    /// The annotation as a property-list object (dictionary, array, string, number or Bool), like UIKit's.
    public var annotation: Any? {
        annotationJSON.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8), options: .fragmentsAllowed) }
    }

    /// What `Container.openURLNotification` carries: the request, and the URL, source and annotation under UIKit's keys.
    var notificationUserInfo: [AnyHashable: Any] {
        var userInfo: [AnyHashable: Any] = [Container.openURLRequestKey: self, Container.openURLKey: url]
        if let sourceApplication { userInfo[Container.openURLSourceApplicationKey] = sourceApplication }
        if let annotation { userInfo[Container.openURLAnnotationKey] = annotation }
        return userInfo
    }

    public var description: String {
        "open URL \(path)" + (sourceApplication.map { " from \($0)" } ?? "") + (annotationJSON.map { " annotation \($0)" } ?? "")
    }
}

/// Receives a container's open-URL events, like UIApplicationDelegate's `application(_:open:sourceApplication:annotation:)`.
/// Called on a private serial queue per delegate; returning tells the container the item's event was handled.
public protocol OpenURLDelegate: AnyObject, Sendable {
    /// An item arrived in the container's Inbox: `url` is its file, which the app may read and delete.
    func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?)
}

/// An open-URL observer that passes whole requests on (`sandboxctl launch` relays them to the sandboxed app through
/// the daemon); returning means the event was handled, as for any delegate.
package protocol OpenURLRequestRelay: OpenURLDelegate {
    func relay(_ request: OpenURLRequest, from container: Container)
}

extension OpenURLRequestRelay {
    package func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {}
}

/// A container's open-URL events as an `AsyncSequence`; asking for the next one, or leaving the loop, marks the
/// previous one handled.
/// It keeps the container alive while it exists.
public struct OpenURLEvents: AsyncSequence, Sendable {
    public typealias Element = OpenURLRequest
    let container: Container
    let subscription: EventSubscription<OpenURLRequest>

    public func makeAsyncIterator() -> Iterator { Iterator(container: container, subscription: subscription, end: IterationEnd(subscription)) }

    /// Gives the events in delivery order; one consumer at a time.
    public struct Iterator: AsyncIteratorProtocol {
        let container: Container
        let subscription: EventSubscription<OpenURLRequest>
        let end: IterationEnd<OpenURLRequest>

        /// The next event; nil once the task is cancelled.
        public mutating func next() async -> OpenURLRequest? { await subscription.next() }
    }
}

extension Container {
    /// Posted (object: the container) for each open-URL event once `postOpenURLNotifications()` was called; the
    /// userInfo holds the request under `openURLRequestKey`, and the URL, source and annotation under UIKit's names.
    public static let openURLNotification = Notification.Name("ProtectedStoreContainerOpenURL")
    /// userInfo key of the `OpenURLRequest` in `openURLNotification`.
    public static let openURLRequestKey = "ProtectedStoreOpenURLRequest"
    /// userInfo key of the item's URL.
    public static let openURLKey = "UIApplicationLaunchOptionsURLKey"
    /// userInfo key of the sending app's bundle identifier.
    public static let openURLSourceApplicationKey = "UIApplicationOpenURLOptionsSourceApplicationKey"
    /// userInfo key of the annotation (a property-list object).
    public static let openURLAnnotationKey = "UIApplicationOpenURLOptionsAnnotationKey"

    // MARK: Receiving

    /// Adds a delegate (held weakly) for the container's open-URL events. Registering the first observer makes this
    /// program the container's receiver: items still pending (delivered while locked, or while no program listened)
    /// come first, in delivery order, once protected data is available — the analog of launch options carrying a URL.
    public func addOpenURLDelegate(_ delegate: any OpenURLDelegate) {
        inboxReceiver.dispatcher.add(delegate)
        inboxReceiver.observersChanged()
    }

    /// Stops sending open-URL events to `delegate`.
    public func removeOpenURLDelegate(_ delegate: any OpenURLDelegate) { receiverLock.withLock { receiver }?.dispatcher.remove(delegate) }

    /// A new subscription to the container's open-URL events (pending ones first); ends when dropped or its task is cancelled.
    public func openURLEvents() -> OpenURLEvents {
        let events = OpenURLEvents(container: self, subscription: inboxReceiver.dispatcher.subscribe())
        inboxReceiver.observersChanged()
        return events
    }

    /// Posts `openURLNotification` for every later open-URL event, and makes this program the container's receiver
    /// even without a delegate or sequence. Posting counts as handling: nothing tells which observer listened.
    public func postOpenURLNotifications() {
        inboxReceiver.dispatcher.startPostingNotifications()
        inboxReceiver.observersChanged()
    }
}
