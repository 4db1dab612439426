import Dispatch
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import ProtectedStoreTesting
import SystemPackage
import Testing
import SuiteThreads

@Suite("writes behind", .ownThread)
struct WritesBehindTests {
    @Test("writes behind, mixed with writes, truncations and reopenings, match a model; every other call sees them", arguments: [UInt64(1), 2, 3])
    func matchesModel(seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        let test = try TestDevice()
        let path = test.path("model")
        var file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        var model: [UInt8] = []
        var queued: UInt64 = 0
        func apply(_ data: [UInt8], at offset: Int) {
            if offset + data.count > model.count { model += [UInt8](repeating: 0, count: offset + data.count - model.count) }
            model.replaceSubrange(offset..<offset + data.count, with: data)
        }
        for step in 0..<120 {
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<6:
                let offset = Int.random(in: 0...model.count + 70_000, using: &random)
                let count = Int.random(in: EncryptedFile.writeBehindThreshold...300_000, using: &random)
                let data = (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) }
                try data.withUnsafeBytes { try file.writeBehind(from: $0, at: Int64(offset)) }
                apply(data, at: offset)
            case 6:
                let offset = Int.random(in: 0...model.count, using: &random)
                let data = (0..<Int.random(in: 1...5000, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                try file.write(data, at: Int64(offset))
                apply(data, at: offset)
            case 7:
                let offset = Int.random(in: 0...model.count, using: &random)
                let expected = offset >= model.count ? [] : Array(model[offset..<min(model.count, offset + 100_000)])
                #expect(try file.read(at: Int64(offset), count: 100_000) == expected, "seed \(seed) step \(step)")
            case 8:
                let size = Int.random(in: 0...model.count + 5000, using: &random)
                try file.truncate(to: Int64(size))
                if size < model.count { model.removeLast(model.count - size) } else { model += [UInt8](repeating: 0, count: size - model.count) }
            default:
                queued += file.writesQueuedBehind
                try file.close()
                file = try EncryptedFile.open(at: path, keys: test.device, writable: true)
            }
            // Now and then only, so that reads, truncations and closes mostly start with writes still queued.
            if step % 10 == 9 { #expect(file.size == Int64(model.count), "seed \(seed) step \(step)") }
        }
        queued += file.writesQueuedBehind
        #expect(queued > 0, "no write went behind (less than 256 MiB free where the test runs?)")
        file.waitForWritesBehind()
        #expect(file.failuresOfWritesBehind == 0)
        #expect(try file.readAll() == model)
        try file.close()
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == model)
    }

    @Test("a write behind that can't be stored is reported once, with its offset, and the write queued after it is dropped, not stored over the gap")
    func failureReportedOnce() throws {
        let test = try TestDevice()
        let path = test.path("damaged-neighbour")
        let original = pattern(1 << 20, seed: 5)
        try test.device.writeFile(original, to: path, protection: .complete)
        let file = try EncryptedFile.open(at: path, keys: test.device, writable: true)
        // Storing a write that starts inside a block reads that block first; the injected read failure stops it there.
        let rule = FaultInjection.install(FaultInjection.Rule(.read, folder: (path as NSString).deletingLastPathComponent, pattern: "damaged-neighbour", errno: .ioError))
        let first = pattern(EncryptedFile.writeBehindThreshold, seed: 6), second = pattern(EncryptedFile.writeBehindThreshold * 2, seed: 7)
        try first.withUnsafeBytes { try file.writeBehind(from: $0, at: 100) }
        // Aligned, so it could be stored: it must not be, after the failure before it.
        try second.withUnsafeBytes { try file.writeBehind(from: $0, at: 512 * 1024) }
        var seen = 0
        let report = try #require(throws: ProtectedStoreError.self) { try finishWrites(file, seen: &seen) }
        try finishWrites(file, seen: &seen)
        FaultInjection.remove(rule)
        #expect(report.errno == .ioError && report.path == path)
        #expect(report.problem.contains("a write of \(first.count) bytes at offset 100, accepted earlier, was not stored"), "\(report.problem)")
        #expect(report.problem.contains("the 1 write(s) accepted after it were not stored either"), "\(report.problem)")
        #expect(try file.readAll() == original)
        // Reported once, storing goes on.
        try second.withUnsafeBytes { try file.writeBehind(from: $0, at: 512 * 1024) }
        try file.close()
        var expected = original
        expected.replaceSubrange(512 * 1024..<512 * 1024 + second.count, with: second)
        #expect(try test.device.readFile(at: path) == expected)
    }

    @Test("through the mount's file system, each descriptor open when a write behind failed hears of it once, at its next write, flush or fsync; one opened after it does not")
    func failureToEveryDescriptor() async throws {
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .complete)
        let original = pattern(1 << 20, seed: 9)
        try device.container.write(Data(original), toPath: "Documents/shared.bin")
        let view = ContainerFileSystem(container: device.container)
        let writer = try view.open("/Documents/shared.bin", flags: O_RDWR), reader = try view.open("/Documents/shared.bin", flags: O_RDONLY)
        let chunk = pattern(EncryptedFile.writeBehindThreshold, seed: 10)
        try await device.failingReads(matching: "Documents/shared.bin") {
            // Storing it reads the block it starts in, which fails.
            #expect(try chunk.withUnsafeBytes { try view.write(writer, from: $0, at: 100) } == chunk.count)
            _ = try view.attributes(ofHandle: reader)  // waits for it, telling no one
        }
        // Opened after the failure, before anyone heard of it: not told, as on Linux.
        let later = try view.open("/Documents/shared.bin", flags: O_RDONLY)
        let told = try #require(throws: ProtectedStoreError.self) { try view.finishWrites(writer) }
        #expect(told.problem.contains("at offset 100, accepted earlier, was not stored"), "\(told.problem)")
        try view.finishWrites(writer)
        #expect(try chunk.withUnsafeBytes { try view.write(writer, from: $0, at: 512 * 1024) } == chunk.count)
        #expect(throws: ProtectedStoreError.self) { try view.synchronize(reader) }
        try view.synchronize(reader)
        try view.finishWrites(later)
        for handle in [writer, reader, later] { view.release(handle) }
        var expected = original
        expected.replaceSubrange(512 * 1024..<512 * 1024 + chunk.count, with: chunk)
        #expect(try device.container.contents(atPath: "Documents/shared.bin") == Data(expected))
    }

    @Test("power cuts while the mount stores large writes behind: the file always reads, and what an fsync covered is there")
    func powerCuts() async throws {
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .complete)
        let view = ContainerFileSystem(container: device.container)
        let chunk = 3 * EncryptedFile.writeBehindThreshold
        let first = pattern(chunk, seed: 11), second = pattern(chunk, seed: 12), third = pattern(chunk, seed: 13)
        // The file and its first bytes are durable before the cuts begin.
        let created = try view.create("/Documents/big.bin", mode: 0o600)
        _ = try first.withUnsafeBytes { try view.write(created, from: $0, at: 0) }
        try view.synchronize(created)
        view.release(created)
        let folder = try view.openDirectory("/Documents")
        try view.synchronizeDirectory(folder)
        view.releaseDirectory(folder)
        let summary = try await device.everyPowerCut(maxStates: 300, seed: 14, during: {
            let handle = try view.open("/Documents/big.bin", flags: O_RDWR)
            _ = try second.withUnsafeBytes { try view.write(handle, from: $0, at: 100_000) }
            try view.synchronize(handle)
            _ = try third.withUnsafeBytes { try view.write(handle, from: $0, at: 300_000) }
            try view.finishWrites(handle)
            view.release(handle)
        }, afterReboot: { rebooted in
            try await rebooted.unlock()
            // A torn write destroys the blocks it covers (FORMAT.md §4.6), so only the others are read: the first
            // write's blocks before the second's, and once the fsync is past, the second's.
            let handle = try rebooted.container.fileHandle(forReadingAtPath: "Documents/big.bin")
            try #require([chunk, 100_000 + chunk, 300_000 + chunk].contains(Int(handle.size)), "\(handle.size) bytes")
            try #require([UInt8](try handle.read(upToCount: 98_304, atOffset: 0)) == Array(first.prefix(98_304)))
            guard rebooted.powerCut?.operationHadReturned == true else { return }
            try #require([UInt8](try handle.read(upToCount: chunk, atOffset: 100_000)) == second)
        })
        print("power cuts, writes behind: \(summary)")
        #expect(summary.statesChecked > 50)
    }

    @Test("an injected full disk fails a write behind at once and changes nothing")
    func fullDiskAtOnce() throws {
        let test = try TestDevice()
        let path = test.path("full")
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        let chunk = pattern(128 * 1024, seed: 8)
        try chunk.withUnsafeBytes { try file.writeBehind(from: $0, at: 0) }
        file.waitForWritesBehind()
        #expect(file.failuresOfWritesBehind == 0)
        let rule = FaultInjection.install(FaultInjection.Rule(.write(allowedBytes: 200 * 1024), folder: (path as NSString).deletingLastPathComponent, pattern: "full", errno: .noSpace))
        defer { FaultInjection.remove(rule) }
        // Under an injected full disk writes are stored before they return: the first fits, the second fails at once.
        try chunk.withUnsafeBytes { try file.writeBehind(from: $0, at: 128 * 1024) }
        let error = try #require(throws: ProtectedStoreError.self) { try chunk.withUnsafeBytes { try file.writeBehind(from: $0, at: 256 * 1024) } }
        #expect(error.errno == .noSpace)
        file.waitForWritesBehind()
        #expect(file.failuresOfWritesBehind == 0)
        #expect(file.size == 256 * 1024)
        #expect(try file.readAll() == chunk + chunk)
    }

    @Test("a lock stores the writes accepted before it: every write that returned is there; after it, writes fail at once", arguments: 0..<4)
    func discardStoresFirst(round: Int) throws {
        let test = try TestDevice()
        let path = test.path("locked-\(round)")
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        let chunk = 128 * 1024, writers = 2, lap = 64
        // Per writer: how many of its chunks (every `writers`th, from its own) returned, and whether a failure stopped it.
        let returned = Locked([Int](repeating: 0, count: writers)), stoppedByLock = Locked([Bool](repeating: false, count: writers))
        let done = DispatchSemaphore(value: 0)
        // Writers that keep the queue full until the lock stops them: the lock must not wait for them to stop first.
        // Bounded by a count, not a time, should the lock never stop them (a failure below): 512 MiB each.
        let chunks = (0..<lap * writers).map { pattern(chunk, seed: UInt8($0 % 251 + 1)) }
        for writer in 0..<writers {
            Thread.detachNewThread {
                var written = 0
                while written < 4096 {
                    let index = (written % lap) * writers + writer
                    let data = chunks[index]
                    do {
                        try data.withUnsafeBytes { try file.writeBehind(from: $0, at: Int64(index * chunk)) }
                    } catch {
                        stoppedByLock.withLock { $0[writer] = true }
                        break
                    }
                    written += 1
                    returned.withLock { $0[writer] = min(written, lap) }
                }
                done.signal()
            }
        }
        while file.writesQueuedBehind < UInt64(20 * (round + 1)) { Thread.sleep(forTimeInterval: 0.001) }
        let queuedBefore = file.writesQueuedBehind
        file.discardKey()
        // Writes go behind only until the lock begins; waiting for writers that keep the queue full would let
        // thousands more in (a count, not a time: 512 writes are 64 MiB).
        #expect(file.writesQueuedBehind - queuedBefore < 512, "the discard kept accepting writes while it waited")
        for _ in 0..<writers { done.wait() }
        #expect(stoppedByLock.withLock { $0 } == [Bool](repeating: true, count: writers), "the discard waited for the writers to stop")
        #expect(!file.hasKey)
        #expect(throws: ProtectedStoreError.self) { try pattern(chunk).withUnsafeBytes { try file.writeBehind(from: $0, at: 0) } }
        try file.close()
        let reopened = try EncryptedFile.open(at: path, keys: test.device, writable: false)
        for (writer, count) in returned.withLock({ $0 }).enumerated() {
            for index in (0..<count).map({ $0 * writers + writer }) {
                #expect(try reopened.read(at: Int64(index * chunk), count: chunk) == pattern(chunk, seed: UInt8(index % 251 + 1)), "chunk \(index)")
            }
        }
    }

    /// What the mount's flush does for one descriptor, whose count of failures heard of is `seen`: waits for the
    /// file's writes behind and reports a failure among them once.
    private func finishWrites(_ file: EncryptedFile, seen: inout Int) throws {
        file.waitForWritesBehind()
        if let failure = file.failureOfWritesBehind(after: &seen) { throw failure }
    }
}
