import CSodium
import SystemPackage

/// A device passcode, held in guarded memory from the moment it is read.
public struct Passcode: Sendable {
    package let bytes: SecureBytes

    /// A passcode from a Swift string (its UTF-8 bytes). Prefer `read(from:)` for user input: a String cannot be zeroed.
    public init(_ string: String) throws {
        var utf8 = Array(string.utf8)
        defer { zeroize(&utf8) }
        guard !utf8.isEmpty else {
            throw ProtectedStoreError(.invalidArgument, problem: "the passcode is empty", remedy: "Choose a passcode of at least one character")
        }
        bytes = SecureBytes(count: utf8.count) { out in out.copyBytes(from: utf8) }
    }

    package init(secureBytes: SecureBytes) { bytes = secureBytes }

    /// Compares two passcodes (e.g. the two entries at a prompt) in constant time.
    public func matches(_ other: Passcode) throws -> Bool { try bytes.constantTimeEquals(other.bytes) }
}

/// Argon2id cost settings. `fast` exists only so test suites run quickly; it protects nothing.
public enum KDFPreset: String, Sendable, CaseIterable {
    /// libsodium's interactive Argon2id limits: quick enough for a prompt; the default for a new device.
    case interactive
    /// libsodium's moderate limits: costlier for an attacker, a second or so per attempt.
    case moderate
    /// libsodium's sensitive limits: seconds per attempt, for the most valuable devices.
    case sensitive
    /// Minimum cost: for tests only, insecure.
    case fast

    package var opsLimit: UInt64 {
        switch self {
        case .interactive: UInt64(crypto_pwhash_opslimit_interactive())
        case .moderate: UInt64(crypto_pwhash_opslimit_moderate())
        case .sensitive: UInt64(crypto_pwhash_opslimit_sensitive())
        case .fast: UInt64(crypto_pwhash_opslimit_min())
        }
    }

    package var memLimit: UInt64 {
        switch self {
        case .interactive: UInt64(crypto_pwhash_memlimit_interactive())
        case .moderate: UInt64(crypto_pwhash_memlimit_moderate())
        case .sensitive: UInt64(crypto_pwhash_memlimit_sensitive())
        case .fast: UInt64(crypto_pwhash_memlimit_min())
        }
    }
}

/// Argon2id (libsodium's crypto_pwhash) with the salt and costs a keybag stores.
package struct PasscodeKDF: Equatable, Sendable {
    static let algorithmArgon2id13 = UInt8(crypto_pwhash_alg_argon2id13())
    static let saltBytes = Int(crypto_pwhash_saltbytes())
    static let outputBytes = 32

    var algorithm: UInt8
    var opsLimit: UInt64
    var memLimit: UInt64
    var salt: [UInt8]

    /// New parameters with a fresh random salt.
    package init(preset: KDFPreset) {
        algorithm = Self.algorithmArgon2id13
        opsLimit = preset.opsLimit
        memLimit = preset.memLimit
        salt = Random.bytes(Self.saltBytes)
    }

    init(algorithm: UInt8, opsLimit: UInt64, memLimit: UInt64, salt: [UInt8]) {
        self.algorithm = algorithm
        self.opsLimit = opsLimit
        self.memLimit = memLimit
        self.salt = salt
    }

    /// Whether libsodium accepts these costs; a tampered keybag could otherwise ask for terabytes of memory.
    package var isSupported: Bool {
        algorithm == Self.algorithmArgon2id13 && salt.count == Self.saltBytes
            && opsLimit >= UInt64(crypto_pwhash_opslimit_min()) && opsLimit <= UInt64(crypto_pwhash_opslimit_sensitive()) * 4
            && memLimit >= UInt64(crypto_pwhash_memlimit_min()) && memLimit <= UInt64(crypto_pwhash_memlimit_sensitive()) * 4
    }

    /// Runs Argon2id over the passcode; the 32-byte output stays in guarded memory.
    package func derive(from passcode: Passcode) throws -> SecureBytes {
        Sodium.ensureInitialised()
        var status: Int32 = 0
        let output = try SecureBytes(count: Self.outputBytes) { out in
            try passcode.bytes.withUnsafeBytes { pass in
                salt.withUnsafeBytes { saltBytes in
                    status = crypto_pwhash(
                        out.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(out.count),
                        pass.baseAddress!.assumingMemoryBound(to: CChar.self), UInt64(pass.count),
                        saltBytes.baseAddress!.assumingMemoryBound(to: UInt8.self),
                        opsLimit, Int(memLimit), Int32(algorithm))
                }
            }
        }
        guard status == 0 else {
            throw ProtectedStoreError(.io, problem: "Argon2id could not allocate \(memLimit / 1_048_576) MiB",
                                      remedy: "Free memory, or create the device with a smaller --kdf preset")
        }
        return output
    }
}

extension Passcode {
    /// The longest passcode `read(from:)` accepts.
    public static let maximumLength = 1024

    /// Reads one line (without its line break) from `descriptor` straight into guarded memory.
    /// Throws if the line is empty, too long, or the input ends before any byte.
    public static func read(from descriptor: FileDescriptor) throws -> Passcode {
        let line = SecureBytes(count: maximumLength + 1)
        var length = 0
        var byte: UInt8 = 0
        try line.withUnsafeBytes { buffer in
            let target = UnsafeMutableRawPointer(mutating: buffer.baseAddress!)
            while true {
                let count = try withUnsafeMutableBytes(of: &byte) { b in
                    try FileSystem.mappingErrno(path: "standard input", doing: "read the passcode") {
                        try descriptor.read(into: b, retryOnInterrupt: true)
                    }
                }
                if count == 0 || byte == UInt8(ascii: "\n") { break }
                guard length < maximumLength else {
                    byte = 0
                    throw ProtectedStoreError(.invalidArgument, problem: "the passcode is longer than \(maximumLength) bytes", remedy: "Use a shorter passcode")
                }
                target.storeBytes(of: byte, toByteOffset: length, as: UInt8.self)
                length += 1
            }
            byte = 0
            if length > 0, buffer[length - 1] == UInt8(ascii: "\r") { length -= 1 }
        }
        guard length > 0 else {
            throw ProtectedStoreError(.invalidArgument, problem: "no passcode was given (empty line or end of input)",
                                      remedy: "Enter a passcode of at least one character")
        }
        let exact = try SecureBytes(count: length) { out in
            try line.withUnsafeBytes { out.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<length])) }
        }
        line.discard()
        return Passcode(secureBytes: exact)
    }
}
