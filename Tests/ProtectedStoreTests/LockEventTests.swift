import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// What one observer saw: each event, and whether class A's key was still (or already) usable at that moment.
final class ObservationLog: @unchecked Sendable {
    struct Entry: Equatable {
        var observer: String
        var event: ProtectedDataEvent
        var classAUsable: Bool
    }

    private let mutex = NSLock()
    private var recorded: [Entry] = []

    func record(_ observer: String, _ event: ProtectedDataEvent, device: Device) {
        let usable = (try? device.classKey(for: .complete)) != nil
        mutex.withLock { recorded.append(Entry(observer: observer, event: event, classAUsable: usable)) }
    }

    var entries: [Entry] { mutex.withLock { recorded } }
    func events(of observer: String) -> [ProtectedDataEvent] { entries.filter { $0.observer == observer }.map(\.event) }
}

final class RecordingDelegate: ProtectedDataDelegate, @unchecked Sendable {
    let name: String
    let log: ObservationLog
    let workDuration: TimeInterval
    private let mutex = NSLock()
    private var recordedState: Device.State?
    /// The state seen when the will-become-unavailable handler finished its work. Under the mutex: the handler runs on
    /// the delegate's queue, and nothing else orders its write before the test's read (a lock can end by its grace timer).
    var stateAfterWork: Device.State? { mutex.withLock { recordedState } }

    init(_ name: String, log: ObservationLog, workDuration: TimeInterval = 0) {
        self.name = name
        self.log = log
        self.workDuration = workDuration
    }

    func protectedDataWillBecomeUnavailable(_ device: Device) {
        log.record(name, .willBecomeUnavailable, device: device)
        if workDuration > 0 { Thread.sleep(forTimeInterval: workDuration) }
        let state = device.state
        mutex.withLock { recordedState = state }
    }

    func protectedDataDidBecomeAvailable(_ device: Device) { log.record(name, .didBecomeAvailable, device: device) }
}

@Suite("lock state machine and events", .ownThread)
struct LockEventTests {
    @Test("every observer of all three kinds gets will-become-unavailable before any key goes, and did-become-available after all are back")
    func ordering() async throws {
        let test = try TestDevice()
        let device = test.device
        let log = ObservationLog()
        let quick = RecordingDelegate("delegate-quick", log: log)
        let slow = RecordingDelegate("delegate-slow", log: log, workDuration: 0.3)
        device.addDelegate(quick)
        device.addDelegate(slow)
        let observers = ["notification-1", "notification-2"].flatMap { name in
            [Device.protectedDataWillBecomeUnavailableNotification, Device.protectedDataDidBecomeAvailableNotification].map { notificationName in
                device.notificationCenter.addObserver(forName: notificationName, object: device, queue: nil) { note in
                    log.record(name, note.name == Device.protectedDataWillBecomeUnavailableNotification ? .willBecomeUnavailable : .didBecomeAvailable, device: device)
                }
            }
        }
        defer { observers.forEach(device.notificationCenter.removeObserver) }
        let stream = device.protectedDataEvents()
        let streamTask = Task(executorPreference: ThreadPerJobExecutor.shared) {
            var seen = 0
            for await event in stream {
                log.record("stream", event, device: device)
                seen += 1
                if seen == 2 { break }
            }
        }
        // Takes the first event, then never asks for another: it never says it is done.
        let silent = device.protectedDataEvents()
        let silentTask = Task(executorPreference: ThreadPerJobExecutor.shared) {
            var iterator = silent.makeAsyncIterator()
            if let event = await iterator.next() { log.record("silent", event, device: device) }
            while !Task.isCancelled { try? await Task.sleep(nanoseconds: 10_000_000) }
            _ = iterator
        }

        let grace: TimeInterval = 1.5
        let started = Date()
        await device.lock(gracePeriod: grace)
        let elapsed = Date().timeIntervalSince(started)
        #expect(device.state == .locked)
        #expect(elapsed >= grace, "the silent observer never signals, so the keys went only when the grace period ended")
        #expect(slow.stateAfterWork == .locking, "a slow observer finishing within the grace period still had its keys")
        expectError(.protectedDataUnavailable) { try device.classKey(for: .complete) }

        try device.unlock(passcode: try Passcode(TestDevice.passcode))
        await streamTask.value
        try await Task.sleep(nanoseconds: 200_000_000)
        silentTask.cancel()
        await silentTask.value

        for observer in ["delegate-quick", "delegate-slow", "notification-1", "notification-2", "stream"] {
            #expect(log.events(of: observer) == [.willBecomeUnavailable, .didBecomeAvailable], "\(observer)")
        }
        #expect(log.events(of: "silent") == [.willBecomeUnavailable])
        // Delegates and notifications run before the lock goes on; a stream's event is queued before the keys go,
        // but its consumer may be scheduled later on a loaded machine, so only the order is checked for streams.
        for entry in log.entries where !["stream", "silent"].contains(entry.observer) {
            #expect(entry.classAUsable, "\(entry.observer) got \(entry.event) while class A's key was gone")
        }
    }

    @Test("the lock proceeds as soon as every observer is done, without waiting for the grace period")
    func earlyCompletion() async throws {
        let test = try TestDevice()
        let device = test.device
        let log = ObservationLog()
        let delegate = RecordingDelegate("delegate", log: log, workDuration: 0.05)
        device.addDelegate(delegate)
        let stream = device.protectedDataEvents()
        let consumer = Task(executorPreference: ThreadPerJobExecutor.shared) { for await event in stream { log.record("stream", event, device: device) } }
        defer { consumer.cancel() }
        let started = Date()
        await device.lock(gracePeriod: 600)
        #expect(Date().timeIntervalSince(started) < 300, "did not wait for the 600 s grace period")
        #expect(device.state == .locked)
        #expect(log.events(of: "delegate") == [.willBecomeUnavailable])
    }

    @Test("an unlock during the grace period cancels the lock: keys kept, did-become-available delivered")
    func unlockDuringGrace() async throws {
        let test = try TestDevice()
        let device = test.device
        let container = try test.makeContainer()
        try container.write(Data("a".utf8), toPath: "Documents/a")
        let handle = try container.fileHandle(forReadingAtPath: "Documents/a")
        let log = ObservationLog()
        let delegate = RecordingDelegate("delegate", log: log)
        device.addDelegate(delegate)
        let silent = device.protectedDataEvents()
        let lockTask = Task(executorPreference: ThreadPerJobExecutor.shared) { await device.lock(gracePeriod: 600) }
        while device.state != .locking { try await Task.sleep(nanoseconds: 1_000_000) }
        #expect(device.isProtectedDataAvailable, "keys stay usable during the grace period")
        try device.unlock(passcode: try Passcode(TestDevice.passcode))
        await lockTask.value
        #expect(device.state == .unlocked)
        #expect(try handle.read(upToCount: 1, atOffset: 0) == Data("a".utf8), "the open class A handle kept its key")
        try await Task.sleep(nanoseconds: 100_000_000)
        #expect(log.events(of: "delegate") == [.willBecomeUnavailable, .didBecomeAvailable])
        _ = silent
    }

    @Test("lock before first unlock or when locked does nothing; a second lock waits for the first")
    func idempotentLock() async throws {
        let test = try TestDevice()
        let rebooted = try test.reopen()
        await rebooted.lock(gracePeriod: 0)
        #expect(rebooted.state == .beforeFirstUnlock)
        let device = test.device
        let silent = device.protectedDataEvents()
        async let first: Void = device.lock(gracePeriod: 0.3)
        while device.state != .locking { try await Task.sleep(nanoseconds: 1_000_000) }
        await device.lock(gracePeriod: 0)
        #expect(device.state == .locked, "the second call returned only once the first lock had finished")
        await first
        await device.lock()
        #expect(device.state == .locked)
        _ = silent
    }

    @Test("open class A handles fail after the lock and stay failed after unlock; class B handles keep working")
    func handlesAcrossLock() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data(pattern(9000)), toPath: "Documents/a", options: .completeFileProtection)
        try container.write(Data(pattern(9000)), toPath: "Documents/b", options: .completeFileProtectionUnlessOpen)
        let a = try container.fileHandle(forUpdatingAtPath: "Documents/a")
        let b = try container.fileHandle(forUpdatingAtPath: "Documents/b")
        await test.device.lock(gracePeriod: 0)
        expectDenied(writing: false) { try a.read(upToCount: 10, atOffset: 0) }
        expectDenied(writing: true) { try a.write(contentsOf: Data([1]), atOffset: 0) }
        try b.write(contentsOf: Data([9, 9]), atOffset: 100)
        #expect(try b.read(upToCount: 2, atOffset: 100) == Data([9, 9]))
        try test.device.unlock(passcode: try Passcode(TestDevice.passcode))
        expectDenied(writing: false) { try a.read(upToCount: 10, atOffset: 0) }
        #expect(try container.contents(atPath: "Documents/a") == Data(pattern(9000)), "reopening after unlock works")
        try a.close()
        try b.close()
    }

    @Test("repeated locks: every observer is entered with the keys still usable, and a quick observer ends the wait early")
    func repeatedLocks() async throws {
        let test = try TestDevice()
        let device = test.device
        let log = ObservationLog()
        let delegates = (0..<4).map { RecordingDelegate("delegate-\($0)", log: log) }
        delegates.forEach(device.addDelegate)
        let observer = device.notificationCenter.addObserver(forName: Device.protectedDataWillBecomeUnavailableNotification, object: device, queue: nil) { _ in
            log.record("notification", .willBecomeUnavailable, device: device)
        }
        defer { device.notificationCenter.removeObserver(observer) }
        for _ in 0..<10 {
            await device.lock(gracePeriod: 5)
            try device.unlock(passcode: try Passcode(TestDevice.passcode))
        }
        // Every will of those locks was handled before its lock returned.
        let withGrace = log.entries.filter { $0.event == .willBecomeUnavailable }
        #expect(withGrace.count == 10 * 5)
        #expect(withGrace.filter { !$0.classAUsable }.isEmpty, "an observer was entered after the keys were gone")
        // With grace 0 the keys may go as soon as each observer has been entered, so only delivery is checked.
        for _ in 0..<10 {
            await device.lock(gracePeriod: 0)
            try device.unlock(passcode: try Passcode(TestDevice.passcode))
        }
        try await Task.sleep(nanoseconds: 100_000_000)
        let wills = log.entries.filter { $0.event == .willBecomeUnavailable }
        #expect(wills.count == 20 * 5, "every observer got every event, grace 0 included")
    }

    @Test("a handle opened before its file became class A loses its key at the lock too")
    func reclassifiedHandle() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data("c".utf8), toPath: "Documents/f", options: .completeFileProtectionUntilFirstUserAuthentication)
        let old = try container.fileHandle(forReadingAtPath: "Documents/f")
        try container.setProtection(.complete, ofItemAtPath: "Documents/f")
        await test.device.lock(gracePeriod: 0)
        expectDenied(writing: false) { try old.read(upToCount: 1, atOffset: 0) }
    }

    @Test("wrong passcodes are throttled, and the throttle survives reopening the device")
    func throttling() throws {
        let policy = PasscodePolicy(freeAttempts: 2, delays: [60, 3600])
        let test = try TestDevice(policy: policy)
        let device = try test.reopen()
        let wrong = try Passcode("nope")
        expectError(.wrongPasscode) { try device.unlock(passcode: wrong) }
        expectError(.wrongPasscode) { try device.unlock(passcode: wrong) }
        let third = expectError(.wrongPasscode) { try device.unlock(passcode: wrong) }
        #expect(third?.problem.contains("next attempt is allowed in 60 s") == true, "\(String(describing: third))")
        let right = try Passcode(TestDevice.passcode)
        let throttled = expectError(.throttled) { try device.unlock(passcode: right) }
        #expect(throttled?.problem.contains("3 wrong passcodes") == true)
        let rebooted = try test.reopen()
        #expect(rebooted.passcodePolicy == policy)
        #expect(rebooted.failedPasscodeAttempts == 3)
        expectError(.throttled) { try rebooted.unlock(passcode: right) }
        // The delay passes: the last failure moved back 61 s in the persisted counter, rather than a test sleeping.
        let counter = (test.root as NSString).appendingPathComponent("passcode-attempts.json")
        let passed = PasscodeAttempts(failedAttempts: 3, lastFailure: Date().timeIntervalSince1970 - 61)
        try Data(JSONEncoder().encode(passed)).write(to: URL(fileURLWithPath: counter))
        try rebooted.unlock(passcode: right)
        #expect(rebooted.state == .unlocked)
        #expect(rebooted.failedPasscodeAttempts == 0, "a right passcode resets the count")
        // Passcode changes count too.
        expectError(.wrongPasscode) { try rebooted.changePasscode(from: wrong, to: right) }
        #expect(try test.reopen().failedPasscodeAttempts == 1)
    }

    @Test("with erase-after-N, the Nth wrong passcode in a row erases the device")
    func eraseAfterFailures() async throws {
        let test = try TestDevice(policy: PasscodePolicy(freeAttempts: 10, delays: [0], eraseAfterFailedAttempts: 3))
        let container = try test.makeContainer()
        try container.write(Data("x".utf8), toPath: "Documents/x", options: .noFileProtection)
        let device = try test.reopen()
        let wrong = try Passcode("nope")
        expectError(.wrongPasscode) { try device.unlock(passcode: wrong) }
        let second = expectError(.wrongPasscode) { try device.unlock(passcode: wrong) }
        #expect(second?.problem.contains("erased after 3") == true)
        let last = expectError(.wrongPasscode) { try device.unlock(passcode: wrong) }
        #expect(last?.problem.contains("has been erased") == true)
        #expect(!FileManager.default.fileExists(atPath: test.secretPath))
        #expect(try FileManager.default.contentsOfDirectory(atPath: test.root).isEmpty)
        expectError(.notFound) { try test.reopen() }
    }

    @Test("the default policy is off for erasing and matches iOS's delays")
    func defaultPolicy() {
        let policy = PasscodePolicy.default
        #expect(policy.eraseAfterFailedAttempts == nil)
        #expect((1...4).map(policy.delay(afterFailures:)) == [0, 0, 0, 0])
        #expect((5...10).map(policy.delay(afterFailures:)) == [60, 300, 900, 900, 3600, 3600])
    }
}
