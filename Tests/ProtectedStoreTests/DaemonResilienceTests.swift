import CSupport
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// A `lock` typed by the device's owner always gets through: past a flood of idle connections, past a lock pending in a
/// long grace period, and without the daemon's log growing with every bad peer (docs/PROTOCOL.md §1, §4).
@Suite("daemon resilience", .ownThread) struct DaemonResilienceTests {
    /// Runs `sandboxctl` and gives up after `timeout` seconds (nil), so a lock that never gets through fails the test
    /// instead of hanging it.
    static func sandboxctl(_ test: TestDevice, _ arguments: [String], stdin: String? = nil, timeout: TimeInterval = 20) throws -> Int32? {
        let process = try SpawnedProcess(CLI.executable, arguments + ["--root", test.root, "--device-secret", test.secretPath])
        if let stdin { process.send(stdin) }
        defer { if process.process.isRunning { process.signal(SIGKILL) } }
        return process.waitForExit(timeout: timeout)
    }

    static func connect(_ socket: String) -> Int32 { ps_unix_connect(socket) }

    @Test("600 idle connections from the owner, the daemon limited to 400 descriptors: unlock, lock and status still answer",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit"), "needs prlimit (util-linux)"))
    func idleFloodNeverKeepsALockOut() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0, descriptorLimit: "400")
        let socket = DaemonInfo.defaultSocketPath(root: test.root)
        let idle = (0..<600).map { _ in Self.connect(socket) }
        defer { idle.filter { $0 >= 0 }.forEach { close($0) } }
        #expect(idle.allSatisfy { $0 >= 0 }, "could not open 600 connections")
        let start = Date()
        #expect(try Self.sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode, timeout: 10) == 0)
        #expect(try Self.sandboxctl(test, ["lock", "--grace", "0"], timeout: 10) == 0)
        #expect(try Self.sandboxctl(test, ["status"], timeout: 10) == 0)
        let elapsed = Date().timeIntervalSince(start)
        print("daemon resilience: unlock, lock --grace 0 and status took \(String(format: "%.2f", elapsed)) s together beside 600 idle connections (daemon limited to 400 descriptors)")

        // A connection that never says hello is closed by the daemon soon after: its read sees the end.
        let silent = Self.connect(socket)
        defer { close(silent) }
        var pollfd = pollfd(fd: silent, events: Int16(POLLIN), revents: 0)
        #expect(poll(&pollfd, 1, 8_000) == 1, "a connection without hello was not closed within 8 s")
        var byte: UInt8 = 0
        #expect(recv(silent, &byte, 1, 0) <= 0, "the daemon sent something to a connection that never said hello")
        #expect(kill(daemon.pid, 0) == 0, "the daemon died: \(daemon.spawned.standardError.suffix(2000))")
    }

    @Test("with a stopped watcher and lock --grace 3600 pending, lock --grace 0 locks now and the pending lock returns too")
    func latestLockWins() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 10)
        #expect(try Self.sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode) == 0)
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        defer { client.powerOff() }
        let subscribers = try #require(try client.daemonStatus()).subscribers
        let watch = try SpawnedProcess(CLI.executable, ["watch", "--root", test.root, "--device-secret", test.secretPath])
        defer {
            watch.signal(SIGCONT)
            watch.signal(SIGTERM)
            _ = watch.waitForExit()
        }
        #expect(eventually { (try? client.daemonStatus()?.subscribers) == subscribers + 1 }, "the watcher did not subscribe")
        watch.signal(SIGSTOP)

        let pending = try SpawnedProcess(CLI.executable, ["lock", "--grace", "3600", "--root", test.root, "--device-secret", test.secretPath])
        defer { if pending.process.isRunning { pending.signal(SIGKILL) } }
        #expect(eventually { (try? client.daemonStatus()?.state) == .locking }, "the first lock did not start")
        let start = Date()
        #expect(try Self.sandboxctl(test, ["lock", "--grace", "0"], timeout: 10) == 0, "lock --grace 0 did not return within 10 s")
        let elapsed = Date().timeIntervalSince(start)
        #expect(try client.daemonStatus()?.state == .locked)
        #expect(pending.waitForExit(timeout: 10) == 0, "the pending lock --grace 3600 did not return once the keys were gone")
        print("daemon resilience: lock --grace 0 returned in \(String(format: "%.2f", elapsed)) s behind a pending lock --grace 3600 and a stopped watcher")
        _ = daemon
    }

    @Test("20,000 connections with one bad frame each: the log grows by less than 256 KiB and status still answers")
    func badFramesDoNotFloodTheLog() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0)
        let socket = DaemonInfo.defaultSocketPath(root: test.root)
        let before = daemon.spawned.standardError.utf8.count
        // A length prefix far beyond the maximum frame: the decoder refuses it at once.
        let badFrame: [UInt8] = [0x7F, 0xFF, 0xFF, 0xFF]
        var sent = 0
        for _ in 0..<20_000 {
            let fd = Self.connect(socket)
            guard fd >= 0 else { continue }
            if badFrame.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == badFrame.count { sent += 1 }
            close(fd)
        }
        #expect(sent == 20_000)
        #expect(try Self.sandboxctl(test, ["status"]) == 0)
        // What the daemon logged about them, once it has read them all (status was answered after them).
        Thread.sleep(forTimeInterval: 1.5)
        let grown = daemon.spawned.standardError.utf8.count - before
        #expect(grown < 256 << 10, "the log grew by \(grown) bytes")
        print("daemon resilience: 20,000 bad frames grew the daemon's log by \(grown) bytes")
    }
}
