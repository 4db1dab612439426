import Foundation
import SystemPackage

/// The device secret: 32 random bytes kept outside the data root, the analog of Apple's hardware UID key.
/// Every key derivation is keyed with it, so a copy of the root plus the passcode unwraps nothing without it.
public final class DeviceSecret: Sendable {
    static let magic: [UInt8] = Array("PSDEVSEC".utf8)
    static let version: UInt16 = 1
    static let size = 64
    static let secretBytes = 32

    /// Where the secret is stored.
    public let path: String
    /// The keybag this secret belongs to.
    package let keybagID: [UInt8]
    let secret: SecureBytes

    private init(path: String, keybagID: [UInt8], secret: SecureBytes) {
        self.path = path
        self.keybagID = keybagID
        self.secret = secret
    }

    /// `$XDG_STATE_HOME/sandboxctl/device-secrets/<keybag id>.secret` (XDG_STATE_HOME defaults to ~/.local/state):
    /// outside any device root, and found again from the keybag's id alone.
    public static func defaultPath(keybagID: [UInt8]) -> String {
        (stateFolder as NSString).appendingPathComponent("device-secrets/\(keybagID.hex).secret")
    }

    /// `$XDG_STATE_HOME/sandboxctl` (XDG_STATE_HOME defaults to ~/.local/state): this user's state outside any device root.
    package static var stateFolder: String {
        let stateHome = ProcessInfo.processInfo.environment["XDG_STATE_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? (NSHomeDirectory() as NSString).appendingPathComponent(".local/state")
        return (stateHome as NSString).appendingPathComponent("sandboxctl")
    }

    /// Creates a new random secret at `path` (mode 0600, parents 0700); never replaces an existing file. With `seal`,
    /// the stored form is what `seal` makes of the plain bytes and writes at `path` (a system credential store), so the
    /// plain secret never reaches the disk.
    package static func create(at path: String, keybagID: [UInt8], seal: ((_ plain: [UInt8], _ path: String) throws -> Void)? = nil) throws -> DeviceSecret {
        try FileSystem.createDirectories((path as NSString).deletingLastPathComponent)
        let secret = SecureBytes.random(count: secretBytes)
        var writer = ByteWriter(capacity: size)
        writer.append(magic)
        writer.append(version)
        writer.appendZeros(6)
        writer.append(keybagID)
        var bytes = writer.bytes
        try secret.withUnsafeBytes { bytes.append(contentsOf: $0) }
        defer { zeroize(&bytes) }
        do {
            if let seal {
                guard !(try FileSystem.exists(path)) else { throw ProtectedStoreError(.alreadyExists, path: path, problem: "exists", remedy: "") }
                try seal(bytes, path)
            } else {
                try FileSystem.writeAtomically(bytes, to: FileLocation(path: path), replacing: false)
            }
        } catch let error as ProtectedStoreError where error.kind == .alreadyExists {
            throw ProtectedStoreError(.alreadyExists, path: path, problem: "a device secret already exists there",
                                      remedy: "Pass another --device-secret path; an existing secret is never overwritten")
        }
        return DeviceSecret(path: path, keybagID: keybagID, secret: secret)
    }

    /// Loads the secret at `path`, refusing one that other users could read.
    package static func load(at path: String) throws -> DeviceSecret {
        var info = stat()
        guard stat(path, &info) == 0 else {
            let errno = Errno(rawValue: Foundation.errno)
            if errno == .noSuchFileOrDirectory {
                throw ProtectedStoreError(.notFound, path: path, problem: "the device secret is missing",
                                          remedy: "Pass the path it was created at with --device-secret or SANDBOXCTL_DEVICE_SECRET; without it the device's data cannot be decrypted")
            }
            throw ProtectedStoreError.io(errno, path: path, doing: "read the device secret")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "the device secret is accessible to other users (mode \(String(info.st_mode & 0o777, radix: 8)))",
                                      remedy: "Run: chmod 600 '\(path)'")
        }
        var bytes = try FileLocation(path: path).readPrefix(count: size + 1, what: "device secret")
        defer { zeroize(&bytes) }
        return try parse(bytes, path: path)
    }

    /// The secret from its stored bytes (read from `path`, or unsealed from it).
    package static func parse(_ bytes: [UInt8], path: String) throws -> DeviceSecret {
        guard bytes.count == size, Array(bytes[0..<8]) == magic else {
            throw ProtectedStoreError(.integrity, path: path, problem: "not a ProtectedStore device secret (wrong size or magic)",
                                      remedy: "Point --device-secret at the file `sandboxctl init` created")
        }
        var reader = ByteReader(bytes)
        _ = reader.take(8)
        let version = reader.uint16()
        guard version == Self.version else {
            throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "device secret format version \(version) is not supported (this build reads version \(Self.version))",
                                      remedy: "Use the ProtectedStore version that created it")
        }
        guard reader.take(6).allSatisfy({ $0 == 0 }) else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the device secret's reserved bytes are not zero: it was modified or corrupted",
                                      remedy: "Restore the device secret from its backup")
        }
        let keybagID = reader.take(FileHeader.idBytes)
        let secret = SecureBytes(count: secretBytes) { out in
            bytes.withUnsafeBytes { out.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[32..<64])) }
        }
        return DeviceSecret(path: path, keybagID: keybagID, secret: secret)
    }

    /// BLAKE2b-256 keyed with the secret over `label ‖ keybag id ‖ context ‖ secret inputs`: every key the device
    /// secret guards comes from here.
    func derive(_ label: String, keybagID: [UInt8], context: [UInt8] = [], secretInputs: [SecureBytes] = []) throws -> SecureBytes {
        try Blake2b.derive(key: secret, parts: [Array(label.utf8), keybagID, context], secretParts: secretInputs)
    }

    /// BLAKE2b-256 of `body` keyed with `derive(label, keybagID:)`: the MAC of a file only this device can write
    /// (the keybag, the passcode binding).
    package func mac(_ label: String, keybagID: [UInt8], over body: [UInt8]) throws -> [UInt8] {
        let key = try derive(label, keybagID: keybagID)
        defer { key.discard() }
        return try body.withUnsafeBytes { try Blake2b.mac(key: key, message: $0) }
    }

    /// The name key of the container of `bundleIdentifier` (docs/FORMAT.md §7): from the device secret alone, so
    /// names are readable before the first unlock and while locked, as iOS's file-system metadata key.
    /// With no bundle identifier, the device's own name key, which names and seals the containers themselves.
    package func nameKey(forContainer bundleIdentifier: String?, keybagID: [UInt8]) throws -> SecureBytes {
        guard let bundleIdentifier else { return try derive("ProtectedStore v2 device name key", keybagID: keybagID) }
        return try derive("ProtectedStore v2 name key", keybagID: keybagID, context: Array(bundleIdentifier.utf8))
    }

    /// Overwrites the stored secret with zeros, syncs, and unlinks it: the effaceable-storage step of an erase.
    package func destroy() throws {
        let fd = try FileLocation(path: path).open(.writeOnly, doing: "open the device secret to destroy it")
        try fd.closeAfter {
            _ = try FileSystem.mappingErrno(path: path, doing: "overwrite the device secret") {
                try fd.writeAll(toAbsoluteOffset: 0, [UInt8](repeating: 0, count: Self.size))
            }
            try DurableIO.synchronize(fd, path: path)
        }
        guard unlink(path) == 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "remove the device secret") }
        try FileSystem.synchronizeDirectory((path as NSString).deletingLastPathComponent)
        secret.discard()
    }
}
