/// Little-endian fixed-width fields, the only integer encoding used on disk.
package struct ByteWriter {
    package private(set) var bytes: [UInt8] = []

    package init(capacity: Int = 0) { bytes.reserveCapacity(capacity) }

    package mutating func append(_ data: some Collection<UInt8>) { bytes.append(contentsOf: data) }
    package mutating func append(_ value: UInt8) { bytes.append(value) }
    package mutating func append(_ value: UInt16) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    package mutating func append(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    package mutating func append(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    package mutating func appendZeros(_ count: Int) { bytes.append(contentsOf: repeatElement(0, count: count)) }
}

/// Reads what `ByteWriter` wrote; the caller checks the total length first, so reads never run past the end.
package struct ByteReader {
    private let bytes: [UInt8]
    package private(set) var offset = 0

    package init(_ bytes: [UInt8]) { self.bytes = bytes }

    package mutating func take(_ count: Int) -> [UInt8] {
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    package mutating func uint8() -> UInt8 { take(1)[0] }
    package mutating func uint16() -> UInt16 { take(2).reversed().reduce(0) { $0 << 8 | UInt16($1) } }
    package mutating func uint32() -> UInt32 { take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) } }
    package mutating func uint64() -> UInt64 { take(8).reversed().reduce(0) { $0 << 8 | UInt64($1) } }
}
