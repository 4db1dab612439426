import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Format version 1's block layout and growth path, kept only so the power-cut simulator can show that it finds that
/// format's hazard (docs/SECURITY.md, "Power cuts"): blocks `nonce ‖ AEAD(key, nonce, plaintext, FID ‖ index ‖ final)`
/// after a 148-byte header, the size taken from the stored length, and an append that re-encrypts the old final block
/// (its final flag changes) in the same pwrite as the new ones. Appends only; the key is the caller's.
package final class Version1GrowthFile: PlaintextReading {
    package let blockSize: Int
    private let descriptor: FileDescriptor
    private let path: String
    private let key: SecureBytes
    private let fileID: [UInt8]
    package private(set) var size: Int64

    private init(descriptor: FileDescriptor, path: String, key: SecureBytes, fileID: [UInt8], blockSize: Int, size: Int64) {
        self.descriptor = descriptor
        self.path = path
        self.key = key
        self.fileID = fileID
        self.blockSize = blockSize
        self.size = size
    }

    /// A new file holding `content`, written as version 1 wrote it.
    package static func create(at path: String, content: [UInt8], key: SecureBytes, fileID: [UInt8], blockSize: Int = 4096) throws -> Version1GrowthFile {
        let descriptor = try FileLocation(path: path).open(.readWrite, options: [.create, .exclusiveCreate], permissions: [.ownerReadWrite], doing: "create")
        let file = Version1GrowthFile(descriptor: descriptor, path: path, key: key, fileID: fileID, blockSize: blockSize, size: 0)
        try [UInt8](repeating: 0, count: Int(Version1Layout.headerSize)).withUnsafeBytes { try DurableIO.write($0, at: 0, to: descriptor, path: path) }
        try file.store(blocks: 0..<1, of: [])
        try file.append(content)
        return file
    }

    /// Opens a file: its size from its stored length, authenticated by opening the final block.
    package static func open(at path: String, key: SecureBytes, fileID: [UInt8], blockSize: Int = 4096) throws -> Version1GrowthFile {
        let descriptor = try FileLocation(path: path).openRegularFile(.readWrite, doing: "open")
        let stored = Int64(try FileSystem.fileSize(descriptor, path: path))
        guard let size = Version1Layout.plaintextSize(storedSize: stored, blockSize: blockSize) else {
            try? descriptor.close()
            throw ProtectedStoreError(.integrity, path: path, problem: "not a valid version 1 length (\(stored) bytes)", remedy: "none: a test file")
        }
        let file = Version1GrowthFile(descriptor: descriptor, path: path, key: key, fileID: fileID, blockSize: blockSize, size: size)
        _ = try file.block(file.finalBlock)
        return file
    }

    /// Appends `bytes`: the old final block is re-encrypted without its final flag, with the new bytes that fit in it,
    /// and written in one pwrite with the new blocks.
    package func append(_ bytes: [UInt8]) throws {
        guard !bytes.isEmpty else { return }
        let blocks = max(1, (size + Int64(blockSize) - 1) / Int64(blockSize))
        let first = size == 0 ? 0 : blocks - 1
        var plaintext = size == 0 ? [] : try block(first)
        plaintext += bytes
        size += Int64(bytes.count)
        let newBlocks = (size + Int64(blockSize) - 1) / Int64(blockSize)
        try store(blocks: first..<newBlocks, of: plaintext)
    }

    package func read(at offset: Int64, count: Int) throws -> [UInt8] {
        var result: [UInt8] = []
        var position = offset
        let end = min(size, offset + Int64(count))
        while position < end {
            let index = position / Int64(blockSize)
            let plaintext = try block(index)
            let from = Int(position - index * Int64(blockSize))
            let to = min(plaintext.count, from + Int(end - position))
            result += plaintext[from..<to]
            position += Int64(to - from)
        }
        return result
    }

    package func synchronize() throws { try DurableIO.synchronize(descriptor, path: path) }

    package func close() throws { try descriptor.close() }

    private var finalBlock: Int64 { Version1Layout.finalBlock(size: size, blockSize: blockSize) }

    private func associatedData(_ index: Int64) -> [UInt8] {
        Version1Layout.associatedData(fileID: fileID, index: index, isFinal: index == finalBlock)
    }

    private func block(_ index: Int64) throws -> [UInt8] {
        let length = Int(max(0, min(Int64(blockSize), size - index * Int64(blockSize))))
        var stored = [UInt8](repeating: 0, count: length + Version1Layout.overhead)
        let read = try stored.withUnsafeMutableBytes {
            try descriptor.read(fromAbsoluteOffset: Version1Layout.offset(ofBlock: index, blockSize: blockSize), into: $0)
        }
        guard read == stored.count, let plaintext = try Version1Layout.openBlock(stored, index: index, isFinal: index == finalBlock, fileID: fileID, key: key) else {
            throw ProtectedStoreError(.integrity, path: path, problem: "block \(index) failed authentication", remedy: "none: a test file")
        }
        return plaintext
    }

    /// Seals blocks `range` from `plaintext` (which starts at block `range.lowerBound`) and writes them in one pwrite.
    private func store(blocks range: Range<Int64>, of plaintext: [UInt8]) throws {
        var stored: [UInt8] = []
        for index in range {
            let from = Int(index - range.lowerBound) * blockSize
            let chunk = Array(plaintext[min(from, plaintext.count)..<min(from + blockSize, plaintext.count)])
            let nonce = Random.bytes(AEAD.nonceBytes)
            var sealed = [UInt8](repeating: 0, count: chunk.count + AEAD.tagBytes)
            try key.withUnsafeBytes { k in
                associatedData(index).withUnsafeBytes { ad in
                    chunk.withUnsafeBytes { c in
                        nonce.withUnsafeBytes { n in
                            sealed.withUnsafeMutableBytes { AEAD.seal(c, key: k, nonce: n, associatedData: ad, into: $0) }
                        }
                    }
                }
            }
            stored += nonce + sealed
        }
        try stored.withUnsafeBytes {
            try DurableIO.write($0, at: Version1Layout.offset(ofBlock: range.lowerBound, blockSize: blockSize), to: descriptor, path: path)
        }
    }
}
