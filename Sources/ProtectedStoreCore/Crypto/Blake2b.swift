import CSodium

/// BLAKE2b (libsodium's crypto_generichash) used as a keyed KDF and MAC over labelled inputs.
package enum Blake2b {
    package static let outputBytes = 32

    /// BLAKE2b-256 of the concatenation of `parts`, keyed with `key` when given; the result stays in guarded memory.
    package static func derive(key: SecureBytes?, parts: [[UInt8]], secretParts: [SecureBytes] = []) throws -> SecureBytes {
        try SecureBytes(count: outputBytes) { out in
            try hash(key: key, parts: parts, secretParts: secretParts, into: out)
        }
    }

    /// As `derive`, for values that are not secret (a MAC tag).
    package static func mac(key: SecureBytes, message: UnsafeRawBufferPointer) throws -> [UInt8] {
        var tag = [UInt8](repeating: 0, count: outputBytes)
        try tag.withUnsafeMutableBytes { out in
            try key.withUnsafeBytes { k in
                _ = crypto_generichash(out.baseAddress!.assumingMemoryBound(to: UInt8.self), out.count,
                                   message.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(message.count),
                                   k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count)
            }
        }
        return tag
    }

    private static func hash(key: SecureBytes?, parts: [[UInt8]], secretParts: [SecureBytes],
                             into out: UnsafeMutableRawBufferPointer) throws {
        Sodium.ensureInitialised()
        // The state holds key-dependent values, so it too lives in guarded memory.
        let state = SecureBytes(count: crypto_generichash_statebytes())
        try state.withUnsafeBytes { stateBytes in
            // The 64-byte-aligned state struct imports as an opaque pointer.
            let statePointer = OpaquePointer(stateBytes.baseAddress!)
            if let key {
                try key.withUnsafeBytes { k in
                    _ = crypto_generichash_init(statePointer, k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count, out.count)
                }
            } else {
                crypto_generichash_init(statePointer, nil, 0, out.count)
            }
            for part in parts {
                part.withUnsafeBytes { p in
                    _ = crypto_generichash_update(statePointer, p.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(p.count))
                }
            }
            for part in secretParts {
                try part.withUnsafeBytes { p in
                    _ = crypto_generichash_update(statePointer, p.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(p.count))
                }
            }
            crypto_generichash_final(statePointer, out.baseAddress!.assumingMemoryBound(to: UInt8.self), out.count)
        }
    }
}

extension Blake2b {
    /// Unkeyed BLAKE2b-256 of public bytes: a checksum that tells a torn or garbled record without any key.
    package static func hash(_ message: some Collection<UInt8>) -> [UInt8] {
        Sodium.ensureInitialised()
        let bytes = Array(message)
        var digest = [UInt8](repeating: 0, count: outputBytes)
        digest.withUnsafeMutableBytes { out in
            bytes.withUnsafeBytes { input in
                _ = crypto_generichash(out.baseAddress!.assumingMemoryBound(to: UInt8.self), out.count,
                                       input.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(input.count), nil, 0)
            }
        }
        return digest
    }
}
