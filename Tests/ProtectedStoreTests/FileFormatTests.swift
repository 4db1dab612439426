import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import ProtectedStoreTesting
import Testing
import SuiteThreads

@Suite("Encrypted file format", .ownThread)
struct FileFormatTests {
    static let blockSize = EncryptedFile.defaultBlockSize
    /// Every cipher libsodium has here: XChaCha20-Poly1305 always, AES-256-GCM with AES-NI and PCLMUL, AEGIS-256 from
    /// libsodium 1.0.19 on.
    static let ciphers = FileHeader.Cipher.allCases.filter(\.isAvailable)
    /// What a block of a file created without naming a cipher adds to its plaintext.
    static let overhead = BlockLayout.overhead(.preferred)

    @Test("round trip", arguments: [0, 1, blockSize - 1, blockSize, blockSize + 1, 5 * blockSize + 17, 64 * blockSize + 3])
    func roundTrip(size: Int) throws {
        let test = try TestDevice()
        let path = test.path("file")
        let contents = pattern(size)
        try test.device.writeFile(contents, to: path, protection: .complete)
        #expect(try test.device.readFile(at: path) == contents)
        let layout = BlockLayout(blockSize: Self.blockSize, cipher: .preferred)
        #expect(readRaw(path).count == Int(layout.storedOffset(ofBlock: layout.blockCount(plaintextSize: Int64(size)))))
        // A fresh process sees the same bytes: reopen the device from disk.
        let reopened = try test.reopen()
        try reopened.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(try reopened.readFile(at: path) == contents)
    }

    @Test("block arithmetic: counts, offsets, and the largest size, whose every block offset fits a file offset")
    func layoutArithmetic() {
        for blockSize in [512, 4096, 1 << 20] {
            for cipher in FileHeader.Cipher.allCases { layoutArithmetic(blockSize: blockSize, cipher: cipher) }
        }
    }

    private func layoutArithmetic(blockSize: Int, cipher: FileHeader.Cipher) {
        let layout = BlockLayout(blockSize: blockSize, cipher: cipher)
        let overhead = BlockLayout.overhead(cipher)
        #expect(layout.blockCount(plaintextSize: 0) == 0)
        #expect(layout.blockCount(plaintextSize: 1) == 1)
        #expect(layout.blockCount(plaintextSize: Int64(blockSize)) == 1)
        #expect(layout.blockCount(plaintextSize: Int64(blockSize) + 1) == 2)
        #expect(layout.storedOffset(ofBlock: 1) - layout.storedOffset(ofBlock: 0) == Int64(blockSize + overhead))
        let maximum = layout.maximumPlaintextSize
        #expect(maximum > 1 << 62 && maximum % Int64(blockSize) == 0)
        let (_, overflow) = Int64(blockSize + overhead).multipliedReportingOverflow(by: layout.blockCount(plaintextSize: maximum) + 1)
        #expect(!overflow)
        #expect(layout.storedOffset(ofBlock: layout.blockCount(plaintextSize: maximum)) > 0)
    }

    @Test("random writes, reads and truncations match an in-memory model", arguments: ciphers, [UInt64(1), 2, 3])
    func randomOperations(cipher: FileHeader.Cipher, seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        let test = try TestDevice()
        let path = test.path("model")
        var file = try EncryptedFile.create(at: FileLocation(path: path), protectionClass: .completeUntilFirstUserAuthentication, keys: test.device,
                                            blockSize: 512, cipher: cipher)
        var model: [UInt8] = []
        for step in 0..<300 {
            let limit = 6000
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<5:
                let offset = Int.random(in: 0...min(limit, model.count + 700), using: &random)
                let data = (0..<Int.random(in: 1...1800, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                try file.write(data, at: Int64(offset))
                if offset > model.count { model += [UInt8](repeating: 0, count: offset - model.count) }
                if offset + data.count > model.count { model += [UInt8](repeating: 0, count: offset + data.count - model.count) }
                model.replaceSubrange(offset..<offset + data.count, with: data)
            case 5..<8:
                let offset = Int.random(in: 0...model.count + 100, using: &random)
                let count = Int.random(in: 0...2000, using: &random)
                let expected = offset >= model.count ? [] : Array(model[offset..<min(model.count, offset + count)])
                #expect(try file.read(at: Int64(offset), count: count) == expected, "seed \(seed) step \(step)")
            case 8:
                let size = Int.random(in: 0...min(limit, model.count + 1500), using: &random)
                try file.truncate(to: Int64(size))
                if size < model.count { model.removeLast(model.count - size) } else { model += [UInt8](repeating: 0, count: size - model.count) }
            default:
                try file.close()
                file = try EncryptedFile.open(at: path, keys: test.device, writable: true)
            }
            #expect(file.size == Int64(model.count), "seed \(seed) step \(step)")
        }
        #expect(try file.readAll() == model)
        try file.close()
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == model)
    }

    @Test("large calls spread over cores give the same bytes as small ones")
    func parallelPathMatchesSerial() throws {
        let test = try TestDevice()
        let contents = pattern(3 * EncryptedFile.maximumBytesPerPass / 2 + 77, seed: 9)
        let big = try EncryptedFile.create(at: test.path("big"), protectionClass: .complete, keys: test.device)
        try big.write(contents, at: 0)
        let small = try EncryptedFile.create(at: test.path("small"), protectionClass: .complete, keys: test.device)
        for start in stride(from: 0, to: contents.count, by: 1000) {
            try small.write(Array(contents[start..<min(contents.count, start + 1000)]), at: Int64(start))
        }
        #expect(try big.readAll() == contents)
        #expect(try small.readAll() == contents)
        #expect(try big.read(at: 12345, count: 3_000_000) == Array(contents[12345..<3_012_345]))
        #expect(try big.read(at: 4_000_001, count: 9_000_000) == Array(contents[4_000_001...]))
    }

    @Test("large unaligned writes, growth and shrinking across pass boundaries match a model")
    func largeOperations() throws {
        let test = try TestDevice()
        let path = test.path("large")
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        var model = pattern(5 * 1_048_576 + 333, seed: 3)
        try file.write(model, at: 0)
        let patch = pattern(EncryptedFile.maximumBytesPerPass + 9_999, seed: 4)
        try file.write(patch, at: 12_345)
        model.replaceSubrange(12_345..<12_345 + patch.count, with: patch)
        #expect(try file.readAll() == model)
        let grown = Int64(model.count + 2 * EncryptedFile.maximumBytesPerPass + 5)
        try file.truncate(to: grown)
        model += [UInt8](repeating: 0, count: Int(grown) - model.count)
        try file.write([1, 2, 3], at: grown + Int64(EncryptedFile.maximumBytesPerPass) + 7)
        model += [UInt8](repeating: 0, count: EncryptedFile.maximumBytesPerPass + 7) + [1, 2, 3]
        #expect(file.size == Int64(model.count))
        try file.truncate(to: 3_000_007)
        model.removeLast(model.count - 3_000_007)
        try file.close()
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == model)
    }

    @Test("a damaged block is named even when the read is spread over cores")
    func parallelReadNamesBlock() throws {
        let test = try TestDevice()
        let path = test.path("parallel-damage")
        try test.device.writeFile(pattern(3 * 1_048_576), to: path, protection: .complete)
        var raw = readRaw(path)
        raw[Int(BlockLayout.bodyOffset) + 700 * (Self.blockSize + Self.overhead) + 100] ^= 0x80
        writeRaw(raw, path)
        let file = try EncryptedFile.open(at: path, keys: test.device, writable: false)
        var buffer = [UInt8](repeating: 0xAA, count: 3 * 1_048_576)
        let error = expectError(.integrity) { try buffer.withUnsafeMutableBytes { try file.read(into: $0, at: 0) } }
        #expect(error?.problem.contains("block 700 ") == true, "\(String(describing: error))")
        #expect(buffer.allSatisfy { $0 == 0 }, "nothing of a failed read reaches the caller")
    }

    @Test("an empty file is authenticated too: every byte of its header and length record, and a synced file cut short")
    func emptyFileAuthenticated() throws {
        let test = try TestDevice()
        let path = test.path("empty")
        try test.device.writeFile([], to: path, protection: .complete)
        let original = readRaw(path)
        #expect(original.count == Int(BlockLayout.bodyOffset))
        for position in original.indices {
            var flipped = original
            flipped[position] ^= 0x01
            writeRaw(flipped, path)
            // The version (bytes 4–5) names a format this build does not read, and so does the cipher id (byte 8) unless
            // it became another cipher this build can use, whose header then fails authentication.
            let anotherCipher = position == 8 && FileHeader.Cipher(rawValue: flipped[8])?.isAvailable == true
            expectError([4, 5, 8].contains(position) && !anotherCipher ? .unsupportedFormat : .integrity) { try test.device.readFile(at: path) }
        }
        let long = test.path("long")
        try test.device.writeFile(pattern(4 * Self.blockSize), to: long, protection: .complete)
        for kept in [Int(BlockLayout.bodyOffset), Int(BlockLayout.bodyOffset) + 3 * (Self.blockSize + Self.overhead) + 100] {
            writeRaw(Array(readRaw(long)[0..<kept]), long)
            let error = expectError(.integrity) { try test.device.readFile(at: long) }
            #expect(error?.problem.contains("truncated") == true, "\(String(describing: error))")
            try test.device.writeFile(pattern(4 * Self.blockSize), to: long, protection: .complete)
        }
    }

    @Test("growing by truncate stores nothing: a 1 TiB file reads as zeros and takes two sectors")
    func truncateUpIsAHole() throws {
        let test = try TestDevice()
        let path = test.path("huge")
        let file = try EncryptedFile.create(at: path, protectionClass: .none, keys: test.device)
        try file.write([7, 8, 9], at: 0)
        try file.truncate(to: 1 << 40)
        #expect(file.size == 1 << 40)
        #expect(try file.read(at: (1 << 40) - 5, count: 10) == [0, 0, 0, 0, 0])
        #expect(try file.read(at: 0, count: 5) == [7, 8, 9, 0, 0])
        try file.close()
        #expect(readRaw(path).count == Int(BlockLayout.bodyOffset) + Self.blockSize + Self.overhead)
        let reopened = try EncryptedFile.open(at: path, keys: test.device, writable: true)
        #expect(reopened.size == 1 << 40)
        try reopened.write([1], at: (1 << 40) + 4095)
        #expect(try reopened.read(at: 1 << 40, count: 4096) == [UInt8](repeating: 0, count: 4095) + [1])
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_blocks < 64, "a sparse backing file (\(info.st_blocks) sectors allocated)")
    }

    @Test("a size past the largest fails with EFBIG and changes nothing")
    func tooLarge() throws {
        let test = try TestDevice()
        let path = test.path("efbig")
        let file = try EncryptedFile.create(at: path, protectionClass: .none, keys: test.device)
        try file.write(pattern(5000), at: 0)
        let before = readRaw(path)
        let attempts: [() throws -> Void] = [{ try file.truncate(to: file.maximumSize + 1) }, { try file.truncate(to: Int64.max) },
                                             { try file.write([1], at: file.maximumSize) }]
        for attempt in attempts {
            let error = expectError(.invalidArgument) { try attempt() }
            #expect(error?.errno == .fileTooLarge)
        }
        #expect(readRaw(path) == before)
        #expect(try file.readAll() == pattern(5000))
        try file.truncate(to: file.maximumSize)
        #expect(file.size == file.maximumSize)
    }

    @Test("allocate reserves space that reads as zeros; keep-size leaves the size, and a failed call changes nothing")
    func allocate() throws {
        let test = try TestDevice()
        let path = test.path("allocate")
        let file = try EncryptedFile.create(at: path, protectionClass: .none, keys: test.device)
        try file.write(pattern(100), at: 0)
        try file.allocate(from: 0, length: 1 << 20, keepSize: false)
        #expect(file.size == 1 << 20)
        #expect(try file.readAll() == pattern(100) + [UInt8](repeating: 0, count: (1 << 20) - 100))
        try file.allocate(from: 1 << 20, length: 1 << 20, keepSize: true)
        #expect(file.size == 1 << 20)
        var info = stat()
        #expect(stat(path, &info) == 0 && Int64(info.st_blocks) * 512 >= 2 << 20, "space is reserved (\(info.st_blocks) sectors)")
        let before = readRaw(path)
        let error = expectError(.invalidArgument) { try file.allocate(from: file.maximumSize, length: 10, keepSize: false) }
        #expect(error?.errno == .fileTooLarge)
        #expect(readRaw(path) == before && file.size == 1 << 20)
        try file.write([1], at: 5000)
        try file.close()
        var model = pattern(100) + [UInt8](repeating: 0, count: (1 << 20) - 100)
        model[5000] = 1
        #expect(try test.device.readFile(at: path) == model)
    }

    @Test("a full disk: ProtectedFileHandle.write fails with fileWriteOutOfSpace, having changed nothing; the handle then writes again once space is freed")
    func fullDisk() throws {
        guard let disk = SmallDisk(megabytes: 4, purpose: "the library's full-disk test") else { return }
        let test = try TestDevice(in: disk.directory)
        let container = try test.makeContainer(defaultProtection: .completeUntilFirstUserAuthentication)
        try test.device.unlock(passcode: try Passcode(TestDevice.passcode))
        let handle = try container.createFile(atPath: "Documents/big.bin")
        var model: [UInt8] = []
        var failure: CocoaError?
        for round in 0..<200 where failure == nil {
            let chunk = pattern(100_000, seed: UInt8(round))
            do {
                try handle.write(contentsOf: Data(chunk), atOffset: UInt64(model.count))
                model += chunk
            } catch let error as CocoaError {
                failure = error
            }
        }
        #expect(failure?.code == .fileWriteOutOfSpace, "\(String(describing: failure))")
        #expect((failure?.underlying as? POSIXError)?.code == .ENOSPC)
        #expect(failure?.protectedStoreError?.description.contains("the file is unchanged") == true, "\(String(describing: failure))")
        #expect(failure?.protectedStoreError?.remedy == "Free some disk space and try again")
        #expect(handle.size == UInt64(model.count))
        #expect(try handle.read(upToCount: model.count + 10, atOffset: 0) == Data(model))
        // Cutting the file frees space; the same handle goes on.
        try handle.truncate(atOffset: UInt64(model.count / 2))
        model.removeLast(model.count - model.count / 2)
        try handle.write(contentsOf: Data(pattern(100_000, seed: 99)), atOffset: UInt64(model.count))
        model += pattern(100_000, seed: 99)
        try handle.synchronize()
        try handle.close()
        #expect(try container.contents(atPath: "Documents/big.bin") == Data(model))
    }

    @Test("a shrink never rewrites the block it cuts, and the cut-off bytes never come back")
    func shrinkKeepsTheCutBlock() throws {
        let test = try TestDevice()
        let path = test.path("shrink")
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        try file.write(pattern(3 * Self.blockSize), at: 0)
        let stored = Self.blockSize + Self.overhead
        let block1 = readRaw(path)[Int(BlockLayout.bodyOffset) + stored..<Int(BlockLayout.bodyOffset) + 2 * stored]
        try file.truncate(to: Int64(Self.blockSize + 100))
        #expect(readRaw(path)[Int(BlockLayout.bodyOffset) + stored..<Int(BlockLayout.bodyOffset) + 2 * stored] == block1)
        #expect(readRaw(path).count == Int(BlockLayout.bodyOffset) + 2 * stored)
        try file.truncate(to: Int64(3 * Self.blockSize))
        try file.write([42], at: Int64(3 * Self.blockSize))
        let expected = pattern(Self.blockSize + 100) + [UInt8](repeating: 0, count: 2 * Self.blockSize - 100) + [42]
        #expect(try file.readAll() == expected)
        try file.close()
        #expect(try test.device.readFile(at: path) == expected)
        // A write into the cut block zeroes its stale bytes in the block itself.
        let again = try EncryptedFile.open(at: path, keys: test.device, writable: true)
        try again.write([5], at: Int64(Self.blockSize + 200))
        var model = expected
        model[Self.blockSize + 200] = 5
        #expect(try again.readAll() == model)
        try again.close()
        #expect(try test.device.readFile(at: path) == model)
    }

    @Test("writing past the end zero-fills the gap")
    func sparseWrite() throws {
        let test = try TestDevice()
        let file = try EncryptedFile.create(at: test.path("sparse"), protectionClass: .none, keys: test.device)
        try file.write([1, 2, 3], at: 10_000)
        #expect(file.size == 10_003)
        #expect(try file.readAll() == [UInt8](repeating: 0, count: 10_000) + [1, 2, 3])
    }

    @Test("the plaintext never appears in the bytes on disk")
    func noPlaintextOnDisk() throws {
        let test = try TestDevice()
        let secret = Array("The quick brown fox knows the launch code 0000".utf8)
        let contents = (0..<200).flatMap { _ in secret }
        for protectionClass in ProtectionClass.allCases {
            let path = test.path("secret-\(protectionClass.letter)")
            try test.device.writeFile(contents, to: path, protection: protectionClass)
            let disk = readRaw(path)
            #expect(!disk.contains(subsequence: Array(secret[0..<16])), "class \(protectionClass.letter)")
            #expect(!disk.contains(subsequence: Array("launch code".utf8)))
        }
    }

    @Test("every single-byte modification of a small file is detected", arguments: ciphers)
    func everyByteFlipDetected(cipher: FileHeader.Cipher) throws {
        let test = try TestDevice()
        let path = test.path("small")
        let contents = pattern(1300)
        let file = try EncryptedFile.create(at: FileLocation(path: path), protectionClass: .complete, keys: test.device, blockSize: 512, cipher: cipher)
        try file.write(contents, at: 0)
        try file.close()
        let original = readRaw(path)
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        var undetected: [Int] = []
        for position in original.indices {
            try handle.seek(toOffset: UInt64(position))
            try handle.write(contentsOf: [original[position] ^ 0x01])
            do {
                _ = try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll()
                undetected.append(position)
            } catch let error as ProtectedStoreError {
                #expect(error.kind == .integrity || error.kind == .unsupportedFormat, "byte \(position): \(error)")
                #expect(error.path == path)
                if position >= Int(BlockLayout.bodyOffset) {
                    let block = (position - Int(BlockLayout.bodyOffset)) / (512 + BlockLayout.overhead(cipher))
                    #expect(error.problem.contains("block \(block) "), "byte \(position): \(error.problem)")
                }
            }
            try handle.seek(toOffset: UInt64(position))
            try handle.write(contentsOf: [original[position]])
        }
        #expect(undetected.isEmpty, "flips not detected at \(undetected)")
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == contents)
    }

    @Test("blocks swapped, spliced from another file or cut off are detected; blocks appended past the length are ignored")
    func blockMovesDetected() throws {
        let test = try TestDevice()
        let stored = 512 + Self.overhead
        let body = Int(BlockLayout.bodyOffset)
        func make(_ name: String, seed: UInt8) throws -> (String, [UInt8]) {
            let path = test.path(name)
            let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device, blockSize: 512)
            try file.write(pattern(4 * 512, seed: seed), at: 0)
            try file.synchronize()
            try file.close()
            return (path, readRaw(path))
        }
        let (path, original) = try make("victim", seed: 1)
        let (_, other) = try make("donor", seed: 2)
        func block(_ bytes: [UInt8], _ index: Int) -> ArraySlice<UInt8> {
            bytes[body + index * stored..<body + (index + 1) * stored]
        }
        func expectRejected(_ bytes: [UInt8], _ what: String) {
            writeRaw(bytes, path)
            let error = expectError(.integrity) { try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() }
            #expect(error != nil, "\(what)")
        }
        var swapped = original
        swapped.replaceSubrange(body..<body + 2 * stored, with: block(original, 1) + block(original, 0))
        expectRejected(swapped, "swap of blocks 0 and 1")
        var rotated = Array(original[0..<body])
        for index in [1, 2, 3, 0] { rotated += block(original, index) }
        expectRejected(rotated, "reordered blocks")
        var spliced = original
        spliced.replaceSubrange(body + stored..<body + 2 * stored, with: block(other, 1))
        expectRejected(spliced, "block 1 from another file")
        expectRejected(Array(original.dropLast(stored)), "last block cut off")
        expectRejected(Array(original[0..<body]), "body removed")
        var otherHeader = original
        otherHeader.replaceSubrange(0..<512, with: other[0..<512])
        expectRejected(otherHeader, "header of another file")
        var otherRecord = original
        otherRecord.replaceSubrange(512..<body, with: other[512..<body])
        expectRejected(otherRecord, "length record of another file")
        // The length record, not the file's length, says where the file ends.
        writeRaw(original + block(original, 3), path)
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == pattern(4 * 512, seed: 1))
    }

    @Test("changing the class rewrites the header only")
    func classChangeKeepsBody() throws {
        let test = try TestDevice()
        let path = test.path("reclass")
        let contents = pattern(10_000)
        try test.device.writeFile(contents, to: path, protection: .complete)
        let before = readRaw(path)
        for newClass in [ProtectionClass.completeUnlessOpen, .none, .completeUntilFirstUserAuthentication, .complete] {
            let file = try EncryptedFile.open(at: path, keys: test.device, writable: true)
            try file.changeProtectionClass(to: newClass, keys: test.device)
            try file.close()
            let after = readRaw(path)
            #expect(after[512...] == before[512...])
            #expect(after[0..<512] != before[0..<512])
            #expect(try EncryptedFile.protectionClass(ofFileAt: path) == newClass)
            #expect(try test.device.readFile(at: path) == contents)
        }
    }

    @Test("a handle's key zeroed by a lock fails further operations with a data-protection error")
    func discardedHandle() throws {
        let test = try TestDevice()
        let file = try EncryptedFile.create(at: test.path("handle"), protectionClass: .complete, keys: test.device)
        try file.write([1, 2, 3], at: 0)
        file.discardKey()
        expectError(.protectedDataUnavailable) { try file.read(at: 0, count: 3) }
        expectError(.protectedDataUnavailable) { try file.write([4], at: 0) }
    }

    @Test("a file of another format or another device is refused with a clear error")
    func foreignFiles() throws {
        let test = try TestDevice()
        let other = try TestDevice()
        let path = test.path("foreign")
        try other.device.writeFile([1, 2, 3], to: path, protection: .none)
        let error = expectError(.integrity) { try test.device.readFile(at: path) }
        #expect(error?.problem.contains("another device") == true)
        writeRaw(Array("just some text, not ours".utf8) + [UInt8](repeating: 0, count: 200), path)
        expectError(.integrity) { try test.device.readFile(at: path) }
        try other.device.writeFile([1], to: path, protection: .none)
        var versioned = readRaw(path)
        versioned[4] = 9
        writeRaw(versioned, path)
        let versionError = expectError(.unsupportedFormat) { try other.device.readFile(at: path) }
        #expect(versionError?.problem.contains("version 9") == true)
    }

    @Test("AES-256-GCM blocks: one random seed per sealing pass, block counters 0…n−1 in it, a fresh seed for every pass",
          .enabled(if: FileHeader.Cipher.aes256GCM.isAvailable, "this CPU lacks AES-NI or PCLMUL"))
    func aesNonceFields() throws {
        let test = try TestDevice()
        let path = test.path("aes")
        let file = try EncryptedFile.create(at: FileLocation(path: path), protectionClass: .none, keys: test.device, blockSize: 512, cipher: .aes256GCM)
        try file.write(pattern(8 * 512), at: 0)
        try file.write(pattern(2 * 512, seed: 9), at: 3 * 512)
        try file.close()
        let stored = readRaw(path)
        #expect(stored[8] == FileHeader.Cipher.aes256GCM.rawValue)
        let layout = BlockLayout(blockSize: 512, cipher: .aes256GCM)
        let fields = (0..<8).map { index in
            let start = Int(layout.storedOffset(ofBlock: Int64(index)))
            return Array(stored[start..<start + BlockLayout.nonceBytes])
        }
        let seeds = fields.map { Array($0[0..<16]) }
        let counters: [UInt64] = fields.map { field in
            var counter: UInt64 = 0
            for (shift, byte) in field[16..<24].enumerated() { counter |= UInt64(byte) << UInt64(8 * shift) }
            return counter
        }
        // Blocks 0–2 and 5–7 from the first pass, 3–4 from the second, each pass counting from its first block.
        #expect(Set([0, 1, 2, 5, 6, 7].map { seeds[$0] }).count == 1)
        #expect(seeds[3] == seeds[4] && seeds[3] != seeds[0])
        #expect(counters == [0, 1, 2, 0, 1, 5, 6, 7])
        let reopened = try EncryptedFile.open(at: path, keys: test.device, writable: false)
        var expected = pattern(8 * 512)
        expected.replaceSubrange(3 * 512..<5 * 512, with: pattern(2 * 512, seed: 9))
        #expect(try reopened.readAll() == expected)
        // The seed is bound to the block key: the same counter under another seed does not open.
        var swapped = stored
        let third = Int(layout.storedOffset(ofBlock: 2))
        swapped.replaceSubrange(third..<third + 16, with: seeds[3])
        writeRaw(swapped, path)
        let error = expectError(.integrity) { try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() }
        #expect(error?.problem.contains("block 2 ") == true, "\(String(describing: error))")
    }

    @Test("new files get the cipher this build was meant to have (scripts/aegis-suite.sh names it)",
          .enabled(if: ProcessInfo.processInfo.environment["PROTECTEDSTORE_EXPECTED_CIPHER"] != nil, "no cipher is expected of this build"))
    func expectedCipher() throws {
        let test = try TestDevice()
        let path = test.path("expected")
        try test.device.writeFile(pattern(5000), to: path, protection: .complete)
        let stored = try FileHeader.parse(readRaw(path), path: path)
        #expect(stored.cipher.name == ProcessInfo.processInfo.environment["PROTECTEDSTORE_EXPECTED_CIPHER"], "libsodium \(Sodium.version)")
        #expect(try test.device.readFile(at: path) == pattern(5000))
    }

    @Test("a file of a cipher this build's libsodium can't use is refused as unsupported, saying why and what to do, before its key wrap: a cipher id changed to it too",
          arguments: FileHeader.Cipher.allCases.filter { !$0.isAvailable })
    func unavailableCipherRefused(cipher: FileHeader.Cipher) throws {
        let test = try TestDevice()
        let path = test.path("other-cipher")
        try test.device.writeFile(pattern(100), to: path, protection: .complete)
        var stored = readRaw(path)
        let tampered = test.path("tampered")
        writeRaw(stored.enumerated().map { $0.offset == 8 ? cipher.rawValue : $0.element }, tampered)
        // It can't be opened here whatever its wrap says (docs/FORMAT.md §4.1); where the cipher is available, the
        // changed id fails the wrap (emptyFileAuthenticated).
        #expect(expectError(.unsupportedFormat) { try test.device.readFile(at: tampered) }?.problem.contains(cipher.name) == true)

        // A header sealed for that cipher, as a build with it would write: its key wrap authenticates the cipher id.
        let header = try FileHeader.parse(stored, path: path)
        let fileKey = try header.unwrapFileKey(keys: test.device, path: path)
        defer { fileKey.discard() }
        let resealed = try FileHeader.sealing(fileKey: fileKey, fileID: header.fileID, protectionClass: header.protectionClass, cipher: cipher,
                                              blockSize: Int(header.layout.blockSize), keys: test.device)
        stored.replaceSubrange(0..<Int(BlockLayout.sectorSize), with: resealed.serialized)
        writeRaw(stored, path)
        let error = expectError(.unsupportedFormat) { try test.device.readFile(at: path) }
        #expect(error?.path == path)
        #expect(error?.problem.contains("sealed with \(cipher.name)") == true, "\(String(describing: error))")
        let (problem, remedy) = try #require(cipher.unavailability)
        #expect(error?.problem.contains(problem) == true && error?.remedy == remedy, "\(String(describing: error))")
        #expect(cipher != .aegis256 || (problem.contains("1.0.19") && remedy.contains("A faster cipher")))
    }

    @Test("a file keeps its cipher across writes, a class change and a reopen; every kind reads side by side")
    func cipherKeptPerFile() throws {
        let test = try TestDevice()
        for cipher in Self.ciphers {
            let path = test.path("kept-\(cipher.rawValue)")
            let file = try EncryptedFile.create(at: FileLocation(path: path), protectionClass: .complete, keys: test.device, cipher: cipher)
            try file.write(pattern(3 * Self.blockSize + 5), at: 0)
            try file.changeProtectionClass(to: .completeUntilFirstUserAuthentication, keys: test.device)
            try file.write([1, 2, 3], at: 10)
            try file.close()
            #expect(readRaw(path)[8] == cipher.rawValue)
            var expected = pattern(3 * Self.blockSize + 5)
            expected.replaceSubrange(10..<13, with: [1, 2, 3])
            #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == expected)
        }
    }

    @Test("a guarded slot is zeroed when it is given back, and handed out again; secrets small and large work")
    func guardedSlotZeroed() throws {
        // A pool of its own: the shared ones serve the tests running beside this one.
        let pool = GuardedScratch(slotSize: 64, slotsPerRegion: 4)
        let slot = pool.acquire()
        #expect(UnsafeRawBufferPointer(start: slot, count: 64).allSatisfy { $0 == 0 })
        memset(slot, 0xA5, 64)
        pool.release(slot)
        let reused = pool.acquire()
        #expect(reused == slot, "last in, first out")
        #expect(UnsafeRawBufferPointer(start: reused, count: 64).allSatisfy { $0 == 0 }, "no byte of the secret is left in its slot")
        // A secret whose initialiser throws gives its slot back once: twice, two later secrets would share it.
        struct Refused: Error {}
        #expect(throws: Refused.self) { _ = try SecureBytes(count: 32) { _ in throw Refused() } }
        let first = SecureBytes.random(count: 32), second = SecureBytes.random(count: 32)
        #expect(try first.withUnsafeBytes { $0.baseAddress } != second.withUnsafeBytes { $0.baseAddress })
        for count in [FileHeader.fileKeyBytes, GuardedScratch.smallSecrets.slotSize, GuardedScratch.smallSecrets.slotSize + 1] {
            let secret = SecureBytes.random(count: count)
            try secret.withUnsafeBytes { bytes in
                #expect(bytes.count == count)
                #expect(bytes.contains { $0 != 0 })
            }
            secret.discard()
            #expect(secret.isDiscarded)
        }
    }

    @Test("a pass's derived keys (AES-256-GCM's block key and state, AEGIS-256's key) are zeroed in their guarded slot when the pass ends",
          arguments: ciphers.filter { $0 != .xChaCha20Poly1305 })
    func blockKeyZeroed(cipher: FileHeader.Cipher) throws {
        let key = SecureBytes.random(count: FileHeader.fileKeyBytes)
        var fields = [UInt8](repeating: 0, count: BlockCipher.nonceFieldBytes)
        fields.withUnsafeMutableBytes { BlockCipher.makeNonceFields(cipher, count: 1, into: $0) }
        var sealed = [UInt8](repeating: 0, count: 512 + cipher.tagBytes)
        var slot: UnsafeMutableRawPointer?
        try key.withUnsafeBytes { fileKey in
            BlockCipher.with(cipher, fileKey: fileKey) { sealer in
                fields.withUnsafeBytes { field in
                    [UInt8](repeating: 1, count: 512).withUnsafeBytes { plaintext in
                        sealed.withUnsafeMutableBytes { sealer.seal(plaintext, nonceField: field, associatedData: UnsafeRawBufferPointer(start: nil, count: 0), into: $0) }
                    }
                }
                // The slot the pass took is the one the pool hands out next once it is back (last in, first out).
                slot = GuardedScratch.shared.acquire()
                GuardedScratch.shared.release(slot!)
            }
        }
        let reused = GuardedScratch.shared.acquire()
        defer { GuardedScratch.shared.release(reused) }
        #expect(reused != slot, "the pass's own slot went back after the probe's")
        let bytes = UnsafeRawBufferPointer(start: reused, count: GuardedScratch.shared.slotSize)
        #expect(bytes.allSatisfy { $0 == 0 }, "no byte of a derived key or of the AES state is left")
        #expect(sealed.contains { $0 != 0 })
    }
}
