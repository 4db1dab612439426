import CSodium

/// XChaCha20-Poly1305 (IETF) from libsodium: 192-bit random nonces are safe to draw at random for every message.
package enum AEAD {
    package static let keyBytes = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    package static let nonceBytes = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    package static let tagBytes = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)

    /// Encrypts `plaintext` into `output` (ciphertext then tag; `output.count == plaintext.count + tagBytes`).
    package static func seal(
        _ plaintext: UnsafeRawBufferPointer,
        key: UnsafeRawBufferPointer,
        nonce: UnsafeRawBufferPointer,
        associatedData: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) {
        precondition(key.count == keyBytes && nonce.count == nonceBytes)
        precondition(output.count == plaintext.count + tagBytes)
        var written: UInt64 = 0
        let result = crypto_aead_xchacha20poly1305_ietf_encrypt(
            output.baseAddress!.assumingMemoryBound(to: UInt8.self), &written,
            plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
            associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
            nil,
            nonce.baseAddress!.assumingMemoryBound(to: UInt8.self),
            key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        precondition(result == 0 && Int(written) == output.count)
    }

    /// Decrypts and authenticates `sealed` (ciphertext then tag) into `output`; false if authentication fails,
    /// in which case `output` holds nothing usable.
    package static func open(
        _ sealed: UnsafeRawBufferPointer,
        key: UnsafeRawBufferPointer,
        nonce: UnsafeRawBufferPointer,
        associatedData: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) -> Bool {
        precondition(key.count == keyBytes && nonce.count == nonceBytes)
        guard sealed.count >= tagBytes, output.count == sealed.count - tagBytes else { return false }
        // An empty block still carries a tag to verify, and libsodium wants a real pointer for its (empty) output.
        var emptyOutput: UInt8 = 0
        var written: UInt64 = 0
        // On failure libsodium zeroes `output`, so no unauthenticated plaintext is left behind.
        let result = withUnsafeMutablePointer(to: &emptyOutput) { fallback in
            crypto_aead_xchacha20poly1305_ietf_decrypt(
                output.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? fallback,
                &written,
                nil,
                sealed.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(sealed.count),
                associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                nonce.baseAddress!.assumingMemoryBound(to: UInt8.self),
                key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return result == 0
    }
}

extension AEAD {
    /// Wraps a 32-byte key: returns nonce (24) ‖ ciphertext (32) ‖ tag (16).
    package static func wrap(_ secret: SecureBytes, with key: SecureBytes, associatedData: [UInt8]) throws -> [UInt8] {
        var output = [UInt8](repeating: 0, count: nonceBytes + secret.count + tagBytes)
        try output.withUnsafeMutableBytes { out in
            Random.fill(UnsafeMutableRawBufferPointer(rebasing: out[0..<nonceBytes]))
            try key.withUnsafeBytes { k in
                try secret.withUnsafeBytes { s in
                    associatedData.withUnsafeBytes { ad in
                        seal(s, key: k, nonce: UnsafeRawBufferPointer(rebasing: out[0..<nonceBytes]),
                             associatedData: ad, into: UnsafeMutableRawBufferPointer(rebasing: out[nonceBytes...]))
                    }
                }
            }
        }
        return output
    }

    /// Unwraps what `wrap` produced into guarded memory; nil if authentication fails.
    package static func unwrap(_ wrapped: ArraySlice<UInt8>, with key: SecureBytes, associatedData: [UInt8]) throws -> SecureBytes? {
        let secretCount = wrapped.count - nonceBytes - tagBytes
        guard secretCount > 0 else { return nil }
        var authentic = false
        let secret = try SecureBytes(count: secretCount) { out in
            try key.withUnsafeBytes { k in
                wrapped.withUnsafeBytes { w in
                    associatedData.withUnsafeBytes { ad in
                        authentic = open(UnsafeRawBufferPointer(rebasing: w[nonceBytes...]), key: k,
                                         nonce: UnsafeRawBufferPointer(rebasing: w[0..<nonceBytes]),
                                         associatedData: ad, into: out)
                    }
                }
            }
        }
        return authentic ? secret : nil
    }
}
