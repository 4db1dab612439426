/// Little-endian fixed-width fields, the only integer encoding used on disk.
struct ByteWriter {
    private(set) var bytes: [UInt8] = []

    init(capacity: Int = 0) { bytes.reserveCapacity(capacity) }

    mutating func append(_ data: some Collection<UInt8>) { bytes.append(contentsOf: data) }
    mutating func append(_ value: UInt8) { bytes.append(value) }
    mutating func append(_ value: UInt16) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func append(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func append(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func appendZeros(_ count: Int) { bytes.append(contentsOf: repeatElement(0, count: count)) }
}

/// Reads what `ByteWriter` wrote; the caller checks the total length first, so reads never run past the end.
struct ByteReader {
    private let bytes: [UInt8]
    private(set) var offset = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    mutating func take(_ count: Int) -> [UInt8] {
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    mutating func uint8() -> UInt8 { take(1)[0] }
    mutating func uint16() -> UInt16 { take(2).reversed().reduce(0) { $0 << 8 | UInt16($1) } }
    mutating func uint32() -> UInt32 { take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) } }
    mutating func uint64() -> UInt64 { take(8).reversed().reduce(0) { $0 << 8 | UInt64($1) } }
}
