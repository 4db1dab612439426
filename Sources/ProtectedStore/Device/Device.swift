import Foundation
import ProtectedStoreCore
import SystemPackage

/// A device root: its keybag, its device secret, its app containers, and the lock state of this process's key holder.
///
/// A freshly opened device is *before first unlock*: only class D is available until `unlock(passcode:)`.
/// The lock state machine and its events are in Device+Lock.swift.
public final class Device: @unchecked Sendable, ClassKeyProviding {
    /// The device's lock state.
    public enum State: String, Sendable, CaseIterable {
        /// No passcode entered since the device was opened (booted): only class D is available.
        case beforeFirstUnlock
        /// Every class is available.
        case unlocked
        /// Locking: observers were told; keys are discarded when all are done or the grace period ends.
        case locking
        /// Classes A and B (reading) are unavailable; C and D stay.
        case locked
    }

    /// The grace period iOS gives between *will become unavailable* and discarding the keys.
    public static let defaultGracePeriod: TimeInterval = 10

    /// The root directory.
    public let root: String
    /// The device secret file in use (by the daemon, when attached to one).
    public let deviceSecretPath: String
    /// The keybag file inside the root.
    public var keybagPath: String { Self.keybagPath(root: root) }
    /// The 16-byte id of this device's keybag (also in every file header).
    public let keybagID: [UInt8]
    /// Class B's public key, usable in every state to create class B files.
    public let classBPublicKey: [UInt8]
    /// How wrong passcodes are throttled.
    public let passcodePolicy: PasscodePolicy
    /// Where the protected-data notifications are posted.
    public var notificationCenter: NotificationCenter { dispatcher.notificationCenter }
    /// Whether a key daemon holds the keys (`Device.attach`) rather than this process (`Device.open`, `Device.create`).
    public var isAttachedToDaemon: Bool { holder is DaemonKeyHolder }

    let holder: any KeyHolder
    /// Guards the state below; broadcast when a daemon's event makes the device unlocked (`waitUntilUnlocked`).
    let mutex = NSCondition()
    var currentState: State
    var currentGracePeriod = Device.defaultGracePeriod
    var pendingLock: LockAttempt?
    /// Whether open-URL events may be delivered: unlocked, and this process's observers have handled *did become available*.
    var openURLsAllowed: Bool
    // Taken around a state change and the hand-off of its event, so observers see events in state order.
    let deliveryLock = NSLock()
    /// Where this device's grace periods end and its lock and unlock steps run: a serial queue of its own, so a step
    /// that waits (a key discard waits for the file operation in flight) delays only this device's lock, never another
    /// device's deadline in the same process (the daemon serves one device; a test process runs many at once).
    let lockSteps = DispatchQueue(label: "ProtectedStore.lock-steps", qos: .userInitiated)
    var openFiles: [ObjectIdentifier: TrackedFile] = [:]
    /// Told which files lost their keys; guarded by `mutex`.
    var keysDiscardedHandlers: [@Sendable ([EncryptedFile]) -> Void] = []
    package let dispatcher: EventDispatcher<ProtectedDataEvent, Device>
    /// Containers of this process receiving open-URL events, told when protected data becomes available.
    let inboxReceivers = WeakSet<InboxReceiver>()
    /// Attached to a daemon: serves its events to this process's observers, one at a time, in order.
    let daemonEvents = DispatchQueue(label: "ProtectedStore.daemon-events")
    /// Entered for work that will hand events to observers but has not yet (a daemon event queued, open-URL events
    /// waiting for *did* to be handled), so `waitUntilObserversIdle(timeout:)` does not return in the gap.
    let pendingDelivery = DispatchGroup()

    /// `containersPath` nil: the root's `containers` folder; a migration builds the new containers elsewhere.
    init(root: String, deviceSecretPath: String, keybagID: [UInt8], classBPublicKey: [UInt8], holder: any KeyHolder, state: State,
         passcodePolicy: PasscodePolicy, notificationCenter: NotificationCenter, containersPath: String? = nil) {
        self.root = root
        self.containersPath = containersPath ?? (root as NSString).appendingPathComponent("containers")
        self.deviceSecretPath = deviceSecretPath
        self.keybagID = keybagID
        self.classBPublicKey = classBPublicKey
        self.holder = holder
        self.currentState = state
        self.openURLsAllowed = state == .unlocked
        self.passcodePolicy = passcodePolicy
        self.dispatcher = EventDispatcher(notificationCenter: notificationCenter, postingNotifications: true, callDelegate: { delegate, event, device in
            guard let delegate = delegate as? any ProtectedDataDelegate else { return }
            switch event {
            case .willBecomeUnavailable: delegate.protectedDataWillBecomeUnavailable(device)
            case .didBecomeAvailable: delegate.protectedDataDidBecomeAvailable(device)
            }
        }, post: { center, event, device in
            center.post(name: event == .willBecomeUnavailable ? Device.protectedDataWillBecomeUnavailableNotification : Device.protectedDataDidBecomeAvailableNotification,
                        object: device)
        })
    }

    private convenience init(root: String, keys: EmbeddedKeyHolder, state: State, passcodePolicy: PasscodePolicy, notificationCenter: NotificationCenter,
                             containersPath: String? = nil) {
        let keybag = keys.keybag
        self.init(root: root, deviceSecretPath: keys.deviceSecret.path, keybagID: keybag.keybagID, classBPublicKey: keybag.classBPublicKey,
                  holder: keys, state: state, passcodePolicy: passcodePolicy, notificationCenter: notificationCenter, containersPath: containersPath)
    }

    static func keybagPath(root: String) -> String { (root as NSString).appendingPathComponent("keybag") }
    static func passcodePolicyPath(root: String) -> String { (root as NSString).appendingPathComponent("passcode-policy.json") }
    var passcodePolicyPath: String { Self.passcodePolicyPath(root: root) }
    var passcodeAttemptsPath: String { (root as NSString).appendingPathComponent("passcode-attempts.json") }
    /// Where the containers live: `<root>/containers`.
    let containersPath: String

    // MARK: Creating and opening

    /// Creates a device in `root` (new or empty directory): a device secret at `deviceSecretPath`
    /// (default: `DeviceSecret.defaultPath(keybagID:)`, outside the root), then the keybag. The device starts unlocked.
    /// With `secretStorage` `.systemdCredential`, the secret is sealed by `systemd-creds` at the path plus `.cred`.
    public static func create(root: String, deviceSecretPath: String? = nil, passcode: Passcode, kdf: KDFPreset = .interactive,
                              passcodePolicy: PasscodePolicy = .default, secretStorage: DeviceSecretStorage = .file,
                              notificationCenter: NotificationCenter = .default) throws -> Device {
        let root = absolute(root)
        try passcodePolicy.validate()
        try checkCreatable(root: root, deviceSecretPath: deviceSecretPath)
        let keybagID = Random.bytes(FileHeader.idBytes)
        if secretStorage == .systemdCredential { _ = try SealedDeviceSecret.requireTool() }
        let plainPath = absolute(deviceSecretPath ?? DeviceSecret.defaultPath(keybagID: keybagID))
        let secretPath = secretStorage == .systemdCredential ? SealedDeviceSecret.sealedPath(for: plainPath) : plainPath
        let rootExisted = try FileSystem.exists(root)
        try FileSystem.createDirectories(root)
        let secretExisted = try FileSystem.exists(secretPath)
        let bindingPath = PasscodeBinding.path(forSecretAt: plainPath)
        do {
            let seal: (([UInt8], String) throws -> Void)? = secretStorage == .systemdCredential ? { try SealedDeviceSecret.seal($0, to: $1) } : nil
            let deviceSecret = try DeviceSecret.create(at: secretPath, keybagID: keybagID, seal: seal)
            let bindingValue = PasscodeBinding.Entry.freshValue()
            let (keybag, classKeys) = try ScrubbedStack.run {
                try Keybag.create(keybagID: keybagID, passcode: passcode, preset: kdf, binding: bindingValue, deviceSecret: deviceSecret)
            }
            let keybagBytes = try keybag.serialized(deviceSecret: deviceSecret)
            let device = Device(root: root, keys: EmbeddedKeyHolder(deviceSecret: deviceSecret, keybag: keybag, keybagBytes: keybagBytes, classKeys: classKeys,
                                                                    bindingPath: bindingPath), state: .unlocked,
                                passcodePolicy: passcodePolicy, notificationCenter: notificationCenter)
            try FileSystem.createDirectories(device.containersPath)
            try FileSystem.writeAtomically(Array(try JSONEncoder().encode(passcodePolicy)), to: FileLocation(path: device.passcodePolicyPath), replacing: false)
            try PasscodeBinding(keybagID: keybagID, entries: [PasscodeBinding.Entry(value: bindingValue, keybag: keybagBytes)])
                .store(at: bindingPath, deviceSecret: deviceSecret)
            // The keybag last: a root is a device once it has one, so a crash before this leaves a root `create` can reuse.
            try FileSystem.writeAtomically(keybagBytes, to: FileLocation(path: device.keybagPath), replacing: false)
            return device
        } catch {
            // Leave nothing half-made. The root was empty (checked above), so anything in it is ours.
            if rootExisted {
                for name in (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [] {
                    try? FileManager.default.removeItem(atPath: (root as NSString).appendingPathComponent(name))
                }
            } else {
                try? FileManager.default.removeItem(atPath: root)
            }
            if !secretExisted {
                unlink(secretPath)
                unlink(bindingPath)
            }
            throw error
        }
    }

    /// Throws unless `create` could make a device in `root` with that device secret path: the root must be new or
    /// empty, and the secret must not exist yet and must lie outside the root. Lets a CLI check before asking for a passcode.
    public static func checkCreatable(root: String, deviceSecretPath: String?) throws {
        let root = absolute(root)
        if try FileSystem.exists(keybagPath(root: root)) {
            throw ProtectedStoreError(.alreadyExists, path: root, problem: "a device already exists here (it has a keybag)",
                                      remedy: "Choose another --root; to start over, erase this device first")
        }
        if try FileSystem.exists(root) {
            let contents: [String]
            do {
                contents = try FileManager.default.contentsOfDirectory(atPath: root)
            } catch {
                throw ProtectedStoreError(.io, path: root, problem: "cannot list the directory (not a directory, or not readable)",
                                          remedy: "Choose a new or empty directory you can write to for --root")
            }
            guard contents.isEmpty else {
                throw ProtectedStoreError(.alreadyExists, path: root, problem: "the directory is not empty and holds no device",
                                          remedy: "Choose a new or empty directory for --root")
            }
        }
        guard let deviceSecretPath else { return }
        let secretPath = absolute(deviceSecretPath)
        if try FileSystem.exists(secretPath) {
            throw ProtectedStoreError(.alreadyExists, path: secretPath, problem: "a device secret already exists there",
                                      remedy: "Pass another --device-secret path; an existing secret is never overwritten")
        }
        // Compare real paths, so a symlink can't smuggle the secret into the root.
        let realRoot = URL(fileURLWithPath: root).resolvingSymlinksInPath().path
        let realSecret = URL(fileURLWithPath: secretPath).resolvingSymlinksInPath().path
        if realSecret.hasPrefix(realRoot + "/") || secretPath.hasPrefix(root + "/") {
            throw ProtectedStoreError(.invalidArgument, path: secretPath, problem: "the device secret must live outside the device root",
                                      remedy: "Pass a --device-secret path outside \(root), so a copy of the root alone cannot be decrypted")
        }
    }

    /// Opens the device in `root`, before first unlock (as after a reboot). The device secret is read from
    /// `deviceSecretPath`, else from the default path for this keybag's id.
    /// A device in an older on-disk format is refused with `.unsupportedFormat`, naming `sandboxctl migrate`.
    public static func open(root: String, deviceSecretPath: String? = nil, notificationCenter: NotificationCenter = .default) throws -> Device {
        try open(root: root, deviceSecretPath: deviceSecretPath, notificationCenter: notificationCenter, checkingFormat: true, containersPath: nil)
    }

    /// The device in `root` whatever its format, with its containers in `containersPath`: what a migration converts
    /// into. The keys are this process's, so an unlock counts wrong passcodes as any other does.
    static func openForMigration(root: String, deviceSecretPath: String?, containersPath: String) throws -> Device {
        try open(root: root, deviceSecretPath: deviceSecretPath, notificationCenter: NotificationCenter(), checkingFormat: false, containersPath: containersPath)
    }

    private static func open(root: String, deviceSecretPath: String?, notificationCenter: NotificationCenter, checkingFormat: Bool,
                             containersPath: String?) throws -> Device {
        let root = absolute(root)
        let keybagPath = keybagPath(root: root)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: root, isDirectory: &isDirectory) else {
            throw ProtectedStoreError(.notFound, path: root, problem: "the device root does not exist",
                                      remedy: "Create a device with `sandboxctl init --root \(root)`, or pass the right --root")
        }
        guard isDirectory.boolValue else {
            throw ProtectedStoreError(.invalidArgument, path: root, problem: "the device root is not a directory", remedy: "Pass the device's root directory with --root")
        }
        guard try FileSystem.exists(keybagPath) else {
            throw ProtectedStoreError(.notFound, path: root, problem: "no device here (no keybag)",
                                      remedy: "Create one with `sandboxctl init --root \(root)`, or pass the right --root")
        }
        if checkingFormat { try DeviceFormat.requireCurrent(root: root) }
        var bytes = try FileLocation(path: keybagPath).readPrefix(count: Keybag.size + 1, what: "keybag")
        let keybagID = try Keybag.peekID(bytes, path: keybagPath)
        let configuredSecretPath = absolute(deviceSecretPath ?? DeviceSecret.defaultPath(keybagID: keybagID))
        let deviceSecret = try loadDeviceSecret(at: configuredSecretPath)
        let bindingPath = PasscodeBinding.path(forSecretAt: configuredSecretPath)
        guard deviceSecret.keybagID == keybagID else {
            throw ProtectedStoreError(.integrity, path: deviceSecret.path, problem: "this device secret is for keybag \(deviceSecret.keybagID.hex) but \(keybagPath) says \(keybagID.hex): the secret belongs to another device, or the keybag was modified",
                                      remedy: "Pass the device secret created with this root, or restore the keybag from a backup")
        }
        var keybag = try Keybag.parse(bytes, path: keybagPath, deviceSecret: deviceSecret)
        // A keybag restored from before a passcode change is refused here, before any key comes out of it; read once
        // more first, in case a passcode change in another process finished between the two reads.
        do {
            _ = try EmbeddedKeyHolder.bindingValue(forKeybag: keybag, bytes: bytes, keybagPath: keybagPath, bindingPath: bindingPath, deviceSecret: deviceSecret)
        } catch let error as ProtectedStoreError where error.kind == .integrity {
            let again = try FileLocation(path: keybagPath).readPrefix(count: Keybag.size + 1, what: "keybag")
            guard again != bytes else { throw error }
            bytes = again
            keybag = try Keybag.parse(bytes, path: keybagPath, deviceSecret: deviceSecret)
            _ = try EmbeddedKeyHolder.bindingValue(forKeybag: keybag, bytes: bytes, keybagPath: keybagPath, bindingPath: bindingPath, deviceSecret: deviceSecret)
        }
        let classD = try keybag.unwrapDeviceClassKey(deviceSecret: deviceSecret, path: keybagPath)
        return Device(root: root, keys: EmbeddedKeyHolder(deviceSecret: deviceSecret, keybag: keybag, keybagBytes: bytes, classKeys: ClassKeys(keys: [.none: classD]),
                                                          bindingPath: bindingPath),
                      state: .beforeFirstUnlock, passcodePolicy: try loadPasscodePolicy(root: root), notificationCenter: notificationCenter,
                      containersPath: containersPath)
    }

    /// The device secret at `path`: the plain file; else the one systemd loaded for this service
    /// (`LoadCredentialEncrypted=`); else the one sealed beside `path` (`.cred`), unsealed by `systemd-creds`.
    static func loadDeviceSecret(at path: String) throws -> DeviceSecret {
        func unsealed(_ sealed: String) throws -> DeviceSecret {
            var bytes = try SealedDeviceSecret.unseal(sealed)
            defer { zeroize(&bytes) }
            return try DeviceSecret.parse(bytes, path: sealed)
        }
        let exists = try FileSystem.exists(path)
        if exists && path.hasSuffix(".cred") { return try unsealed(path) }
        if !exists {
            if let loaded = SealedDeviceSecret.fromCredentialsDirectory { return try DeviceSecret.load(at: loaded) }
            let sealed = SealedDeviceSecret.sealedPath(for: path)
            if try FileSystem.exists(sealed) { return try unsealed(sealed) }
        }
        return try DeviceSecret.load(at: path)
    }

    /// The root's passcode policy, or the default when it has none.
    static func loadPasscodePolicy(root: String) throws -> PasscodePolicy {
        let policyPath = passcodePolicyPath(root: root)
        guard try FileSystem.exists(policyPath) else { return .default }
        guard let stored = try FileLocation(path: policyPath).readJSON(PasscodePolicy.self, what: "passcode policy"), (try? stored.validate()) != nil else {
            throw ProtectedStoreError(.integrity, path: policyPath, problem: "the passcode policy is unreadable",
                                      remedy: "Restore it from a backup, or delete it to use the default policy")
        }
        return stored
    }

    package static func absolute(_ path: String) -> String {
        let expanded = (path as NSString).expandingTildeInPath
        let joined = expanded.hasPrefix("/") ? expanded : (FileManager.default.currentDirectoryPath as NSString).appendingPathComponent(expanded)
        return (joined as NSString).standardizingPath
    }

    // MARK: Passcode

    /// Re-wraps the class keys under `newPasscode` (no file is touched). The keybag is replaced atomically,
    /// so a crash at any instant leaves one that opens with either the old or the new passcode.
    /// A wrong `oldPasscode` counts as a failed attempt, as an unlock would.
    public func changePasscode(from oldPasscode: Passcode, to newPasscode: Passcode) throws {
        try holder.changePasscode(self, from: oldPasscode, to: newPasscode)
    }

    /// Wrong passcodes in a row so far (persisted; reset by a right one).
    public var failedPasscodeAttempts: Int { (try? PasscodeAttempts.load(from: passcodeAttemptsPath).failedAttempts) ?? 0 }

    /// Destroys the device secret and the keybag, which makes every file of this device unrecoverable at once,
    /// then removes the containers and settings, leaving an empty root.
    /// A device attached to a daemon, or one a daemon serves, can't be erased from here: the daemon holds its keys.
    public func erase() throws {
        try holder.checkErasable(self)
        try holder.erase(self)
    }

    /// Throws unless this process alone holds the device, as `erase()` requires (lets a CLI check before asking for a passcode).
    public func requireNoDaemon() throws { try holder.checkErasable(self) }

    /// For good: waits for a passcode check in flight, refuses every later unlock, and zeroes every key (daemon shutdown).
    package func shutDown() {
        holder.shutDown()
        discardAllKeys()
    }

    /// A test's reboot: zeroes every key as a power cut would, telling nobody, and ends the holder for good, so this
    /// object never comes back to life when a new daemon starts on the same socket.
    package func powerOff() {
        discardAllKeys()
        holder.shutDown()
    }

    /// Zeroes every class key and the per-file key of every open file, and counts as locked (erase, shutdown).
    func discardAllKeys() {
        let (files, lockToRelease): ([EncryptedFile], LockAttempt?) = mutex.withLock {
            holder.discardClassKeys()
            currentState = .locked
            defer { openFiles = [:] }
            return (openFiles.values.compactMap(\.file), pendingLock.take())
        }
        discardKeys(of: files)
        lockToRelease?.complete()
    }

    // MARK: ClassKeyProviding

    public func wrapFileKey(_ fileKey: SecureBytes, for protectionClass: ProtectionClass, associatedData: [UInt8]) throws -> [UInt8] {
        try holder.wrapFileKey(fileKey, for: protectionClass, associatedData: associatedData, device: self)
    }

    public func unwrapFileKey(_ wrapped: WrappedFileKey) throws -> SecureBytes? {
        try holder.unwrapFileKey(wrapped, device: self)
    }

    public func newWrappedFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8]) throws -> NewWrappedFileKey {
        try holder.newWrappedFileKey(for: protectionClass, associatedData: associatedData, device: self)
    }

    /// A class key of the in-process holder, or the data-protection error for the current state (tests look at it).
    package func classKey(for protectionClass: ProtectionClass) throws -> SecureBytes {
        guard let embedded = holder as? EmbeddedKeyHolder else { preconditionFailure("class keys stay in the daemon") }
        return try embedded.classKey(for: protectionClass, device: self)
    }

    static func unavailableError(_ protectionClass: ProtectionClass, state: State, path: String? = nil) -> ProtectedStoreError {
        let reason = state == .beforeFirstUnlock ? "before first unlock" : "while the device is locked"
        return ProtectedStoreError(.protectedDataUnavailable, path: path, problem: "\(protectionClass.name) (class \(protectionClass.letter)) data is unavailable \(reason)",
                                   remedy: "Unlock the device with its passcode")
    }
}

/// An open file as the lock sees it: weakly held (a forgotten handle is not kept alive), with what the lock needs
/// recorded up front so the device never reads a file's state under its own mutex.
struct TrackedFile {
    weak var file: EncryptedFile?
    let fileID: [UInt8]
    var isComplete: Bool
}
