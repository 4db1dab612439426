import Foundation
import Notes
import ProtectedStore
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// The notes store against the kit's power cuts and disk faults: every acknowledged note survives any power cut
/// during add, delete and the fold of the locked journal; a full disk and a failed fsync are reported and lose nothing.
@Suite("Notes store: power cuts and disk faults", .ownThread)
struct NotesPowerCutTests {
    /// States per test; under the sanitizers (make verify) a fifth, with the same checks.
    static func states(_ count: Int) -> Int { runsUnderSanitizer ? count / 5 : count }

    /// What a rebooted device's store holds once unlocked, as (title, body) pairs; the database must pass integrity_check.
    static func notesAfterReboot(_ rebooted: TestDevice) async throws -> [String] {
        try await rebooted.unlock()
        let store = try NotesStore(container: rebooted.container)
        defer { store.close() }
        try store.verifyIntegrity()
        try #require(try store.pendingChangeCount() == 0, "the journal is folded at the first open after the unlock")
        return try store.notes().map(\.title)
    }

    /// Throws unless `found` is one of the `allowed` lists of titles.
    static func expect(_ found: [String], in allowed: [[String]]) throws {
        guard allowed.contains(found) else {
            throw CocoaError(.fileReadCorruptFile, userInfo: [NSLocalizedDescriptionKey: "the store holds \(found), expected one of \(allowed)"])
        }
    }

    /// Every power cut during `change` leaves the notes `before` or `after`; once `change` has returned, `after` only.
    static func expectEveryPowerCut(on device: TestDevice, seed: UInt64, before: [String], after: [String],
                                    during change: () throws -> Void) async throws -> PowerCutSummary {
        try await device.everyPowerCut(maxStates: states(200), seed: seed, during: change, afterReboot: { rebooted in
            let returned = rebooted.powerCut?.operationHadReturned == true
            try expect(try await notesAfterReboot(rebooted), in: (returned ? [] : [before]) + [after])
        })
    }

    @Test("a power cut at any point of an add leaves every acknowledged note, and the new one at most once; once the add returned, the new one too")
    func powerCutDuringAdd() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try store.add(title: "first", body: "saved before")
        try store.add(title: "second", body: "saved before")
        let summary = try await Self.expectEveryPowerCut(on: device, seed: 11, before: ["first", "second"], after: ["first", "second", "third"]) {
            try store.add(title: "third", body: "in flight")
        }
        print("notes add: \(summary)")
    }

    @Test("a power cut at any point of a delete leaves the note or not, and every other one; once the delete returned, not the note")
    func powerCutDuringDelete() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try store.add(title: "keep", body: "")
        let doomed = try store.add(title: "doomed", body: "")
        try store.add(title: "also keep", body: "")
        let summary = try await Self.expectEveryPowerCut(on: device, seed: 12, before: ["keep", "doomed", "also keep"], after: ["keep", "also keep"]) {
            try store.delete(id: doomed.id)
        }
        print("notes delete: \(summary)")
    }

    @Test("a power cut during a transaction whose rollback journal outgrows the VFS's write-behind buffer leaves all of it or none")
    func powerCutDuringLargeTransaction() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        // A 3000-byte row fills a page of its own, so deleting 400 of them journals 400 pages (1.6 MB): more than the
        // 1 MiB the VFS keeps before storing, so the journal is written in several runs.
        let titles = (0..<400).map { "note \($0)" }
        let filler = String(repeating: "x", count: 3000)
        try store.transaction { batch in for title in titles { batch.add(title: title, body: filler) } }
        let ids = try store.notes().map(\.id)
        let summary = try await Self.expectEveryPowerCut(on: device, seed: 14, before: titles, after: []) {
            try store.transaction { batch in for id in ids { batch.delete(id: id) } }
        }
        print("notes large transaction: \(summary)")
    }

    @Test("a power cut while the unlock folds the locked journal into the database loses no note and applies none twice")
    func powerCutDuringJournalFold() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try store.add(title: "before", body: "")
        await device.lock()
        try store.add(title: "locked 1", body: "")
        try store.add(title: "locked 2", body: "")
        let summary = try await device.everyPowerCut(maxStates: Self.states(800), seed: 13, during: {
            try await device.unlock()
        }, afterReboot: { rebooted in
            try Self.expect(try await Self.notesAfterReboot(rebooted), in: [["before", "locked 1", "locked 2"]])
        })
        print("notes journal fold: \(summary)")
        #expect(try store.notes().map(\.title) == ["before", "locked 1", "locked 2"])
    }

    @Test("a full disk during a save gives fileWriteOutOfSpace and loses nothing already saved; the store goes on after")
    func fullDisk() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try store.add(title: "saved", body: "before the disk filled")
        let error = await #expect(throws: CocoaError.self) {
            try await device.failingWrites(with: .noSpace) { try store.add(title: "lost", body: "the disk is full") }
        }
        #expect(error?.code == .fileWriteOutOfSpace, "\(String(describing: error))")
        #expect(try store.notes().map(\.title) == ["saved"])
        try store.verifyIntegrity()
        try store.add(title: "after", body: "space again")
        #expect(try store.notes().map(\.title) == ["saved", "after"])
    }

    @Test("a failed fsync during a save is reported, not swallowed, and the save is not acknowledged")
    func failedSynchronize() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try store.add(title: "saved", body: "")
        let error = await #expect(throws: CocoaError.self) {
            try await device.failingSynchronize { try store.add(title: "unsure", body: "fsync failed") }
        }
        #expect((error?.underlying as? POSIXError)?.code == .EIO, "\(String(describing: error))")
        #expect(try store.notes().map(\.title) == ["saved"], "a save whose fsync failed is rolled back")
        try store.verifyIntegrity()
        try store.add(title: "after", body: "")
        #expect(try store.notes().map(\.title) == ["saved", "after"])
    }
}
