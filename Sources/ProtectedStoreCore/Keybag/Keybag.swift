import Foundation

/// The keybag: the four class keys, wrapped, in one file per device root (docs/FORMAT.md §2).
///
/// Classes A, C and B's secret key are wrapped by the passcode key (Argon2id of the passcode, entangled with the
/// device secret); class D by a key from the device secret alone, so it is usable before any passcode.
/// A MAC keyed by the device secret covers the whole file, so corruption is told apart from a wrong passcode.
package struct Keybag: Sendable {
    static let magic: [UInt8] = Array("PSKEYBAG".utf8)
    static let version: UInt16 = 1
    package static let size = 424
    package static let macBytes = Blake2b.outputBytes
    static let entryOrder: [ProtectionClass] = [.complete, .completeUnlessOpen, .completeUntilFirstUserAuthentication, .none]
    static let wrappedKeyBytes = AEAD.nonceBytes + AEAD.keyBytes + AEAD.tagBytes

    static let passcodeKeyLabel = "ProtectedStore v1 passcode key"
    static let deviceKeyLabel = "ProtectedStore v1 device key"
    static let macKeyLabel = "ProtectedStore v1 keybag mac"

    /// How a class key is wrapped.
    enum Wrapping: UInt8 {
        case passcode = 1
        case device = 2
    }

    package struct Entry: Sendable {
        var protectionClass: ProtectionClass
        var wrapping: Wrapping
        /// nonce (24) ‖ encrypted class key (32) ‖ tag (16).
        package var wrappedKey: [UInt8]
    }

    /// Flags bit 0: the passcode key is derived with a passcode binding's value (PasscodeBinding), which the device
    /// keeps outside the root, so this keybag opens only while the binding names it.
    static let boundFlag: UInt16 = 1

    package let keybagID: [UInt8]
    /// Whether the passcode key takes a binding value; keybags written before bindings existed do not.
    package let isBound: Bool
    package let kdf: PasscodeKDF
    package let classBPublicKey: [UInt8]
    package let entries: [Entry]

    /// Associated data of an entry: keybag id ‖ class id ‖ wrapping, so an entry only opens in its own slot of its own keybag.
    static func associatedData(keybagID: [UInt8], protectionClass: ProtectionClass, wrapping: Wrapping) -> [UInt8] {
        keybagID + [protectionClass.rawValue, wrapping.rawValue]
    }

    static func wrapping(for protectionClass: ProtectionClass) -> Wrapping {
        protectionClass == .none ? .device : .passcode
    }

    // MARK: Creating and re-wrapping

    /// A new keybag with fresh class keys; returns it with the unwrapped keys (the device starts unlocked, as after setting a passcode).
    package static func create(keybagID: [UInt8], passcode: Passcode, preset: KDFPreset, binding: [UInt8],
                       deviceSecret: DeviceSecret) throws -> (Keybag, ClassKeys) {
        let classB = X25519.generateKeyPair()
        let keys = ClassKeys(keys: [
            .complete: .random(count: AEAD.keyBytes),
            .completeUnlessOpen: classB.secret,
            .completeUntilFirstUserAuthentication: .random(count: AEAD.keyBytes),
            .none: .random(count: AEAD.keyBytes),
        ])
        let keybag = try wrapping(keys, keybagID: keybagID, classBPublicKey: classB.publicKey, kdf: PasscodeKDF(preset: preset),
                                  passcode: passcode, binding: binding, deviceSecret: deviceSecret)
        return (keybag, keys)
    }

    /// This keybag with its passcode-wrapped entries re-wrapped under `newPasscode`, a fresh salt and the new binding
    /// value; class keys are unchanged.
    package func changingPasscode(to newPasscode: Passcode, keys: ClassKeys, binding: [UInt8], deviceSecret: DeviceSecret) throws -> Keybag {
        let newKDF = PasscodeKDF(algorithm: kdf.algorithm, opsLimit: kdf.opsLimit, memLimit: kdf.memLimit,
                                 salt: Random.bytes(PasscodeKDF.saltBytes))
        return try Self.wrapping(keys, keybagID: keybagID, classBPublicKey: classBPublicKey, kdf: newKDF,
                                 passcode: newPasscode, binding: binding, deviceSecret: deviceSecret)
    }

    private static func wrapping(_ keys: ClassKeys, keybagID: [UInt8], classBPublicKey: [UInt8], kdf: PasscodeKDF,
                                 passcode: Passcode, binding: [UInt8], deviceSecret: DeviceSecret) throws -> Keybag {
        let passcodeKey = try passcodeKey(passcode, kdf: kdf, keybagID: keybagID, binding: binding, deviceSecret: deviceSecret)
        let deviceKey = try deviceSecret.derive(deviceKeyLabel, keybagID: keybagID)
        defer { passcodeKey.discard(); deviceKey.discard() }
        let entries = try entryOrder.map { protectionClass in
            let wrapping = wrapping(for: protectionClass)
            let wrapped = try AEAD.wrap(try keys.key(for: protectionClass), with: wrapping == .device ? deviceKey : passcodeKey,
                                        associatedData: associatedData(keybagID: keybagID, protectionClass: protectionClass, wrapping: wrapping))
            return Entry(protectionClass: protectionClass, wrapping: wrapping, wrappedKey: wrapped)
        }
        return Keybag(keybagID: keybagID, isBound: true, kdf: kdf, classBPublicKey: classBPublicKey, entries: entries)
    }

    /// Argon2id(passcode), then BLAKE2b keyed with the device secret over label ‖ keybag id ‖ Argon2id output, then
    /// the binding value for a bound keybag (nil for one that is not).
    private static func passcodeKey(_ passcode: Passcode, kdf: PasscodeKDF, keybagID: [UInt8], binding: [UInt8]?, deviceSecret: DeviceSecret) throws -> SecureBytes {
        let stretched = try kdf.derive(from: passcode)
        defer { stretched.discard() }
        guard let binding else { return try deviceSecret.derive(passcodeKeyLabel, keybagID: keybagID, secretInputs: [stretched]) }
        let value = SecureBytes(count: binding.count) { $0.copyBytes(from: binding) }
        defer { value.discard() }
        return try deviceSecret.derive(passcodeKeyLabel, keybagID: keybagID, secretInputs: [stretched, value])
    }

    // MARK: Unwrapping

    /// Class D's key, which needs only the device secret.
    package func unwrapDeviceClassKey(deviceSecret: DeviceSecret, path: String) throws -> SecureBytes {
        let deviceKey = try deviceSecret.derive(Self.deviceKeyLabel, keybagID: keybagID)
        defer { deviceKey.discard() }
        return try unwrap(.none, with: deviceKey, path: path)
    }

    /// Classes A, B (secret key) and C; a failure of the first entry means the passcode is wrong. `binding` is the
    /// value the device's passcode binding holds for this keybag (ignored for a keybag that is not bound).
    package func unwrapPasscodeClassKeys(passcode: Passcode, binding: [UInt8], deviceSecret: DeviceSecret, path: String) throws -> [ProtectionClass: SecureBytes] {
        let passcodeKey = try Self.passcodeKey(passcode, kdf: kdf, keybagID: keybagID, binding: isBound ? binding : nil, deviceSecret: deviceSecret)
        defer { passcodeKey.discard() }
        let classA: SecureBytes
        do {
            classA = try unwrap(.complete, with: passcodeKey, path: path)
        } catch let error as ProtectedStoreError where error.kind == .integrity {
            throw ProtectedStoreError(.wrongPasscode, path: path, problem: "wrong passcode", remedy: "Try again with the device's passcode")
        }
        let classB = try unwrap(.completeUnlessOpen, with: passcodeKey, path: path)
        // The MAC binds PK_B to the keybag, but whoever holds the device secret can re-MAC a keybag with a public key
        // of their own: class B files made afterwards would be sealed to them. The pair must match.
        guard try X25519.isPublicKey(classBPublicKey, of: classB) else {
            classA.discard()
            classB.discard()
            throw ProtectedStoreError(.integrity, path: path, problem: "the keybag's class B public key is not the public key of its class B secret key: the keybag was rewritten by someone holding the device secret",
                                      remedy: "Do not write class B files on this device; restore the keybag from a backup, and move the device secret somewhere only you can read")
        }
        return [
            .complete: classA,
            .completeUnlessOpen: classB,
            .completeUntilFirstUserAuthentication: try unwrap(.completeUntilFirstUserAuthentication, with: passcodeKey, path: path),
        ]
    }

    private func unwrap(_ protectionClass: ProtectionClass, with key: SecureBytes, path: String) throws -> SecureBytes {
        let entry = entries[Self.entryOrder.firstIndex(of: protectionClass)!]
        let ad = Self.associatedData(keybagID: keybagID, protectionClass: protectionClass, wrapping: entry.wrapping)
        guard let classKey = try AEAD.unwrap(entry.wrappedKey[...], with: key, associatedData: ad) else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the keybag entry of class \(protectionClass.letter) failed authentication",
                                      remedy: "The keybag was modified or corrupted; restore it from a backup")
        }
        return classKey
    }

    // MARK: Bytes

    /// The file's bytes, MAC included.
    package func serialized(deviceSecret: DeviceSecret) throws -> [UInt8] {
        var writer = ByteWriter(capacity: Self.size)
        writer.append(Self.magic)
        writer.append(Self.version)
        writer.append(isBound ? Self.boundFlag : 0)
        writer.append(keybagID)
        writer.append(kdf.algorithm)
        writer.appendZeros(3)
        writer.append(kdf.opsLimit)
        writer.append(kdf.memLimit)
        writer.append(kdf.salt)
        writer.append(classBPublicKey)
        for entry in entries {
            writer.append(entry.protectionClass.rawValue)
            writer.append(entry.wrapping.rawValue)
            writer.append(entry.wrappedKey)
        }
        let body = writer.bytes
        return body + (try Self.mac(body, keybagID: keybagID, deviceSecret: deviceSecret))
    }

    package static func mac(_ body: [UInt8], keybagID: [UInt8], deviceSecret: DeviceSecret) throws -> [UInt8] {
        try deviceSecret.mac(macKeyLabel, keybagID: keybagID, over: body)
    }

    /// The keybag id, read before anything is verified, to find the default device secret.
    package static func peekID(_ bytes: [UInt8], path: String) throws -> [UInt8] {
        try checkPreamble(bytes, path: path)
        return Array(bytes[12..<28])
    }

    private static func checkPreamble(_ bytes: [UInt8], path: String) throws {
        guard bytes.count >= 10, Array(bytes[0..<8]) == magic else {
            throw ProtectedStoreError(.integrity, path: path, problem: "not a ProtectedStore keybag (bad magic or empty file)",
                                      remedy: "Restore the keybag from a backup, or point --root at a device root")
        }
        let version = UInt16(bytes[8]) | UInt16(bytes[9]) << 8
        guard version == Self.version else {
            throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "keybag format version \(version) is not supported (this build reads version \(Self.version))",
                                      remedy: "Use the ProtectedStore version that created this device")
        }
        guard bytes.count == size else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the keybag is \(bytes.count) bytes, expected \(size): it was truncated or extended",
                                      remedy: "Restore the keybag from a backup")
        }
    }

    /// Parses and verifies keybag bytes with the device secret.
    package static func parse(_ bytes: [UInt8], path: String, deviceSecret: DeviceSecret) throws -> Keybag {
        try checkPreamble(bytes, path: path)
        let body = Array(bytes[0..<size - macBytes])
        let expected = try mac(body, keybagID: Array(bytes[12..<28]), deviceSecret: deviceSecret)
        let stored = Array(bytes[(size - macBytes)...])
        guard expected.withUnsafeBytes({ e in stored.withUnsafeBytes { s in constantTimeEqual(e, s) } }) else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the keybag failed its integrity check: it was modified or corrupted, or the device secret \(deviceSecret.path) is not this device's",
                                      remedy: "Restore the keybag from a backup, or pass the right --device-secret")
        }
        var reader = ByteReader(body)
        _ = reader.take(10)
        let flags = reader.uint16()
        guard flags & ~boundFlag == 0 else {
            throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "the keybag has flags 0x\(String(flags, radix: 16)), which this build does not know",
                                      remedy: "Use the ProtectedStore version that created this device")
        }
        let keybagID = reader.take(FileHeader.idBytes)
        let algorithm = reader.uint8()
        _ = reader.take(3)
        let kdf = PasscodeKDF(algorithm: algorithm, opsLimit: reader.uint64(), memLimit: reader.uint64(), salt: reader.take(PasscodeKDF.saltBytes))
        guard kdf.isSupported else {
            throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "the keybag's passcode KDF (algorithm \(algorithm), ops \(kdf.opsLimit), memory \(kdf.memLimit)) is not supported",
                                      remedy: "Use the ProtectedStore version that created this device")
        }
        let classBPublicKey = reader.take(X25519.keyBytes)
        var entries: [Entry] = []
        for expectedClass in entryOrder {
            let classID = reader.uint8(), wrappingID = reader.uint8()
            guard classID == expectedClass.rawValue, wrappingID == wrapping(for: expectedClass).rawValue else {
                throw ProtectedStoreError(.integrity, path: path, problem: "the keybag's entries are out of order",
                                          remedy: "Restore the keybag from a backup")
            }
            entries.append(Entry(protectionClass: expectedClass, wrapping: wrapping(for: expectedClass), wrappedKey: reader.take(wrappedKeyBytes)))
        }
        return Keybag(keybagID: keybagID, isBound: flags & boundFlag != 0, kdf: kdf, classBPublicKey: classBPublicKey, entries: entries)
    }
}

/// Unwrapped class keys held in guarded memory (class B: its secret X25519 key).
package final class ClassKeys: @unchecked Sendable {
    private let lock = NSLock()
    private var keys: [ProtectionClass: SecureBytes]

    package init(keys: [ProtectionClass: SecureBytes]) { self.keys = keys }

    package func key(for protectionClass: ProtectionClass) throws -> SecureBytes {
        guard let key = lock.withLock({ keys[protectionClass] }) else {
            throw ProtectedStoreError(.protectedDataUnavailable, problem: "the class \(protectionClass.letter) key is not loaded",
                                      remedy: "Unlock the device")
        }
        return key
    }

    /// Adds keys for classes not loaded yet; a key already loaded stays (operations may be using it).
    package func insert(_ newKeys: [ProtectionClass: SecureBytes]) {
        lock.withLock { keys.merge(newKeys) { current, duplicate in duplicate.discard(); return current } }
    }

    /// Zeroes and forgets the given classes' keys.
    package func discard(_ classes: [ProtectionClass]) {
        lock.withLock {
            for protectionClass in classes {
                keys.removeValue(forKey: protectionClass)?.discard()
            }
        }
    }
}
