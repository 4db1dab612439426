import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreDaemon
import Testing
import SuiteThreads

/// A raw client socket speaking the frame format directly, to send what a well-behaved client never would.
final class RawConnection {
    let fd: Int32

    init(_ path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno)!) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(fd) }

    func sendBytes(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    func send(_ json: String) {
        let message = Array(json.utf8)
        let payload = UInt32(message.count + 2)
        sendBytes(withUnsafeBytes(of: payload.bigEndian) { Array($0) } + withUnsafeBytes(of: UInt16(message.count).bigEndian) { Array($0) } + message)
    }

    /// The next frame's JSON object, or nil at end of stream.
    func receive() -> [String: Any]? {
        let buffer = FrameBuffer()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            if let frame = try? buffer.nextFrame() {
                return (try? JSONSerialization.jsonObject(with: Data(frame.message))) as? [String: Any]
            }
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return nil }
            chunk.withUnsafeBytes { buffer.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        }
    }

    /// True once the daemon has closed the connection (after any frames still pending).
    func isClosedByPeer() -> Bool {
        while let _ = receive() {}
        return true
    }

    func errorCode(of reply: [String: Any]?) -> String? { (reply?["error"] as? [String: Any])?["code"] as? String }
}

/// Records events of every kind an attached device delivers.
final class EventRecorder: ProtectedDataDelegate, @unchecked Sendable {
    private let mutex = NSLock()
    private var recorded: [ProtectedDataEvent] = []
    var events: [ProtectedDataEvent] { mutex.withLock { recorded } }

    func protectedDataWillBecomeUnavailable(_ device: Device) { mutex.withLock { recorded.append(.willBecomeUnavailable) } }
    func protectedDataDidBecomeAvailable(_ device: Device) { mutex.withLock { recorded.append(.didBecomeAvailable) } }
}

@Suite("key daemon protocol", .ownThread)
struct DaemonProtocolTests {
    /// A test device served by a daemon running in this process (its socket is real).
    private func daemon(grace: TimeInterval = 10) throws -> (TestDevice, KeyDaemon) {
        let test = try TestDevice()
        _ = try test.makeContainer()
        return (test, try KeyDaemon.start(root: test.root, deviceSecretPath: test.secretPath, gracePeriod: grace))
    }

    @Test("malformed, oversized, unknown and out-of-order frames close that connection only; the daemon keeps serving")
    func badFrames() throws {
        let (test, daemon) = try daemon()
        defer { daemon.stop() }
        let cases: [(name: String, send: (RawConnection) -> Void, code: String)] = [
            ("oversized length", { $0.sendBytes([0xff, 0xff, 0xff, 0xff, 0, 0]) }, "bad-frame"),
            ("message length past the payload", { $0.sendBytes([0, 0, 0, 4, 0xff, 0xff, 1, 2]) }, "bad-frame"),
            ("not JSON", { $0.send("\u{1}garbage") }, "bad-frame"),
            ("JSON without an op", { $0.send(#"{"id": 1}"#) }, "bad-frame"),
            ("request before hello", { $0.send(#"{"id": 1, "op": "status"}"#) }, "bad-frame"),
            ("unsupported version", { $0.send(#"{"id": 1, "op": "hello", "version": 99}"#) }, "unsupported-version"),
            ("unknown operation", { $0.send(#"{"id": 1, "op": "hello", "version": 1}"#); _ = $0.receive(); $0.send(#"{"id": 2, "op": "format-disk"}"#) }, "unknown-operation"),
            // Echoed whole, a 60 000-character name would not fit the error reply's frame.
            ("huge unknown operation", { $0.send(#"{"id": 1, "op": "hello", "version": 1}"#); _ = $0.receive()
                                         $0.send(#"{"id": 2, "op": ""# + String(repeating: "/", count: 60_000) + #""}"#) }, "unknown-operation"),
            ("ack without a subscription", { $0.send(#"{"id": 1, "op": "hello", "version": 1}"#); _ = $0.receive(); $0.send(#"{"id": 2, "op": "ack", "seq": 1}"#) }, "bad-frame"),
        ]
        for testCase in cases {
            let connection = try RawConnection(daemon.socketPath)
            testCase.send(connection)
            let reply = connection.receive()
            #expect(connection.errorCode(of: reply) == testCase.code, "\(testCase.name): \(String(describing: reply))")
            #expect(connection.isClosedByPeer(), "\(testCase.name)")
        }
        // A client that disconnects in the middle of a frame, then one that sends half a frame and waits.
        try RawConnection(daemon.socketPath).sendBytes([0, 0, 0, 50, 0, 10, 123])
        let stalled = try RawConnection(daemon.socketPath)
        stalled.sendBytes([0, 0])
        let healthy = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        #expect(try healthy.daemonStatus()?.state == .beforeFirstUnlock)
    }

    @Test("wrong passcodes through the daemon are refused, counted and persisted; the right one unlocks")
    func wrongPasscode() throws {
        let (test, daemon) = try daemon()
        defer { daemon.stop() }
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        expectError(.wrongPasscode) { try client.unlock(passcode: try Passcode("nope")) }
        #expect(try client.daemonStatus()?.failedPasscodeAttempts == 1)
        #expect(try test.reopen().failedPasscodeAttempts == 1)
        try client.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(client.state == .unlocked)
        #expect(try client.daemonStatus()?.failedPasscodeAttempts == 0)
    }

    @Test("an attached device delivers events in all three forms, and its files follow the daemon's lock")
    func attachedDeviceEvents() async throws {
        let (test, daemon) = try daemon()
        defer { daemon.stop() }
        let center = NotificationCenter()
        let client = try Device.attach(root: test.root, notificationCenter: center)
        let recorder = EventRecorder()
        client.addDelegate(recorder)
        let notified = EventRecorder()
        let observers = [
            center.addObserver(forName: Device.protectedDataWillBecomeUnavailableNotification, object: nil, queue: nil) { _ in notified.protectedDataWillBecomeUnavailable(client) },
            center.addObserver(forName: Device.protectedDataDidBecomeAvailableNotification, object: nil, queue: nil) { _ in notified.protectedDataDidBecomeAvailable(client) },
        ]
        defer { observers.forEach(center.removeObserver) }
        let sequence = client.protectedDataEvents()

        try client.unlock(passcode: try Passcode(TestDevice.passcode))
        let container = try client.container(bundleIdentifier: TestDevice.bundleIdentifier)
        try container.write(Data("a".utf8), toPath: "Documents/a", options: .completeFileProtection)
        try container.write(Data("c".utf8), toPath: "Documents/c", options: .completeFileProtectionUntilFirstUserAuthentication)
        try container.write(Data("b".utf8), toPath: "Documents/b", options: .completeFileProtectionUnlessOpen)
        let handle = try container.fileHandle(forReadingAtPath: "Documents/a")
        // The other process (the daemon's own device) reads what this one wrote: the daemon wrapped the keys.
        #expect(try daemon.device.container(bundleIdentifier: TestDevice.bundleIdentifier).contents(atPath: "Documents/a") == Data("a".utf8))

        var iterator = sequence.makeAsyncIterator()
        #expect(await iterator.next() == .didBecomeAvailable)
        // The lock ends when this subscriber asks for its next event; the grace period only bounds a failure, and is
        // long so that a test thread stalled on a loaded machine cannot end it before the check below.
        let locking = Task(executorPreference: ThreadPerJobExecutor.shared) { await client.lock(gracePeriod: 600) }
        #expect(await iterator.next() == .willBecomeUnavailable)
        // Still within the grace period: this subscriber has not acknowledged yet.
        #expect(daemon.device.state == .locking)
        #expect(client.isProtectedDataAvailable)
        let pending = Task(executorPreference: ThreadPerJobExecutor.shared) { await iterator.next() }
        await locking.value
        #expect(client.state == .locked)
        #expect(!client.isProtectedDataAvailable)
        expectDenied(writing: false) { try handle.read(upToCount: 1, atOffset: 0) }
        expectDenied(writing: false) { try container.contents(atPath: "Documents/a") }
        #expect(try container.contents(atPath: "Documents/c") == Data("c".utf8))
        try container.write(Data("b2".utf8), toPath: "Documents/b2", options: .completeFileProtectionUnlessOpen)
        expectDenied(writing: false) { try container.contents(atPath: "Documents/b2") }

        try client.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(await pending.value == .didBecomeAvailable)
        let expected: [ProtectedDataEvent] = [.didBecomeAvailable, .willBecomeUnavailable, .didBecomeAvailable]
        #expect(eventually { recorder.events == expected && notified.events == expected })
        #expect(try container.contents(atPath: "Documents/b2") == Data("b2".utf8))
    }

    @Test("new files' keys are sealed in batches, the next one ahead of need; the batch is zeroed at the lock, so no class A file is created while locked")
    func prewrappedKeys() async throws {
        let (test, daemon) = try daemon()
        defer { daemon.stop() }
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        try client.unlock(passcode: try Passcode(TestDevice.passcode))
        let container = try client.container(bundleIdentifier: TestDevice.bundleIdentifier)
        let pool = try #require((client.holder as? DaemonKeyHolder)?.prewrapped)
        let count = PrewrappedFileKeys.batchSize + 3
        let half = PrewrappedFileKeys.batchSize / 2
        for index in 0..<half {
            try container.write(Data("a\(index)".utf8), toPath: "Documents/a\(index)", options: .completeFileProtection)
        }
        // Half a batch handed out: the next one is sealed in the background, before any create needs it.
        #expect(eventually { pool.batchesFetched == 2 })
        for index in half..<count {
            try container.write(Data("a\(index)".utf8), toPath: "Documents/a\(index)", options: .completeFileProtection)
        }
        // One round trip per batch; every key went to its own file and opens in another process.
        #expect(pool.batchesFetched == 2)
        let daemonSide = try daemon.device.container(bundleIdentifier: TestDevice.bundleIdentifier)
        for index in 0..<count {
            #expect(try daemonSide.contents(atPath: "Documents/a\(index)") == Data("a\(index)".utf8))
        }
        let fileIDs = try (0..<count).map { try EncryptedFile.header(at: FileLocation(path: container.storedPath("Documents/a\($0)"))).fileID }
        #expect(Set(fileIDs).count == count)
        // A class C file takes a batch of its own: a key is only ever sealed for the header it goes into.
        try container.write(Data("c".utf8), toPath: "Documents/c", options: .completeFileProtectionUntilFirstUserAuthentication)
        #expect(pool.batchesFetched == 3)

        // 29 class A keys were left in the batch; the lock zeroes them, and a create then fails as iOS's does.
        await client.lock(gracePeriod: 600)
        #expect(client.state == .locked)
        expectDenied(writing: true) { try container.write(Data("x".utf8), toPath: "Documents/locked", options: .completeFileProtection) }
        #expect(!FileManager.default.fileExists(atPath: try container.storedPath("Documents/locked")))
        try container.write(Data("b".utf8), toPath: "Documents/b", options: .completeFileProtectionUnlessOpen)
        try client.unlock(passcode: try Passcode(TestDevice.passcode))
        try container.write(Data("again".utf8), toPath: "Documents/again", options: .completeFileProtection)
        #expect(pool.batchesFetched == 4, "a fresh batch after the unlock, none kept across the lock")
        #expect(try daemonSide.contents(atPath: "Documents/again") == Data("again".utf8))
        // A daemon that does not list wrap-batch in its hello (an earlier release) gets one wrap per file.
        pool.daemonChanged(sealsBatches: false)
        try container.write(Data("one".utf8), toPath: "Documents/one", options: .completeFileProtection)
        #expect(pool.batchesFetched == 4)
        #expect(try daemonSide.contents(atPath: "Documents/one") == Data("one".utf8))
    }

    @Test("wrap-batch refuses class B, more than 64 keys, and lists that do not match the keys sent")
    func wrapBatchBadInput() throws {
        let (test, daemon) = try daemon()
        defer { daemon.stop() }
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        try client.unlock(passcode: try Passcode(TestDevice.passcode))
        let link = try #require((client.holder as? DaemonKeyHolder)?.link)
        let prefix = [UInt8](repeating: 1, count: 80)
        for (protectionClass, keys, prefixes) in [(ProtectionClass.completeUnlessOpen, 1, 1), (.complete, 65, 65), (.complete, 2, 3), (.complete, 0, 0)] {
            let attachment = SecureBytes.random(count: max(1, keys) * FileHeader.fileKeyBytes)
            let error = expectError(.invalidArgument) {
                try link.wrapFileKeys(attachment, for: protectionClass, associatedData: Array(repeating: prefix, count: prefixes))
            }
            #expect(error?.problem.contains("wrap-batch needs") == true, "\(protectionClass) \(keys) \(prefixes)")
        }
        #expect(try link.wrapFileKeys(SecureBytes.random(count: 2 * FileHeader.fileKeyBytes), for: .complete, associatedData: [prefix, prefix]).count == 2)
    }

    @Test("100 concurrent subscribers are all told before the keys go")
    func hundredSubscribers() async throws {
        let (test, daemon) = try daemon(grace: 30)
        defer { daemon.stop() }
        let recorders = (0..<100).map { _ in EventRecorder() }
        let clients = try recorders.map { recorder in
            let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
            client.addDelegate(recorder)
            return client
        }
        #expect(try clients[0].daemonStatus()?.subscribers == 100)
        try clients[0].unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(eventually { recorders.allSatisfy { $0.events == [.didBecomeAvailable] } })
        // With an hour's grace, the keys go within two minutes only if every subscriber acknowledged: a check of the
        // acknowledgements that does not depend on how fast this machine is (the suite shares it, sanitizers slow it).
        let lock = Task(executorPreference: ThreadPerJobExecutor.shared) { await clients[1].lock(gracePeriod: 3600) }
        var locked = false
        for _ in 0..<1200 where !locked {
            // Polled with Task.sleep: this test must not hold one of the few threads Swift's concurrency runs on.
            try await Task.sleep(for: .milliseconds(100))
            locked = (try? clients[0].daemonStatus()?.state) == .locked
        }
        #expect(locked, "the lock waited on: not every subscriber acknowledged")
        if !locked { try clients[0].unlock(passcode: try Passcode(TestDevice.passcode)) }
        await lock.value
        #expect(recorders.allSatisfy { $0.events == [.didBecomeAvailable, .willBecomeUnavailable] })
        #expect(clients.allSatisfy { $0.state == .locked })
    }

    @Test("an erase policy applies through the daemon: the device is erased and the daemon stops")
    func erasePolicyThroughDaemon() throws {
        let test = try TestDevice(policy: PasscodePolicy(freeAttempts: 10, delays: [0], eraseAfterFailedAttempts: 2))
        let daemon = try KeyDaemon.start(root: test.root, deviceSecretPath: test.secretPath)
        defer { daemon.stop() }
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        expectError(.wrongPasscode) { try client.unlock(passcode: try Passcode("wrong")) }
        expectError(.wrongPasscode) { try client.unlock(passcode: try Passcode("wrong")) }
        #expect(!FileManager.default.fileExists(atPath: test.secretPath))
        #expect(!FileManager.default.fileExists(atPath: (test.root as NSString).appendingPathComponent("keybag")))
        #expect(eventually { !Device.isDaemonRunning(root: test.root) })
        daemon.waitUntilStopped()
    }

    @Test("a second daemon on the same root is refused, and a live socket is never taken over")
    func oneDaemonPerRoot() throws {
        let (test, daemon) = try daemon()
        defer { daemon.stop() }
        let error = expectError(.alreadyExists) { try KeyDaemon.start(root: test.root, deviceSecretPath: test.secretPath) }
        #expect(error?.problem.contains("a key daemon already serves this device (pid \(getpid())") == true)
        let other = try TestDevice()
        let stolen = expectError(.alreadyExists) { try KeyDaemon.start(root: other.root, deviceSecretPath: other.secretPath, socketPath: daemon.socketPath) }
        #expect(stolen?.problem.hasPrefix("another daemon is listening on this socket") == true)
        // The daemon holds the keys: erasing from another process is refused, and nothing is removed.
        expectError(.invalidArgument) { try test.device.erase() }
        #expect(FileManager.default.fileExists(atPath: test.secretPath))
    }
}

@Suite("subscriber coalescing", .ownThread)
struct SubscriberRegistryTests {
    @Test("a subscriber that never acknowledges is sent one event, however many happen; then one per kind for the net change")
    func coalescing() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        registry.add(2, available: true)
        var sentToStopped: [SubscriberRegistry.Delivery] = []
        for round in 0..<10_000 {
            let event: ProtectedDataEvent = round % 2 == 0 ? .willBecomeUnavailable : .didBecomeAvailable
            for delivery in registry.broadcast(event) {
                if delivery.subscriber == 1 { sentToStopped.append(delivery) }
                if delivery.subscriber == 2 { _ = registry.acknowledge(2, seq: delivery.seq) }
            }
        }
        #expect(sentToStopped.map(\.event) == [.protection(.willBecomeUnavailable)])
        // It resumes and acknowledges the will it had: the net change since is one did (the device ended unlocked).
        let resumed = registry.acknowledge(1, seq: sentToStopped[0].seq)
        #expect(resumed.handled == .protection(.willBecomeUnavailable))
        #expect(resumed.next.map(\.event) == [.protection(.didBecomeAvailable)])
        #expect(registry.acknowledge(1, seq: resumed.next[0].seq).next.isEmpty)
    }

    @Test("a lock waits for every subscriber present, also one whose will was held back behind an earlier event")
    func lockAcknowledgement() {
        var registry = SubscriberRegistry()
        registry.add(1, available: false)
        let did = registry.broadcast(.didBecomeAvailable)
        #expect(did.count == 1)
        #expect(registry.broadcast(.willBecomeUnavailable).isEmpty, "held back: the did is not acknowledged yet")
        #expect(!registry.lockAcknowledged)
        let will = registry.acknowledge(1, seq: did[0].seq).next
        #expect(will.map(\.event) == [.protection(.willBecomeUnavailable)])
        #expect(!registry.lockAcknowledged)
        #expect(registry.acknowledge(1, seq: will[0].seq).next.isEmpty)
        #expect(registry.lockAcknowledged)
    }

    @Test("a suspended app's subscriber: did-enter-background first, nothing while suspended, no lock waits for it; on resume will-enter-foreground, then the net change")
    func suspension() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        let background = registry.send(.didEnterBackground, to: [1])
        #expect(background.map(\.event) == [.lifecycle(.didEnterBackground)])
        #expect(registry.acknowledge(1, seq: background[0].seq).handled == .lifecycle(.didEnterBackground))
        registry.setSuspended(1, true)
        #expect(registry.broadcast(.willBecomeUnavailable).isEmpty, "a stopped app is sent nothing")
        #expect(registry.lockAcknowledged, "and no lock waits for it")
        registry.lockCompleted()
        #expect(registry.broadcast(.didBecomeAvailable).isEmpty)
        #expect(registry.broadcast(.willBecomeUnavailable).isEmpty)
        registry.lockCompleted()
        registry.setSuspended(1, false)
        let foreground = registry.send(.willEnterForeground, to: [1])
        #expect(foreground.map(\.event) == [.lifecycle(.willEnterForeground)])
        // It saw did-become-available last; a lock happened and the device is locked now: one will.
        let net = registry.acknowledge(1, seq: foreground[0].seq).next
        #expect(net.map(\.event) == [.protection(.willBecomeUnavailable)])
        #expect(registry.acknowledge(1, seq: net[0].seq).next.isEmpty)
    }

    @Test("a suspended app across a lock and an unlock gets did-become-available alone after will-enter-foreground: one event for the net change")
    func suspendedAcrossLockAndUnlock() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        registry.setSuspended(1, true)
        #expect(registry.broadcast(.willBecomeUnavailable).isEmpty)
        registry.lockCompleted()
        #expect(registry.broadcast(.didBecomeAvailable).isEmpty)
        registry.setSuspended(1, false)
        let foreground = registry.send(.willEnterForeground, to: [1])
        let net = registry.acknowledge(1, seq: foreground[0].seq).next
        #expect(net.map(\.event) == [.protection(.didBecomeAvailable)])
        #expect(registry.acknowledge(1, seq: net[0].seq).next.isEmpty)
    }

    @Test("a lifecycle event for a busy subscriber waits for its acknowledgement and goes before the protection catch-up")
    func lifecycleBehindOutstanding() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        let will = registry.broadcast(.willBecomeUnavailable)
        _ = registry.broadcast(.didBecomeAvailable)
        #expect(registry.send(.willTerminate, to: [1]).isEmpty)
        let next = registry.acknowledge(1, seq: will[0].seq).next
        #expect(next.map(\.event) == [.lifecycle(.willTerminate)])
        #expect(registry.acknowledge(1, seq: next[0].seq).next.map(\.event) == [.protection(.didBecomeAvailable)])
    }

    @Test("after will-enter-foreground: the protection change it missed, then the open-URL event that came meanwhile")
    func openURLAfterCatchUp() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        registry.setSuspended(1, true)
        #expect(registry.broadcast(.willBecomeUnavailable).isEmpty)
        registry.lockCompleted()
        let item = OpenURLPayload(path: "Documents/Inbox/a.txt", sourceApplication: nil, annotation: nil, sequence: 1)
        #expect(registry.send(item, to: [1]).isEmpty, "nothing reaches a suspended app")
        registry.setSuspended(1, false)
        let foreground = registry.send(.willEnterForeground, to: [1])
        let net = registry.acknowledge(1, seq: foreground[0].seq).next
        #expect(net.map(\.event) == [.protection(.willBecomeUnavailable)])
        #expect(registry.acknowledge(1, seq: net[0].seq).next.map(\.event) == [.openURL(item)])
    }

    @Test("a lock does not wait for a subscriber in the middle of a lifecycle event: it was sent nothing")
    func lockSkipsBusyApp() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        registry.add(2, available: true)
        _ = registry.send(.didEnterBackground, to: [1])
        let will = registry.broadcast(.willBecomeUnavailable)
        #expect(will.map(\.subscriber) == [2])
        _ = registry.acknowledge(2, seq: will[0].seq)
        #expect(registry.lockAcknowledged)
    }

    @Test("a subscriber that leaves no longer holds up a lock; stale acknowledgements are ignored")
    func leaving() {
        var registry = SubscriberRegistry()
        registry.add(1, available: true)
        registry.add(2, available: true)
        let deliveries = registry.broadcast(.willBecomeUnavailable)
        #expect(registry.acknowledge(1, seq: 999).next.isEmpty)
        _ = registry.acknowledge(1, seq: deliveries.first { $0.subscriber == 1 }!.seq)
        #expect(!registry.lockAcknowledged)
        registry.remove(2)
        #expect(registry.lockAcknowledged)
    }
}

