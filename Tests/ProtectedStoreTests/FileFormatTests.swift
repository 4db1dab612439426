import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing

@Suite("Encrypted file format")
struct FileFormatTests {
    static let blockSize = EncryptedFile.defaultBlockSize

    @Test("round trip", arguments: [0, 1, blockSize - 1, blockSize, blockSize + 1, 5 * blockSize + 17, 64 * blockSize + 3])
    func roundTrip(size: Int) throws {
        let test = try TestDevice()
        let path = test.path("file")
        let contents = pattern(size)
        try test.device.writeFile(contents, to: path, protection: .complete)
        #expect(try test.device.readFile(at: path) == contents)
        let layout = BlockLayout(headerSize: FileHeader.size, blockSize: Self.blockSize)
        #expect(readRaw(path).count == Int(layout.storedSize(plaintextSize: Int64(size))))
        // A fresh process sees the same bytes: reopen the device from disk.
        let reopened = try test.reopen()
        try reopened.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(try reopened.readFile(at: path) == contents)
    }

    @Test("layout arithmetic inverts for every size up to four blocks")
    func layoutInverts() {
        let layout = BlockLayout(headerSize: FileHeader.size, blockSize: 512)
        for size in Int64(0)...2048 {
            #expect(layout.plaintextSize(storedSize: layout.storedSize(plaintextSize: size)) == size)
        }
        // Lengths no writer produces: shorter than one empty block, or a final block with no plaintext after a full one.
        #expect(layout.plaintextSize(storedSize: Int64(FileHeader.size)) == nil)
        #expect(layout.plaintextSize(storedSize: Int64(FileHeader.size) + 39) == nil)
        #expect(layout.plaintextSize(storedSize: layout.storedSize(plaintextSize: 512) + 40) == nil)
    }

    @Test("random writes, reads and truncations match an in-memory model", arguments: [UInt64(1), 2, 3, 4])
    func randomOperations(seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        let test = try TestDevice()
        let path = test.path("model")
        var file = try EncryptedFile.create(at: path, protectionClass: .completeUntilFirstUserAuthentication, keys: test.device, blockSize: 512)
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
        raw[FileHeader.size + 700 * (Self.blockSize + BlockLayout.overhead) + 100] ^= 0x80
        writeRaw(raw, path)
        let file = try EncryptedFile.open(at: path, keys: test.device, writable: false)
        var buffer = [UInt8](repeating: 0xAA, count: 3 * 1_048_576)
        let error = expectError(.integrity) { try buffer.withUnsafeMutableBytes { try file.read(into: $0, at: 0) } }
        #expect(error?.problem.contains("block 700 ") == true, "\(String(describing: error))")
        #expect(buffer.allSatisfy { $0 == 0 }, "nothing of a failed read reaches the caller")
    }

    @Test("an empty file is authenticated too: its lone block, and a file cut down to one empty block")
    func emptyFileAuthenticated() throws {
        let test = try TestDevice()
        let path = test.path("empty")
        try test.device.writeFile([], to: path, protection: .complete)
        let original = readRaw(path)
        #expect(original.count == FileHeader.size + BlockLayout.overhead)
        for position in original.indices {
            var flipped = original
            flipped[position] ^= 0x01
            writeRaw(flipped, path)
            expectError(position < 4 || position >= 6 ? .integrity : .unsupportedFormat) { try test.device.readFile(at: path) }
        }
        let long = test.path("long")
        try test.device.writeFile(pattern(4 * Self.blockSize), to: long, protection: .complete)
        writeRaw(Array(readRaw(long)[0..<FileHeader.size + BlockLayout.overhead]), long)
        expectError(.integrity) { try test.device.readFile(at: long) }
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

    @Test("every single-byte modification of a small file is detected")
    func everyByteFlipDetected() throws {
        let test = try TestDevice()
        let path = test.path("small")
        let contents = pattern(1300)
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device, blockSize: 512)
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
                if position >= FileHeader.size {
                    let block = (position - FileHeader.size) / (512 + BlockLayout.overhead)
                    #expect(error.problem.contains("block \(block) "), "byte \(position): \(error.problem)")
                }
            }
            try handle.seek(toOffset: UInt64(position))
            try handle.write(contentsOf: [original[position]])
        }
        #expect(undetected.isEmpty, "flips not detected at \(undetected)")
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == contents)
    }

    @Test("blocks swapped, spliced from another file, cut off or appended are detected")
    func blockMovesDetected() throws {
        let test = try TestDevice()
        let stored = 512 + BlockLayout.overhead
        func make(_ name: String, seed: UInt8) throws -> (String, [UInt8]) {
            let path = test.path(name)
            let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device, blockSize: 512)
            try file.write(pattern(4 * 512, seed: seed), at: 0)
            try file.close()
            return (path, readRaw(path))
        }
        let (path, original) = try make("victim", seed: 1)
        let (_, other) = try make("donor", seed: 2)
        func block(_ bytes: [UInt8], _ index: Int) -> ArraySlice<UInt8> {
            bytes[FileHeader.size + index * stored..<FileHeader.size + (index + 1) * stored]
        }
        func expectRejected(_ bytes: [UInt8], _ what: String) {
            writeRaw(bytes, path)
            let error = expectError(.integrity) { try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() }
            #expect(error != nil, "\(what)")
        }
        var swapped = original
        swapped.replaceSubrange(FileHeader.size..<FileHeader.size + 2 * stored, with: block(original, 1) + block(original, 0))
        expectRejected(swapped, "swap of blocks 0 and 1")
        var rotated = Array(original[0..<FileHeader.size])
        for index in [1, 2, 3, 0] { rotated += block(original, index) }
        expectRejected(rotated, "reordered blocks")
        var spliced = original
        spliced.replaceSubrange(FileHeader.size + stored..<FileHeader.size + 2 * stored, with: block(other, 1))
        expectRejected(spliced, "block 1 from another file")
        expectRejected(Array(original.dropLast(stored)), "last block cut off")
        expectRejected(original + block(original, 3), "block appended")
        expectRejected(Array(original[0..<FileHeader.size]), "body removed")
        var otherHeader = original
        otherHeader.replaceSubrange(0..<FileHeader.size, with: other[0..<FileHeader.size])
        expectRejected(otherHeader, "header of another file")
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
            #expect(after[FileHeader.size...] == before[FileHeader.size...])
            #expect(after[0..<FileHeader.size] != before[0..<FileHeader.size])
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
}
