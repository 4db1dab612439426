import Dispatch
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import ProtectedStoreTesting
import SystemPackage
import Testing

@Suite("writes behind")
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
        try file.finishWrites()
        #expect(try file.readAll() == model)
        try file.close()
        #expect(try EncryptedFile.open(at: path, keys: test.device, writable: false).readAll() == model)
    }

    @Test("a write behind that can't be stored is reported once, with its offset, and no write after it is stored before that")
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
        var reports: [ProtectedStoreError] = []
        do {
            // Aligned, so it could be stored: it must not be, after the failure before it.
            try second.withUnsafeBytes { try file.writeBehind(from: $0, at: 512 * 1024) }
        } catch let error as ProtectedStoreError {
            reports.append(error)
        }
        do { try file.finishWrites() } catch let error as ProtectedStoreError { reports.append(error) }
        try file.finishWrites()
        FaultInjection.remove(rule)
        #expect(reports.count == 1)
        let report = try #require(reports.first)
        #expect(report.errno == .ioError && report.path == path)
        #expect(report.problem.contains("a write of \(first.count) bytes at offset 100, accepted earlier, was not stored"), "\(report.problem)")
        #expect(try file.readAll() == original)
        // Reported once, storing goes on.
        try second.withUnsafeBytes { try file.writeBehind(from: $0, at: 512 * 1024) }
        try file.close()
        var expected = original
        expected.replaceSubrange(512 * 1024..<512 * 1024 + second.count, with: second)
        #expect(try test.device.readFile(at: path) == expected)
    }

    @Test("an injected full disk fails a write behind at once and changes nothing")
    func fullDiskAtOnce() throws {
        let test = try TestDevice()
        let path = test.path("full")
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        let chunk = pattern(128 * 1024, seed: 8)
        try chunk.withUnsafeBytes { try file.writeBehind(from: $0, at: 0) }
        try file.finishWrites()
        let rule = FaultInjection.install(FaultInjection.Rule(.write(allowedBytes: 200 * 1024), folder: (path as NSString).deletingLastPathComponent, pattern: "full", errno: .noSpace))
        defer { FaultInjection.remove(rule) }
        // Under an injected full disk writes are stored before they return: the first fits, the second fails at once.
        try chunk.withUnsafeBytes { try file.writeBehind(from: $0, at: 128 * 1024) }
        let error = try #require(throws: ProtectedStoreError.self) { try chunk.withUnsafeBytes { try file.writeBehind(from: $0, at: 256 * 1024) } }
        #expect(error.errno == .noSpace)
        try file.finishWrites()
        #expect(file.size == 256 * 1024)
        #expect(try file.readAll() == chunk + chunk)
    }

    @Test("a lock stores the writes accepted before it: every write that returned is there; after it, writes fail at once", arguments: 0..<4)
    func discardStoresFirst(round: Int) throws {
        let test = try TestDevice()
        let path = test.path("locked-\(round)")
        let file = try EncryptedFile.create(at: path, protectionClass: .complete, keys: test.device)
        let chunk = 128 * 1024
        let returned = Locked(0), stoppedByLock = Locked(false)
        let done = DispatchSemaphore(value: 0)
        // A writer that keeps going until the lock stops it: the lock must not wait for it to stop first.
        Thread.detachNewThread {
            let deadline = Date().addingTimeInterval(10)
            var index = 0
            while Date() < deadline {
                let data = pattern(chunk, seed: UInt8(index % 251 + 1))
                do {
                    try data.withUnsafeBytes { try file.writeBehind(from: $0, at: Int64(index * chunk)) }
                } catch {
                    stoppedByLock.withLock { $0 = true }
                    break
                }
                index += 1
                returned.withLock { $0 = index }
                // Bounded disk use: start again at the beginning of the file now and then.
                if index == 2048 { index = 0 }
            }
            done.signal()
        }
        Thread.sleep(forTimeInterval: 0.005 * Double(round + 1))
        file.discardKey()
        done.wait()
        #expect(stoppedByLock.withLock { $0 }, "the discard waited for the writer to stop")
        let count = min(returned.withLock { $0 }, 2048)
        #expect(!file.hasKey)
        #expect(throws: ProtectedStoreError.self) { try pattern(chunk).withUnsafeBytes { try file.writeBehind(from: $0, at: 0) } }
        try file.close()
        let reopened = try EncryptedFile.open(at: path, keys: test.device, writable: false)
        #expect(reopened.size >= Int64(count * chunk))
        for index in 0..<count {
            #expect(try reopened.read(at: Int64(index * chunk), count: chunk) == pattern(chunk, seed: UInt8(index % 251 + 1)), "chunk \(index) of \(count)")
        }
    }
}
