import Foundation
import ProtectedStore
import ProtectedStoreDaemon

/// A throwaway device with one app container, for testing storage code against data protection: real encryption,
/// a real lock, a fast passcode KDF, all in a temporary folder removed when the value is released, even when the
/// test fails.
///
/// It starts unlocked. `lock()`, `unlock()`, `reboot()` and `deliverToInbox(_:name:)` drive the device as a user and
/// other apps would, and return once this process's observers have handled the events they caused, so the test can
/// look at what the code under test did (waiting at most the grace period plus 5 s for an observer that never finishes). Hand `device` and `container` to the code under test; after `reboot()` both
/// are new, and objects made from the old ones are dead, as the processes of a rebooted phone are.
public final class TestDevice: @unchecked Sendable {
    /// Who holds the class keys.
    public enum KeyHolder: Sendable {
        /// This process (`Device.create`/`Device.open`): the quickest.
        case inProcess
        /// A key daemon on a real Unix socket, as under `sandboxctl daemon`; `device` is attached to it
        /// (`Device.attach`), so every lock, unlock and key request crosses the socket. The daemon runs on a thread
        /// of the test process.
        case daemon
    }

    /// The passcode every test device is created with.
    public static let passcode = "0000-test"
    /// The bundle identifier of `container` unless chosen.
    public static let defaultBundleIdentifier = "com.example.app"

    /// The temporary folder holding the device root and its device secret.
    public let directory: String
    /// The device root.
    public let root: String
    /// Who holds the class keys.
    public let keyHolder: KeyHolder
    /// The seconds between *will become unavailable* and discarding the keys when an observer is not done.
    public let gracePeriod: TimeInterval
    /// On a device `everyPowerCut` brought up: the state, and whether the operation had returned when the power went.
    public let powerCut: PowerCutContext?

    let secretPath: String
    let bundleIdentifier: String
    private let mutex = NSLock()
    private var currentDevice: Device
    private var currentContainer: Container
    private var daemon: KeyDaemon?
    private var recorders: [EventRecorder] = []
    private var currentKeychain: (device: Device, keychain: Keychain)?

    /// The device as the app sees it: the one to observe and to build containers and stores from. New after `reboot()`.
    public var device: Device { mutex.withLock { currentDevice } }
    /// The app container. New after `reboot()`.
    public var container: Container { mutex.withLock { currentContainer } }

    /// Creates the device, unlocked, with one container. `gracePeriod` is iOS's 10 s unless chosen; a lock waits
    /// that long only for an observer that does not return.
    public init(bundleIdentifier: String = TestDevice.defaultBundleIdentifier, defaultProtection: FileProtectionType = .complete,
                keyHolder: KeyHolder = .inProcess, gracePeriod: TimeInterval = Device.defaultGracePeriod) throws {
        precondition(gracePeriod >= 0 && gracePeriod.isFinite, "the grace period must be a finite number of seconds ≥ 0")
        // Short, because a Unix socket path inside the root must stay under 108 bytes.
        let directory = (NSTemporaryDirectory() as NSString).appendingPathComponent("pst-\(UUID().uuidString.prefix(13))")
        self.directory = directory
        self.root = (directory as NSString).appendingPathComponent("root")
        self.secretPath = (directory as NSString).appendingPathComponent("device.secret")
        self.keyHolder = keyHolder
        self.gracePeriod = gracePeriod
        self.bundleIdentifier = bundleIdentifier
        self.powerCut = nil
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let created = try Device.create(root: root, deviceSecretPath: secretPath, passcode: try Passcode(Self.passcode), kdf: .fast,
                                            notificationCenter: NotificationCenter())
            created.gracePeriod = gracePeriod
            currentContainer = try created.createContainer(bundleIdentifier: bundleIdentifier, defaultProtection: defaultProtection)
            currentDevice = created
            if keyHolder == .daemon {
                // The daemon opens the root itself, as after a reboot; the creating device's keys go.
                created.powerOff()
                let (daemon, attached) = try Self.startDaemon(root: root, secretPath: secretPath, gracePeriod: gracePeriod)
                self.daemon = daemon
                currentDevice = attached
                currentContainer = try attached.container(bundleIdentifier: bundleIdentifier)
                try attached.unlock(passcode: try Passcode(Self.passcode))
                // Its *did become available* is served before anyone observes, so no recorder starts with it.
                attached.waitUntilDaemonEventsServed()
            }
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// The device a power-cut state left in `directory` (its `root` and `device.secret`), brought up in this process
    /// as after the power came back: before first unlock. It owns `directory` and removes it when released.
    init(poweringUp directory: String, after powerCut: PowerCutContext, bundleIdentifier: String, gracePeriod: TimeInterval) throws {
        self.powerCut = powerCut
        self.directory = directory
        self.root = (directory as NSString).appendingPathComponent("root")
        self.secretPath = (directory as NSString).appendingPathComponent("device.secret")
        self.keyHolder = .inProcess
        self.gracePeriod = gracePeriod
        self.bundleIdentifier = bundleIdentifier
        do {
            let device = try Device.open(root: root, deviceSecretPath: secretPath, notificationCenter: NotificationCenter())
            device.gracePeriod = gracePeriod
            currentContainer = try device.container(bundleIdentifier: bundleIdentifier)
            currentDevice = device
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    deinit {
        currentDevice.powerOff()
        daemon?.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The app's keychain, as the app sees it: its one access group is the container's bundle identifier. New after
    /// `reboot()`, like `device`; the lock and the reboot apply to it as on iOS (`errSecInteractionNotAllowed`).
    public var keychain: Keychain {
        get throws {
            let device = device
            return try mutex.withLock {
                if let current = currentKeychain, current.device === device { return current.keychain }
                let keychain = try Keychain(device: device, accessGroups: .only([bundleIdentifier]))
                currentKeychain = (device, keychain)
                return keychain
            }
        }
    }

    /// The device's keychain as another program sees it: every group (`.all`, the device owner's view), or some.
    public func keychain(accessGroups: KeychainAccessGroups) throws -> Keychain {
        try Keychain(device: device, accessGroups: accessGroups)
    }

    /// Another container on the same device (created if missing).
    public func container(bundleIdentifier: String, defaultProtection: FileProtectionType = .complete) throws -> Container {
        let device = device
        if try device.containerIdentifiers().contains(bundleIdentifier) { return try device.container(bundleIdentifier: bundleIdentifier) }
        return try device.createContainer(bundleIdentifier: bundleIdentifier, defaultProtection: defaultProtection)
    }

    // MARK: Lock, unlock, reboot

    /// Locks the device as the side button does: *will become unavailable* reaches every observer, then the class A
    /// and B keys are discarded once all are done (or the grace period, `gracePeriod` unless given, has passed).
    /// Returns when the device is locked.
    public func lock(gracePeriod: TimeInterval? = nil) async {
        await device.lock(gracePeriod: gracePeriod)
        await device.waitUntilObserversIdle(timeout: observerTimeout)
    }

    /// Unlocks with the passcode, and returns once this process's observers have handled *did become available* and
    /// the open-URL events it released (Inbox items delivered while locked).
    public func unlock() async throws {
        let device = device
        try device.unlock(passcode: try Passcode(Self.passcode))
        await device.waitUntilObserversIdle(timeout: observerTimeout)
    }

    /// Runs `body` with the device locked, and unlocks afterwards, also when `body` throws.
    public func whileLocked<Result>(isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> Result) async throws -> Result {
        await lock()
        let result: Result
        do {
            result = try await body()
        } catch {
            try? await unlock()
            throw error
        }
        try await unlock()
        return result
    }

    /// Restarts the device without warning, as a power cut does: every key in memory is zeroed and nobody is told;
    /// the device comes back *before first unlock* (only class D readable) with new `device` and `container`
    /// objects. Recorders made by `recordEvents()` follow. Throw away what was built on the old objects (stores,
    /// handles) and build it again, as a relaunched app does.
    public func reboot() throws {
        let (old, oldContainer, oldDaemon, recorders) = mutex.withLock { (currentDevice, currentContainer, daemon, self.recorders) }
        recorders.forEach { $0.detach(from: old, container: oldContainer) }
        // The app's device goes first, so losing the daemon tells its observers nothing either.
        old.powerOff()
        oldDaemon?.stop()
        let fresh: Device
        let freshDaemon: KeyDaemon?
        switch keyHolder {
        case .inProcess:
            fresh = try Device.open(root: root, deviceSecretPath: secretPath, notificationCenter: NotificationCenter())
            fresh.gracePeriod = gracePeriod
            freshDaemon = nil
        case .daemon:
            (freshDaemon, fresh) = try Self.startDaemon(root: root, secretPath: secretPath, gracePeriod: gracePeriod)
        }
        let container = try fresh.container(bundleIdentifier: bundleIdentifier)
        mutex.withLock {
            currentDevice = fresh
            currentContainer = container
            daemon = freshDaemon
        }
        recorders.forEach { $0.attach(to: fresh, container: container) }
    }

    private static func startDaemon(root: String, secretPath: String, gracePeriod: TimeInterval) throws -> (KeyDaemon, Device) {
        let daemon = try KeyDaemon.start(root: root, deviceSecretPath: secretPath, gracePeriod: gracePeriod)
        do {
            return (daemon, try Device.attach(root: root, socketPath: daemon.socketPath, notificationCenter: NotificationCenter()))
        } catch {
            daemon.stop()
            throw error
        }
    }

    // MARK: Inbox and events

    /// Delivers `contents` to the container's Documents/Inbox as another app does (`sandboxctl inbox deliver`), under
    /// `name` or a free variant of it, and returns the item's path (`Documents/Inbox/<name>`). Unlocked, it returns once
    /// this process's open-URL observers have handled the event; locked, the event waits for the unlock.
    @discardableResult
    public func deliverToInbox(_ contents: Data, name: String, sourceApplication: String? = nil, annotationJSON: String? = nil) async throws -> String {
        let source = (directory as NSString).appendingPathComponent("delivery-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: source, contents: contents) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: source])
        }
        defer { try? FileManager.default.removeItem(atPath: source) }
        let item = try container.deliverToInbox(fileAtPath: source, name: name, sourceApplication: sourceApplication, annotationJSON: annotationJSON)
        let device = device
        device.deliverPendingOpenURLs()
        await device.waitUntilObserversIdle(timeout: observerTimeout)
        return item.path
    }

    /// Returns once this process's observers have handled every event so far (for events the test did not cause
    /// through this type), or after `timeout` seconds; true if they had.
    @discardableResult
    public func waitUntilEventsHandled(timeout: TimeInterval = 10) async -> Bool { await device.waitUntilObserversIdle(timeout: timeout) }

    /// How long the calls above wait for observers before returning anyway: one that never finishes (a stuck
    /// delegate, an event sequence nobody iterates) must not hang the test.
    private var observerTimeout: TimeInterval { max(gracePeriod, 1) + 5 }

    /// A recorder of the protected-data events of `device` and the open-URL events of `container`, from now on and
    /// across reboots. Recording open-URL events makes this process a receiver of the container's events, as the
    /// app's own observer does; pass `openURLs: false` to leave them to the code under test alone.
    public func recordEvents(openURLs: Bool = true) -> EventRecorder {
        let recorder = EventRecorder(recordsOpenURLs: openURLs)
        let (device, container) = mutex.withLock {
            recorders.append(recorder)
            return (currentDevice, currentContainer)
        }
        recorder.attach(to: device, container: container)
        return recorder
    }
}
