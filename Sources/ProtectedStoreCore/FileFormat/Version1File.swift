import Foundation
import SystemPackage

/// Format version 1's block arithmetic (docs/FORMAT.md §8): a 148-byte header, then blocks of
/// `nonce ‖ AEAD(FK, nonce, plaintext, FID ‖ index ‖ final)` whose last one holds the file's tail, so the plaintext
/// size follows from the stored size. Kept for reading old devices (`sandboxctl migrate`) and for the power-cut
/// simulator's proof that it finds that format's hazard.
package enum Version1Layout {
    package static let headerSize: Int64 = 148
    package static let version: UInt16 = 1
    /// Bytes a block adds to its plaintext: a 24-byte nonce and XChaCha20-Poly1305's tag, the only cipher of version 1.
    package static let overhead = AEAD.nonceBytes + AEAD.tagBytes

    package static func stride(blockSize: Int) -> Int64 { Int64(blockSize + overhead) }

    package static func offset(ofBlock index: Int64, blockSize: Int) -> Int64 { headerSize + index * stride(blockSize: blockSize) }

    /// The plaintext size a stored size stands for, or nil when no version 1 file has that size.
    package static func plaintextSize(storedSize: Int64, blockSize: Int) -> Int64? {
        let stride = stride(blockSize: blockSize)
        let body = storedSize - headerSize
        guard body >= Int64(overhead) else { return nil }
        let blocks = (body + stride - 1) / stride
        let last = body - (blocks - 1) * stride - Int64(overhead)
        // Only a file's one block may be empty.
        guard last >= (blocks == 1 ? 0 : 1) else { return nil }
        return (blocks - 1) * Int64(blockSize) + last
    }

    /// Index of the final block of a file of `size` plaintext bytes (an empty file has one, empty, block).
    package static func finalBlock(size: Int64, blockSize: Int) -> Int64 { max(1, (size + Int64(blockSize) - 1) / Int64(blockSize)) - 1 }

    package static func associatedData(fileID: [UInt8], index: Int64, isFinal: Bool) -> [UInt8] {
        var ad = fileID
        withUnsafeBytes(of: UInt64(index).littleEndian) { ad += $0 }
        ad.append(isFinal ? 1 : 0)
        return ad
    }

    /// Opens stored block `index` (nonce ‖ sealed) of a file; nil when it fails authentication.
    package static func openBlock(_ stored: [UInt8], index: Int64, isFinal: Bool, fileID: [UInt8], key: SecureBytes) throws -> [UInt8]? {
        guard stored.count >= overhead else { return nil }
        var plaintext = [UInt8](repeating: 0, count: stored.count - overhead)
        let authentic = try key.withUnsafeBytes { k in
            associatedData(fileID: fileID, index: index, isFinal: isFinal).withUnsafeBytes { ad in
                stored.withUnsafeBytes { s in
                    plaintext.withUnsafeMutableBytes { p in
                        AEAD.open(UnsafeRawBufferPointer(rebasing: s[AEAD.nonceBytes...]), key: k,
                                  nonce: UnsafeRawBufferPointer(rebasing: s[0..<AEAD.nonceBytes]), associatedData: ad, into: p)
                    }
                }
            }
        }
        return authentic ? plaintext : nil
    }
}

/// A format version 1 encrypted file, opened for reading only: its class, and its plaintext block by block.
package final class Version1File {
    package let protectionClass: ProtectionClass
    /// Sealed for class B by an Inbox delivery while locked, to take its directory's class at the first unlocked open.
    package let awaitsDefaultClass: Bool
    package let size: Int64
    private let descriptor: FileDescriptor
    private let path: String
    private let blockSize: Int
    private let fileID: [UInt8]
    private let fileKey: SecureBytes

    private init(descriptor: FileDescriptor, path: String, protectionClass: ProtectionClass, awaitsDefaultClass: Bool, blockSize: Int,
                 fileID: [UInt8], fileKey: SecureBytes, size: Int64) {
        self.descriptor = descriptor
        self.path = path
        self.protectionClass = protectionClass
        self.awaitsDefaultClass = awaitsDefaultClass
        self.blockSize = blockSize
        self.fileID = fileID
        self.fileKey = fileKey
        self.size = size
    }

    deinit {
        fileKey.discard()
        try? descriptor.close()
    }

    /// Whether `bytes` (a file's first bytes) start a version 1 encrypted file's header.
    package static func isVersion1Header(_ bytes: [UInt8]) -> Bool {
        bytes.count >= 6 && Array(bytes[0..<4]) == Array("PSEF".utf8) && UInt16(bytes[4]) | UInt16(bytes[5]) << 8 == Version1Layout.version
    }

    /// A version 1 header's fields (FORMAT.md §8), checked as far as they can be without the keys.
    package struct Header {
        package var protectionClass: ProtectionClass
        package var awaitsDefaultClass: Bool
        package var blockSize: Int
        package var keybagID: [UInt8]
        package var fileID: [UInt8]
        package var wrappedFileKey: WrappedFileKey
    }

    package static func parseHeader(_ header: [UInt8], path: String) throws -> Header {
        func damaged(_ problem: String) -> ProtectedStoreError {
            ProtectedStoreError(.integrity, path: path, problem: "not a valid format version 1 file: \(problem)",
                                remedy: "Restore the file from a backup, or remove it from the version 1 device before migrating")
        }
        guard header.count >= Int(Version1Layout.headerSize), isVersion1Header(header) else { throw damaged("its header is missing or of another version") }
        guard let protectionClass = ProtectionClass(rawValue: header[6]) else { throw damaged("unknown class id \(header[6])") }
        let flags = header[7]
        guard flags == 0 || (flags == 1 && protectionClass == .completeUnlessOpen) else { throw damaged("unknown flags \(flags)") }
        let blockSize = Int(UInt32(header[8]) | UInt32(header[9]) << 8 | UInt32(header[10]) << 16 | UInt32(header[11]) << 24)
        guard blockSize >= FileHeader.minimumBlockSize, blockSize <= FileHeader.maximumBlockSize, blockSize & (blockSize - 1) == 0 else {
            throw damaged("block size \(blockSize)")
        }
        return Header(protectionClass: protectionClass, awaitsDefaultClass: flags == 1, blockSize: blockSize, keybagID: Array(header[12..<28]),
                      fileID: Array(header[28..<44]),
                      wrappedFileKey: WrappedFileKey(protectionClass: protectionClass, associatedData: Array(header[0..<76]),
                                                     ephemeralPublicKey: Array(header[44..<76]), sealed: Array(header[76..<148])))
    }

    /// Opens the file, unwraps its key with `keys` and authenticates its size (by opening the final block).
    package static func open(at location: FileLocation, keys: any ClassKeyProviding) throws -> Version1File {
        let path = location.displayPath
        let descriptor = try location.openRegularFile(.readOnly, doing: "open the version 1 file")
        do {
            var bytes = [UInt8](repeating: 0, count: Int(Version1Layout.headerSize))
            let read = try bytes.withUnsafeMutableBytes { try descriptor.read(fromAbsoluteOffset: 0, into: $0) }
            let header = try parseHeader(Array(bytes.prefix(read)), path: path)
            guard header.keybagID == keys.keybagID else {
                throw ProtectedStoreError(.integrity, path: path, problem: "the file was written by another device (keybag \(header.keybagID.hex))",
                                          remedy: "Remove it from this device before migrating, or migrate it on the device that wrote it")
            }
            guard let fileKey = try EncryptedFile.attributingKeyErrors(to: path, { try keys.unwrapFileKey(header.wrappedFileKey) }) else {
                throw ProtectedStoreError(.integrity, path: path, problem: "not a valid format version 1 file: its key does not open (tampered with, or not this device's)",
                                          remedy: "Restore the file from a backup, or remove it from the version 1 device before migrating")
            }
            let storedSize = Int64(try FileSystem.fileSize(descriptor, path: path))
            guard let size = Version1Layout.plaintextSize(storedSize: storedSize, blockSize: header.blockSize) else {
                fileKey.discard()
                throw ProtectedStoreError(.integrity, path: path, problem: "not a valid format version 1 file: its length (\(storedSize) bytes) is not one a version 1 file can have",
                                          remedy: "Restore the file from a backup, or remove it from the version 1 device before migrating")
            }
            let file = Version1File(descriptor: descriptor, path: path, protectionClass: header.protectionClass, awaitsDefaultClass: header.awaitsDefaultClass,
                                    blockSize: header.blockSize, fileID: header.fileID, fileKey: fileKey, size: size)
            _ = try file.block(Version1Layout.finalBlock(size: size, blockSize: header.blockSize))
            return file
        } catch {
            try? descriptor.close()
            throw error
        }
    }

    /// Hands the plaintext to `body` block by block, in order, each authenticated before it is handed over.
    package func forEachBlock(_ body: ([UInt8]) throws -> Void) throws {
        let finalBlock = Version1Layout.finalBlock(size: size, blockSize: blockSize)
        for index in 0...finalBlock {
            let plaintext = try block(index)
            if !plaintext.isEmpty { try body(plaintext) }
        }
    }

    private func block(_ index: Int64) throws -> [UInt8] {
        let length = Int(max(0, min(Int64(blockSize), size - index * Int64(blockSize))))
        var stored = [UInt8](repeating: 0, count: length + Version1Layout.overhead)
        let read = try stored.withUnsafeMutableBytes {
            try descriptor.read(fromAbsoluteOffset: Version1Layout.offset(ofBlock: index, blockSize: blockSize), into: $0)
        }
        let isFinal = index == Version1Layout.finalBlock(size: size, blockSize: blockSize)
        guard read == stored.count, let plaintext = try Version1Layout.openBlock(stored, index: index, isFinal: isFinal, fileID: fileID, key: fileKey) else {
            throw ProtectedStoreError(.integrity, path: path, problem: "block \(index) of the version 1 file failed authentication",
                                      remedy: "Restore the file from a backup, or remove it from the version 1 device before migrating")
        }
        return plaintext
    }
}
