/// All offset arithmetic of the encrypted file format (docs/FORMAT.md §4): where the header, the two length records
/// and each block live on disk.
///
/// The header and the length record have a 512-byte sector each, so writing one never touches the other; blocks follow at a fixed stride, each `nonce ‖ ciphertext ‖ tag` of exactly `blockSize` plaintext bytes,
/// so writing one block never moves or re-encrypts another. The tag's size, so the stride, depends on the cipher.
package struct BlockLayout: Sendable {
    static let nonceBytes = BlockCipher.nonceFieldBytes
    /// The unit a power cut can tear writes at; the header and the length record own one each.
    package static let sectorSize: Int64 = 512
    /// Where the length record's sector starts.
    package static let recordOffset: Int64 = sectorSize
    /// Header sector, then the length record's sector, then the blocks.
    package static let bodyOffset: Int64 = 2 * sectorSize

    package let blockSize: Int64
    /// Bytes one block takes on disk.
    package let storedBlockSize: Int64

    package init(blockSize: Int, cipher: FileHeader.Cipher) {
        self.blockSize = Int64(blockSize)
        storedBlockSize = Int64(blockSize + Self.overhead(cipher))
    }

    /// Bytes a block adds to its plaintext: the nonce field and the tag.
    package static func overhead(_ cipher: FileHeader.Cipher) -> Int { nonceBytes + cipher.tagBytes }

    /// Number of blocks that hold the bytes of a file of `plaintextSize` bytes (0 for an empty file).
    package func blockCount(plaintextSize: Int64) -> Int64 {
        plaintextSize / blockSize + (plaintextSize % blockSize == 0 ? 0 : 1)
    }

    /// Index of the block holding plaintext byte `offset`.
    func blockIndex(containing offset: Int64) -> Int64 { offset / blockSize }

    /// Where block `index` starts on disk; also the stored size of a file whose blocks `0..<index` are stored.
    package func storedOffset(ofBlock index: Int64) -> Int64 { Self.bodyOffset + index * storedBlockSize }

    /// Index of the block whose stored bytes include stored offset `offset` (0 for the header region).
    package func blockIndex(atStoredOffset offset: Int64) -> Int64 { max(0, offset - Self.bodyOffset) / storedBlockSize }

    /// The largest plaintext size a file can have: the stored offset of every block, and of the one after the last,
    /// fits a signed 64-bit file offset.
    package var maximumPlaintextSize: Int64 { ((Int64.max - Self.bodyOffset) / storedBlockSize - 1) * blockSize }
}
