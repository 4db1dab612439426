import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// The kit's power cuts and injected faults: what a user's test sees, that the check can fail, and that a seed
/// replays the same states.
@Suite("ProtectedStoreTesting: power cuts and faults", .ownThread)
struct PowerCutAndFaultTests {
    static let path = "Documents/draft.txt"

    /// A save that is not atomic: the file is cut, then written in place, with no fsync.
    static func saveInPlace(_ text: String, in container: Container) throws {
        let handle = try container.fileHandle(forUpdatingAtPath: path)
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8), atOffset: 0)
        try handle.close()
    }

    static func expectOldOrNew(_ rebooted: TestDevice) async throws {
        try await rebooted.unlock()
        let text = String(decoding: try rebooted.container.contents(atPath: path), as: UTF8.self)
        guard text == "the old draft" || text == "the new draft, longer" else {
            throw CocoaError(.fileReadCorruptFile, userInfo: [NSLocalizedDescriptionKey: "the draft reads \"\(text)\""])
        }
    }

    @Test("an atomic save passes every power cut, in both key holders", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func atomicSavePasses(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        try device.container.write(Data("the old draft".utf8), toPath: Self.path)
        let summary = try await device.everyPowerCut(maxStates: 60, seed: 7, during: {
            try device.container.write(Data("the new draft, longer".utf8), toPath: Self.path)
        }, afterReboot: Self.expectOldOrNew)
        print("power cuts, atomic save (\(keyHolder)): \(summary)")
        #expect(summary.statesChecked > 10 && summary.statesChecked <= 60 && summary.operationsRecorded > 3)
    }

    @Test("a save in place without fsync is caught, with the state that breaks it; the same seed finds the same state; replayPowerCut brings it back")
    func inPlaceSaveIsCaught() async throws {
        func firstFailure() async throws -> PowerCutFailure? {
            let device = try TestDevice()
            try device.container.write(Data("the old draft".utf8), toPath: Self.path)
            do {
                try await device.everyPowerCut(seed: 42, during: { try Self.saveInPlace("the new draft, longer", in: device.container) },
                                               afterReboot: Self.expectOldOrNew)
                return nil
            } catch let failure as PowerCutFailure {
                return failure
            }
        }
        let failure = try #require(try await firstFailure(), "a non-atomic save must fail some power cut")
        #expect(failure.description.contains("replayPowerCut(\"\(failure.state)\""), "\(failure)")
        #expect(failure.state.seed == 42)
        print("power cuts, save in place: \(failure)")
        let again = try #require(try await firstFailure())
        #expect(again.state == failure.state, "the same seed gives the same states in the same order")

        let device = try TestDevice()
        try device.container.write(Data("the old draft".utf8), toPath: Self.path)
        await #expect(throws: PowerCutFailure.self) {
            try await device.replayPowerCut(failure.state.description, during: { try Self.saveInPlace("the new draft, longer", in: device.container) },
                                            afterReboot: Self.expectOldOrNew)
        }
        let bad = await #expect(throws: (any Error).self) {
            try await device.replayPowerCut("not-a-state", during: {}, afterReboot: { _ in })
        }
        #expect("\(bad.map { "\($0)" } ?? "")".contains("is not a power-cut state"))
    }

    @Test("failingWrites: a full disk gives fileWriteOutOfSpace over ENOSPC and loses nothing; after the scope writes work again")
    func fullDisk() async throws {
        let device = try TestDevice()
        let container = device.container
        try container.write(Data("the old draft".utf8), toPath: Self.path)
        let error = await #expect(throws: CocoaError.self) {
            try await device.failingWrites(with: .noSpace) { try container.write(Data("the new draft".utf8), toPath: Self.path) }
        }
        #expect(error?.code == .fileWriteOutOfSpace)
        #expect((error?.underlying as? POSIXError)?.code == .ENOSPC)
        #expect(try container.contents(atPath: Self.path) == Data("the old draft".utf8))
        // A budget: small writes pass until it is spent; a quota error reads the same to Foundation code.
        try await device.failingWrites(after: 20_000, with: .quotaExceeded) { () async throws in
            try container.write(Data("small".utf8), toPath: "Documents/small.txt")
            let quota = #expect(throws: CocoaError.self) { try container.write(Data(count: 100_000), toPath: "Documents/big.bin") }
            #expect((quota?.underlying as? POSIXError)?.code == .EDQUOT)
        }
        try container.write(Data("the new draft".utf8), toPath: Self.path)
        #expect(try container.contents(atPath: Self.path) == Data("the new draft".utf8))
    }

    @Test("failingReads matching a pattern fails only those files with EIO; failingSynchronize makes fsync report EIO")
    func readAndSynchronizeFailures() async throws {
        let device = try TestDevice()
        let container = device.container
        try container.write(Data("data".utf8), toPath: "Documents/a.sqlite")
        try container.write(Data("text".utf8), toPath: Self.path)
        try await device.failingReads(matching: "Documents/*.sqlite") { () async throws in
            let error = #expect(throws: CocoaError.self) { try container.contents(atPath: "Documents/a.sqlite") }
            #expect(error?.code == .fileReadUnknown && (error?.underlying as? POSIXError)?.code == .EIO)
            #expect(try container.contents(atPath: Self.path) == Data("text".utf8))
        }
        #expect(try container.contents(atPath: "Documents/a.sqlite") == Data("data".utf8))
        let handle = try container.fileHandle(forUpdatingAtPath: Self.path)
        try handle.write(contentsOf: Data("more".utf8), atOffset: 4)
        try await device.failingSynchronize { () async throws in
            let error = #expect(throws: CocoaError.self) { try handle.synchronize() }
            #expect((error?.underlying as? POSIXError)?.code == .EIO)
        }
        try handle.synchronize()
        try handle.close()
    }
}
