import Foundation
import ProtectedStoreCore

/// An item's extended attributes of the `user.` namespace, names and values, stored sealed under the container's
/// name key as one attribute of the stored item, `user.sandboxctl.attributes` (docs/FORMAT.md §7). One sealed
/// value hides how many there are, their names and their sizes (to 64 bytes); like names, they are readable while
/// the device is locked.
package struct SealedAttributes: Equatable, Sendable {
    /// The stored item's own attribute that holds them.
    package static let storedName = "user.sandboxctl.attributes"
    /// What a program may keep per item: ext4 with 4 KiB blocks keeps about 4,000 bytes of attributes per inode;
    /// these are stored sealed in one attribute of the stored item, beside its ACLs, within the same block.
    package static let capacity = 3_800
    /// The namespace stored here; `system.posix_acl_*` stay the stored item's own ACLs.
    package static let namespace = "user."
    private static let context = Array("attributes".utf8)
    private static let version: UInt8 = 1
    private static let padding = 64

    /// Name and value, in the order they were first set (listxattr's order).
    package private(set) var entries: [(name: String, value: [UInt8])] = []

    package init() {}

    package static func == (lhs: SealedAttributes, rhs: SealedAttributes) -> Bool {
        lhs.entries.elementsEqual(rhs.entries) { $0.name == $1.name && $0.value == $1.value }
    }

    package func value(named name: String) -> [UInt8]? { entries.first { $0.name == name }?.value }

    /// Sets `name` to `value`; ENOSPC (as ext4) when the item's attributes would exceed `capacity`.
    package mutating func set(_ name: String, to value: [UInt8]) throws {
        var changed = self
        if let index = changed.entries.firstIndex(where: { $0.name == name }) {
            changed.entries[index].value = value
        } else {
            changed.entries.append((name, value))
        }
        guard changed.plaintextSize <= Self.capacity else {
            throw ProtectedStoreError(.io, path: name, problem: "the item's extended attributes would take \(changed.plaintextSize) bytes; an item keeps at most \(Self.capacity)",
                                      remedy: "Remove attributes or store less in them", errno: .noSpace)
        }
        self = changed
    }

    /// Removes `name`; false if it was not set.
    package mutating func remove(_ name: String) -> Bool {
        guard let index = entries.firstIndex(where: { $0.name == name }) else { return false }
        entries.remove(at: index)
        return true
    }

    /// Version, count (2 bytes), then per attribute: name length (1), name, value length (4), value; little-endian.
    private var plaintextSize: Int { entries.reduce(3) { $0 + 5 + $1.name.utf8.count + $1.value.count } }

    /// The stored value: the plaintext sealed with the name key, padded with spaces to a multiple of 64 bytes.
    package func sealed(with cipher: NameCipher) throws -> [UInt8] {
        var plain: [UInt8] = [Self.version]
        plain += withUnsafeBytes(of: UInt16(entries.count).littleEndian, Array.init)
        for (name, value) in entries {
            plain.append(UInt8(name.utf8.count))
            plain += Array(name.utf8)
            plain += withUnsafeBytes(of: UInt32(value.count).littleEndian, Array.init)
            plain += value
        }
        defer { zeroize(&plain) }
        return try cipher.sealedRecord(plain, context: Self.context, padding: Self.padding)
    }

    /// The attributes stored as `sealed`; nil unless it opens and parses exactly (the padding only after the last).
    package static func open(_ sealed: [UInt8], with cipher: NameCipher) -> SealedAttributes? {
        guard var plain = cipher.record(fromSealed: sealed, context: context) else { return nil }
        defer { zeroize(&plain) }
        var reader = plain[...]
        func take(_ count: Int) -> ArraySlice<UInt8>? {
            guard reader.count >= count else { return nil }
            defer { reader = reader.dropFirst(count) }
            return reader.prefix(count)
        }
        func integer(_ bytes: ArraySlice<UInt8>) -> Int { bytes.reversed().reduce(0) { $0 << 8 | Int($1) } }
        guard take(1)?.first == version, let count = take(2).map(integer) else { return nil }
        var attributes = SealedAttributes()
        for _ in 0..<count {
            guard let nameLength = take(1).map(integer), nameLength > 0, let nameBytes = take(nameLength),
                  let name = String(validating: nameBytes, as: UTF8.self), name.hasPrefix(namespace),
                  attributes.value(named: name) == nil,
                  let valueLength = take(4).map(integer), let value = take(valueLength) else { return nil }
            attributes.entries.append((name, Array(value)))
        }
        guard reader.count < padding, reader.allSatisfy({ $0 == UInt8(ascii: " ") }) else { return nil }
        return attributes
    }
}
