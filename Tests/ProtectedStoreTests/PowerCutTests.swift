import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// The power-cut simulator against the encrypted file format: it must find the hazard of format version 1 (growing
/// a file rewrites its old final block, which the write does not cover) and must not report the paths that are safe.
@Suite("power-cut simulator", .ownThread, .serialized)
struct PowerCutTests {
    static let blockSize = EncryptedFile.defaultBlockSize

    /// A folder holding one encrypted file with `content`, synced (file and folder) before any recording starts.
    struct Fixture {
        let test: TestDevice
        let root: String
        let path: String
        let scratch = TemporaryDirectory()

        init(content: [UInt8]) throws {
            test = try TestDevice()
            root = test.path("recorded")
            path = (root as NSString).appendingPathComponent("file")
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
            let file = try EncryptedFile.create(at: path, protectionClass: .completeUntilFirstUserAuthentication, keys: test.device)
            try file.write(content, at: 0)
            try file.synchronize()
            try file.close()
            try FileSystem.synchronizeDirectory(root)
        }
    }

    /// Runs `workload` on the fixture's file under a recording and checks every power-cut state of it.
    func simulate(_ name: String, initial: [UInt8], statesPerCut: Int = 24, seed: UInt64 = 1,
                  _ workload: (EncryptedFile, EncryptedFileHistory) throws -> Void) throws -> PowerCutReport {
        let fixture = try Fixture(content: initial)
        let recording = try PowerCutRecording.start(root: fixture.root)
        let history = EncryptedFileHistory(name: "file", initialContent: initial, recording: recording)
        do {
            let file = try EncryptedFile.open(at: fixture.path, keys: fixture.test.device, writable: true)
            try workload(file, history)
            try file.close()
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        let report = try recording.check(workload: name, statesPerCut: statesPerCut, seed: seed, scratch: fixture.scratch.path) {
            history.check($0, keys: fixture.test.device)
        }
        print("power-cut: \(report.description)")
        return report
    }

    @Test("finds format version 1's growth hazard: an append after an fsync can destroy the synced block before it")
    func findsVersion1GrowthHazard() throws {
        let test = try TestDevice()
        let root = test.path("recorded")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
        let path = (root as NSString).appendingPathComponent("file")
        let key = SecureBytes.random(count: 32), fileID = Random.bytes(16)
        let initial = pattern(2 * Self.blockSize)
        let created = try Version1GrowthFile.create(at: path, content: initial, key: key, fileID: fileID)
        try created.synchronize()
        try created.close()
        try FileSystem.synchronizeDirectory(root)
        let recording = try PowerCutRecording.start(root: root)
        let history = EncryptedFileHistory(name: "file", initialContent: initial, recording: recording)
        do {
            let file = try Version1GrowthFile.open(at: path, key: key, fileID: fileID)
            let appended = pattern(10, seed: 9)
            history.write(appended, at: Int64(initial.count))
            try file.append(appended)
            history.completed()
            try file.close()
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        let scratch = TemporaryDirectory()
        let report = try recording.check(workload: "append after fsync, format version 1", statesPerCut: 24, seed: 1, scratch: scratch.path) {
            history.check($0) { try Version1GrowthFile.open(at: $0, key: key, fileID: fileID) }
        }
        print("power-cut: \(report.description)")
        #expect(report.violations.contains { $0.contains("block 1, which no write since the last fsync touched, is unreadable") }, "\(report)")
    }

    @Test("the same append in the current format: no state a power cut leaves damages the synced blocks")
    func appendAfterSynchronize() throws {
        let report = try simulate("append after fsync", initial: pattern(2 * Self.blockSize)) { file, history in
            let appended = pattern(10, seed: 9)
            history.write(appended, at: Int64(2 * Self.blockSize))
            try file.write(appended, at: Int64(2 * Self.blockSize))
            history.completed()
        }
        #expect(report.violations.isEmpty, "\(report)")
    }

    @Test("appends, truncates up and down around block boundaries, sparse writes and fallocate, fsynced now and then")
    func growthAndShrinking() throws {
        let block = Self.blockSize
        let report = try simulate("growth and shrinking", initial: pattern(block + 100), statesPerCut: 12) { file, history in
            var step = 0
            func write(_ count: Int, at offset: Int) throws {
                step += 1
                let bytes = pattern(count, seed: UInt8(step))
                history.write(bytes, at: Int64(offset))
                try file.write(bytes, at: Int64(offset))
                history.completed()
            }
            func truncate(_ size: Int) throws {
                history.truncate(to: Int64(size))
                try file.truncate(to: Int64(size))
                history.completed()
            }
            func sync() throws {
                try file.synchronize()
                history.synchronized()
            }
            func allocate(_ offset: Int, _ length: Int, keepSize: Bool) throws {
                history.truncate(to: Int64(keepSize ? history.current.count : max(history.current.count, offset + length)))
                try file.allocate(from: Int64(offset), length: Int64(length), keepSize: keepSize)
                history.completed()
            }
            try write(block - 100, at: block + 100)          // fills block 1 exactly
            try sync()
            try write(1, at: 2 * block)                      // a new block after a full one
            try truncate(2 * block - 7)                       // shrink mid-block: a stale tail
            try sync()
            try truncate(5 * block + 3)                       // grow: only the length record
            try write(20, at: 7 * block + 5)                  // a sparse write past the end
            try sync()
            try write(block, at: 2 * block - 50)              // covers the stale tail and the hole after it
            try truncate(block / 2)
            try write(300, at: block / 2)                     // append into the cut block
            try sync()
            try allocate(6 * block + 10, 3 * block, keepSize: false)  // fallocate past the end: a hole with space behind it
            try write(50, at: 7 * block)                      // into the reserved space
            try allocate(0, 12 * block, keepSize: true)       // reserves only
            try sync()
            try truncate(8 * block + 1)                       // cuts the fallocated range
            try write(10, at: 11 * block)                     // sparse again
            try sync()
        }
        #expect(report.violations.isEmpty, "\(report)")
        #expect(report.statesChecked > 300)
    }

    @Test("overwrites inside the file, fsynced in between, leave only old or new bytes")
    func overwritesInPlace() throws {
        let size = 3 * Self.blockSize + 100
        let report = try simulate("overwrites in place", initial: pattern(size)) { file, history in
            for (offset, count, seed) in [(0, Self.blockSize, UInt8(1)), (Self.blockSize + 7, 300, 2), (2 * Self.blockSize - 5, 10, 3)] {
                let bytes = pattern(count, seed: seed)
                history.write(bytes, at: Int64(offset))
                try file.write(bytes, at: Int64(offset))
                history.completed()
                try file.synchronize()
                history.synchronized()
            }
        }
        #expect(report.violations.isEmpty, "\(report)")
        #expect(report.statesChecked > 100)
    }

    @Test("the mount's mkdir (built in place and made ahead), rmdir (moved out, removed after) and rename over an empty folder leave every folder listable with its items' names after any power cut")
    func mountFolders() async throws {
        let long = String(repeating: "л", count: 80) + ".txt"
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .none)
        try device.container.createDirectory(atPath: "Documents/gone")
        try device.container.write(Data("going".utf8), toPath: "Documents/gone/" + long)
        try device.container.createDirectory(atPath: "Documents/replaced")
        let view = ContainerFileSystem(container: device.container)
        // Two folders ahead, made inside the calls that take them: "new" is built in place (none is ready yet),
        // "inner" and "moving" are made ahead, and "gone" is removed in the pool.
        view.makeFoldersAhead(size: 2, inBackground: false)
        defer { view.stopMakingFoldersAhead() }
        let summary = try await device.everyPowerCut(maxStates: 400, seed: 11, during: {
            try view.createDirectory("/Documents/new", mode: 0o755)
            try view.createDirectory("/Documents/new/inner", mode: 0o700)
            try device.container.write(Data("new".utf8), toPath: "Documents/new/inner/" + long)
            try view.removeFile("/Documents/gone/" + long)
            try view.removeDirectory("/Documents/gone")
            try view.createDirectory("/Documents/moving", mode: 0o700)
            try view.rename("/Documents/moving", to: "/Documents/replaced", flags: 0)
        }, afterReboot: { rebooted in
            // A listing leaves out a folder whose IV does not read, so each one that exists is listed by its path.
            for folder in ["new", "new/inner", "gone", "moving", "replaced"].map({ "Documents/" + $0 }) where rebooted.container.fileExists(atPath: folder) {
                let items = try rebooted.container.contentsOfDirectory(atPath: folder)
                if folder.hasSuffix("gone"), !items.isEmpty {
                    try #require(try rebooted.container.contents(atPath: "Documents/gone/" + long) == Data("going".utf8))
                }
            }
            try #require(rebooted.container.fileExists(atPath: "Documents/replaced"))
            // A pool made after the reboot removes the one the power cut left, with whatever it held.
            let root = rebooted.container.dataPath
            let rebootedView = ContainerFileSystem(container: rebooted.container)
            rebootedView.makeFoldersAhead(size: 2, inBackground: false)
            try #require(try FileManager.default.contentsOfDirectory(atPath: root).filter { $0.hasPrefix(".sandboxctl-tmp-folders-") }.count == 1)
            rebootedView.stopMakingFoldersAhead()
            try #require(try FileManager.default.contentsOfDirectory(atPath: root).allSatisfy { !$0.hasPrefix(".sandboxctl-tmp-folders-") })
            // Like ext4's, the mount's name changes are durable once a folder is synced; the library's write syncs its folder.
            guard rebooted.powerCut?.operationHadReturned == true else { return }
            try #require(try rebooted.container.contents(atPath: "Documents/new/inner/" + long) == Data("new".utf8))
        })
        print("power cuts, the mount's folders: \(summary)")
        let pools = try FileManager.default.contentsOfDirectory(atPath: device.container.dataPath).filter { $0.hasPrefix(".sandboxctl-tmp-folders-") }
        #expect(pools.count == 1, "the pool's own folder, until it is closed: \(pools)")
        #expect(summary.statesChecked > 100)
    }

    @Test("a whole-file replacement leaves the old file or the new one, never a mixture or nothing")
    func atomicReplacement() throws {
        let test = try TestDevice()
        let root = test.path("recorded")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
        let location = FileLocation(path: (root as NSString).appendingPathComponent("settings"))
        let old = pattern(700), new = pattern(1500, seed: 4)
        try FileSystem.writeAtomically(old, to: location, replacing: false)
        let recording = try PowerCutRecording.start(root: root)
        do {
            try FileSystem.writeAtomically(new, to: location, replacing: true)
            recording.mark(1)
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        let scratch = TemporaryDirectory()
        let report = try recording.check(workload: "whole-file replacement", statesPerCut: 24, seed: 2, scratch: scratch.path) { state in
            let returned = state.marks.contains(1)
            guard let bytes = FileManager.default.contents(atPath: (state.path as NSString).appendingPathComponent("settings")) else {
                return ["the file is gone"]
            }
            if Array(bytes) == new || (!returned && Array(bytes) == old) { return [] }
            return ["the file holds \(bytes.count) bytes that are neither the old version nor the new one"]
        }
        print("power-cut: \(report.description)")
        #expect(report.violations.isEmpty, "\(report)")
    }
}
