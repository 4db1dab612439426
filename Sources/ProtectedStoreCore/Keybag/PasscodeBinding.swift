import Foundation

/// The passcode binding (docs/FORMAT.md §3.1): a small file beside the device secret, outside the root, holding a
/// random value the passcode key is derived with, and the digest of the keybag it belongs to. `passwd` replaces both,
/// so a keybag restored from before a passcode change no longer opens with the old passcode: the part iOS's
/// effaceable storage plays for its keybag.
///
/// ```
/// magic "PSPCBIND" (8) ‖ version 1 (u16) ‖ count (u8, 1 or 2) ‖ zero (5) ‖ KBID (16) ‖ count × (B (32) ‖ H(keybag) (32)) ‖ MAC (32)
/// ```
/// Two entries only while a passcode change is under way: the keybag before it, and the one it writes.
package struct PasscodeBinding: Sendable {
    static let magic: [UInt8] = Array("PSPCBIND".utf8)
    static let version: UInt16 = 1
    static let valueBytes = 32
    static let headerBytes = 32
    static let entryBytes = 64
    static let macLabel = "ProtectedStore v1 passcode binding mac"

    /// One keybag the binding accepts: the value its passcode key was derived with (all zeros for a keybag written
    /// before bindings, which derives without one) and the BLAKE2b-256 of its bytes.
    package struct Entry: Sendable {
        package let value: [UInt8]
        package let keybagDigest: [UInt8]

        package init(value: [UInt8], keybag bytes: [UInt8]) {
            self.value = value
            self.keybagDigest = Blake2b.hash(bytes)
        }

        fileprivate init(value: [UInt8], keybagDigest: [UInt8]) {
            self.value = value
            self.keybagDigest = keybagDigest
        }

        /// A fresh random value, for the keybag about to be written.
        package static func freshValue() -> [UInt8] { Random.bytes(valueBytes) }
    }

    package let keybagID: [UInt8]
    package let entries: [Entry]

    package init(keybagID: [UInt8], entries: [Entry]) {
        precondition((1...2).contains(entries.count))
        self.keybagID = keybagID
        self.entries = entries
    }

    /// Where the binding of the device secret at `secretPath` is kept (beside it; a sealed secret's `.cred` dropped).
    package static func path(forSecretAt secretPath: String) -> String {
        (secretPath.hasSuffix(".cred") ? String(secretPath.dropLast(5)) : secretPath) + ".binding"
    }

    /// The entry for the keybag `bytes`; an integrity error naming a rollback if the binding names another keybag.
    package func entry(forKeybag bytes: [UInt8], keybagPath: String) throws -> Entry {
        let digest = Blake2b.hash(bytes)
        guard let entry = entries.first(where: { $0.keybagDigest == digest }) else {
            throw ProtectedStoreError(.integrity, path: keybagPath, problem: "the keybag is not the one this device's passcode binding names: it was restored from before a passcode change (a rollback), or replaced",
                                      remedy: "Put back the keybag the last `sandboxctl passwd` wrote (from a backup made after it)")
        }
        return entry
    }

    package func serialized(deviceSecret: DeviceSecret) throws -> [UInt8] {
        var writer = ByteWriter(capacity: Self.headerBytes + entries.count * Self.entryBytes + Blake2b.outputBytes)
        writer.append(Self.magic)
        writer.append(Self.version)
        writer.append(UInt8(entries.count))
        writer.appendZeros(5)
        writer.append(keybagID)
        for entry in entries {
            writer.append(entry.value)
            writer.append(entry.keybagDigest)
        }
        let body = writer.bytes
        return body + (try Self.mac(body, keybagID: keybagID, deviceSecret: deviceSecret))
    }

    private static func mac(_ body: [UInt8], keybagID: [UInt8], deviceSecret: DeviceSecret) throws -> [UInt8] {
        try deviceSecret.mac(macLabel, keybagID: keybagID, over: body)
    }

    /// The binding at `path`, checked against the device secret; nil if there is none.
    package static func load(at path: String, deviceSecret: DeviceSecret) throws -> PasscodeBinding? {
        let location = FileLocation(path: path)
        guard try location.status() != nil else { return nil }
        let bytes = try location.readPrefix(count: headerBytes + 2 * entryBytes + Blake2b.outputBytes + 1, what: "passcode binding")
        func damaged(_ problem: String) -> ProtectedStoreError {
            ProtectedStoreError(.integrity, path: path, problem: "the passcode binding \(problem): it was modified or corrupted, or belongs to another device",
                                remedy: "Restore it from the backup of the device secret it lies beside")
        }
        guard bytes.count >= headerBytes, Array(bytes[0..<8]) == magic, bytes[8] == UInt8(version), bytes[9] == 0 else { throw damaged("is not a passcode binding of this version") }
        let count = Int(bytes[10])
        guard (1...2).contains(count), bytes[11..<16].allSatisfy({ $0 == 0 }),
              bytes.count == headerBytes + count * entryBytes + Blake2b.outputBytes else { throw damaged("has a wrong size or reserved bytes") }
        let keybagID = Array(bytes[16..<32])
        guard keybagID == deviceSecret.keybagID else { throw damaged("is for keybag \(keybagID.hex), not \(deviceSecret.keybagID.hex)") }
        let body = Array(bytes[..<(bytes.count - Blake2b.outputBytes)])
        let expected = try mac(body, keybagID: keybagID, deviceSecret: deviceSecret)
        let stored = Array(bytes[(bytes.count - Blake2b.outputBytes)...])
        guard expected.withUnsafeBytes({ e in stored.withUnsafeBytes { s in constantTimeEqual(e, s) } }) else { throw damaged("failed its integrity check") }
        let entries = (0..<count).map { index in
            let start = headerBytes + index * entryBytes
            return Entry(value: Array(bytes[start..<start + valueBytes]), keybagDigest: Array(bytes[start + valueBytes..<start + entryBytes]))
        }
        return PasscodeBinding(keybagID: keybagID, entries: entries)
    }

    /// Replaces the binding at `path` atomically and durably.
    package func store(at path: String, deviceSecret: DeviceSecret) throws {
        try FileSystem.writeAtomically(try serialized(deviceSecret: deviceSecret), to: FileLocation(path: path), replacing: true)
    }
}
