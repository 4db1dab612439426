import Foundation
import ProtectedStoreCore
import SystemPackage

/// The key holder of a device opened in this process (`Device.create`, `Device.open`, and the daemon's own device):
/// the device secret, the keybag, and the class keys unwrapped from it. It checks passcodes (counted and throttled
/// across processes) and runs the device's lock state machine with its own key discards.
final class EmbeddedKeyHolder: KeyHolder, @unchecked Sendable {
    let deviceSecret: DeviceSecret
    let classKeys: ClassKeys
    /// The passcode binding beside the device secret (PasscodeBinding).
    let bindingPath: String
    private let mutex = NSLock()
    private var storedKeybag: (keybag: Keybag, bytes: [UInt8])
    // Serialises passcode checks (unlock, passcode change) so the attempt counter is never raced, without holding
    // the device's mutex through Argon2id.
    private let passcodeLock = NSLock()
    /// Set by `shutDown()`, under `passcodeLock`.
    private var isShutDown = false

    init(deviceSecret: DeviceSecret, keybag: Keybag, keybagBytes: [UInt8], classKeys: ClassKeys, bindingPath: String) {
        self.deviceSecret = deviceSecret
        self.storedKeybag = (keybag, keybagBytes)
        self.classKeys = classKeys
        self.bindingPath = bindingPath
    }

    /// The keybag as last read or written by this process.
    var keybag: Keybag { mutex.withLock { storedKeybag.keybag } }

    /// The binding value the passcode key of the keybag `bytes` takes; an integrity error if the device's binding
    /// names another keybag (one restored from before a passcode change) or is missing though the keybag needs it.
    static func bindingValue(forKeybag keybag: Keybag, bytes: [UInt8], keybagPath: String, bindingPath: String, deviceSecret: DeviceSecret) throws -> [UInt8] {
        guard let binding = try PasscodeBinding.load(at: bindingPath, deviceSecret: deviceSecret) else {
            guard !keybag.isBound else {
                throw ProtectedStoreError(.integrity, path: bindingPath, problem: "the passcode binding is missing, and the keybag \(keybagPath) was written with one: it was removed, or the device secret was moved without it",
                                          remedy: "Put back the .binding file that lay beside the device secret (from the same backup)")
            }
            return unboundValue  // a keybag from before bindings, on a device that never had one
        }
        return try binding.entry(forKeybag: bytes, keybagPath: keybagPath).value
    }

    /// What a binding entry holds for a keybag written before bindings existed: its passcode key takes no value.
    static let unboundValue = [UInt8](repeating: 0, count: 32)

    // MARK: File keys

    func wrapFileKey(_ fileKey: SecureBytes, for protectionClass: ProtectionClass, associatedData: [UInt8], device: Device) throws -> [UInt8] {
        try usingClassKey(protectionClass, device: device) { try FileKeySeal.seal(fileKey, classKey: $0, associatedData: associatedData) }
    }

    func nameKey(forContainer bundleIdentifier: String?, device: Device) throws -> SecureBytes {
        try deviceSecret.nameKey(forContainer: bundleIdentifier, keybagID: device.keybagID)
    }

    func unwrapFileKey(_ wrapped: WrappedFileKey, device: Device) throws -> SecureBytes? {
        try usingClassKey(wrapped.protectionClass, device: device) { try FileKeySeal.open(wrapped, classKey: $0, classBPublicKey: device.classBPublicKey) }
    }

    /// Runs `body` with a class key. A lock that zeroes the key while `body` runs is the same refusal as a key already
    /// gone: without this, the daemon reported it to its clients as an I/O error (found by `ps-verify load`).
    private func usingClassKey<R>(_ protectionClass: ProtectionClass, device: Device, _ body: (SecureBytes) throws -> R) throws -> R {
        let key = try classKey(for: protectionClass, device: device)
        do {
            return try body(key)
        } catch let error as SecureBytes.Discarded {
            guard key.isDiscarded else { throw error }
            throw Device.unavailableError(protectionClass, state: device.state)
        }
    }

    /// A class key, or the data-protection error for the device's current state.
    func classKey(for protectionClass: ProtectionClass, device: Device) throws -> SecureBytes {
        do {
            return try classKeys.key(for: protectionClass)
        } catch let error as ProtectedStoreError where error.kind == .protectedDataUnavailable {
            throw Device.unavailableError(protectionClass, state: device.state)
        }
    }

    // MARK: Lock and unlock

    func lock(_ device: Device, gracePeriod: TimeInterval?, then: @escaping @Sendable () -> Void) {
        device.runLock(gracePeriod: gracePeriod, discardClassKeys: { [classKeys] in classKeys.discard([.complete, .completeUnlessOpen]) }, then: then)
    }

    func unlock(_ device: Device, passcode: Passcode) throws {
        try passcodeLock.withLock {
            guard !isShutDown else {
                throw ProtectedStoreError(.invalidArgument, path: device.root, problem: "the key holder has shut down", remedy: "Start it again")
            }
            let keys = try unwrapPasscodeClassKeys(device, passcode: passcode)
            device.becomeUnlocked { classKeys.insert(keys) }
        }
    }

    func discardClassKeys() { classKeys.discard(ProtectionClass.allCases) }

    func shutDown() { passcodeLock.withLock { isShutDown = true } }

    func daemonStatus() throws -> DaemonStatus? { nil }

    // MARK: Passcode

    func changePasscode(_ device: Device, from oldPasscode: Passcode, to newPasscode: Passcode) throws {
        try passcodeLock.withLock { try Self.holdingKeybagLock(device) {
            let (current, currentBytes, value) = try currentKeybag(device)
            let unwrapped = try checkingPasscode(device) {
                try ScrubbedStack.run { try current.unwrapPasscodeClassKeys(passcode: oldPasscode, binding: value, deviceSecret: deviceSecret, path: device.keybagPath) }
            }
            let classD = try current.unwrapDeviceClassKey(deviceSecret: deviceSecret, path: device.keybagPath)
            let allKeys = ClassKeys(keys: unwrapped.merging([.none: classD]) { current, _ in current })
            defer { allKeys.discard(ProtectionClass.allCases) }
            // A new binding value with the new keybag: once the binding names only it, the keybag before this change
            // no longer opens, with either passcode. In between, the binding names both, so a power cut at any point
            // leaves a device that opens with the old passcode or the new one.
            let newValue = PasscodeBinding.Entry.freshValue()
            let newKeybag = try ScrubbedStack.run { try current.changingPasscode(to: newPasscode, keys: allKeys, binding: newValue, deviceSecret: deviceSecret) }
            let bytes = try newKeybag.serialized(deviceSecret: deviceSecret)
            let before = PasscodeBinding.Entry(value: current.isBound ? value : Self.unboundValue, keybag: currentBytes)
            let after = PasscodeBinding.Entry(value: newValue, keybag: bytes)
            try PasscodeBinding(keybagID: current.keybagID, entries: [before, after]).store(at: bindingPath, deviceSecret: deviceSecret)
            do {
                try FileSystem.writeAtomically(bytes, to: FileLocation(path: device.keybagPath), replacing: true)
            } catch {
                // If the rename happened and only the directory fsync failed, the new keybag is the one on disk.
                if (try? FileLocation(path: device.keybagPath).readPrefix(count: Keybag.size + 1, what: "keybag")) == bytes {
                    mutex.withLock { storedKeybag = (newKeybag, bytes) }
                }
                throw error
            }
            mutex.withLock { storedKeybag = (newKeybag, bytes) }
            // The passcode is changed; if dropping the old keybag's entry fails, the next unlock drops it.
            try? PasscodeBinding(keybagID: current.keybagID, entries: [after]).store(at: bindingPath, deviceSecret: deviceSecret)
        } }
    }

    /// Runs `body` holding `<root>/keybag.lock` exclusively: the keybag and its binding change together in one
    /// process at a time, across processes (a passcode change, the trim after an unlock), so no two interleave into a
    /// binding that names a keybag no longer on disk.
    static func holdingKeybagLock<R>(_ device: Device, _ body: () throws -> R) throws -> R {
        let lockPath = (device.root as NSString).appendingPathComponent("keybag.lock")
        let lockFile = try FileLocation(path: lockPath).open(.readWrite, options: [.create], permissions: [.ownerReadWrite], doing: "open the keybag lock")
        defer { try? lockFile.close() }
        while flock(lockFile.rawValue, LOCK_EX) != 0 {
            guard Foundation.errno == EINTR else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: lockPath, doing: "lock the keybag") }
        }
        return try body()
    }

    /// The keybag as on disk now, its bytes, and its binding value: another process (the CLI beside a daemon) may
    /// have changed the passcode since this device was opened. Falls back to the one in memory if the file can't be
    /// read; the passcode check then says why. Either way it must be the keybag the binding names.
    private func currentKeybag(_ device: Device) throws -> (keybag: Keybag, bytes: [UInt8], binding: [UInt8]) {
        var current = mutex.withLock { storedKeybag }
        if let bytes = try? FileLocation(path: device.keybagPath).readPrefix(count: Keybag.size + 1, what: "keybag"),
           let onDisk = try? Keybag.parse(bytes, path: device.keybagPath, deviceSecret: deviceSecret),
           onDisk.keybagID == current.keybag.keybagID, onDisk.classBPublicKey == current.keybag.classBPublicKey {
            current = (onDisk, bytes)
            mutex.withLock { storedKeybag = current }
        }
        let value = try Self.bindingValue(forKeybag: current.keybag, bytes: current.bytes, keybagPath: device.keybagPath,
                                          bindingPath: bindingPath, deviceSecret: deviceSecret)
        return (current.keybag, current.bytes, value)
    }

    /// Unwraps classes A, B and C with the passcode (throttled), from the keybag as on disk. Caller holds `passcodeLock`.
    private func unwrapPasscodeClassKeys(_ device: Device, passcode: Passcode) throws -> [ProtectionClass: SecureBytes] {
        let (keybag, _, value) = try currentKeybag(device)
        let keys = try checkingPasscode(device) {
            // Argon2id's output, the passcode key and the unwrapped class keys leave copies on the stack (ScrubbedStack).
            try ScrubbedStack.run { try keybag.unwrapPasscodeClassKeys(passcode: passcode, binding: value, deviceSecret: deviceSecret, path: device.keybagPath) }
        }
        // A passcode change cut short leaves the binding naming two keybags: keep only the one on disk now, under the
        // keybag lock, so a change running in another process is not undone.
        try? Self.holdingKeybagLock(device) {
            guard let binding = try? PasscodeBinding.load(at: bindingPath, deviceSecret: deviceSecret), binding.entries.count > 1,
                  let onDisk = try? FileLocation(path: device.keybagPath).readPrefix(count: Keybag.size + 1, what: "keybag"),
                  let entry = try? binding.entry(forKeybag: onDisk, keybagPath: device.keybagPath) else { return }
            try? PasscodeBinding(keybagID: keybag.keybagID, entries: [entry]).store(at: bindingPath, deviceSecret: deviceSecret)
        }
        return keys
    }

    /// Runs a passcode check under the throttle: refuses while a delay is running, counts a wrong passcode
    /// (erasing the device if the policy says so), and resets the count on success. Caller holds `passcodeLock`;
    /// an flock on a file beside the counter serialises checks across processes.
    private func checkingPasscode<R>(_ device: Device, _ check: () throws -> R) throws -> R {
        try requireNotErased(device)
        // One check at a time across processes too, so parallel guesses are each counted.
        let lockPath = device.passcodeAttemptsPath + ".lock"
        let lockFile = try FileLocation(path: lockPath).open(.readWrite, options: [.create], permissions: [.ownerReadWrite], doing: "open the passcode attempt lock")
        defer { try? lockFile.close() }
        guard flock(lockFile.rawValue, LOCK_EX) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: lockPath, doing: "lock the passcode attempt counter")
        }
        // Another process may have erased the device while this one waited for the lock.
        try requireNotErased(device)
        let passcodeAttemptsPath = device.passcodeAttemptsPath
        let before = try PasscodeAttempts.load(from: passcodeAttemptsPath)
        let remaining = before.remainingDelay(policy: device.passcodePolicy, now: Date())
        guard remaining <= 0 else {
            throw ProtectedStoreError(.throttled, path: device.root, problem: "\(before.failedAttempts) wrong passcodes in a row; the next attempt is allowed in \(Int(remaining.rounded(.up))) s",
                                      remedy: "Wait, then try again")
        }
        // Counted before the verdict: a process killed during Argon2id to dodge the count has still used its guess.
        // The durable write runs alongside Argon2id (it takes far less), and the verdict is used only once it is done.
        var attempts = before
        attempts.failedAttempts += 1
        attempts.lastFailure = Date().timeIntervalSince1970
        // On a thread of its own, not Dispatch's pool: parallel checks waiting for the lock above may hold every
        // thread of the pool, and this one must not wait for them.
        let counted = DispatchSemaphore(value: 0)
        let counting = CountingOutcome()
        Thread { [attempts] in
            do { try attempts.save(to: passcodeAttemptsPath) } catch { counting.error = error }
            counted.signal()
        }.start()
        let verdict = Result { try check() }
        counted.wait()
        if let error = counting.error { throw error }
        let result: R
        do {
            result = try verdict.get()
        } catch let error as ProtectedStoreError where error.kind == .wrongPasscode {
            if let limit = device.passcodePolicy.eraseAfterFailedAttempts, attempts.failedAttempts >= limit {
                try erase(device)
                throw ProtectedStoreError(.wrongPasscode, path: device.root, problem: "wrong passcode, \(attempts.failedAttempts) times in a row: the device has been erased, as its passcode policy requires",
                                          remedy: "Its data is gone; create a new device with `sandboxctl init`")
            }
            let delay = device.passcodePolicy.delay(afterFailures: attempts.failedAttempts)
            let next = delay > 0 ? "; the next attempt is allowed in \(Int(delay.rounded(.up))) s" : ""
            let erasing = device.passcodePolicy.eraseAfterFailedAttempts.map { "; the device is erased after \($0) in a row" } ?? ""
            throw ProtectedStoreError(.wrongPasscode, path: device.keybagPath, problem: "wrong passcode (\(attempts.failedAttempts) in a row\(next)\(erasing))",
                                      remedy: "Try again with the device's passcode")
        } catch {
            // Not a passcode verdict (a damaged keybag, I/O): the attempt does not count.
            try? before.save(to: passcodeAttemptsPath)
            throw error
        }
        // The passcode was right: failing to reset the counter must not turn that into a failure. Durable like every
        // other write of it: unsynced, a power cut could keep the rename and lose the data, leaving an empty counter
        // that refuses every later unlock (found by the power-cut simulator).
        try? PasscodeAttempts().save(to: passcodeAttemptsPath)
        return result
    }

    private func requireNotErased(_ device: Device) throws {
        guard try FileSystem.exists(device.keybagPath) else {
            throw ProtectedStoreError(.notFound, path: device.root, problem: "the device has been erased (its keybag is gone)",
                                      remedy: "Create a new device with `sandboxctl init`")
        }
    }

    // MARK: Erasing

    func checkErasable(_ device: Device) throws {
        guard !Device.isDaemonRunning(root: device.root) else {
            throw ProtectedStoreError(.invalidArgument, path: device.root, problem: "a key daemon holds this device's keys, so it can't be erased from here",
                                      remedy: "Stop the daemon (Ctrl-C or SIGTERM), then erase")
        }
    }

    /// The erase itself; also what the passcode policy runs, in whichever process holds the keys (the daemon too).
    func erase(_ device: Device) throws {
        // Every key in memory goes first, whatever fails afterwards.
        device.discardAllKeys()
        try deviceSecret.destroy()
        guard unlink(bindingPath) == 0 || Foundation.errno == ENOENT else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: bindingPath, doing: "remove the passcode binding")
        }
        let keybagPath = device.keybagPath
        guard unlink(keybagPath) == 0 || Foundation.errno == ENOENT else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: keybagPath, doing: "remove the keybag")
        }
        try FileSystem.synchronizeDirectory(device.root)
        let daemonFiles = [DaemonInfo.path(root: device.root), (device.root as NSString).appendingPathComponent("daemon.lock")]
        let settings = [device.passcodePolicyPath, device.passcodeAttemptsPath, device.passcodeAttemptsPath + ".lock",
                        (device.root as NSString).appendingPathComponent("keybag.lock")]
        for name in [device.containersPath] + settings + daemonFiles where try FileSystem.exists(name) {
            do {
                try FileManager.default.removeItem(atPath: name)
            } catch {
                throw ProtectedStoreError(.io, path: name, problem: "the keys are destroyed, so the data is unreadable, but removing it failed (\(error.localizedDescription))",
                                          remedy: "Remove the directory by hand")
            }
        }
    }
}

/// Where the attempt counter's write reports a failure; read only after its dispatch group is done.
private final class CountingOutcome: @unchecked Sendable {
    var error: (any Error)?
}
