import Foundation
import ProtectedStoreCore

// The keychain requests' fields (docs/PROTOCOL.md §7). Secrets never travel in the JSON: an add's or update's
// secret is the frame's attachment, and so are a search's secrets in the reply (each a 4-byte little-endian length
// and its bytes, in the order of the items).

/// An item's attributes on the wire.
package struct KeychainItemMessage: Codable, Sendable, Equatable {
    var itemClass: UInt8
    var service, account, server, `protocol`, path, label, accessGroup: String?
    var port: Int?
    var generic: String?
    var accessible: UInt8
    var created, modified: Double?
    var persistentReference: String?

    package init(_ item: KeychainItem) {
        itemClass = item.itemClass.rawValue
        service = item.service
        account = item.account
        server = item.server
        `protocol` = item.protocol
        path = item.path
        label = item.label
        accessGroup = item.accessGroup
        port = item.port
        generic = item.generic?.base64EncodedString()
        accessible = item.accessible.rawValue
        created = item.creationDate?.timeIntervalSince1970
        modified = item.modificationDate?.timeIntervalSince1970
        persistentReference = item.persistentReference?.base64EncodedString()
    }

    /// The item, without a secret; nil if a field is not one this build knows.
    package func item() -> KeychainItem? {
        guard let itemClass = KeychainItemClass(rawValue: itemClass), let accessible = KeychainAccessibility(rawValue: accessible),
              validBase64(generic), validBase64(persistentReference) else { return nil }
        var item = KeychainItem(itemClass: itemClass, service: service, account: account, server: server, protocol: `protocol`, port: port, path: path,
                                label: label, generic: generic.flatMap { Data(base64Encoded: $0) }, accessGroup: accessGroup, accessible: accessible)
        item.creationDate = created.map(Date.init(timeIntervalSince1970:))
        item.modificationDate = modified.map(Date.init(timeIntervalSince1970:))
        item.persistentReference = persistentReference.flatMap { Data(base64Encoded: $0) }
        return item
    }
}

/// A query on the wire.
package struct KeychainQueryMessage: Codable, Sendable, Equatable {
    var itemClass: UInt8
    var service, account, server, `protocol`, path, label, accessGroup: String?
    var port: Int?
    var accessible: UInt8?
    var persistentReference: String?
    var all: Bool

    package init(_ query: KeychainQuery) {
        itemClass = query.itemClass.rawValue
        service = query.service
        account = query.account
        server = query.server
        `protocol` = query.protocol
        path = query.path
        label = query.label
        accessGroup = query.accessGroup
        port = query.port
        accessible = query.accessible?.rawValue
        persistentReference = query.persistentReference?.base64EncodedString()
        all = query.limit == .all
    }

    package func query() -> KeychainQuery? {
        // A reference that does not decode must not widen the query to every item.
        guard let itemClass = KeychainItemClass(rawValue: itemClass), validBase64(persistentReference) else { return nil }
        var accessibility: KeychainAccessibility?
        if let accessible {
            guard let known = KeychainAccessibility(rawValue: accessible) else { return nil }
            accessibility = known
        }
        return KeychainQuery(itemClass: itemClass, service: service, account: account, server: server, protocol: `protocol`, port: port, path: path,
                             label: label, accessGroup: accessGroup, accessible: accessibility,
                             persistentReference: persistentReference.flatMap { Data(base64Encoded: $0) }, limit: all ? .all : .one)
    }
}

/// An update's changes on the wire (the new secret, if any, is the attachment).
package struct KeychainChangesMessage: Codable, Sendable, Equatable {
    var service, account, server, `protocol`, path, label, accessGroup: String?
    var port: Int?
    var generic: String?
    var accessible: UInt8?

    package init(_ changes: KeychainChanges) {
        service = changes.service
        account = changes.account
        server = changes.server
        `protocol` = changes.protocol
        path = changes.path
        label = changes.label
        accessGroup = changes.accessGroup
        port = changes.port
        generic = changes.generic?.base64EncodedString()
        accessible = changes.accessible?.rawValue
    }

    package func changes(secret: Data?) -> KeychainChanges? {
        guard validBase64(generic) else { return nil }
        var accessibility: KeychainAccessibility?
        if let accessible {
            guard let known = KeychainAccessibility(rawValue: accessible) else { return nil }
            accessibility = known
        }
        return KeychainChanges(service: service, account: account, server: server, protocol: `protocol`, port: port, path: path, label: label,
                               generic: generic.flatMap { Data(base64Encoded: $0) }, accessGroup: accessGroup, accessible: accessibility, secret: secret)
    }
}

/// Whether an optional base64 field is absent or decodes.
private func validBase64(_ text: String?) -> Bool { text.map { Data(base64Encoded: $0) != nil } ?? true }

/// Secrets as one attachment: each a 4-byte little-endian length and its bytes.
package enum KeychainSecrets {
    package static func pack(_ secrets: [Data]) -> SecureBytes {
        SecureBytes(count: secrets.reduce(0) { $0 + 4 + $1.count }) { out in
            var offset = 0
            for secret in secrets {
                withUnsafeBytes(of: UInt32(secret.count).littleEndian) { out.baseAddress!.advanced(by: offset).copyMemory(from: $0.baseAddress!, byteCount: 4) }
                offset += 4
                secret.withUnsafeBytes { if let base = $0.baseAddress { out.baseAddress!.advanced(by: offset).copyMemory(from: base, byteCount: $0.count) } }
                offset += secret.count
            }
        }
    }

    /// The secrets an attachment holds; nil if it does not parse as `pack` writes.
    package static func unpack(_ attachment: SecureBytes?) throws -> [Data]? {
        guard let attachment else { return [] }
        return try attachment.withUnsafeBytes { bytes -> [Data]? in
            var secrets: [Data] = []
            var offset = 0
            while offset < bytes.count {
                guard bytes.count - offset >= 4 else { return nil }
                let count = Int(bytes[offset]) | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2]) << 16 | Int(bytes[offset + 3]) << 24
                offset += 4
                guard bytes.count - offset >= count else { return nil }
                secrets.append(Data(bytes[offset..<offset + count]))
                offset += count
            }
            return secrets
        }
    }
}
