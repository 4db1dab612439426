import CSodium

/// libsodium must be initialised once per process before any other call; every entry point goes through here.
enum Sodium {
    private static let initialised: Bool = sodium_init() >= 0

    static func ensureInitialised() {
        precondition(initialised, "libsodium failed to initialise (sodium_init() < 0)")
    }

    /// libsodium's AES-256-GCM runs only on CPUs with AES-NI and PCLMUL (it has no portable fallback).
    static let isAES256GCMAvailable: Bool = {
        ensureInitialised()
        return crypto_aead_aes256gcm_is_available() == 1
    }()

    /// AEGIS-256 is in libsodium from 1.0.19 on (Debian 12 ships 1.0.18); it needs no CPU feature, but picks its AES-NI
    /// code only once libsodium is initialised, which every use of it follows from here.
    static let isAEGIS256Available: Bool = {
        ensureInitialised()
        return ps_aegis256_is_available() == 1
    }()

    /// The linked libsodium's version, for messages.
    static var version: String { String(cString: sodium_version_string()) }
}

/// Random bytes from libsodium's CSPRNG (getrandom(2) underneath).
package enum Random {
    package static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        Sodium.ensureInitialised()
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        randombytes_buf(base, buffer.count)
    }

    package static func bytes(_ count: Int) -> [UInt8] {
        var result = [UInt8](repeating: 0, count: count)
        result.withUnsafeMutableBytes { fill($0) }
        return result
    }
}

/// Constant-time comparison, for anything an attacker could probe byte by byte.
func constantTimeEqual(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    Sodium.ensureInitialised()
    guard a.count == b.count else { return false }
    guard a.count > 0 else { return true }
    return sodium_memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0
}

/// Zeroes a transient ordinary-memory copy of secret bytes (e.g. a file buffer) in a way the optimiser keeps.
package func zeroize(_ bytes: inout [UInt8]) {
    bytes.withUnsafeMutableBytes { buffer in
        if let base = buffer.baseAddress { sodium_memzero(base, buffer.count) }
    }
}

/// Zeroes the first `count` bytes of `bytes`.
package func zeroize(_ bytes: inout [UInt8], count: Int) {
    bytes.withUnsafeMutableBytes { buffer in
        if let base = buffer.baseAddress, count > 0 { sodium_memzero(base, min(count, buffer.count)) }
    }
}

/// Zeroes `count` bytes at `pointer`.
package func zeroize(_ pointer: UnsafeMutableRawPointer, count: Int) {
    if count > 0 { sodium_memzero(pointer, count) }
}
