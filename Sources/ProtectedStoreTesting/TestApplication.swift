import Foundation
import ProtectedStore
import ProtectedStoreDaemon

/// A launched app for a user's test, without bubblewrap or a daemon: `application` is a real `Application`, and this
/// drives its lifecycle as `sandboxctl launch`, `interrupt`, `suspend`, `resume` and `terminate` do, with the same rules
/// and in the same order (the daemon's own event registry decides it), and hands it the test device's protected-data
/// events. Each call returns once the app's observers have handled what it sent (or their time ran out), as the
/// commands do.
///
/// A suspension here sends the app nothing more until `resume()`; its code is not frozen (it is the test's process).
/// An app "ended" (a background time overrun, `endBySystem()`) is closed: it gets no further event, as a killed app.
public final class TestApplication: @unchecked Sendable {
    /// Where the app is: the seeds' five states.
    public enum State: String, Sendable {
        /// Ended, or not launched.
        case notRunning
        /// Launching, or interrupted.
        case inactive
        /// In the foreground.
        case active
        /// In its background time.
        case background
        /// Sent nothing until `resume()`.
        case suspended
    }

    /// What a trip to the background ended in.
    public enum BackgroundOutcome: Sendable, Equatable {
        /// Every observer returned and every background task ended: the app is suspended.
        case suspended
        /// The app was ended, as iOS ends one that overruns its background time.
        case ended(reason: String)
    }

    /// The app under test: add its delegates, then `launch`.
    public let application: Application
    private let transport: InProcessAppTransport

    /// An app of `device` (its protected-data events reach the app); `backgroundTaskTime` is `launch
    /// --background-task-time`'s, `launchTimeout` `--launch-timeout`'s.
    public init(_ device: TestDevice, bundleIdentifier: String = TestDevice.defaultBundleIdentifier, notificationCenter: NotificationCenter = NotificationCenter(),
                launchTimeout: TimeInterval = 20, backgroundTaskTime: TimeInterval = 30) {
        transport = InProcessAppTransport(device: device.device, gracePeriod: device.gracePeriod, launchTimeout: launchTimeout,
                                          backgroundTaskTime: backgroundTaskTime)
        application = Application(bundleIdentifier: bundleIdentifier, transport: transport, available: device.device.state == .unlocked,
                                  state: .inactive, notificationCenter: notificationCenter)
    }

    deinit { transport.detach() }

    /// The app's state as the daemon would show it in `ps`.
    public var state: State { transport.state }

    /// *will finish launching* and *did finish launching* (with launch options naming `inboxItem`, a container path such
    /// as `Documents/Inbox/report.pdf`, when given), its open-URL event if both answered true, then *did become active*.
    /// Returns whether the app accepted the item; throws if its launch did not finish within the launch timeout (it is
    /// then ended).
    @discardableResult
    public func launch(openingInboxItem inboxItem: String? = nil, sourceApplication: String? = nil, annotationJSON: String? = nil) throws -> Bool {
        try application.postNotifications()
        let options = inboxItem.map { OpenURLPayload(path: $0, sourceApplication: sourceApplication, annotation: annotationJSON, sequence: 1) }
        return try transport.launch(options: options)
    }

    /// An interruption (a call, an alert): *will resign active*; the app is inactive.
    public func interrupt() { transport.interrupt(ending: false) }

    /// The interruption's end: *did become active*.
    public func endInterruption() { transport.interrupt(ending: true) }

    /// To the background: *will resign active* (if active), *did enter background*, its background tasks; then the
    /// suspension, or the end of an app that overran `backgroundTime` or left tasks open past the background task time.
    public func enterBackground(backgroundTime: TimeInterval = 5) -> BackgroundOutcome { transport.enterBackground(backgroundTime: backgroundTime) }

    /// Back to the foreground: *will enter foreground*, the protected-data change it missed, *did become active*.
    public func resume() { transport.resume() }

    /// As `sandboxctl terminate`: *will terminate* to a running app (within `timeout`); a suspended app is ended without
    /// notice.
    public func terminate(timeout: TimeInterval = 5) { transport.terminate(timeout: timeout) }

    /// The system ends the app (memory pressure, a reboot): no notice, whatever its state. State saved at *did enter
    /// background* is what a next launch finds.
    public func endBySystem() { transport.end() }

    /// As `sandboxctl memory-warning`: *did receive memory warning* to a running app, returning once its observers
    /// have handled it (within `timeout`); false, and nothing sent, for a suspended or ended app.
    @discardableResult
    public func memoryWarning(timeout: TimeInterval = 5) -> Bool { transport.memoryWarning(timeout: timeout) }

    /// As the clock set, local midnight or a daylight-saving transition: *significant time change* to a running app
    /// (returning once its observers handled it); a suspended app gets one at its resume, however many came.
    public func significantTimeChange() { transport.significantTimeChange() }
}

/// The daemon's part, in-process: one subscriber in a `SubscriberRegistry`, events as notices to the `Application`,
/// acknowledgements waited for on a condition. Every method but the notices' callback runs on the caller's thread.
private final class InProcessAppTransport: ApplicationTransport, ProtectedDataDelegate, @unchecked Sendable {
    private let device: Device
    /// A significant time change came while suspended: sent at the resume.
    private var timeChangePending = false
    private let gracePeriod: TimeInterval
    private let launchTimeout: TimeInterval
    private let backgroundTaskTime: TimeInterval
    private let condition = NSCondition()
    // Under `condition`.
    private var registry = SubscriberRegistry()
    private var onNotice: (@Sendable (DaemonLink.Notice) -> Void)?
    private var subscribed = false
    /// The daemon's own record of an app's state and its moves; `ending` once the app is ended here.
    private var lifecycle = AppLifecycle()
    private var launchOptions: OpenURLPayload?
    /// Acknowledged events: their answers (a launch event's `accepted`).
    private var acknowledged: [UInt64: Bool] = [:]
    /// The events sent, with their seq, latest last.
    private var sent: [(event: SubscriberRegistry.Event, seq: UInt64)] = []
    private var tasks: Set<UInt64> = []
    private var nextTask: UInt64 = 0

    init(device: Device, gracePeriod: TimeInterval, launchTimeout: TimeInterval, backgroundTaskTime: TimeInterval) {
        self.device = device
        self.gracePeriod = gracePeriod
        self.launchTimeout = launchTimeout
        self.backgroundTaskTime = backgroundTaskTime
        registry.add(1, available: device.state == .unlocked)
        device.addDelegate(self)
    }

    func detach() { device.removeDelegate(self) }

    var state: TestApplication.State { condition.withLock { currentState } }

    /// Under `condition`.
    private var currentState: TestApplication.State {
        lifecycle.ending ? .notRunning : TestApplication.State(rawValue: lifecycle.state.rawValue) ?? .notRunning
    }

    // MARK: ApplicationTransport

    func start(_ onNotice: @escaping @Sendable (DaemonLink.Notice) -> Void) { condition.withLock { self.onNotice = onNotice } }

    func subscribe() throws -> DaemonReply? {
        condition.withLock {
            guard !subscribed else { return nil }
            subscribed = true
            var reply = DaemonReply(id: 0)
            reply.state = device.state.rawValue
            return reply
        }
    }

    func acknowledge(seq: UInt64, connection: UInt64, accepted: Bool?) {
        let deliveries: [SubscriberRegistry.Delivery] = condition.withLock {
            let (_, next) = registry.acknowledge(1, seq: seq)
            acknowledged[seq] = accepted ?? true
            condition.broadcast()
            return next
        }
        deliver(deliveries)
    }

    /// The app's keychain in this process, as the daemon would open it: the app's bundle identifier is its one group.
    func keychainBackend(bundleIdentifier: String) throws -> any KeychainBackend {
        try KeychainStore(device: device, accessGroups: .only([bundleIdentifier]))
    }

    func reply(to request: DaemonRequest) throws -> DaemonReply {
        condition.withLock {
            var status = AppStatus(bundle: "", pid: 0, state: currentState.rawValue, since: lifecycle.since.timeIntervalSince1970)
            status.remaining = lifecycle.backgroundTimeRemaining
            switch request.operation {
            case .appTaskBegin:
                if lifecycle.mayBeginBackgroundTask {
                    nextTask += 1
                    tasks.insert(nextTask)
                    status.task = nextTask
                } else {
                    status.task = 0
                }
            case .appTaskEnd:
                if let task = request.task { tasks.remove(task) }
                condition.broadcast()
            default:
                break
            }
            var reply = DaemonReply(id: request.id)
            reply.apps = [status]
            return reply
        }
    }

    func close() {}

    // MARK: The device's events

    func protectedDataWillBecomeUnavailable(_ device: Device) { broadcast(.willBecomeUnavailable) }
    func protectedDataDidBecomeAvailable(_ device: Device) { broadcast(.didBecomeAvailable) }

    /// As the daemon does: sent at once unless the app is busy or suspended; a lock waits (within the grace period)
    /// for the app to acknowledge it.
    private func broadcast(_ event: ProtectedDataEvent) {
        let deliveries = condition.withLock { lifecycle.ending ? [] : registry.broadcast(event) }
        deliver(deliveries)
        guard event == .willBecomeUnavailable else { return }
        condition.withLock {
            let deadline = Date().addingTimeInterval(gracePeriod)
            while !registry.lockAcknowledged, !lifecycle.ending, condition.wait(until: deadline) {}
            registry.lockCompleted()
        }
    }

    // MARK: The lifecycle

    func launch(options: OpenURLPayload?) throws -> Bool {
        condition.withLock { launchOptions = options }
        let will = send(.lifecycle(.willFinishLaunching), timeout: launchTimeout)
        let did = will.returned ? send(.lifecycle(.didFinishLaunching), timeout: launchTimeout) : will
        condition.withLock { launchOptions = nil }
        guard will.returned, did.returned else {
            end()
            throw ProtectedStoreError(.io, path: nil, problem: "the app did not finish launching within \(launchTimeout) s", remedy: "Return from the launch methods sooner")
        }
        let accepted = will.accepted && did.accepted
        if let options, accepted { _ = send(.openURL(options), timeout: launchTimeout) }
        condition.withLock { _ = lifecycle.finishLaunching() }
        _ = send(.lifecycle(.didBecomeActive), timeout: launchTimeout)
        return accepted
    }

    func significantTimeChange() {
        let running: Bool = condition.withLock {
            guard !lifecycle.ending else { return false }
            if lifecycle.state == .suspended { timeChangePending = true }
            return lifecycle.state != .suspended
        }
        if running { _ = send(.lifecycle(.significantTimeChange), timeout: 5) }
    }

    func memoryWarning(timeout: TimeInterval) -> Bool {
        let running = condition.withLock { lifecycle.state != .suspended && !lifecycle.ending }
        if running { _ = send(.lifecycle(.didReceiveMemoryWarning), timeout: timeout) }
        return running
    }

    func interrupt(ending: Bool) {
        let moved = condition.withLock { lifecycle.interrupt(ending: ending) }
        if moved { _ = send(.lifecycle(ending ? .didBecomeActive : .willResignActive), timeout: 5) }
    }

    func enterBackground(backgroundTime: TimeInterval) -> TestApplication.BackgroundOutcome {
        let wasActive: Bool? = condition.withLock {
            guard let (_, wasActive) = lifecycle.enterBackground() else { return nil }
            lifecycle.backgroundDeadline = Date().addingTimeInterval(backgroundTime)
            return wasActive
        }
        guard let wasActive else { return condition.withLock { lifecycle.ending ? .ended(reason: "it was ended already") : .suspended } }
        let entered = Date()
        if wasActive { _ = send(.lifecycle(.willResignActive), timeout: backgroundTime) }
        guard send(.lifecycle(.didEnterBackground), timeout: max(0, backgroundTime - Date().timeIntervalSince(entered))).returned else {
            end()
            return .ended(reason: "it did not return from did-enter-background within its background time (\(backgroundTime) s)")
        }
        let deadline = entered.addingTimeInterval(max(backgroundTime, backgroundTaskTime))
        let warning = deadline.addingTimeInterval(-min(3, deadline.timeIntervalSinceNow / 2))
        var warned = false
        while true {
            let open: Bool = condition.withLock {
                lifecycle.backgroundDeadline = deadline
                while !tasks.isEmpty, Date() < (warned ? deadline : warning), condition.wait(until: warned ? deadline : warning) {}
                return !tasks.isEmpty
            }
            guard open else { break }
            if warned || Date() >= deadline {
                end()
                return .ended(reason: "its background tasks were not ended within its background time (\(Int(backgroundTaskTime)) s at most)")
            }
            warned = true
            _ = send(.lifecycle(.backgroundTimeWillExpire), timeout: max(0, deadline.timeIntervalSinceNow))
        }
        condition.withLock {
            lifecycle.suspend()
            registry.setSuspended(1, true)
        }
        return .suspended
    }

    func resume() {
        let back: Bool = condition.withLock {
            guard lifecycle.state == .suspended || lifecycle.state == .background, !lifecycle.ending else { return false }
            registry.setSuspended(1, false)
            lifecycle.enterForeground()
            return true
        }
        guard back else { return }
        _ = send(.lifecycle(.willEnterForeground), timeout: 5)
        let timeChanged: Bool = condition.withLock {
            defer { timeChangePending = false }
            return timeChangePending
        }
        if timeChanged { _ = send(.lifecycle(.significantTimeChange), timeout: 5) }
        // The catch-up the registry releases after *will enter foreground*, then *did become active* behind it.
        _ = send(.lifecycle(.didBecomeActive), timeout: 5)
    }

    func terminate(timeout: TimeInterval) {
        let running: Bool = condition.withLock { !lifecycle.ending && lifecycle.state != .suspended }
        if running { _ = send(.lifecycle(.willTerminate), timeout: timeout) }
        end()
    }

    func end() {
        condition.withLock {
            lifecycle.end()
            onNotice = nil
            condition.broadcast()
        }
    }

    /// Sends `event` through the registry and waits, within `timeout`, until the app acknowledged it.
    private func send(_ event: SubscriberRegistry.Event, timeout: TimeInterval) -> (returned: Bool, accepted: Bool) {
        let deliveries: [SubscriberRegistry.Delivery] = condition.withLock {
            guard !lifecycle.ending else { return [] }
            sent.removeAll { $0.event == event }
            return switch event {
            case .lifecycle(let lifecycle): registry.send(lifecycle, to: [1])
            case .openURL(let payload): registry.send(payload, to: [1])
            case .protection: []
            }
        }
        deliver(deliveries)
        return condition.withLock {
            let deadline = Date().addingTimeInterval(timeout)
            while !lifecycle.ending {
                if let seq = sent.last(where: { $0.event == event })?.seq, let accepted = acknowledged[seq] { return (true, accepted) }
                guard condition.wait(until: deadline) else { break }
            }
            return (false, false)
        }
    }

    /// Hands deliveries to the app as the daemon's frames would be, recording what was sent under which seq.
    private func deliver(_ deliveries: [SubscriberRegistry.Delivery]) {
        for delivery in deliveries {
            let (notice, handler): (DaemonLink.Notice, (@Sendable (DaemonLink.Notice) -> Void)?) = condition.withLock {
                sent.append((delivery.event, delivery.seq))
                condition.broadcast()
                let notice: DaemonLink.Notice = switch delivery.event {
                case .protection(let event): .event(event, seq: delivery.seq, grace: gracePeriod, connection: 0)
                case .lifecycle(let event):
                    .lifecycle(event, options: event == .willFinishLaunching || event == .didFinishLaunching ? launchOptions : nil, seq: delivery.seq, connection: 0)
                case .openURL(let payload): .openURL(payload, seq: delivery.seq, connection: 0)
                }
                return (notice, onNotice)
            }
            handler?(notice)
        }
    }
}
