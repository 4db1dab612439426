import CSodium

/// X25519 (crypto_scalarmult) for class B's one-pass key agreement.
package enum X25519 {
    package static let keyBytes = Int(crypto_scalarmult_BYTES)

    /// A new key pair: the secret scalar in guarded memory, the public key in the clear.
    static func generateKeyPair() -> (secret: SecureBytes, publicKey: [UInt8]) {
        let secret = SecureBytes.random(count: Int(crypto_scalarmult_SCALARBYTES))
        var publicKey = [UInt8](repeating: 0, count: keyBytes)
        // The secret was just created and cannot have been discarded.
        try! secret.withUnsafeBytes { s in
            publicKey.withUnsafeMutableBytes { p in
                _ = crypto_scalarmult_base(p.baseAddress!.assumingMemoryBound(to: UInt8.self), s.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        return (secret, publicKey)
    }

    /// Whether `publicKey` is `secret`'s public key (X25519(secret, 9)), compared in constant time.
    static func isPublicKey(_ publicKey: [UInt8], of secret: SecureBytes) throws -> Bool {
        guard publicKey.count == keyBytes else { return false }
        var derived = [UInt8](repeating: 0, count: keyBytes)
        defer { zeroize(&derived) }
        try secret.withUnsafeBytes { s in
            derived.withUnsafeMutableBytes { p in
                _ = crypto_scalarmult_base(p.baseAddress!.assumingMemoryBound(to: UInt8.self), s.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        return derived.withUnsafeBytes { d in publicKey.withUnsafeBytes { p in sodium_memcmp(d.baseAddress!, p.baseAddress!, keyBytes) == 0 } }
    }

    /// The shared secret of `secret` and `publicKey`; nil for a low-order public key (all-zero result).
    static func sharedSecret(secret: SecureBytes, publicKey: [UInt8]) throws -> SecureBytes? {
        guard publicKey.count == keyBytes else { return nil }
        var status: Int32 = 0
        let shared = try SecureBytes(count: keyBytes) { out in
            try secret.withUnsafeBytes { s in
                publicKey.withUnsafeBytes { p in
                    status = crypto_scalarmult(out.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                               s.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                               p.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        return status == 0 ? shared : nil
    }
}
