import Foundation
import Notes
import ProtectedStore
import ProtectedStoreTesting
import SuiteThreads
import Testing

/// The notes store across lock, unlock, reboot and Inbox delivery, driven by ProtectedStoreTesting.
@Suite("Notes store", .ownThread)
struct NotesStoreTests {
    @Test("notes are stored encrypted, and read, deleted and checked while unlocked")
    func basics() throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        let kept = try store.add(title: "Groceries", body: "oat milk, secret-marker-7f3a")
        let gone = try store.add(title: "Old", body: "remove me")
        try store.delete(id: gone.id)
        #expect(try store.notes() == [kept])
        try store.verifyIntegrity()
        #expect((try device.container.attributesOfItem(atPath: store.databasePath)[.protectionKey] as? FileProtectionType)?.rawValue == FileProtectionType.complete.rawValue)
        // The stored database holds no plaintext.
        let raw = try Data(contentsOf: URL(fileURLWithPath: try device.container.storedPath(store.databasePath)))
        #expect(raw.range(of: Data("secret-marker-7f3a".utf8)) == nil)
        #expect(raw.range(of: Data("SQLite format 3".utf8)) == nil)
    }

    @Test("the database closes on will-become-unavailable, reads fail while locked, and it reopens on did-become-available")
    func closesAndReopens() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try store.add(title: "a", body: "b")
        #expect(store.isDatabaseOpen)
        await device.lock()
        #expect(!store.isDatabaseOpen)
        let error = #expect(throws: CocoaError.self) { try store.notes() }
        #expect(error?.code == .fileReadNoPermission)
        #expect((error?.underlying as? POSIXError)?.code == .EPERM)
        #expect(error?.isProtectedDataUnavailable == true)
        try await device.unlock()
        #expect(store.isDatabaseOpen)
        #expect(try store.notes().map(\.title) == ["a"])
    }

    @Test("writes while locked go to the class B journal and are folded in exactly once after unlock", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func writesWhileLocked(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        let store = try NotesStore(container: device.container)
        let early = try store.add(title: "before", body: "written unlocked")
        let doomed = try store.add(title: "doomed", body: "deleted while locked")
        let written = try await device.whileLocked {
            let notes = try (1...5).map { try store.add(title: "locked \($0)", body: "written while locked \($0)") }
            try store.delete(id: doomed.id)
            #expect(try store.pendingChangeCount() == 6)
            for entry in try device.container.contentsOfDirectory(atPath: "Library/Application Support/\(TestDevice.defaultBundleIdentifier)/Pending") {
                #expect(entry.protection?.rawValue == FileProtectionType.completeUnlessOpen.rawValue)
            }
            return notes
        }
        #expect(try store.pendingChangeCount() == 0)
        #expect(try store.notes() == [early] + written)
        try store.verifyIntegrity()
    }

    @Test("a lock in the middle of a transaction waits for it: the transaction commits, then the database closes")
    func lockWaitsForTransaction() async throws {
        // A grace period no stall of a loaded machine outlasts: the lock must end because the store is done, and a
        // 10 s grace ended by a stalled test thread would discard the keys under the transaction.
        let device = try TestDevice(gracePeriod: 600)
        let recorder = device.recordEvents(openURLs: false)
        let store = try NotesStore(container: device.container)
        let gate = Gate()
        let writer = transactionHeld(at: gate, in: store) { recorder.mark("transaction returned") }
        await gate.arrival()
        let locking = Task(executorPreference: ThreadPerJobExecutor.shared) { await device.lock() }
        try await recorder.waitUntil { $0.contains(.willBecomeUnavailable) }
        try await Task.sleep(nanoseconds: 300_000_000)
        // The store is still in its transaction, so it has not said it is done: the keys are still there.
        #expect(device.device.state == .locking)
        gate.release()
        await locking.value
        try await writer.finished()
        #expect(device.device.state == .locked)
        try recorder.expectOrder(.willBecomeUnavailable, .mark("transaction returned"))
        // Committed to the database before it closed, not journaled.
        #expect(try store.pendingChangeCount() == 0)
        try await device.unlock()
        #expect(try store.notes().map(\.title) == ["first", "second"])
    }

    @Test("a lock that takes the keys in the middle of a transaction loses nothing: the changes go to the journal")
    func keysTakenMidTransaction() async throws {
        let device = try TestDevice(gracePeriod: 0.2)
        let store = try NotesStore(container: device.container)
        let before = try store.add(title: "before", body: "0")
        let gate = Gate()
        let writer = transactionHeld(at: gate, in: store)
        await gate.arrival()
        let locking = Task(executorPreference: ThreadPerJobExecutor.shared) { await device.lock() }
        // The grace period ends while the store is still in its transaction: the keys are discarded under it. The
        // wait is long because this task, and the one locking, may not get a thread for a while on a loaded machine.
        let deadline = Date().addingTimeInterval(300)
        while device.device.state != .locked && Date() < deadline { try await Task.sleep(nanoseconds: 5_000_000) }
        #expect(device.device.state == .locked)
        gate.release()
        try await writer.finished()
        await locking.value
        #expect(try store.pendingChangeCount() == 1)
        try await device.unlock()
        #expect(try store.notes().map(\.title) == ["before", "first", "second"])
        #expect(try store.notes().first == before)
        try store.verifyIntegrity()
    }

    @Test("after a reboot the store starts before first unlock, accepts writes, and folds everything in at the first unlock")
    func rebootBeforeFirstUnlock() async throws {
        let device = try TestDevice()
        var beforeReboot: NotesStore? = try NotesStore(container: device.container)
        try beforeReboot?.add(title: "unlocked", body: "1")
        await device.lock()
        try beforeReboot?.add(title: "locked", body: "2")
        try device.reboot()
        #expect(device.device.state == .beforeFirstUnlock)
        // The app died with the device, and is launched again before the user has unlocked once.
        beforeReboot = nil
        let store = try NotesStore(container: device.container)
        #expect(!store.isDatabaseOpen)
        #expect(throws: CocoaError.self) { try store.notes() }
        try store.add(title: "before first unlock", body: "3")
        #expect(try store.pendingChangeCount() == 2)
        try await device.unlock()
        #expect(try store.notes().map(\.title) == ["unlocked", "locked", "before first unlock"])
        #expect(try store.pendingChangeCount() == 0)
        try store.verifyIntegrity()
    }

    @Test("an Inbox item delivered while locked is imported after the unlock, after did-become-available", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func inboxWhileLocked(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        let recorder = device.recordEvents()
        let store = try NotesStore(container: device.container)
        await device.lock()
        let path = try await device.deliverToInbox(Data("Agenda: budget".utf8), name: "meeting.txt", sourceApplication: "com.example.mail")
        #expect(path == "Documents/Inbox/meeting.txt")
        try recorder.expectEvents([.willBecomeUnavailable])
        #expect(try device.container.contentsOfDirectory(atPath: "Documents/Inbox").map(\.name) == ["meeting.txt"])
        try await device.unlock()
        try recorder.expectEvents([.willBecomeUnavailable, .didBecomeAvailable, .openURL("Documents/Inbox/meeting.txt")])
        let notes = try store.notes()
        #expect(notes.map(\.title) == ["meeting"])
        #expect(notes.first?.body == "Agenda: budget")
        #expect(notes.first?.importedFrom == "meeting.txt")
        // Moved out of the Inbox, and the staging folder is empty again.
        #expect(try device.container.contentsOfDirectory(atPath: "Documents/Inbox").isEmpty)
        #expect(try device.container.contentsOfDirectory(atPath: "Library/Application Support/\(TestDevice.defaultBundleIdentifier)/Imported").isEmpty)
    }

    @Test("a journal torn by a crash before SQLite synced it is ignored, as on a plain file system")
    func tornJournal() throws {
        let device = try TestDevice()
        var store = try NotesStore(container: device.container)
        let note = try store.add(title: "kept", body: "1")
        store.close()
        let journal = "\(store.databasePath)-journal"
        // Two blocks of non-zero bytes, the first of which (the journal header) fails authentication.
        try device.container.write(Data(repeating: 0xD9, count: 8192), toPath: journal)
        let raw = URL(fileURLWithPath: try device.container.storedPath(journal))
        var bytes = try Data(contentsOf: raw)
        // Block 0 starts after the header's and the length record's sectors (FORMAT.md §4.3), whatever the cipher.
        bytes[1024 + 100] ^= 0x01
        try bytes.write(to: raw)
        store = try NotesStore(container: device.container)
        #expect(try store.notes() == [note])
        try store.verifyIntegrity()
    }

    @Test("a second store on the same database is refused until the first is closed")
    func oneStorePerDatabase() throws {
        let device = try TestDevice()
        let first = try NotesStore(container: device.container)
        let error = #expect(throws: NotesStoreError.self) { try NotesStore(container: device.container) }
        #expect(error?.problem.contains("another NotesStore") == true)
        first.close()
        #expect(throws: NotesStoreError.self) { try first.notes() }
        _ = try NotesStore(container: device.container)
    }

    @Test("an Inbox item delivered while unlocked is imported at once; one that is not text is set aside, not lost")
    func inboxWhileUnlocked() async throws {
        let device = try TestDevice()
        let store = try NotesStore(container: device.container)
        try await device.deliverToInbox(Data("hello".utf8), name: "hello.txt")
        try await device.deliverToInbox(Data([0xFF, 0xFE, 0x00, 0xC3]), name: "binary.bin")
        #expect(try store.notes().map(\.title) == ["hello"])
        let folder = "Library/Application Support/\(TestDevice.defaultBundleIdentifier)/Unreadable"
        let setAside = try device.container.contentsOfDirectory(atPath: folder)
        #expect(setAside.count == 1)
        #expect(try device.container.contentsOfDirectory(atPath: "\(folder)/\(setAside[0].name)").map(\.name) == ["binary.bin"])
    }

    @Test("a crash after folding a journal entry but before removing it replays the entry without duplicating notes")
    func replayAfterCrash() async throws {
        let device = try TestDevice()
        var store = try NotesStore(container: device.container)
        let pending = "Library/Application Support/\(TestDevice.defaultBundleIdentifier)/Pending"
        await device.lock()
        try store.add(title: "once", body: "only once")
        let entry = try #require(try device.container.contentsOfDirectory(atPath: pending).first { $0.name.hasSuffix(".json") })
        let stored = try device.container.storedPath("\(pending)/\(entry.name)")
        let saved = try Data(contentsOf: URL(fileURLWithPath: stored))
        try await device.unlock()
        #expect(try store.pendingChangeCount() == 0)
        // What a crash between the commit and the removal leaves on disk: the entry, still there.
        try saved.write(to: URL(fileURLWithPath: stored))
        store.close()
        store = try NotesStore(container: device.container)
        #expect(try store.notes().map(\.body) == ["only once"])
        #expect(try store.pendingChangeCount() == 0)
    }

    /// 16,000 notes in all, at least 4,000 of them while locked: more than the writers that ran until the cycles
    /// ended wrote on this project's machine (13,663; docs/PERFORMANCE.md).
    static let notesPerWriterAndCycle = 4

    @Test("1000 lock/unlock cycles with 4 concurrent writers: every accepted note is present exactly once")
    func thousandCycles() async throws {
        let device = try TestDevice()
        let recorder = device.recordEvents(openURLs: false)
        let store = try NotesStore(container: device.container)
        let accepted = AcceptedNotes()
        // Under the sanitizers (make verify) a cycle costs far more: a hundredth of the cycles, the same checks.
        let cycles = runsUnderSanitizer ? 10 : 1000
        // A count of notes per writer and cycle, not writers running until the cycles end: those wrote more on a slower
        // machine, and each note written while locked lengthens that cycle's fold, so the test fed itself.
        let writerCount = 4
        let rounds = Rounds(workers: writerCount)
        let writers = (0..<writerCount).map { writer in
            Writer {
                try rounds.work(worker: writer) { count in
                    let body = "writer \(writer) note \(count)"
                    try store.add(title: "w\(writer)", body: body)
                    accepted.append(body, whileLocked: !device.device.isProtectedDataAvailable)
                    // A breath between notes, so the two notes of a round meet its lock or unlock at different points.
                    usleep(1_000)
                }
            }
        }
        let started = Date()
        for cycle in 0..<cycles {
            // Notes that meet the lock, one each while locked for certain, then one that meets the unlock.
            rounds.start(steps: 2)
            await device.lock()
            rounds.start(steps: 1)
            await rounds.finished()
            rounds.start(steps: 1)
            // Let the writers meet the locked device now and then, not only the gaps between events.
            if cycle % 10 == 0 { try await Task.sleep(nanoseconds: 2_000_000) }
            try await device.unlock()
            await rounds.finished()
        }
        rounds.close()
        for writer in writers { try await writer.finished() }
        let elapsed = Date().timeIntervalSince(started)
        #expect(rounds.steps == Array(repeating: cycles * Self.notesPerWriterAndCycle, count: writerCount), "every writer wrote every note of every cycle")

        let bodies = try store.notes().map(\.body)
        let counted = Dictionary(bodies.map { ($0, 1) }, uniquingKeysWith: +)
        let (all, locked) = accepted.snapshot
        // One note a writer and cycle is written while the device is locked for certain.
        #expect(locked >= cycles * writerCount && locked < all.count, "notes were written both while locked and while unlocked: \(locked) of \(all.count)")
        #expect(bodies.count == all.count, "stored \(bodies.count) notes for \(all.count) accepted")
        #expect(counted.values.allSatisfy { $0 == 1 }, "duplicated: \(counted.filter { $0.value > 1 }.keys.sorted().prefix(5))")
        #expect(all.allSatisfy { counted[$0] == 1 }, "missing: \(all.filter { counted[$0] == nil }.prefix(5))")
        #expect(try store.pendingChangeCount() == 0)
        try store.verifyIntegrity()
        let expected = (0..<cycles).flatMap { _ in [EventRecorder.Event.willBecomeUnavailable, .didBecomeAvailable] }
        try recorder.expectEvents(expected)
        print(String(format: "%d lock/unlock cycles: %.1f s (%.1f ms per cycle); %d notes accepted by 4 writers, %d of them while locked; all present exactly once",
                     cycles, elapsed, elapsed * 1000 / Double(cycles), all.count, locked))
    }
}

// MARK: Helpers

/// Whether this test binary runs under AddressSanitizer or ThreadSanitizer (`make verify`).
let runsUnderSanitizer = dlsym(nil, "__asan_init") != nil || dlsym(nil, "__tsan_init") != nil

/// A writer thread (not a task: store calls block, and the cooperative pool has one thread per core).
final class Writer: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private var failure: (any Error)?

    init(_ body: @escaping @Sendable () throws -> Void) {
        Thread.detachNewThread { [self] in
            do { try body() } catch { failure = error }
            done.signal()
        }
    }

    /// Waits for the thread, without blocking a thread of the cooperative pool, and rethrows its error.
    func finished() async throws {
        await waitOffPool(done)
        if let failure { throw failure }
    }
}

/// A writer whose transaction adds "first", waits at `gate`, adds "second", then calls `afterwards`.
func transactionHeld(at gate: Gate, in store: NotesStore, afterwards: @escaping @Sendable () -> Void = {}) -> Writer {
    Writer {
        try store.transaction { transaction in
            transaction.add(title: "first", body: "1")
            gate.arrive()
            gate.waitForRelease()
            transaction.add(title: "second", body: "2")
        }
        afterwards()
    }
}

/// Lets a test hold a writer at a point and release it.
final class Gate: @unchecked Sendable {
    private let arrived = DispatchSemaphore(value: 0)
    private let released = DispatchSemaphore(value: 0)

    func arrive() { arrived.signal() }
    func arrival() async { await waitOffPool(arrived) }
    func release() { released.signal() }
    func waitForRelease() { released.wait() }
}

/// Waits for a semaphore on a dispatch thread, so the waiting task holds no thread of its own: a test without the
/// suites' `.ownThread` runs on the cooperative pool, which a blocked thread would starve (the lock the test is
/// waiting for may need it too).
func waitOffPool(_ semaphore: DispatchSemaphore) async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        DispatchQueue.global().async {
            semaphore.wait()
            continuation.resume()
        }
    }
}

final class AcceptedNotes: @unchecked Sendable {
    private let mutex = NSLock()
    private var bodies: [String] = []
    private var locked = 0

    func append(_ body: String, whileLocked: Bool) {
        mutex.withLock {
            bodies.append(body)
            if whileLocked { locked += 1 }
        }
    }

    var snapshot: ([String], Int) { mutex.withLock { (bodies, locked) } }
}
