import CSodium
import Foundation

/// Encrypts the names in a container's directories, its symbolic-link targets and its metadata records under the
/// container's name key (docs/FORMAT.md §7): names deterministically per directory, so a name is found without
/// listing its directory; link targets and records with a random nonce, since nothing looks them up.
///
/// A name is sealed with XChaCha20-Poly1305 under a synthetic nonce, BLAKE2b keyed with a second key over the
/// directory's IV and the padded name (the SIV construction of RFC 5297, with libsodium's primitives): equal names
/// in one directory give equal stored names, and nothing else about a name is revealed but its length rounded up
/// to 16 bytes. The directory's IV is also the associated data, so an entry moved into another directory does
/// not decrypt there.
package final class NameCipher: Sendable {
    /// Random bytes stored in every directory; they make its names unlike any other directory's.
    package static let directoryIVBytes = 16
    /// Names are padded with NUL bytes (which no name contains) to a multiple of this, hiding their exact length.
    static let paddingBlock = 16
    /// The longest stored name a directory entry can have (Linux's NAME_MAX); longer ones are stored as long names.
    package static let maximumEntryBytes = 255
    /// Begins every long-name entry; never the first character of base64url, so never of a short stored name.
    package static let longEntryPrefix = "~"

    private static let sivLabel = "ProtectedStore v2 name siv"
    private static let encryptionLabel = "ProtectedStore v2 name encryption"
    private static let nameDomain: UInt8 = 0x4E  // "N"
    private static let linkDomain: UInt8 = 0x4C  // "L"
    private static let recordDomain: UInt8 = 0x52  // "R"

    private let sivKey: SecureBytes
    private let encryptionKey: SecureBytes
    /// Stored names computed lately: every path walked encrypts one name per directory, mostly the same few.
    /// Deterministic, so a cached one is what computing it again would give.
    private let recent = Locked<[RecentKey: StoredName]>([:])
    private static let recentLimit = 4096

    private struct RecentKey: Hashable {
        let directoryIV: [UInt8]
        let name: String
    }

    /// `nameKey` is the container's 32-byte name key; the cipher keeps two subkeys derived from it, not the key.
    package init(nameKey: SecureBytes) throws {
        sivKey = try Blake2b.derive(key: nameKey, parts: [Array(Self.sivLabel.utf8)])
        encryptionKey = try Blake2b.derive(key: nameKey, parts: [Array(Self.encryptionLabel.utf8)])
    }

    /// How a name is stored in a directory.
    package enum StoredName: Equatable, Sendable {
        /// The directory entry is the encrypted name itself.
        case short(String)
        /// The encrypted name is longer than an entry may be: the entry is `entry` (see `longEntry(for:)`), and the
        /// encrypted name is kept beside it, in a file the caller names after the entry.
        case long(entry: String, encryptedName: String)

        /// The directory entry's name.
        package var entry: String {
            switch self {
            case .short(let name): name
            case .long(let entry, _): entry
            }
        }
    }

    /// The stored form of `name` in the directory whose IV is `directoryIV`. `name` is one path component:
    /// not empty, no "/" or NUL, at most 255 bytes (callers check with their own error messages first).
    package func storedName(for name: String, directoryIV: [UInt8]) throws -> StoredName {
        let key = RecentKey(directoryIV: directoryIV, name: name)
        if let known = recent.withLock({ $0[key] }) { return known }
        let stored = try computeStoredName(for: name, directoryIV: directoryIV)
        recent.withLock { recent in
            if recent.count >= Self.recentLimit { recent.removeAll(keepingCapacity: true) }
            recent[key] = stored
        }
        return stored
    }

    private func computeStoredName(for name: String, directoryIV: [UInt8]) throws -> StoredName {
        precondition(directoryIV.count == Self.directoryIVBytes)
        let plain = Array(name.utf8)
        precondition(!plain.isEmpty && !plain.contains(0) && !plain.contains(UInt8(ascii: "/")), "not a path component")
        let padded = plain + [UInt8](repeating: 0, count: (Self.paddingBlock - plain.count % Self.paddingBlock) % Self.paddingBlock)
        let nonce = try syntheticNonce(padded: padded, directoryIV: directoryIV)
        var sealed = [UInt8](repeating: 0, count: padded.count + AEAD.tagBytes)
        try seal(padded, nonce: nonce, associatedData: [Self.nameDomain] + directoryIV, into: &sealed)
        let encrypted = Base64URL.encode(nonce + sealed)
        guard encrypted.utf8.count > Self.maximumEntryBytes else { return .short(encrypted) }
        return .long(entry: Self.longEntry(for: encrypted), encryptedName: encrypted)
    }

    /// The name stored as `encrypted` (a short entry, or a long name's encrypted name) in the directory whose IV is
    /// `directoryIV`; nil unless it is authentic, canonical and a valid path component.
    package func name(fromEncrypted encrypted: String, directoryIV: [UInt8]) -> String? {
        guard directoryIV.count == Self.directoryIVBytes, let bytes = Base64URL.decode(encrypted),
              bytes.count >= AEAD.nonceBytes + AEAD.tagBytes + Self.paddingBlock,
              (bytes.count - AEAD.nonceBytes - AEAD.tagBytes) % Self.paddingBlock == 0 else { return nil }
        let nonce = Array(bytes[..<AEAD.nonceBytes])
        guard let padded = try? open(bytes[AEAD.nonceBytes...], nonce: nonce, associatedData: [Self.nameDomain] + directoryIV),
              // Only the synthetic nonce is accepted, so each name has exactly one stored form.
              let expected = try? syntheticNonce(padded: padded, directoryIV: directoryIV),
              sodium_memcmp(expected, nonce, nonce.count) == 0 else { return nil }
        let plain = padded.prefix { $0 != 0 }
        guard !plain.isEmpty, plain.count <= Self.maximumEntryBytes, padded[plain.count...].allSatisfy({ $0 == 0 }), padded.count - plain.count < Self.paddingBlock,
              !plain.contains(UInt8(ascii: "/")), let name = String(validating: plain, as: UTF8.self),
              name != ".", name != ".." else { return nil }
        return name
    }

    /// The directory entry of a long name: the prefix and the unkeyed BLAKE2b-256 of its encrypted name, so a
    /// lookup finds it without reading anything, and the stored encrypted name can be checked against it.
    package static func longEntry(for encryptedName: String) -> String {
        longEntryPrefix + Base64URL.encode(Blake2b.hash(encryptedName.utf8))
    }

    /// Whether a directory entry is a long-name entry (its encrypted name is stored beside it).
    package static func isLongEntry(_ entry: String) -> Bool {
        entry.hasPrefix(longEntryPrefix) && entry.utf8.count == longEntryPrefix.utf8.count + 43
    }

    /// Begins every link target stored in the current form, sealed without its directory; never a base64url
    /// character, so never the start of a target stored in the first form, which was bound to its directory.
    package static let linkTargetPrefix = "~"

    /// The stored target of a symbolic link to `target`: "~" and the sealed target, bound to no directory, so the
    /// link reads wherever it is moved or hard-linked (docs/FORMAT.md §7).
    package func sealedLinkTarget(_ target: String) throws -> String {
        Self.linkTargetPrefix + Base64URL.encode(try sealLinkTarget(target, associatedData: Self.linkAssociatedData))
    }

    /// nonce ‖ the target sealed with a random nonce, padded with NULs to a multiple of 16, as names are, so the
    /// stored length tells the target's only roughly (a target holds no NUL, so the padding is unambiguous).
    private func sealLinkTarget(_ target: String, associatedData: [UInt8]) throws -> [UInt8] {
        let nonce = Random.bytes(AEAD.nonceBytes)
        var padded = Array(target.utf8)
        padded += [UInt8](repeating: 0, count: (Self.paddingBlock - padded.count % Self.paddingBlock) % Self.paddingBlock)
        defer { zeroize(&padded) }
        var sealed = [UInt8](repeating: 0, count: padded.count + AEAD.tagBytes)
        try seal(padded, nonce: nonce, associatedData: associatedData, into: &sealed)
        return nonce + sealed
    }

    /// The target a stored link target stands for, in either form (the first one needs the IV of the directory the
    /// link was made in, `directoryIV`); nil unless it is authentic and holds no NUL before its padding.
    package func linkTarget(fromSealed stored: String, directoryIV: [UInt8]) -> String? {
        let isBound = !stored.hasPrefix(Self.linkTargetPrefix)
        guard let bytes = Base64URL.decode(isBound ? stored : String(stored.dropFirst(Self.linkTargetPrefix.count))),
              bytes.count >= AEAD.nonceBytes + AEAD.tagBytes, !isBound || directoryIV.count == Self.directoryIVBytes,
              let plain = try? open(bytes[AEAD.nonceBytes...], nonce: Array(bytes[..<AEAD.nonceBytes]),
                                    associatedData: isBound ? [Self.linkDomain] + directoryIV : Self.linkAssociatedData) else { return nil }
        // The padding: fewer than 16 NULs after a non-empty target.
        let end = plain.firstIndex(of: 0) ?? plain.count
        guard end > 0, plain.count - end < Self.paddingBlock, plain[end...].allSatisfy({ $0 == 0 }) else { return nil }
        return String(validating: plain[..<end], as: UTF8.self)
    }

    /// Whether a stored link target is in the first form, bound to the directory the link was made in: such a link
    /// is sealed again (`sealedLinkTarget`) before it is moved to another directory or given a name in one.
    package static func isBoundToDirectory(linkTarget stored: String) -> Bool { !stored.hasPrefix(linkTargetPrefix) }

    /// The first form bound a target to its directory with the directory's IV; the current one binds it to the
    /// domain and the form's number only (2 bytes, never the 17 of the first form's data).
    private static let linkAssociatedData: [UInt8] = [linkDomain, 2]

    /// The first form of a stored link target, bound to the directory whose IV is `directoryIV`: kept to test the
    /// reading of links stored before the current form.
    func directoryBoundLinkTarget(_ target: String, directoryIV: [UInt8]) throws -> String {
        precondition(directoryIV.count == Self.directoryIVBytes)
        return Base64URL.encode(try sealLinkTarget(target, associatedData: [Self.linkDomain] + directoryIV))
    }

    /// A 16-byte identifier of `text` (a bundle identifier) that reveals nothing of it without the key: the first
    /// 16 bytes of BLAKE2b keyed with the SIV key over "id" ‖ text, as an uppercase UUID-shaped string.
    package func identifier(for text: String) throws -> String {
        let message = Array("id".utf8) + Array(text.utf8)
        let digest = try message.withUnsafeBytes { try Blake2b.mac(key: sivKey, message: $0) }
        let hex = digest.prefix(16).map { String(format: "%02X", $0) }.joined()
        let groups = [0..<8, 8..<12, 12..<16, 16..<20, 20..<32].map { range in
            String(hex[hex.index(hex.startIndex, offsetBy: range.lowerBound)..<hex.index(hex.startIndex, offsetBy: range.upperBound)])
        }
        return groups.joined(separator: "-")
    }

    /// Seals one of the container's metadata records (an Inbox queue entry, which holds names): nonce ‖ ciphertext,
    /// with `context` (what the record's file name says, such as its sequence number) bound in.
    /// A JSON record is padded with spaces (which JSON allows after the value) to a multiple of `padding` bytes, so
    /// its stored size tells its content's length only to that granularity.
    package func sealedRecord(_ record: [UInt8], context: [UInt8], padding: Int = 1) throws -> [UInt8] {
        let nonce = Random.bytes(AEAD.nonceBytes)
        var padded = record + [UInt8](repeating: UInt8(ascii: " "), count: (padding - record.count % padding) % padding)
        defer { zeroize(&padded) }
        var sealed = [UInt8](repeating: 0, count: padded.count + AEAD.tagBytes)
        try seal(padded, nonce: nonce, associatedData: [Self.recordDomain] + context, into: &sealed)
        return nonce + sealed
    }

    /// The record sealed as `sealed` with `context`; nil unless authentic.
    package func record(fromSealed sealed: [UInt8], context: [UInt8]) -> [UInt8]? {
        guard sealed.count >= AEAD.nonceBytes + AEAD.tagBytes else { return nil }
        return try? open(sealed[AEAD.nonceBytes...], nonce: Array(sealed[..<AEAD.nonceBytes]), associatedData: [Self.recordDomain] + context)
    }

    /// The first 24 bytes of BLAKE2b keyed with the SIV key over IV ‖ padded name (the IV has a fixed length,
    /// so the concatenation is unambiguous).
    private func syntheticNonce(padded: [UInt8], directoryIV: [UInt8]) throws -> [UInt8] {
        let message = directoryIV + padded
        return Array(try message.withUnsafeBytes { try Blake2b.mac(key: sivKey, message: $0) }.prefix(AEAD.nonceBytes))
    }

    private func seal(_ plaintext: [UInt8], nonce: [UInt8], associatedData: [UInt8], into output: inout [UInt8]) throws {
        try encryptionKey.withUnsafeBytes { key in
            plaintext.withUnsafeBytes { plain in
                nonce.withUnsafeBytes { n in
                    associatedData.withUnsafeBytes { ad in
                        output.withUnsafeMutableBytes { out in
                            AEAD.seal(plain, key: key, nonce: n, associatedData: ad, into: out)
                        }
                    }
                }
            }
        }
    }

    private func open(_ sealed: ArraySlice<UInt8>, nonce: [UInt8], associatedData: [UInt8]) throws -> [UInt8]? {
        var plain = [UInt8](repeating: 0, count: sealed.count - AEAD.tagBytes)
        let authentic = try encryptionKey.withUnsafeBytes { key in
            sealed.withUnsafeBytes { s in
                nonce.withUnsafeBytes { n in
                    associatedData.withUnsafeBytes { ad in
                        plain.withUnsafeMutableBytes { out in
                            AEAD.open(s, key: key, nonce: n, associatedData: ad, into: out)
                        }
                    }
                }
            }
        }
        return authentic ? plain : nil
    }
}

/// Base64 with the URL and file-name safe alphabet and no padding (RFC 4648 §5): no "/" and no ".", so a
/// stored name is a valid file name that can't be mistaken for "." , ".." or a hidden file. Byte-level, since every
/// path walked encodes a name per directory.
package enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (value, character) in alphabet.enumerated() { table[Int(character)] = UInt8(value) }
        return table
    }()

    package static func encode(_ bytes: [UInt8]) -> String {
        var text = [UInt8]()
        text.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let group = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            text += [alphabet[Int(group >> 18)], alphabet[Int(group >> 12 & 63)], alphabet[Int(group >> 6 & 63)], alphabet[Int(group & 63)]]
            index += 3
        }
        switch bytes.count - index {
        case 1:
            let group = UInt32(bytes[index]) << 16
            text += [alphabet[Int(group >> 18)], alphabet[Int(group >> 12 & 63)]]
        case 2:
            let group = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8
            text += [alphabet[Int(group >> 18)], alphabet[Int(group >> 12 & 63)], alphabet[Int(group >> 6 & 63)]]
        default:
            break
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// nil unless `text` is canonical unpadded base64url (so each byte string has one text form: the unused low
    /// bits of the last character must be zero).
    package static func decode(_ text: String) -> [UInt8]? {
        let characters = Array(text.utf8)
        guard characters.count % 4 != 1 else { return nil }
        var bytes = [UInt8]()
        bytes.reserveCapacity(characters.count * 3 / 4)
        var group: UInt32 = 0
        var bits = 0
        for character in characters {
            let value = values[Int(character)]
            guard value != 0xFF else { return nil }
            group = group << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                bytes.append(UInt8(truncatingIfNeeded: group >> UInt32(bits)))
                group &= (1 << UInt32(bits)) - 1
            }
        }
        guard group == 0 else { return nil }
        return bytes
    }
}
