/// A file's length record (docs/FORMAT.md §4.2): the plaintext size, how many blocks may hold data, how far they were
/// durable at the last fsync, and the blocks whose tails went stale when the file shrank.
///
/// It has the file's second sector to itself, and every change of size is one write of it, after the data it
/// describes: a power cut leaves the old record or the new one (a sector is written whole or not at all), so the file
/// reads as its old length or its new one. A record that fails its checksum or its tag was damaged: an integrity error.
package struct LengthRecord: Sendable, Equatable {
    /// A block cut mid-way by a shrink: its stored bytes from `validBytes` on are stale and read as zeros, so the block
    /// itself need not be rewritten (a torn rewrite could destroy the bytes the shrink kept).
    package struct StaleTail: Sendable, Equatable {
        package var block: Int64
        package var validBytes: Int
    }

    static let magic: [UInt8] = Array("PSLR".utf8)
    /// Stale tails one record can carry; a shrink needing more first rewrites the oldest (docs/FORMAT.md §4.3).
    package static let maximumStaleTails = 16
    static let staleTailBytes = 12
    /// Bytes covered by the tag and the checksum: the fields up to the end of the stale-tail table.
    static let fieldsSize = 32 + maximumStaleTails * staleTailBytes
    static let tagOffset = fieldsSize + AEAD.nonceBytes
    package static let checksumOffset = tagOffset + AEAD.tagBytes
    package static let size = checksumOffset + Blake2b.outputBytes

    /// Plaintext size in bytes.
    package var length: Int64
    /// Blocks `0..<extent` may hold data; every later block reads as zeros whatever is stored there.
    package var extent: Int64
    /// Blocks below this (and below `extent`) were durable at the last fsync, so a missing one means the file was cut.
    package var synchronizedExtent: Int64
    package var staleTails: [StaleTail]

    package init(length: Int64, extent: Int64, synchronizedExtent: Int64, staleTails: [StaleTail] = []) {
        self.length = length
        self.extent = extent
        self.synchronizedExtent = synchronizedExtent
        self.staleTails = staleTails
    }

    /// A new file's record: nothing stored.
    package static let empty = LengthRecord(length: 0, extent: 0, synchronizedExtent: 0)

    /// The stored fields, before the nonce, tag and checksum.
    private var fields: [UInt8] {
        var writer = ByteWriter(capacity: Self.fieldsSize)
        writer.append(Self.magic)
        writer.append(UInt8(staleTails.count))
        writer.appendZeros(3)
        writer.append(UInt64(length))
        writer.append(UInt64(extent))
        writer.append(UInt64(synchronizedExtent))
        for tail in staleTails {
            writer.append(UInt64(tail.block))
            writer.append(UInt32(tail.validBytes))
        }
        writer.appendZeros(Self.fieldsSize - writer.bytes.count)
        return writer.bytes
    }

    /// The tag's associated data: the file id, then the fields.
    private static func associatedData(fileID: [UInt8], fields: ArraySlice<UInt8>) -> [UInt8] { fileID + fields }

    /// The record as stored: fields ‖ nonce ‖ tag (an AEAD of nothing under the file key) ‖ BLAKE2b checksum.
    package func sealed(fileID: [UInt8], key: UnsafeRawBufferPointer) -> [UInt8] {
        var bytes = fields
        let nonce = Random.bytes(AEAD.nonceBytes)
        var tag = [UInt8](repeating: 0, count: AEAD.tagBytes)
        let ad = Self.associatedData(fileID: fileID, fields: bytes[...])
        nonce.withUnsafeBytes { n in
            ad.withUnsafeBytes { a in
                tag.withUnsafeMutableBytes { t in
                    AEAD.seal(UnsafeRawBufferPointer(start: nil, count: 0), key: key, nonce: n, associatedData: a, into: t)
                }
            }
        }
        bytes += nonce + tag
        bytes += Blake2b.hash(bytes)
        return bytes
    }

    /// Parses a stored record without any key (for listings while locked): nil if its checksum or fields are wrong.
    /// `bytes` is the record's sector; past the record it must be zeros.
    package static func parse(_ bytes: ArraySlice<UInt8>, layout: BlockLayout) -> LengthRecord? {
        guard bytes.count >= size, bytes.dropFirst(size).allSatisfy({ $0 == 0 }) else { return nil }
        let bytes = Array(bytes.prefix(size))
        guard Blake2b.hash(bytes[0..<checksumOffset]) == Array(bytes[checksumOffset...]) else { return nil }
        var reader = ByteReader(bytes)
        guard reader.take(4) == magic else { return nil }
        let staleCount = Int(reader.uint8())
        guard reader.take(3) == [0, 0, 0], staleCount <= maximumStaleTails else { return nil }
        let length = reader.uint64(), extent = reader.uint64(), synchronized = reader.uint64()
        // Sizes no writer produces: beyond the format's maximum, or blocks beyond the last byte.
        guard length <= UInt64(layout.maximumPlaintextSize), extent <= UInt64(layout.blockCount(plaintextSize: Int64(length))),
              synchronized <= extent else { return nil }
        var tails: [StaleTail] = []
        for _ in 0..<staleCount {
            let block = reader.uint64(), valid = reader.uint32()
            guard block < extent, valid < UInt32(layout.blockSize), !tails.contains(where: { $0.block == Int64(block) }) else { return nil }
            tails.append(StaleTail(block: Int64(block), validBytes: Int(valid)))
        }
        // The unused part of the table is zeros, so no byte of the record goes unchecked.
        guard reader.take(fieldsSize - 32 - staleCount * staleTailBytes).allSatisfy({ $0 == 0 }) else { return nil }
        return LengthRecord(length: Int64(length), extent: Int64(extent), synchronizedExtent: Int64(synchronized), staleTails: tails)
    }

    /// Whether the stored record's tag verifies under the file key (it was written by a holder of that key for this file).
    package static func authenticates(_ bytes: ArraySlice<UInt8>, fileID: [UInt8], key: UnsafeRawBufferPointer) -> Bool {
        guard bytes.count >= size else { return false }
        let bytes = Array(bytes.prefix(size))
        let ad = associatedData(fileID: fileID, fields: bytes[0..<fieldsSize])
        var nothing = [UInt8]()
        return bytes[fieldsSize..<tagOffset].withUnsafeBytes { nonce in
            bytes[tagOffset..<checksumOffset].withUnsafeBytes { tag in
                ad.withUnsafeBytes { a in
                    nothing.withUnsafeMutableBytes { AEAD.open(tag, key: key, nonce: nonce, associatedData: a, into: $0) }
                }
            }
        }
    }
}
