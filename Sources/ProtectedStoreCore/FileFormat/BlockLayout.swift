/// All offset arithmetic of the encrypted file format: where plaintext byte ranges live on disk.
///
/// A file is a fixed-size header followed by blocks, each `nonce ‖ ciphertext ‖ tag`. Every block but the last
/// holds exactly `blockSize` plaintext bytes; the last holds 1…`blockSize`, or 0 when the whole file is empty,
/// so even an empty file has one (final) block and cannot be truncated to its header unnoticed.
package struct BlockLayout: Sendable {
    static let nonceBytes = AEAD.nonceBytes
    static let tagBytes = AEAD.tagBytes
    /// Bytes a block adds to its plaintext.
    package static let overhead = nonceBytes + tagBytes

    let headerSize: Int64
    let blockSize: Int64

    package init(headerSize: Int, blockSize: Int) {
        self.headerSize = Int64(headerSize)
        self.blockSize = Int64(blockSize)
    }

    /// Bytes one full block takes on disk.
    var storedBlockSize: Int64 { blockSize + Int64(Self.overhead) }

    /// Number of blocks a file of `plaintextSize` bytes has (at least one).
    package func blockCount(plaintextSize: Int64) -> Int64 {
        max(1, (plaintextSize + blockSize - 1) / blockSize)
    }

    /// Index of the block holding plaintext byte `offset`.
    func blockIndex(containing offset: Int64) -> Int64 { offset / blockSize }

    /// Plaintext bytes in block `index` of a file of `plaintextSize` bytes.
    func plaintextLength(ofBlock index: Int64, plaintextSize: Int64) -> Int {
        Int(max(0, min(blockSize, plaintextSize - index * blockSize)))
    }

    /// Where block `index` starts on disk.
    func storedOffset(ofBlock index: Int64) -> Int64 { headerSize + index * storedBlockSize }

    /// The on-disk size of a file holding `plaintextSize` bytes.
    package func storedSize(plaintextSize: Int64) -> Int64 {
        let last = blockCount(plaintextSize: plaintextSize) - 1
        return storedOffset(ofBlock: last) + Int64(Self.overhead) + Int64(plaintextLength(ofBlock: last, plaintextSize: plaintextSize))
    }

    /// The plaintext size behind an on-disk size, or nil if no valid file has that size (it was truncated or extended).
    package func plaintextSize(storedSize: Int64) -> Int64? {
        let body = storedSize - headerSize
        guard body >= Int64(Self.overhead) else { return nil }
        let blocks = (body + storedBlockSize - 1) / storedBlockSize
        let lastStored = body - (blocks - 1) * storedBlockSize
        let lastPlaintext = lastStored - Int64(Self.overhead)
        // Only a lone block may be empty; a later final block always carries at least one byte.
        guard lastPlaintext >= (blocks == 1 ? 0 : 1) else { return nil }
        return (blocks - 1) * blockSize + lastPlaintext
    }
}
