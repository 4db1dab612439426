/// The header of an encrypted file, alone in its first sector: identity, class, cipher and the wrapped per-file key
/// (docs/FORMAT.md §4.1).
package struct FileHeader: Sendable {
    static let magic: [UInt8] = Array("PSEF".utf8)
    static let version: UInt16 = 2
    package static let size = 152
    package static let idBytes = 16
    package static let fileKeyBytes = AEAD.keyBytes
    /// Bytes before the wrap nonce; they are the associated data of the key wrap, so all of them are authenticated.
    static let authenticatedPrefixSize = 80

    /// The AEAD that seals a file's blocks (docs/FORMAT.md §4.3); key wraps and length records always use
    /// XChaCha20-Poly1305. Readers take each one libsodium has here; new files get `preferred`.
    package enum Cipher: UInt8, Sendable, CaseIterable {
        case xChaCha20Poly1305 = 1
        case aes256GCM = 2
        case aegis256 = 3
    }
    static let minimumBlockSize = 512
    static let maximumBlockSize = 1 << 20

    /// Header byte 7. Bit 0: sealed for class B because the device was locked when the file was delivered to an
    /// Inbox; it takes its directory's class the first time it is opened with the device unlocked.
    package struct Flags: OptionSet, Sendable {
        package let rawValue: UInt8
        package init(rawValue: UInt8) { self.rawValue = rawValue }
        package static let awaitsDefaultClass = Flags(rawValue: 1)
    }

    package var protectionClass: ProtectionClass
    package var flags: Flags
    package var cipher: Cipher = .xChaCha20Poly1305
    var blockSize: Int
    var keybagID: [UInt8]
    var fileID: [UInt8]
    /// Class B only: the ephemeral X25519 public key; zeros for the other classes.
    var ephemeralPublicKey: [UInt8]
    /// nonce (24) ‖ encrypted per-file key (32) ‖ tag (16).
    var wrappedFileKey: [UInt8]

    package var layout: BlockLayout { BlockLayout(blockSize: blockSize, cipher: cipher) }

    /// The prefix that the key wrap authenticates.
    var authenticatedPrefix: [UInt8] {
        var writer = ByteWriter(capacity: Self.authenticatedPrefixSize)
        writer.append(Self.magic)
        writer.append(Self.version)
        writer.append(protectionClass.rawValue)
        writer.append(flags.rawValue)
        writer.append(cipher.rawValue)
        writer.appendZeros(3)
        writer.append(UInt32(blockSize))
        writer.append(keybagID)
        writer.append(fileID)
        writer.append(ephemeralPublicKey)
        return writer.bytes
    }

    /// The whole header sector: the header, then zeros to the sector's end.
    var serialized: [UInt8] { authenticatedPrefix + wrappedFileKey + [UInt8](repeating: 0, count: Int(BlockLayout.sectorSize) - Self.size) }

    /// A header for a new file (or a class change of an existing one) with `fileKey` wrapped for `protectionClass`.
    static func sealing(fileKey: SecureBytes, fileID: [UInt8], protectionClass: ProtectionClass, flags: Flags = [], cipher: Cipher, blockSize: Int,
                        keys: any ClassKeyProviding) throws -> FileHeader {
        var header = FileHeader(protectionClass: protectionClass, flags: flags, cipher: cipher, blockSize: blockSize, keybagID: keys.keybagID, fileID: fileID,
                                ephemeralPublicKey: [UInt8](repeating: 0, count: X25519.keyBytes), wrappedFileKey: [])
        if protectionClass == .completeUnlessOpen {
            // One-pass key agreement: only the public class key is needed, so this works while locked.
            let agreement = try FileKeySeal.sealForClassB(classBPublicKey: keys.classBPublicKey)
            defer { agreement.wrappingKey.discard() }
            header.ephemeralPublicKey = agreement.ephemeralPublicKey
            header.wrappedFileKey = try FileKeySeal.seal(fileKey, classKey: agreement.wrappingKey, associatedData: header.authenticatedPrefix)
        } else {
            header.wrappedFileKey = try keys.wrapFileKey(fileKey, for: protectionClass, associatedData: header.authenticatedPrefix)
        }
        return header
    }

    /// The header of a new file and its new per-file key. Class B seals the key with the public class key (no holder
    /// needed, so this works while locked); the other classes take a key the holder sealed, perhaps ahead of time.
    static func new(protectionClass: ProtectionClass, flags: Flags = [], cipher: Cipher, blockSize: Int,
                    keys: any ClassKeyProviding) throws -> (header: FileHeader, fileKey: SecureBytes) {
        guard protectionClass != .completeUnlessOpen else {
            let fileKey = SecureBytes.random(count: fileKeyBytes)
            do {
                return (try sealing(fileKey: fileKey, fileID: Random.bytes(idBytes), protectionClass: protectionClass, flags: flags, cipher: cipher,
                                    blockSize: blockSize, keys: keys), fileKey)
            } catch {
                fileKey.discard()
                throw error
            }
        }
        var header = FileHeader(protectionClass: protectionClass, flags: flags, cipher: cipher, blockSize: blockSize, keybagID: keys.keybagID,
                                fileID: [UInt8](repeating: 0, count: idBytes), ephemeralPublicKey: [UInt8](repeating: 0, count: X25519.keyBytes),
                                wrappedFileKey: [])
        let new = try keys.newWrappedFileKey(for: protectionClass) { fileID in
            var named = header
            named.fileID = fileID
            return named.authenticatedPrefix
        }
        header.fileID = new.fileID
        header.wrappedFileKey = new.sealed
        return (header, new.fileKey)
    }

    /// Parses the header bytes; `path` only names the file in errors.
    package static func parse(_ bytes: [UInt8], path: String) throws -> FileHeader {
        guard bytes.count >= size else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the file is too short to be a ProtectedStore encrypted file (\(bytes.count) bytes)",
                                      remedy: "It was truncated or is not ours; restore it from a backup")
        }
        var reader = ByteReader(bytes)
        guard reader.take(4) == magic else {
            throw ProtectedStoreError(.integrity, path: path, problem: "not a ProtectedStore encrypted file (bad magic)",
                                      remedy: "Only files written by ProtectedStore can be read; restore it from a backup if it was one")
        }
        let version = reader.uint16()
        guard version == Self.version else {
            throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "encrypted file format version \(version) is not supported (this build reads version \(Self.version))",
                                      remedy: "Use the ProtectedStore version that wrote it")
        }
        // Each rule is checked before the key wrap, and named: a header re-wrapped validly by a key holder can still
        // break one, and the message then says which.
        let classByte = reader.uint8()
        guard let protectionClass = ProtectionClass(rawValue: classByte) else {
            throw headerRuleError(path: path, "its class byte is \(classByte); classes are 1 to 4")
        }
        let flags = Flags(rawValue: reader.uint8())
        // Only class B files can await their class: other combinations are not written by any version.
        guard Flags.awaitsDefaultClass.isSuperset(of: flags) else {
            throw headerRuleError(path: path, "its flags byte is 0x\(String(flags.rawValue, radix: 16)); only bit 0 is defined")
        }
        guard flags.isEmpty || protectionClass == .completeUnlessOpen else {
            throw headerRuleError(path: path, "it awaits its default class but is of class \(protectionClass.letter); only class B files can")
        }
        guard let cipher = Cipher(rawValue: reader.uint8()) else {
            throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "the file is sealed with cipher \(bytes[8]), which this build does not know",
                                      remedy: "Use the ProtectedStore version that wrote it")
        }
        // Reserved bytes, and the rest of the header sector when given, are zeros: no byte of it goes unchecked.
        guard reader.take(3) == [0, 0, 0], bytes.dropFirst(size).prefix(Int(BlockLayout.sectorSize) - size).allSatisfy({ $0 == 0 }) else {
            throw headerRuleError(path: path, "a reserved byte of its header sector is not zero")
        }
        let blockSize = Int(reader.uint32())
        guard blockSize >= minimumBlockSize, blockSize <= maximumBlockSize, blockSize & (blockSize - 1) == 0 else {
            throw headerRuleError(path: path, "its block size is \(blockSize) bytes; it must be a power of two from \(minimumBlockSize) to \(maximumBlockSize)")
        }
        return FileHeader(protectionClass: protectionClass, flags: flags, cipher: cipher, blockSize: blockSize, keybagID: reader.take(idBytes), fileID: reader.take(idBytes),
                          ephemeralPublicKey: reader.take(X25519.keyBytes),
                          wrappedFileKey: reader.take(AEAD.nonceBytes + fileKeyBytes + AEAD.tagBytes))
    }

    /// The sealed per-file key, as a key holder opens it.
    var wrappedKey: WrappedFileKey {
        WrappedFileKey(protectionClass: protectionClass, associatedData: authenticatedPrefix, ephemeralPublicKey: ephemeralPublicKey, sealed: wrappedFileKey)
    }

    /// Unwraps the per-file key through the key holder.
    package func unwrapFileKey(keys: any ClassKeyProviding, path: String) throws -> SecureBytes {
        guard keybagID == keys.keybagID else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the file belongs to another device (keybag \(keybagID.hex), this device's is \(keys.keybagID.hex)), or its header was modified",
                                      remedy: "Open it with the device root it was written on")
        }
        guard let fileKey = try keys.unwrapFileKey(wrappedKey) else {
            throw Self.headerAuthenticationError(path: path)
        }
        return fileKey
    }

    private static func headerRuleError(path: String, _ rule: String) -> ProtectedStoreError {
        ProtectedStoreError(.integrity, path: path, problem: "the file header breaks the format's rules (\(rule)): it was modified or corrupted",
                            remedy: "Restore the file from a backup")
    }

    private static func headerAuthenticationError(path: String) -> ProtectedStoreError {
        ProtectedStoreError(.integrity, path: path, problem: "the file header failed authentication: it was modified or corrupted",
                            remedy: "Restore the file from a backup")
    }
}
