import Foundation

/// What a launched app's observers are told: its lifecycle events and the device's protected-data events.
public enum ApplicationEvent: Sendable, Equatable {
    /// A step of the app's lifecycle: its launch, an interruption, the background and back, its end (docs/DESIGN.md,
    /// "The app lifecycle", gives the order).
    case lifecycle(LifecycleEvent)
    /// The device's protected data will become unavailable (a lock) or did become available (an unlock).
    case protectedData(ProtectedDataEvent)
    /// An item in the app's Inbox: its URL is inside the sandbox (under `HOME`). Pending ones, delivered before the
    /// app ran, come first: its launch options.
    case openURL(OpenURLRequest)
}

/// An observer of a launched app, with the methods of `UIApplicationDelegate` it mirrors; each has an empty default.
/// Called on one serial queue, in the order the events happened; the daemon waits for them to return (within the
/// grace period, or `--background-time` before a suspension).
public protocol ApplicationDelegate: AnyObject {
    /// The first event of a launch; the app is inactive. `launchOptions` name the Inbox item it is launched to open
    /// (`.url`, `.sourceApplication`, `.annotation`); false declines to open it (no open-URL event for that item).
    func application(_ application: Application, willFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool
    /// The launch is done (same options, same answer's rule); *did become active* follows.
    func application(_ application: Application, didFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool
    /// The app is active: after its launch, an interruption's end (`sandboxctl interrupt --end`) or a return to the
    /// foreground (after *will enter foreground*, the protected-data change it missed and the URLs to open).
    func applicationDidBecomeActive(_ application: Application)
    /// The app is about to become inactive: an interruption (`sandboxctl interrupt`), or the first step to the background.
    func applicationWillResignActive(_ application: Application)
    /// The app went to the background (`sandboxctl suspend`): save state now; it is frozen once this returns, and
    /// ended if this has not returned within its background time (`--background-time`, 5 s by default).
    func applicationDidEnterBackground(_ application: Application)
    /// The app is coming back to the foreground (`sandboxctl resume`), also during its background time;
    /// `applicationState` is still `.background` here. The protected-data change it missed follows, then open-URL events.
    func applicationWillEnterForeground(_ application: Application)
    /// The app is about to end (`sandboxctl terminate`, or a signal to the launcher): SIGTERM follows. Only a running
    /// app hears it: a suspended one is ended without notice, as on iOS.
    func applicationWillTerminate(_ application: Application)
    /// The system is short of memory: free what can be rebuilt (caches, decoded images). A suspended app gets none.
    func applicationDidReceiveMemoryWarning(_ application: Application)
    /// The clock was set, or local midnight or a daylight-saving transition came: recompute what depends on the date.
    func applicationSignificantTimeChange(_ application: Application)
    /// The device is locking: close class A files and finish class A writes; their keys go once this returns.
    func applicationProtectedDataWillBecomeUnavailable(_ application: Application)
    /// The device was unlocked: class A files can be opened again.
    func applicationProtectedDataDidBecomeAvailable(_ application: Application)
    /// An item was delivered into the app's Inbox (`sandboxctl inbox deliver`, a drop folder): `url` is its place
    /// in the sandbox, which the app may read and delete but not change.
    func application(_ application: Application, open url: URL, sourceApplication: String?, annotation: Any?)
}

/// Empty defaults, so a delegate implements only the events it cares about.
extension ApplicationDelegate {
    /// Returns true.
    public func application(_ application: Application, willFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool { true }
    /// Returns true.
    public func application(_ application: Application, didFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool { true }
    /// Does nothing.
    public func applicationDidBecomeActive(_ application: Application) {}
    /// Does nothing.
    public func applicationWillResignActive(_ application: Application) {}
    /// Does nothing.
    public func applicationDidEnterBackground(_ application: Application) {}
    /// Does nothing.
    public func applicationWillEnterForeground(_ application: Application) {}
    /// Does nothing.
    public func applicationWillTerminate(_ application: Application) {}
    /// Does nothing.
    public func applicationDidReceiveMemoryWarning(_ application: Application) {}
    /// Does nothing.
    public func applicationSignificantTimeChange(_ application: Application) {}
    /// Does nothing.
    public func applicationProtectedDataWillBecomeUnavailable(_ application: Application) {}
    /// Does nothing.
    public func applicationProtectedDataDidBecomeAvailable(_ application: Application) {}
    /// Does nothing: the item stays in the Inbox and counts as delivered.
    public func application(_ application: Application, open url: URL, sourceApplication: String?, annotation: Any?) {}
}

/// The program `sandboxctl launch` started, as `UIApplication` is an iOS app: it receives its lifecycle events and the
/// device's protected-data events from the key daemon, through the app's own socket in the sandbox
/// (`SANDBOXCTL_APP_SOCKET`), which serves nothing else: no lock, no unlock, no other container.
///
/// Observe it three ways, as a `Device`: delegates, `NotificationCenter` (UIApplication's notification names; open-URL
/// events as `Container.openURLNotification`, object: the application; after `postNotifications()`), or the
/// `events()` async sequence; events start with the first observer. Each event is
/// acknowledged once every observer has had it; an open-URL event counts as delivered only then.
public final class Application: @unchecked Sendable {
    /// Where `sandboxctl launch` puts the app's socket inside the sandbox.
    public static let socketEnvironmentVariable = "SANDBOXCTL_APP_SOCKET"

    /// Posted after *did finish launching*, as `UIApplication.didFinishLaunchingNotification` is (its user info: the
    /// launch options).
    public static let didFinishLaunchingNotification = Notification.Name("UIApplicationDidFinishLaunchingNotification")
    /// Posted after *did become active*, as `UIApplication.didBecomeActiveNotification` is.
    public static let didBecomeActiveNotification = Notification.Name("UIApplicationDidBecomeActiveNotification")
    /// Posted after *will resign active*, as `UIApplication.willResignActiveNotification` is.
    public static let willResignActiveNotification = Notification.Name("UIApplicationWillResignActiveNotification")
    /// Posted before a suspension, as `UIApplication.didEnterBackgroundNotification` is.
    public static let didEnterBackgroundNotification = Notification.Name("UIApplicationDidEnterBackgroundNotification")
    /// Posted after a resume, before the delegates hear of it, as `UIApplication.willEnterForegroundNotification` is.
    public static let willEnterForegroundNotification = Notification.Name("UIApplicationWillEnterForegroundNotification")
    /// Posted before the app is ended, as `UIApplication.willTerminateNotification` is.
    public static let willTerminateNotification = Notification.Name("UIApplicationWillTerminateNotification")
    /// Posted after the delegates heard of a memory warning, as `UIApplication.didReceiveMemoryWarningNotification` is.
    public static let didReceiveMemoryWarningNotification = Notification.Name("UIApplicationDidReceiveMemoryWarningNotification")
    /// Posted after the delegates heard of a significant time change, as `UIApplication.significantTimeChangeNotification` is.
    public static let significantTimeChangeNotification = Notification.Name("UIApplicationSignificantTimeChangeNotification")
    /// Posted when the device locks, before the class A and B keys go, as UIApplication's is.
    public static let protectedDataWillBecomeUnavailableNotification = Notification.Name("UIApplicationProtectedDataWillBecomeUnavailable")
    /// Posted after an unlock, as UIApplication's is.
    public static let protectedDataDidBecomeAvailableNotification = Notification.Name("UIApplicationProtectedDataDidBecomeAvailable")

    /// Where the app is, as `UIApplication.State` (a suspended app runs no code to ask).
    public enum State: String, Sendable {
        /// In the foreground and taking events.
        case active
        /// In the foreground, not taking events: during its launch, an interruption, or on its way to or from the
        /// background.
        case inactive
        /// Sent to the background: *did enter background* was delivered, and a suspension follows.
        case background
    }

    /// A key of the launch options, as `UIApplication.LaunchOptionsKey`.
    public struct LaunchOptionsKey: RawRepresentable, Hashable, Sendable {
        /// UIKit's name of the key.
        public let rawValue: String
        /// Creates a key.
        public init(rawValue: String) { self.rawValue = rawValue }
        /// The Inbox item the app is launched to open: a file URL inside the sandbox.
        public static let url = LaunchOptionsKey(rawValue: "UIApplicationLaunchOptionsURLKey")
        /// Who delivered the item, when the delivery said.
        public static let sourceApplication = LaunchOptionsKey(rawValue: "UIApplicationLaunchOptionsSourceApplicationKey")
        /// The delivery's annotation (a JSON value decoded), when it had one.
        public static let annotation = LaunchOptionsKey(rawValue: "UIApplicationLaunchOptionsAnnotationKey")
    }

    /// The launched app's bundle identifier.
    public let bundleIdentifier: String
    /// Where notifications are posted.
    public let notificationCenter: NotificationCenter
    private let link: any ApplicationTransport
    private let mutex = NSLock()
    private var delegates: [WeakDelegate] = []
    private var continuations: [UUID: AsyncStream<ApplicationEvent>.Continuation] = [:]
    private var state: State
    private var options: [LaunchOptionsKey: Any]?
    /// Open background tasks: their expiration handlers.
    private var expirationHandlers: [UInt64: (@Sendable () -> Void)?] = [:]
    private var protectedDataAvailable: Bool
    private var cachedKeychain: Keychain?
    /// Events handled so far (on `queue`).
    private var handledEvents = 0
    private let queue = DispatchQueue(label: "ProtectedStore.application")

    private struct WeakDelegate {
        weak var delegate: (any ApplicationDelegate)?
    }

    /// Attaches to the daemon through the socket `sandboxctl launch` gave this program; throws `.daemonUnavailable`
    /// when the program was not launched that way.
    public static func attach(notificationCenter: NotificationCenter = .default) throws -> Application {
        guard let socket = ProcessInfo.processInfo.environment[socketEnvironmentVariable], !socket.isEmpty else {
            throw ProtectedStoreError(.daemonUnavailable, path: socketEnvironmentVariable, problem: "this program was not started by `sandboxctl launch` (\(socketEnvironmentVariable) is not set)",
                                      remedy: "Run it with `sandboxctl launch BUNDLE -- PROGRAM`")
        }
        let (link, hello) = try DaemonLink.connect(appSocket: socket)
        guard let bundle = hello.bundle else {
            link.close()
            throw ProtectedStoreError(.unsupportedFormat, path: socket, problem: "the socket is not an app's own socket (its hello names no app)",
                                      remedy: "Use the socket `sandboxctl launch` gives the app")
        }
        let state: State = switch hello.apps?.first?.state {
        case "active": .active
        case "background": .background
        default: .inactive
        }
        return Application(bundleIdentifier: bundle, transport: link, available: isAvailable(hello.state), state: state,
                           notificationCenter: notificationCenter)
    }

    /// An app on `transport` (the testing kit's in-process stand-in for the daemon); its notices start at once.
    package convenience init(bundleIdentifier: String, transport: any ApplicationTransport, available: Bool, state: State,
                             notificationCenter: NotificationCenter) {
        self.init(bundleIdentifier: bundleIdentifier, link: transport, available: available, state: state, notificationCenter: notificationCenter)
        transport.start { [weak self] notice in self?.received(notice) }
    }

    private init(bundleIdentifier: String, link: any ApplicationTransport, available: Bool, state: State, notificationCenter: NotificationCenter) {
        self.bundleIdentifier = bundleIdentifier
        self.state = state
        self.link = link
        self.protectedDataAvailable = available
        self.notificationCenter = notificationCenter
    }

    deinit { link.close() }

    /// The app's keychain: its bundle identifier's access group and those `sandboxctl launch --keychain-group` gave,
    /// nothing else of the device's. The key daemon opens the items, under the lock's rules. It uses this application's
    /// connection, so it works while the application is kept.
    public var keychain: Keychain {
        get throws {
            try mutex.withLock {
                if let keychain = cachedKeychain { return keychain }
                let keychain = Keychain(backend: try link.keychainBackend(bundleIdentifier: bundleIdentifier))
                cachedKeychain = keychain
                return keychain
            }
        }
    }

    /// Inactive during the launch and an interruption, active from *did become active*, background from *did enter
    /// background* until every observer has handled *will enter foreground* (then inactive until *did become active*).
    public var applicationState: State { mutex.withLock { state } }

    /// A background task, as `UIBackgroundTaskIdentifier`.
    public struct BackgroundTaskIdentifier: RawRepresentable, Hashable, Sendable {
        /// The daemon's number for it.
        public let rawValue: UInt64
        /// Creates an identifier.
        public init(rawValue: UInt64) { self.rawValue = rawValue }
        /// No task: what `beginBackgroundTask` returns once the background time is over, as `.invalid` on iOS.
        public static let invalid = BackgroundTaskIdentifier(rawValue: 0)
    }

    /// Asks for more background time, as UIKit's method: while a task is open, a suspension waits (up to `sandboxctl
    /// launch --background-task-time`, 30 s by default, from *did enter background*). A few seconds before that runs out
    /// `expirationHandler` runs (on the events' queue): end the task there, or the app is ended. Returns `.invalid`
    /// once the background time is over, or without the daemon.
    public func beginBackgroundTask(withName name: String? = nil, expirationHandler: (@Sendable () -> Void)? = nil) -> BackgroundTaskIdentifier {
        var request = DaemonRequest(id: 0, op: .appTaskBegin)
        request.taskName = name
        guard let task = (try? link.reply(to: request))?.apps?.first?.task, task != 0 else { return .invalid }
        mutex.withLock { expirationHandlers[task] = expirationHandler }
        return BackgroundTaskIdentifier(rawValue: task)
    }

    /// Ends a task `beginBackgroundTask` began; the last one to end lets the app be suspended.
    public func endBackgroundTask(_ identifier: BackgroundTaskIdentifier) {
        guard identifier != .invalid, mutex.withLock({ expirationHandlers.removeValue(forKey: identifier.rawValue) }) != nil else { return }
        var request = DaemonRequest(id: 0, op: .appTaskEnd)
        request.task = identifier.rawValue
        _ = try? link.reply(to: request)
    }

    /// Seconds of background time left, background tasks counted; `.greatestFiniteMagnitude` in the foreground, as on iOS.
    public var backgroundTimeRemaining: TimeInterval {
        guard let status = (try? link.reply(to: DaemonRequest(id: 0, op: .status)))?.apps?.first, status.state == "background" else {
            return .greatestFiniteMagnitude
        }
        return status.remaining ?? 0
    }

    /// The options of this launch, during *will* and *did finish launching*; nil after, and for a launch to open nothing.
    public var launchOptions: [LaunchOptionsKey: Any]? { mutex.withLock { options } }

    /// Whether protected data (class A) is available, as of the last event handled.
    public var isProtectedDataAvailable: Bool { mutex.withLock { protectedDataAvailable } }

    /// Adds an observer (held weakly). The first observer, of any kind, starts the events: Inbox items waiting for
    /// the app (its launch options) go to it, not to nobody.
    public func addDelegate(_ delegate: any ApplicationDelegate) throws {
        mutex.withLock { delegates.append(WeakDelegate(delegate: delegate)) }
        try startEvents()
    }

    /// Removes an observer added with ``addDelegate(_:)``; it gets no further events.
    public func removeDelegate(_ delegate: any ApplicationDelegate) {
        mutex.withLock { delegates.removeAll { $0.delegate == nil || $0.delegate === delegate } }
    }

    /// Every event from now on, in order; the first observer starts the events, as `addDelegate` does.
    public func events() throws -> AsyncStream<ApplicationEvent> {
        let id = UUID()
        let (stream, continuation) = AsyncStream<ApplicationEvent>.makeStream()
        continuation.onTermination = { [weak self] _ in _ = self?.mutex.withLock { self?.continuations.removeValue(forKey: id) } }
        mutex.withLock { continuations[id] = continuation }
        try startEvents()
        return stream
    }

    /// Starts the events with `NotificationCenter` as the only observer (as `addDelegate` starts them for a delegate).
    public func postNotifications() throws { try startEvents() }

    /// Subscribes, once. The events start from the state at that moment: if it changed since `attach()` said, the
    /// observers hear of it first.
    private func startEvents() throws {
        let handledBefore = mutex.withLock { handledEvents }
        guard let reply = try link.subscribe() else { return }
        let available = Self.isAvailable(reply.state)
        queue.async { [self] in
            // An event handled since is newer than the subscription's state.
            let (handled, believed) = mutex.withLock { (handledEvents, protectedDataAvailable) }
            if handled == handledBefore && available != believed {
                handle(.protectedData(available ? .didBecomeAvailable : .willBecomeUnavailable))
            }
        }
    }

    /// Stops receiving events; the app's socket connection closes.
    public func close() {
        link.close()
        mutex.withLock { continuations.values.forEach { $0.finish() } }
    }

    private func received(_ notice: DaemonLink.Notice) {
        switch notice {
        case .lifecycle(let event, let payload, let seq, let connection):
            let launch = event == .willFinishLaunching || event == .didFinishLaunching
            queue.async { [self] in
                if launch { mutex.withLock { options = payload.map { Self.launchOptions(Self.request(payload: $0)) } } }
                let accepted = handle(.lifecycle(event))
                if event == .didFinishLaunching { mutex.withLock { options = nil } }
                link.acknowledge(seq: seq, connection: connection, accepted: launch ? accepted : nil)
            }
        case .openURL(let payload, let seq, let connection):
            deliver(.openURL(Self.request(payload: payload)), seq: seq, connection: connection)
        case .event(let event, let seq, _, let connection):
            deliver(.protectedData(event), seq: seq, connection: connection)
        case .lost:
            // As an attached device does: without the daemon, protected data is assumed gone.
            queue.async { [self] in
                if mutex.withLock({ protectedDataAvailable }) { handle(.protectedData(.willBecomeUnavailable)) }
            }
        case .restored(let hello):
            queue.async { [self] in
                if Self.isAvailable(hello.state), !mutex.withLock({ protectedDataAvailable }) {
                    handle(.protectedData(.didBecomeAvailable))
                }
            }
        }
    }

    /// Hands `event` to the observers on `queue`, then acknowledges it to the daemon.
    private func deliver(_ event: ApplicationEvent, seq: UInt64, connection: UInt64) {
        queue.async { [self] in
            handle(event)
            link.acknowledge(seq: seq, connection: connection, accepted: nil)
        }
    }

    /// An Inbox item as the app sees it: its URL inside the sandbox, under HOME.
    private static func request(payload: OpenURLPayload) -> OpenURLRequest {
        let home = ProcessInfo.processInfo.environment["HOME"] ?? "/"
        return OpenURLRequest(url: URL(fileURLWithPath: (home as NSString).appendingPathComponent(payload.path)), path: payload.path,
                              sourceApplication: payload.sourceApplication, annotationJSON: payload.annotation, sequenceNumber: payload.sequence)
    }

    private static func launchOptions(_ request: OpenURLRequest) -> [LaunchOptionsKey: Any] {
        var options: [LaunchOptionsKey: Any] = [.url: request.url]
        if let source = request.sourceApplication { options[.sourceApplication] = source }
        if let annotation = request.annotation { options[.annotation] = annotation }
        return options
    }

    /// Whether the daemon's state, as a hello or subscribe reply names it, makes protected data available here.
    private static func isAvailable(_ state: String?) -> Bool { Device.attachedState(state) == .unlocked }

    /// On `queue`: updates the state, then tells every observer; returns whether every delegate accepted a launch
    /// event (true for any other).
    @discardableResult
    private func handle(_ event: ApplicationEvent) -> Bool {
        let (observers, streams, launchOptions) = mutex.withLock {
            () -> ([any ApplicationDelegate], [AsyncStream<ApplicationEvent>.Continuation], [LaunchOptionsKey: Any]?) in
            handledEvents += 1
            switch event {
            case .lifecycle(.didEnterBackground): state = .background
            case .lifecycle(.didBecomeActive): state = .active
            case .lifecycle(.willFinishLaunching): state = .inactive
            case .protectedData(let protection): protectedDataAvailable = protection == .didBecomeAvailable
            // Each of these changes the state once its observers have handled it, as on iOS.
            case .lifecycle, .openURL: break
            }
            delegates.removeAll { $0.delegate == nil }
            return (delegates.compactMap(\.delegate), Array(continuations.values), options)
        }
        let name: Notification.Name? = switch event {
        case .lifecycle(.willFinishLaunching), .lifecycle(.backgroundTimeWillExpire): nil
        case .lifecycle(.didFinishLaunching): Self.didFinishLaunchingNotification
        case .lifecycle(.didBecomeActive): Self.didBecomeActiveNotification
        case .lifecycle(.willResignActive): Self.willResignActiveNotification
        case .lifecycle(.didEnterBackground): Self.didEnterBackgroundNotification
        case .lifecycle(.willEnterForeground): Self.willEnterForegroundNotification
        case .lifecycle(.willTerminate): Self.willTerminateNotification
        case .lifecycle(.didReceiveMemoryWarning): Self.didReceiveMemoryWarningNotification
        case .lifecycle(.significantTimeChange): Self.significantTimeChangeNotification
        case .protectedData(.willBecomeUnavailable): Self.protectedDataWillBecomeUnavailableNotification
        case .protectedData(.didBecomeAvailable): Self.protectedDataDidBecomeAvailableNotification
        case .openURL: Container.openURLNotification
        }
        var userInfo: [AnyHashable: Any]?
        if case .openURL(let request) = event { userInfo = request.notificationUserInfo }
        if event == .lifecycle(.didFinishLaunching), let launchOptions {
            userInfo = Dictionary(uniqueKeysWithValues: launchOptions.map { (AnyHashable($0.key.rawValue), $0.value) })
        }
        // The seeds' order: *will enter foreground*'s notification before the delegates, every other one after.
        let notifiesFirst = event == .lifecycle(.willEnterForeground)
        if notifiesFirst, let name { notificationCenter.post(name: name, object: self, userInfo: userInfo) }
        var accepted = true
        for observer in observers {
            switch event {
            case .lifecycle(.willFinishLaunching):
                if !observer.application(self, willFinishLaunchingWithOptions: launchOptions) { accepted = false }
            case .lifecycle(.didFinishLaunching):
                if !observer.application(self, didFinishLaunchingWithOptions: launchOptions) { accepted = false }
            case .lifecycle(.didBecomeActive): observer.applicationDidBecomeActive(self)
            case .lifecycle(.willResignActive): observer.applicationWillResignActive(self)
            case .lifecycle(.didEnterBackground): observer.applicationDidEnterBackground(self)
            case .lifecycle(.willEnterForeground): observer.applicationWillEnterForeground(self)
            case .lifecycle(.willTerminate): observer.applicationWillTerminate(self)
            case .lifecycle(.didReceiveMemoryWarning): observer.applicationDidReceiveMemoryWarning(self)
            case .lifecycle(.significantTimeChange): observer.applicationSignificantTimeChange(self)
            case .lifecycle(.backgroundTimeWillExpire): break
            case .protectedData(.willBecomeUnavailable): observer.applicationProtectedDataWillBecomeUnavailable(self)
            case .protectedData(.didBecomeAvailable): observer.applicationProtectedDataDidBecomeAvailable(self)
            case .openURL(let request):
                observer.application(self, open: request.url, sourceApplication: request.sourceApplication, annotation: request.annotation)
            }
        }
        if event == .lifecycle(.backgroundTimeWillExpire) {
            for handler in mutex.withLock({ expirationHandlers.values.compactMap { $0 } }) { handler() }
        }
        if !notifiesFirst, let name { notificationCenter.post(name: name, object: self, userInfo: userInfo) }
        for stream in streams { stream.yield(event) }
        if event == .lifecycle(.willResignActive) || event == .lifecycle(.willEnterForeground) { mutex.withLock { state = .inactive } }
        return accepted
    }
}

/// What an `Application` needs of the daemon: the app socket's `DaemonLink`, or the testing kit's in-process stand-in
/// (`TestApplication`), which plays the daemon's part of the lifecycle.
package protocol ApplicationTransport: AnyObject, Sendable {
    /// Starts the notices; `onNotice` is called in order and must not block.
    func start(_ onNotice: @escaping @Sendable (DaemonLink.Notice) -> Void)
    /// Subscribes once (the reply: the state the events start from); nil if subscribed already.
    func subscribe() throws -> DaemonReply?
    func acknowledge(seq: UInt64, connection: UInt64, accepted: Bool?)
    /// Sends a request of the app's own (a background task, its status) and waits for the reply.
    func reply(to request: DaemonRequest) throws -> DaemonReply
    /// Where the app's keychain calls go: the daemon, for the app's own access groups.
    func keychainBackend(bundleIdentifier: String) throws -> any KeychainBackend
    func close()
}

extension DaemonLink: ApplicationTransport {
    package func reply(to request: DaemonRequest) throws -> DaemonReply { try call(request).reply }
    package func keychainBackend(bundleIdentifier: String) throws -> any KeychainBackend { AppSocketKeychain(link: self) }
}
