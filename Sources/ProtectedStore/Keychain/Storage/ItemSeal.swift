import CSodium
import Foundation
import ProtectedStoreCore

/// The keychain's sealing arithmetic (docs/FORMAT.md §9): the keys derived from the lookup key, the tags that let SQL
/// find rows without any attribute in clear, the item body's encoding and its seal, and the row digest.
enum ItemSeal {
    /// Bytes of a persistent reference (the row's id).
    static let referenceBytes = 16
    /// Item bodies are padded to a multiple of this, so a row's size tells little about its attributes.
    static let bodyPadding = 256
    /// The largest secret an item holds.
    static let maximumSecretBytes = 16 * 1024
    /// The largest `generic` attribute.
    static let maximumGenericBytes = 4 * 1024
    /// The ephemeral-key field of a class A or C key seal, which has none (zeros, as in a file header).
    static let noEphemeralKey = [UInt8](repeating: 0, count: 32)
    /// The largest text attribute (service, account, label, …), in UTF-8 bytes.
    static let maximumTextBytes = 1024

    /// The keys under the lookup key: one for tags, one for the row digest.
    struct Keys: Sendable {
        let tag: SecureBytes
        let digest: SecureBytes

        init(lookupKey: SecureBytes) throws {
            tag = try Blake2b.derive(key: lookupKey, parts: [Array("PSKC tag key 1".utf8)])
            digest = try Blake2b.derive(key: lookupKey, parts: [Array("PSKC digest key 1".utf8)])
        }

        func discard() {
            tag.discard()
            digest.discard()
        }

        /// The keyed tag of a labelled list of values: equal inputs give equal tags, nothing else shows.
        func tag(_ label: String, _ values: [[UInt8]]) throws -> [UInt8] {
            var message = ByteWriter()
            appendField(&message, Array(label.utf8))
            for value in values { appendField(&message, value) }
            return try message.bytes.withUnsafeBytes { try Blake2b.mac(key: tag, message: $0) }
        }

        func groupTag(_ group: String) throws -> [UInt8] { try tag("group", [Array(group.utf8)]) }

        /// The tag of one searchable attribute (service, account, server), whatever the group, so a query over every
        /// group the caller may see is one indexed lookup; equal values of different items show as equal tags.
        func attributeTag(_ name: String, _ value: String?) throws -> [UInt8] {
            try tag(name, [Array((value ?? "").utf8)])
        }

        /// The primary key's tag: the UNIQUE column that makes a second item with the same key a duplicate.
        func primaryTag(of item: KeychainItem, group: String) throws -> [UInt8] {
            let text = { (value: String?) in Array((value ?? "").utf8) }
            return switch item.itemClass {
            case .genericPassword: try tag("primary genp", [Array(group.utf8), text(item.service), text(item.account)])
            case .internetPassword: try tag("primary inet", [Array(group.utf8), text(item.server), text(item.account), text(item.protocol), text(item.port.map(String.init)), text(item.path)])
            }
        }

        /// The MAC of the digest record, so only a digest the keychain wrote is taken.
        func digestMAC(xor: [UInt8], count: Int64) throws -> [UInt8] {
            let message = Array("PSKC row set 1".utf8) + xor + withUnsafeBytes(of: UInt64(bitPattern: count).littleEndian, Array.init)
            return try message.withUnsafeBytes { try Blake2b.mac(key: digest, message: $0) }
        }

        /// A row's MAC; the stored digest is the XOR of every row's, so a removed, added or changed row shows.
        func rowMAC(_ row: StoredRow) throws -> [UInt8] {
            var message = ByteWriter()
            for field in [row.reference, [row.kind, row.accessible], row.groupTag, row.primaryTag, row.serviceTag, row.accountTag, row.serverTag, row.wrappedKey, row.body] {
                appendField(&message, field)
            }
            return try message.bytes.withUnsafeBytes { try Blake2b.mac(key: digest, message: $0) }
        }
    }

    /// What the item's key seal authenticates: the keybag, the row and the accessibility, so a wrapped key moved to
    /// another row, device or class fails.
    static func keyAssociatedData(keybagID: [UInt8], reference: [UInt8], kind: UInt8, accessible: UInt8) -> [UInt8] {
        Array("PSKC item key 1".utf8) + keybagID + reference + [kind, accessible]
    }

    /// What the lookup key's seal authenticates.
    static func lookupAssociatedData(keybagID: [UInt8]) -> [UInt8] { Array("PSKC lookup key 1".utf8) + keybagID }

    /// What the body's seal authenticates: every clear column of its row.
    static func bodyAssociatedData(_ row: StoredRow) -> [UInt8] {
        var data = ByteWriter()
        for field in [Array("PSKC body 1".utf8), row.reference, [row.kind, row.accessible], row.groupTag, row.primaryTag, row.serviceTag, row.accountTag, row.serverTag] {
            appendField(&data, field)
        }
        return data.bytes
    }

    /// Throws `errSecParam` unless every attribute of `item` fits the class and the limits.
    static func validate(_ item: KeychainItem, adding: Bool) throws {
        func refuse(_ problem: String) -> KeychainError {
            KeychainError(.param, problem: problem, remedy: "Change the item's attributes")
        }
        if item.itemClass == .genericPassword {
            for (name, value) in [("server", item.server), ("protocol", item.protocol), ("path", item.path)] where value != nil {
                throw refuse("a generic password has no \(name) attribute (kSecAttr\(name.prefix(1).uppercased() + name.dropFirst()) is for internet passwords)")
            }
            if item.port != nil { throw refuse("a generic password has no port attribute (kSecAttrPort is for internet passwords)") }
        } else {
            if item.service != nil { throw refuse("an internet password has no service attribute (kSecAttrService is for generic passwords)") }
            if item.generic != nil { throw refuse("an internet password has no generic attribute (kSecAttrGeneric is for generic passwords)") }
        }
        for (name, value) in [("service", item.service), ("account", item.account), ("server", item.server), ("protocol", item.protocol),
                              ("path", item.path), ("label", item.label), ("access group", item.accessGroup)] {
            if let value, value.utf8.count > maximumTextBytes {
                throw refuse("the \(name) is \(value.utf8.count) bytes; the keychain takes at most \(maximumTextBytes) bytes of UTF-8 per text attribute")
            }
        }
        if let group = item.accessGroup, group.isEmpty { throw refuse("the access group is empty") }
        if let port = item.port, !(0...65535).contains(port) { throw refuse("the port \(port) is not between 0 and 65535") }
        if let generic = item.generic, generic.count > maximumGenericBytes {
            throw refuse("the generic attribute is \(generic.count) bytes; the keychain takes at most \(maximumGenericBytes)")
        }
        if let secret = item.secret, secret.count > maximumSecretBytes {
            throw refuse("the secret is \(secret.count) bytes; the keychain takes at most \(maximumSecretBytes) bytes per item")
        }
        if adding && item.secret == nil { throw refuse("an item to add needs its secret (kSecValueData)") }
    }

    // MARK: The body

    private enum Field: UInt8 {
        case end = 0, accessGroup, service, account, server, `protocol`, port, path, label, generic, created, modified, secret
    }

    /// The item's attributes and secret as one padded plaintext; the caller zeroes it once sealed.
    static func encodeBody(_ item: KeychainItem, group: String) -> [UInt8] {
        // Reserved whole up front: a buffer that grew would leave a copy of what it held in freed memory.
        let texts = [group, item.service, item.account, item.server, item.protocol, item.path, item.label].compactMap { $0?.utf8.count }
        let unpadded = 2 + texts.reduce(0) { $0 + 5 + $1 } + 5 * 4 + 4 + 8 + 8 + (item.generic?.count ?? 0) + (item.secret?.count ?? 0)
        var body = ByteWriter(capacity: (unpadded + bodyPadding - 1) / bodyPadding * bodyPadding + bodyPadding)
        body.append(UInt8(1))
        func text(_ field: Field, _ value: String?) { if let value { bytes(field, value.utf8) } }
        // Appended straight from the caller's value: no intermediate copy of a secret is left unzeroed.
        func bytes(_ field: Field, _ value: some Collection<UInt8>) {
            body.append(field.rawValue)
            body.append(UInt32(value.count))
            body.append(value)
        }
        func date(_ field: Field, _ value: Date?) {
            if let value { bytes(field, withUnsafeBytes(of: Int64((value.timeIntervalSince1970 * 1000).rounded()).littleEndian, Array.init)) }
        }
        text(.accessGroup, group)
        text(.service, item.service)
        text(.account, item.account)
        text(.server, item.server)
        text(.protocol, item.protocol)
        if let port = item.port { bytes(.port, withUnsafeBytes(of: UInt32(port).littleEndian, Array.init)) }
        text(.path, item.path)
        text(.label, item.label)
        if let generic = item.generic { bytes(.generic, generic) }
        date(.created, item.creationDate)
        date(.modified, item.modificationDate)
        if let secret = item.secret { bytes(.secret, secret) }
        body.append(Field.end.rawValue)
        let padded = (body.bytes.count + bodyPadding - 1) / bodyPadding * bodyPadding
        body.appendZeros(padded - body.bytes.count)
        return body.bytes
    }

    /// The item a body holds; nil if it does not parse (only a bug or a key compromise could make an authentic body so).
    static func decodeBody(_ body: [UInt8], itemClass: KeychainItemClass, accessible: KeychainAccessibility, reference: [UInt8]) -> KeychainItem? {
        var item = KeychainItem(itemClass: itemClass, accessible: accessible)
        item.persistentReference = Data(reference)
        guard body.first == 1 else { return nil }
        var reader = ByteReader(body)
        _ = reader.uint8()
        var previous = Field.end
        while true {
            guard reader.offset < body.count, let field = Field(rawValue: reader.uint8()) else { return nil }
            if field == .end { return item }
            // Each field at most once, in order, as `encodeBody` writes them.
            guard field.rawValue > previous.rawValue else { return nil }
            previous = field
            guard body.count - reader.offset >= 4 else { return nil }
            let count = Int(reader.uint32())
            guard body.count - reader.offset >= count else { return nil }
            var value = reader.take(count)
            defer { scrub(&value) }
            var text: String { String(decoding: value, as: UTF8.self) }
            func date() -> Date? {
                guard value.count == 8 else { return nil }
                let milliseconds = Int64(bitPattern: value.reversed().reduce(0) { $0 << 8 | UInt64($1) })
                return Date(timeIntervalSince1970: Double(milliseconds) / 1000)
            }
            switch field {
            case .end: return item
            case .accessGroup: item.accessGroup = text
            case .service: item.service = text
            case .account: item.account = text
            case .server: item.server = text
            case .protocol: item.protocol = text
            case .port:
                guard value.count == 4 else { return nil }
                item.port = Int(value.reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
            case .path: item.path = text
            case .label: item.label = text
            case .generic: item.generic = Data(value)
            case .created:
                guard let date = date() else { return nil }
                item.creationDate = date
            case .modified:
                guard let date = date() else { return nil }
                item.modificationDate = date
            case .secret: item.secret = Data(value)
            }
        }
    }

    /// nonce ‖ XChaCha20-Poly1305 of `plaintext` under the item's key.
    static func sealBody(_ plaintext: [UInt8], key: SecureBytes, associatedData: [UInt8]) throws -> [UInt8] {
        var sealed = [UInt8](repeating: 0, count: AEAD.nonceBytes + plaintext.count + AEAD.tagBytes)
        try sealed.withUnsafeMutableBytes { out in
            Random.fill(UnsafeMutableRawBufferPointer(rebasing: out[0..<AEAD.nonceBytes]))
            try key.withUnsafeBytes { k in
                plaintext.withUnsafeBytes { p in
                    associatedData.withUnsafeBytes { ad in
                        AEAD.seal(p, key: k, nonce: UnsafeRawBufferPointer(rebasing: out[0..<AEAD.nonceBytes]), associatedData: ad,
                                  into: UnsafeMutableRawBufferPointer(rebasing: out[AEAD.nonceBytes...]))
                    }
                }
            }
        }
        return sealed
    }

    /// The plaintext of a sealed body; nil if it fails authentication.
    static func openBody(_ sealed: [UInt8], key: SecureBytes, associatedData: [UInt8]) throws -> [UInt8]? {
        guard sealed.count >= AEAD.nonceBytes + AEAD.tagBytes else { return nil }
        var plaintext = [UInt8](repeating: 0, count: sealed.count - AEAD.nonceBytes - AEAD.tagBytes)
        let authentic = try plaintext.withUnsafeMutableBytes { out in
            try key.withUnsafeBytes { k in
                sealed.withUnsafeBytes { s in
                    associatedData.withUnsafeBytes { ad in
                        AEAD.open(UnsafeRawBufferPointer(rebasing: s[AEAD.nonceBytes...]), key: k, nonce: UnsafeRawBufferPointer(rebasing: s[0..<AEAD.nonceBytes]),
                                  associatedData: ad, into: out)
                    }
                }
            }
        }
        return authentic ? plaintext : nil
    }

    /// Zeroes a plaintext body before its memory is released.
    static func scrub(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { if let base = $0.baseAddress { sodium_memzero(base, $0.count) } }
    }

    private static func appendField(_ writer: inout ByteWriter, _ field: [UInt8]) {
        writer.append(UInt32(field.count))
        writer.append(field)
    }
}

/// A row of the `items` table as stored (docs/FORMAT.md §9).
struct StoredRow: Sendable, Equatable {
    var reference: [UInt8]
    var kind: UInt8
    var accessible: UInt8
    var groupTag: [UInt8]
    var primaryTag: [UInt8]
    var serviceTag: [UInt8]
    var accountTag: [UInt8]
    var serverTag: [UInt8]
    var wrappedKey: [UInt8]
    var body: [UInt8]
}
