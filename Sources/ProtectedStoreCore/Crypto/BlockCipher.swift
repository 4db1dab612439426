import CSodium

/// Seals and opens the blocks of one file under its per-file key with the file's cipher (docs/FORMAT.md §4.3).
///
/// Every block carries a 24-byte nonce field. XChaCha20-Poly1305 uses it as its random nonce. AES-256-GCM's 96-bit
/// nonces are too short to draw at random for the life of a file key, so for it the field is a 16-byte seed, random
/// per sealing pass, then an 8-byte block counter within the pass: the block key is HChaCha20(file key, seed) (the
/// subkey step of XChaCha20, with constants of its own) and the GCM nonce is the counter, so no key ever sees a nonce twice.
/// AEGIS-256 takes the field, random, as the first 24 of its 32 nonce bytes, under a key derived once from the file
/// key (HChaCha20 with constants of its own again), so the file key itself only ever keys XChaCha20.
///
/// One instance per thread and pass: it keeps the last derived key (in guarded memory) for the next block with the
/// same seed, and zeroes it in `finish()`.
package final class BlockCipher {
    package static let nonceFieldBytes = 24
    private static let seedBytes = 16
    private static let gcmNonceBytes = Int(crypto_aead_aes256gcm_NPUBBYTES)
    /// HChaCha20's 16 constant bytes for block keys, not its usual "expand 32-byte k": the length record's
    /// XChaCha20-Poly1305 takes its subkey from the same file key with those, so the two derivations never meet.
    private static let blockKeyConstants: [UInt8] = Array("PSEF AES-GCM key".utf8)
    /// HChaCha20's constants for the AEGIS-256 key, distinct from both of the above, and its input (FORMAT.md §4.3).
    private static let aegisKeyConstants: [UInt8] = Array("PSEF AEGIS-256 k".utf8)
    private static let aegisKeyInput = [UInt8](repeating: 0, count: 16)
    private static let stateBytes = MemoryLayout<crypto_aead_aes256gcm_state>.size

    private let cipher: FileHeader.Cipher
    private let fileKey: UnsafeRawBufferPointer
    /// AES-256-GCM: the expanded state of the current block key, then the key itself; AEGIS-256: its key. In a
    /// guarded slot.
    private var slot: UnsafeMutableRawPointer?
    private var currentSeed: (UInt64, UInt64)?

    private init(cipher: FileHeader.Cipher, fileKey: UnsafeRawBufferPointer) {
        precondition(fileKey.count == FileHeader.fileKeyBytes)
        self.cipher = cipher
        self.fileKey = fileKey
    }

    /// Runs `body` with a block cipher for `fileKey`; derived keys are zeroed before this returns.
    package static func with<R>(_ cipher: FileHeader.Cipher, fileKey: UnsafeRawBufferPointer, _ body: (BlockCipher) throws -> R) rethrows -> R {
        let blockCipher = BlockCipher(cipher: cipher, fileKey: fileKey)
        defer { blockCipher.finish() }
        return try body(blockCipher)
    }

    /// Fills the nonce fields of `count` blocks sealed in one pass (`count * nonceFieldBytes` bytes).
    package static func makeNonceFields(_ cipher: FileHeader.Cipher, count: Int, into fields: UnsafeMutableRawBufferPointer) {
        precondition(fields.count == count * nonceFieldBytes)
        switch cipher {
        case .xChaCha20Poly1305, .aegis256:
            // One CSPRNG call for all nonces instead of one per block.
            Random.fill(fields)
        case .aes256GCM:
            var seed = [UInt8](repeating: 0, count: seedBytes)
            seed.withUnsafeMutableBytes { Random.fill($0) }
            for index in 0..<count {
                let field = fields.baseAddress! + index * nonceFieldBytes
                seed.withUnsafeBytes { field.copyMemory(from: $0.baseAddress!, byteCount: seedBytes) }
                UnsafeMutableRawPointer(field + seedBytes).storeBytes(of: UInt64(index).littleEndian, as: UInt64.self)
            }
        }
    }

    /// Seals each `blockSize` bytes of `plaintext` as one pass of the format does (nonce fields, a `FileHeader.idBytes + 8`
    /// byte associated data), keeping no output: what sealing costs, for measurements. `seedPerBlock` gives every block
    /// nonce fields of its own pass (for AES-256-GCM, a block key each): what not showing passes would cost.
    package static func sealDiscarding(_ plaintext: UnsafeRawBufferPointer, blockSize: Int, cipher: FileHeader.Cipher, fileKey: UnsafeRawBufferPointer,
                                       seedPerBlock: Bool = false) {
        let blocks = plaintext.count / blockSize
        let fields = UnsafeMutableRawBufferPointer.allocate(byteCount: blocks * nonceFieldBytes, alignment: 8)
        let output = UnsafeMutableRawBufferPointer.allocate(byteCount: blockSize + cipher.tagBytes, alignment: 16)
        defer {
            fields.deallocate()
            output.deallocate()
        }
        if seedPerBlock {
            for block in 0..<blocks {
                makeNonceFields(cipher, count: 1, into: UnsafeMutableRawBufferPointer(rebasing: fields[block * nonceFieldBytes..<(block + 1) * nonceFieldBytes]))
            }
        } else {
            makeNonceFields(cipher, count: blocks, into: fields)
        }
        [UInt8](repeating: 7, count: FileHeader.idBytes + 8).withUnsafeBytes { associatedData in
            with(cipher, fileKey: fileKey) { sealer in
                for block in 0..<blocks {
                    sealer.seal(UnsafeRawBufferPointer(rebasing: plaintext[block * blockSize..<(block + 1) * blockSize]),
                                nonceField: UnsafeRawBufferPointer(rebasing: fields[block * nonceFieldBytes..<(block + 1) * nonceFieldBytes]),
                                associatedData: associatedData, into: output)
                }
            }
        }
    }

    /// Seals one block: `output` gets the ciphertext then the tag (`plaintext.count + cipher.tagBytes` bytes).
    package func seal(_ plaintext: UnsafeRawBufferPointer, nonceField: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer,
              into output: UnsafeMutableRawBufferPointer) {
        precondition(nonceField.count == Self.nonceFieldBytes && output.count == plaintext.count + cipher.tagBytes)
        switch cipher {
        case .xChaCha20Poly1305:
            AEAD.seal(plaintext, key: fileKey, nonce: nonceField, associatedData: associatedData, into: output)
        case .aes256GCM:
            let state = blockState(for: nonceField)
            var written: UInt64 = 0
            let result = crypto_aead_aes256gcm_encrypt_afternm(
                output.baseAddress!.assumingMemoryBound(to: UInt8.self), &written,
                plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                nil, Self.gcmNonce(nonceField), state)
            precondition(result == 0 && Int(written) == output.count)
        case .aegis256:
            let key = aegisKey()
            let result = Self.withAEGISNonce(nonceField) { nonce in
                ps_aegis256_encrypt(output.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                    plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                                    associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                                    nonce, key)
            }
            precondition(result == 0)
        }
    }

    /// Opens one block into `output` (`sealed.count - cipher.tagBytes` bytes); false, with `output` zeroed, if it does not
    /// authenticate.
    package func open(_ sealed: UnsafeRawBufferPointer, nonceField: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer,
              into output: UnsafeMutableRawBufferPointer) -> Bool {
        precondition(nonceField.count == Self.nonceFieldBytes)
        switch cipher {
        case .xChaCha20Poly1305:
            return AEAD.open(sealed, key: fileKey, nonce: nonceField, associatedData: associatedData, into: output)
        case .aes256GCM:
            guard let target = Self.target(output, fitting: sealed, tagBytes: cipher.tagBytes) else { return false }
            let state = blockState(for: nonceField)
            var written: UInt64 = 0
            let result = crypto_aead_aes256gcm_decrypt_afternm(
                target.assumingMemoryBound(to: UInt8.self), &written, nil,
                sealed.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(sealed.count),
                associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                Self.gcmNonce(nonceField), state)
            guard result == 0 else {
                // Whatever was decrypted before the tag was checked is not authentic: none of it may reach a caller.
                sodium_memzero(target, output.count)
                return false
            }
            return true
        case .aegis256:
            guard let target = Self.target(output, fitting: sealed, tagBytes: cipher.tagBytes) else { return false }
            let key = aegisKey()
            let result = Self.withAEGISNonce(nonceField) { nonce in
                ps_aegis256_decrypt(target.assumingMemoryBound(to: UInt8.self),
                                    sealed.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(sealed.count),
                                    associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                                    nonce, key)
            }
            guard result == 0 else {
                sodium_memzero(target, output.count)
                return false
            }
            return true
        }
    }

    /// Zeroes the derived key and its state.
    private func finish() {
        if let slot { GuardedScratch.shared.release(slot) }
        slot = nil
        currentSeed = nil
    }

    /// The expanded AES state of the block key for this nonce field's seed, derived unless the last block had the same.
    private func blockState(for nonceField: UnsafeRawBufferPointer) -> UnsafePointer<crypto_aead_aes256gcm_state> {
        let slot = self.slot ?? GuardedScratch.shared.acquire()
        self.slot = slot
        let state = slot.bindMemory(to: crypto_aead_aes256gcm_state.self, capacity: 1)
        let seed = (nonceField.loadUnaligned(fromByteOffset: 0, as: UInt64.self), nonceField.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        if let currentSeed, currentSeed == seed { return UnsafePointer(state) }
        let blockKey = (slot + Self.stateBytes).assumingMemoryBound(to: UInt8.self)
        _ = Self.blockKeyConstants.withUnsafeBufferPointer { constants in
            crypto_core_hchacha20(blockKey, nonceField.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                  fileKey.baseAddress!.assumingMemoryBound(to: UInt8.self), constants.baseAddress)
        }
        _ = crypto_aead_aes256gcm_beforenm(state, blockKey)
        currentSeed = seed
        return UnsafePointer(state)
    }

    /// The AEGIS-256 key, derived from the file key at the pass's first block.
    private func aegisKey() -> UnsafePointer<UInt8> {
        if let slot { return UnsafePointer(slot.assumingMemoryBound(to: UInt8.self)) }
        let slot = GuardedScratch.shared.acquire()
        self.slot = slot
        let key = slot.assumingMemoryBound(to: UInt8.self)
        _ = Self.aegisKeyConstants.withUnsafeBufferPointer { constants in
            crypto_core_hchacha20(key, Self.aegisKeyInput, fileKey.baseAddress!.assumingMemoryBound(to: UInt8.self), constants.baseAddress)
        }
        return UnsafePointer(key)
    }

    /// Where `open` decrypts to, if `output` holds exactly `sealed`'s plaintext; else nil, with `output` zeroed.
    private static func target(_ output: UnsafeMutableRawBufferPointer, fitting sealed: UnsafeRawBufferPointer, tagBytes: Int) -> UnsafeMutableRawPointer? {
        guard sealed.count >= tagBytes, output.count == sealed.count - tagBytes, let target = output.baseAddress else {
            if let base = output.baseAddress { sodium_memzero(base, output.count) }
            return nil
        }
        return target
    }

    /// Runs `body` with AEGIS-256's 32-byte nonce: the 24-byte field, then 8 zero bytes.
    private static func withAEGISNonce(_ nonceField: UnsafeRawBufferPointer, _ body: (UnsafePointer<UInt8>) -> Int32) -> Int32 {
        var nonce: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        return withUnsafeMutableBytes(of: &nonce) { bytes in
            bytes.copyMemory(from: nonceField)
            return body(UnsafePointer(bytes.baseAddress!.assumingMemoryBound(to: UInt8.self)))
        }
    }

    /// The 12-byte GCM nonce of a block: the field's last 12 bytes (the seed's last 4, which are the same for every
    /// block of a pass, then the counter), unique under the pass's key.
    private static func gcmNonce(_ nonceField: UnsafeRawBufferPointer) -> UnsafePointer<UInt8> {
        (nonceField.baseAddress! + nonceFieldBytes - gcmNonceBytes).assumingMemoryBound(to: UInt8.self)
    }
}
