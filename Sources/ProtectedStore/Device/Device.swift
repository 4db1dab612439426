import Foundation
import SystemPackage

/// A device root: its keybag, its device secret and the class keys currently unwrapped, in this process.
///
/// A freshly opened device is *before first unlock*: only class D is available until `unlock(with:)`.
public final class Device: @unchecked Sendable, ClassKeyProviding {
    /// The device's lock state, as far as key availability goes.
    public enum State: String, Sendable {
        /// No passcode entered since the device was opened: only class D is available.
        case beforeFirstUnlock
        /// Every class is available.
        case unlocked
        /// Classes A and B (reading) are unavailable; C and D stay.
        case locked
    }

    /// The root directory.
    public let root: String
    /// The device secret file in use.
    public var deviceSecretPath: String { deviceSecret.path }
    /// The keybag file inside the root.
    public var keybagPath: String { Self.keybagPath(root: root) }

    /// The 16-byte id of this device's keybag (also in every file header).
    public let keybagID: [UInt8]
    /// Class B's public key, usable in every state to create class B files.
    public let classBPublicKey: [UInt8]

    private let deviceSecret: DeviceSecret
    private let mutex = NSLock()
    // Serialises passcode changes without holding `mutex` through two Argon2id runs.
    private let passcodeChangeLock = NSLock()
    private var keybag: Keybag
    private let classKeys: ClassKeys
    private var currentState: State

    private init(root: String, deviceSecret: DeviceSecret, keybag: Keybag, classKeys: ClassKeys, state: State) {
        self.root = root
        self.deviceSecret = deviceSecret
        self.keybag = keybag
        self.keybagID = keybag.keybagID
        self.classBPublicKey = keybag.classBPublicKey
        self.classKeys = classKeys
        self.currentState = state
    }

    static func keybagPath(root: String) -> String { (root as NSString).appendingPathComponent("keybag") }

    // MARK: Creating and opening

    /// Creates a device in `root` (new or empty directory): a device secret at `deviceSecretPath`
    /// (default: `DeviceSecret.defaultPath(keybagID:)`, outside the root), then the keybag. The device starts unlocked.
    public static func create(root: String, deviceSecretPath: String? = nil, passcode: Passcode,
                              kdf: KDFPreset = .interactive) throws -> Device {
        let root = absolute(root)
        try checkCreatable(root: root, deviceSecretPath: deviceSecretPath)
        let keybagID = Random.bytes(FileHeader.idBytes)
        let secretPath = absolute(deviceSecretPath ?? DeviceSecret.defaultPath(keybagID: keybagID))
        let rootExisted = try FileSystem.exists(root)
        try FileSystem.createDirectories(root)
        let keybagPath = keybagPath(root: root)
        let secretExisted = try FileSystem.exists(secretPath)
        do {
            let deviceSecret = try DeviceSecret.create(at: secretPath, keybagID: keybagID)
            let (keybag, classKeys) = try Keybag.create(keybagID: keybagID, passcode: passcode, preset: kdf, deviceSecret: deviceSecret)
            try FileSystem.writeAtomically(try keybag.serialized(deviceSecret: deviceSecret), to: keybagPath, replacing: false)
            return Device(root: root, deviceSecret: deviceSecret, keybag: keybag, classKeys: classKeys, state: .unlocked)
        } catch {
            // Leave nothing half-made. The keybag did not exist before (checked above), so any keybag here is ours.
            unlink(keybagPath)
            if !secretExisted { unlink(secretPath) }
            if !rootExisted { rmdir(root) }
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

    /// Opens the device in `root`, before first unlock. The device secret is read from `deviceSecretPath`,
    /// else from the default path for this keybag's id.
    public static func open(root: String, deviceSecretPath: String? = nil) throws -> Device {
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
        let bytes = try FileSystem.readPrefix(keybagPath, count: Keybag.size + 1, what: "keybag")
        let keybagID = try Keybag.peekID(bytes, path: keybagPath)
        let deviceSecret = try DeviceSecret.load(at: absolute(deviceSecretPath ?? DeviceSecret.defaultPath(keybagID: keybagID)))
        guard deviceSecret.keybagID == keybagID else {
            throw ProtectedStoreError(.integrity, path: deviceSecret.path, problem: "this device secret is for keybag \(deviceSecret.keybagID.hex) but \(keybagPath) says \(keybagID.hex): the secret belongs to another device, or the keybag was modified",
                                      remedy: "Pass the device secret created with this root, or restore the keybag from a backup")
        }
        let keybag = try Keybag.parse(bytes, path: keybagPath, deviceSecret: deviceSecret)
        let classD = try keybag.unwrapDeviceClassKey(deviceSecret: deviceSecret, path: keybagPath)
        return Device(root: root, deviceSecret: deviceSecret, keybag: keybag, classKeys: ClassKeys(keys: [.none: classD]), state: .beforeFirstUnlock)
    }

    private static func absolute(_ path: String) -> String {
        let expanded = (path as NSString).expandingTildeInPath
        let joined = expanded.hasPrefix("/") ? expanded : (FileManager.default.currentDirectoryPath as NSString).appendingPathComponent(expanded)
        return (joined as NSString).standardizingPath
    }

    // MARK: Lock state

    /// The current state.
    public var state: State { mutex.withLock { currentState } }

    /// Whether class A data can be read now (UIApplication's `isProtectedDataAvailable`).
    public var isProtectedDataAvailable: Bool { state == .unlocked }

    /// Unwraps classes A, B and C with the passcode. Throws `.wrongPasscode` if it does not match.
    public func unlock(with passcode: Passcode) throws {
        let keys = try mutex.withLock { keybag }.unwrapPasscodeClassKeys(passcode: passcode, deviceSecret: deviceSecret, path: keybagPath)
        mutex.withLock {
            classKeys.insert(keys)
            currentState = .unlocked
        }
    }

    /// Zeroes class A's key and class B's secret key; class C stays until the device is closed, class D always.
    public func lock() {
        mutex.withLock {
            guard currentState == .unlocked else { return }
            classKeys.discard([.complete, .completeUnlessOpen])
            currentState = .locked
        }
    }

    /// Re-wraps the class keys under `newPasscode` (no file is touched). The keybag is replaced atomically,
    /// so a crash at any instant leaves one that opens with either the old or the new passcode.
    public func changePasscode(from oldPasscode: Passcode, to newPasscode: Passcode) throws {
        try passcodeChangeLock.withLock {
            let current = mutex.withLock { keybag }
            let unwrapped = try current.unwrapPasscodeClassKeys(passcode: oldPasscode, deviceSecret: deviceSecret, path: keybagPath)
            let classD = try current.unwrapDeviceClassKey(deviceSecret: deviceSecret, path: keybagPath)
            let allKeys = ClassKeys(keys: unwrapped.merging([.none: classD]) { current, _ in current })
            defer { allKeys.discard(ProtectionClass.allCases) }
            let newKeybag = try current.changingPasscode(to: newPasscode, keys: allKeys, deviceSecret: deviceSecret)
            let bytes = try newKeybag.serialized(deviceSecret: deviceSecret)
            do {
                try FileSystem.writeAtomically(bytes, to: keybagPath, replacing: true)
            } catch {
                // If the rename happened and only the directory fsync failed, the new keybag is the one on disk.
                if (try? FileSystem.readPrefix(keybagPath, count: Keybag.size + 1, what: "keybag")) == bytes {
                    mutex.withLock { keybag = newKeybag }
                }
                throw error
            }
            mutex.withLock { keybag = newKeybag }
        }
    }

    /// Destroys the device secret and the keybag: every file of this device becomes unrecoverable at once, without touching it.
    public func erase() throws {
        try mutex.withLock {
            classKeys.discard(ProtectionClass.allCases)
            currentState = .locked
            try deviceSecret.destroy()
            guard unlink(keybagPath) == 0 || Foundation.errno == ENOENT else {
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: keybagPath, doing: "remove the keybag")
            }
            try FileSystem.synchronizeDirectory(root)
        }
    }

    // MARK: ClassKeyProviding

    public func classKey(for protectionClass: ProtectionClass) throws -> SecureBytes {
        do {
            return try classKeys.key(for: protectionClass)
        } catch let error as ProtectedStoreError where error.kind == .protectedDataUnavailable {
            let reason = state == .beforeFirstUnlock ? "before first unlock" : "while the device is locked"
            throw ProtectedStoreError(.protectedDataUnavailable, problem: "\(protectionClass.name) (class \(protectionClass.letter)) data is unavailable \(reason)",
                                      remedy: "Unlock the device with its passcode")
        }
    }

    // MARK: Whole files

    /// Writes `contents` to `path` as a new encrypted file of `protectionClass`, atomically:
    /// a reader sees the old file or the new one, never a mix, even after a crash.
    public func writeFile(_ contents: [UInt8], to path: String, protection protectionClass: ProtectionClass = .complete) throws {
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = FileSystem.temporarySibling(of: path)
        do {
            let file = try EncryptedFile.create(at: temporary, protectionClass: protectionClass, keys: self)
            try file.write(contents, at: 0)
            try file.synchronize()
            try file.close()
            guard rename(temporary, path) == 0 else {
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "replace the file")
            }
            try FileSystem.synchronizeDirectory(directory)
        } catch {
            unlink(temporary)
            throw error
        }
    }

    /// Reads and authenticates the whole plaintext of the encrypted file at `path`.
    public func readFile(at path: String) throws -> [UInt8] {
        let file = try EncryptedFile.open(at: path, keys: self, writable: false)
        defer { try? file.close() }
        return try file.readAll()
    }
}
