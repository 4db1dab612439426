import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// The kit itself: each operation does to the device what it says, in both key holders, and cleans up after itself.
@Suite("ProtectedStoreTesting", .ownThread)
struct TestDeviceTests {
    @Test("lock, unlock and whileLocked drive real data protection and reach observers in order", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func lockAndUnlock(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        #expect(device.device.isAttachedToDaemon == (keyHolder == .daemon))
        let recorder = device.recordEvents()
        let container = device.container
        try container.write(Data("secret".utf8), toPath: "Documents/a.txt")
        #expect(device.device.state == .unlocked)
        await device.lock()
        #expect(device.device.state == .locked)
        #expect(throws: CocoaError.self) { try container.contents(atPath: "Documents/a.txt") }
        try await device.unlock()
        #expect(try container.contents(atPath: "Documents/a.txt") == Data("secret".utf8))
        let inside = try await device.whileLocked {
            recorder.mark("inside")
            return device.device.state
        }
        #expect(inside == .locked)
        #expect(device.device.state == .unlocked)
        try recorder.expectEvents([.willBecomeUnavailable, .didBecomeAvailable, .willBecomeUnavailable, .mark("inside"), .didBecomeAvailable])
    }

    @Test("whileLocked unlocks again when its body throws")
    func whileLockedThrows() async throws {
        let device = try TestDevice()
        struct Expected: Error {}
        await #expect(throws: Expected.self) { try await device.whileLocked { throw Expected() } }
        #expect(device.device.state == .unlocked)
    }

    @Test("reboot brings the device back before first unlock with new objects; recorders follow", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func reboot(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        let recorder = device.recordEvents()
        let oldContainer = device.container
        try oldContainer.write(Data("kept".utf8), toPath: "Documents/a.txt")
        let handle = try oldContainer.fileHandle(forReadingAtPath: "Documents/a.txt")
        try device.reboot()
        // Like a power cut: nobody was told, and every key in memory is gone.
        try recorder.expectEvents([])
        #expect(throws: CocoaError.self) { try handle.read(upToCount: 4, atOffset: 0) }
        #expect(device.device.state == .beforeFirstUnlock)
        #expect(device.container !== oldContainer)
        #expect(throws: CocoaError.self) { try device.container.contents(atPath: "Documents/a.txt") }
        try await device.unlock()
        #expect(try device.container.contents(atPath: "Documents/a.txt") == Data("kept".utf8))
        try recorder.expectEvents([.didBecomeAvailable])
    }

    @Test("deliverToInbox: unlocked the event is handled when it returns; locked it waits for the unlock, after did-become-available", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func inbox(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        let recorder = device.recordEvents()
        let first = try await device.deliverToInbox(Data("one".utf8), name: "doc.txt", sourceApplication: "com.example.sender")
        #expect(first == "Documents/Inbox/doc.txt")
        try recorder.expectEvents([.openURL("Documents/Inbox/doc.txt")])
        await device.lock()
        let second = try await device.deliverToInbox(Data("two".utf8), name: "doc.txt")
        #expect(second == "Documents/Inbox/doc-1.txt")
        try recorder.expectEvents([.openURL("Documents/Inbox/doc.txt"), .willBecomeUnavailable])
        try await device.unlock()
        try recorder.expectEvents([.openURL("Documents/Inbox/doc.txt"), .willBecomeUnavailable, .didBecomeAvailable, .openURL("Documents/Inbox/doc-1.txt")])
        #expect(try device.container.contents(atPath: second) == Data("two".utf8))
    }

    @Test("recordEvents(openURLs: false) leaves open-URL events to the code under test")
    func recorderWithoutOpenURLs() async throws {
        let device = try TestDevice()
        let recorder = device.recordEvents(openURLs: false)
        try await device.deliverToInbox(Data("x".utf8), name: "x.txt")
        try recorder.expectEvents([])
        #expect(try device.container.inboxItems().map(\.state) == [.pendingEvent])
    }

    @Test("expectations fail with what was expected and what was recorded")
    func expectationFailures() throws {
        let device = try TestDevice()
        let recorder = device.recordEvents()
        recorder.mark("a")
        recorder.mark("b")
        try recorder.expectOrder(.mark("a"), .mark("b"))
        let order = #expect(throws: EventExpectationFailure.self) { try recorder.expectOrder(.mark("b"), .mark("a")) }
        #expect(order?.problem.contains("mark \"a\" is missing") == true, "\(order.map(String.init(describing:)) ?? "")")
        let exact = #expect(throws: EventExpectationFailure.self) { try recorder.expectEvents([.mark("a")]) }
        #expect(exact?.description.contains("recorded [mark \"a\", mark \"b\"]") == true)
        #expect(exact?.location.contains("TestDeviceTests.swift") == true)
        recorder.reset()
        try recorder.expectEvents([])
    }

    @Test("the temporary folder is removed when the device is released, the daemon's socket with it", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func cleanup(keyHolder: TestDevice.KeyHolder) throws {
        var device: TestDevice? = try TestDevice(keyHolder: keyHolder)
        let directory = device!.directory
        #expect(FileManager.default.fileExists(atPath: directory))
        #expect(Device.isDaemonRunning(root: device!.root) == (keyHolder == .daemon))
        device = nil
        #expect(!FileManager.default.fileExists(atPath: directory))
    }

    @Test("lock() with a grace period discards the keys under an observer that does not finish")
    func gracePeriod() async throws {
        let device = try TestDevice(gracePeriod: 0.1)
        let slow = SlowObserver()
        device.device.addDelegate(slow)
        await device.lock()
        // The keys went while the observer was still in its callback; lock() returned only after it was done.
        #expect(slow.sawKeysDiscarded)
    }
}

/// Stays in *will become unavailable* until the keys are gone (at most 120 s: a loaded machine under a sanitizer can
/// be that slow) and notes whether they went meanwhile.
final class SlowObserver: ProtectedDataDelegate, @unchecked Sendable {
    private let mutex = NSLock()
    private var discarded = false
    var sawKeysDiscarded: Bool { mutex.withLock { discarded } }

    func protectedDataWillBecomeUnavailable(_ device: Device) {
        let deadline = Date().addingTimeInterval(120)
        while device.state != .locked && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        let state = device.state
        mutex.withLock { discarded = state == .locked }
    }

    func protectedDataDidBecomeAvailable(_ device: Device) {}
}
