import Foundation
import ProtectedStore

/// Collects, in the order this process received them, the protected-data events of a device, the open-URL events of
/// a container, and the marks the code under test adds, so a test can assert what happened in which order.
///
/// It observes as one more delegate: every observer of a device gets the same events in the same order, so what it
/// records is what the code under test was given. The `expect` methods throw `EventExpectationFailure`, which fails
/// an XCTest or Swift Testing test alike.
public final class EventRecorder: @unchecked Sendable, ProtectedDataDelegate, OpenURLDelegate {
    /// One recorded event.
    public enum Event: Equatable, Sendable, CustomStringConvertible {
        /// `protectedDataWillBecomeUnavailable`.
        case willBecomeUnavailable
        /// `protectedDataDidBecomeAvailable`.
        case didBecomeAvailable
        /// An open-URL event for the item at this container path, such as `Documents/Inbox/note.txt`.
        case openURL(String)
        /// A label the code under test recorded with `mark(_:)`.
        case mark(String)

        public var description: String {
            switch self {
            case .willBecomeUnavailable: "will become unavailable"
            case .didBecomeAvailable: "did become available"
            case .openURL(let path): "open URL \(path)"
            case .mark(let label): "mark \"\(label)\""
            }
        }
    }

    private let recordsOpenURLs: Bool
    private let mutex = NSLock()
    private var recorded: [Event] = []

    init(recordsOpenURLs: Bool) { self.recordsOpenURLs = recordsOpenURLs }

    /// Starts recording a device's events (and its container's open-URL events); what was recorded stays.
    public func attach(to device: Device, container: Container? = nil) {
        device.addDelegate(self)
        guard recordsOpenURLs, let container else { return }
        container.addOpenURLDelegate(self)
    }

    /// Stops recording a device's (and its container's) events.
    public func detach(from device: Device, container: Container? = nil) {
        device.removeDelegate(self)
        container?.removeOpenURLDelegate(self)
    }

    /// Everything recorded so far, oldest first.
    public var events: [Event] { mutex.withLock { recorded } }

    /// Records a label at this point, so a test can check where the code under test acted relative to the events.
    public func mark(_ label: String) { append(.mark(label)) }

    /// Forgets everything recorded so far.
    public func reset() {
        mutex.withLock { recorded = [] }
    }

    // MARK: Expectations

    /// Throws unless exactly `expected` was recorded, in that order.
    public func expectEvents(_ expected: [Event], sourceLocation: StaticString = #fileID, line: UInt = #line) throws {
        let actual = events
        guard actual != expected else { return }
        throw EventExpectationFailure(problem: "expected exactly \(Self.list(expected)), recorded \(Self.list(actual))", location: "\(sourceLocation):\(line)")
    }

    /// Throws unless `expected` was recorded in that order, other events possibly in between.
    public func expectOrder(_ expected: Event..., sourceLocation: StaticString = #fileID, line: UInt = #line) throws {
        let actual = events
        var remaining = expected[...]
        for event in actual where event == remaining.first { remaining.removeFirst() }
        guard let missing = remaining.first else { return }
        throw EventExpectationFailure(problem: "expected \(Self.list(expected)) in this order; \(missing) is missing after the ones before it, recorded \(Self.list(actual))",
                                      location: "\(sourceLocation):\(line)")
    }

    /// Waits until `condition` holds for the recorded events, and throws if it does not within `timeout` seconds.
    /// For events the test did not cause through `TestDevice`, such as a delivery by another process.
    public func waitUntil(timeout: TimeInterval = 10, sourceLocation: StaticString = #fileID, line: UInt = #line,
                          _ condition: @Sendable ([Event]) -> Bool) async throws {
        let deadline = Date().addingTimeInterval(timeout)
        while !condition(events) {
            guard Date() < deadline else {
                throw EventExpectationFailure(problem: "the condition did not hold within \(timeout) s; recorded \(Self.list(events))", location: "\(sourceLocation):\(line)")
            }
            try await Task.sleep(nanoseconds: 5_000_000)
        }
    }

    private static func list(_ events: [Event]) -> String { events.isEmpty ? "nothing" : "[" + events.map(\.description).joined(separator: ", ") + "]" }

    // MARK: Observing

    /// Records ``Event/willBecomeUnavailable``.
    public func protectedDataWillBecomeUnavailable(_ device: Device) { append(.willBecomeUnavailable) }

    /// Records ``Event/didBecomeAvailable``.
    public func protectedDataDidBecomeAvailable(_ device: Device) { append(.didBecomeAvailable) }

    /// Records ``Event/openURL(_:)`` with the item's path relative to the container.
    public func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {
        let dataPath = container.dataPath
        append(.openURL(url.path.hasPrefix(dataPath + "/") ? String(url.path.dropFirst(dataPath.count + 1)) : url.path))
    }

    private func append(_ event: Event) { mutex.withLock { recorded.append(event) } }
}

/// An expectation of `EventRecorder` that did not hold: what was expected, what was recorded, and where.
public struct EventExpectationFailure: Error, CustomStringConvertible {
    /// What was expected and what was recorded instead.
    public let problem: String
    /// The test's file and line.
    public let location: String

    public var description: String { "\(location): \(problem)" }
}
