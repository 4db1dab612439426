import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreDaemon
import Testing
import SuiteThreads

/// The daemon as users run it: `sandboxctl daemon` and client programs, each a real process.
@Suite("key daemon across processes", .ownThread, .serialized)
struct DaemonProcessTests {
    static let filePath = "Documents/secret.txt"

    /// A device with one class A file, its in-process holder released, and a daemon serving it.
    private func deviceWithDaemon(grace: Double = 30) throws -> (TestDevice, DaemonProcess) {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data("top secret".utf8), toPath: Self.filePath)
        return (test, try DaemonProcess(test, grace: grace))
    }

    private func unlock(_ test: TestDevice) throws {
        let unlocked = try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode + "\n")
        #expect(unlocked.status == 0, "\(unlocked.stderr)")
    }

    private func startProbe(_ test: TestDevice) throws -> SpawnedProcess {
        let probe = try SpawnedProcess(SpawnedProcess.builtExecutable("ProtectedStoreProbe"), [test.root, TestDevice.bundleIdentifier, Self.filePath])
        #expect(probe.nextJSON()?["kind"] == "ready", "\(probe.standardError)")
        return probe
    }

    @Test("sandboxctl lock: two client processes get 'will become unavailable' before the keys go, then class A reads fail; unlock brings them back")
    func lockReachesEveryProcess() throws {
        let (test, daemon) = try deviceWithDaemon()
        try unlock(test)
        let probes = try [startProbe(test), startProbe(test)]
        for probe in probes {
            probe.send("read")
            #expect(probe.nextJSON() == ["kind": "read", "handle": "ok", "fresh": "ok"])
        }

        let locked = try sandboxctl(test, ["lock"])
        #expect(locked.status == 0, "\(locked.stderr)")
        #expect(locked.stdout.contains("state locked"), "\(locked.stdout)")
        for probe in probes {
            // Asked from inside the delegate: the daemon was still in its grace period, keys not yet discarded.
            #expect(probe.nextJSON() == ["kind": "event", "event": "willBecomeUnavailable", "daemonState": "locking"])
            probe.send("read")
            #expect(probe.nextJSON() == ["kind": "read", "handle": "denied", "fresh": "denied"])
        }

        try unlock(test)
        for probe in probes {
            #expect(probe.nextJSON() == ["kind": "event", "event": "didBecomeAvailable", "daemonState": "unlocked"])
            probe.send("read")
            // As in-process: a handle whose key the lock zeroed stays dead; opening the file again works.
            #expect(probe.nextJSON() == ["kind": "read", "handle": "denied", "fresh": "ok"])
            probe.send("exit")
            #expect(probe.waitForExit() == 0)
        }
        #expect(daemon.spawned.process.isRunning)
    }

    @Test("a stopped subscriber delays the lock by at most the grace period, and on SIGCONT gets one event per kind for the net change")
    func stoppedSubscriberIsCoalesced() async throws {
        let (test, daemon) = try deviceWithDaemon(grace: 1)
        try unlock(test)
        let watcher = try SpawnedProcess(SpawnedProcess.builtExecutable("sandboxctl"), ["watch", "--json", "--root", test.root])
        #expect(try eventually { try Device.attach(root: test.root).daemonStatus()?.subscribers == 2 }, "\(watcher.standardError)")
        watcher.signal(SIGSTOP)

        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        let start = Date()
        await client.lock(gracePeriod: 1)
        let elapsed = Date().timeIntervalSince(start)
        #expect(try client.daemonStatus()?.state == .locked)
        // It waited for the stopped watcher (it can't acknowledge) until the grace period ended, not until the watcher
        // resumed (it stays stopped below). The upper bound is loose: a loaded machine under a sanitizer can take
        // seconds to resume this task; waiting for the watcher would never end at all.
        #expect(elapsed >= 0.9 && elapsed < 120, "lock took \(elapsed) s")

        // Many changes while it is stopped: the daemon keeps one record for it, not a backlog.
        for _ in 0..<20 {
            try client.unlock(passcode: try Passcode(TestDevice.passcode))
            await client.lock(gracePeriod: 0)
        }
        try client.unlock(passcode: try Passcode(TestDevice.passcode))

        watcher.signal(SIGCONT)
        let first = watcher.nextJSON()
        let second = watcher.nextJSON()
        #expect(first?["event"] == "willBecomeUnavailable")
        #expect(second?["event"] == "didBecomeAvailable")
        #expect(watcher.nextLine(timeout: 1.5) == nil, "more than one event per kind after SIGCONT")
        #expect(daemon.spawned.process.isRunning)
    }

    @Test("SIGKILL of the daemon: clients get an error naming the fix, see before-first-unlock after a restart, and no file is lost")
    func daemonKilledAndRestarted() throws {
        let (test, daemon) = try deviceWithDaemon()
        try unlock(test)
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        let container = try client.container(bundleIdentifier: TestDevice.bundleIdentifier)
        #expect(try container.contents(atPath: Self.filePath) == Data("top secret".utf8))

        daemon.spawned.signal(SIGKILL)
        #expect(daemon.spawned.waitForExit() != nil)
        #expect(eventually { client.state == .locked })
        _ = expectCocoaError(.daemonUnavailable) { try container.contents(atPath: Self.filePath) }
        let noDaemon = try sandboxctl(test, ["lock"])
        #expect(noDaemon.status == 69)
        #expect(noDaemon.stderr.contains("sandboxctl daemon --root"), "\(noDaemon.stderr)")
        #expect(FileManager.default.fileExists(atPath: KeyDaemon.defaultSocketPath(root: test.root)), "the killed daemon leaves its socket")

        // The restart replaces the stale socket, and is a reboot for everyone attached.
        let restarted = try DaemonProcess(test)
        #expect(eventually { client.state == .beforeFirstUnlock })
        expectDenied(writing: false) { try container.contents(atPath: Self.filePath) }

        let second = try sandboxctl(test, ["daemon"])
        #expect(second.status == 1)
        #expect(second.stderr.contains("a key daemon already serves this device (pid \(restarted.pid)"), "\(second.stderr)")

        try unlock(test)
        #expect(eventually { client.state == .unlocked })
        #expect(try container.contents(atPath: Self.filePath) == Data("top secret".utf8))
    }

    @Test("a peer running as another uid is refused by SO_PEERCRED, and the daemon keeps serving its owner")
    func otherUIDRefused() throws {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"), FileManager.default.isExecutableFile(atPath: "/usr/bin/python3") else {
            print("skipped: needs root, /usr/bin/setpriv and /usr/bin/python3 to connect as another uid (uid \(getuid()))")
            return
        }
        let test = try TestDevice()
        // A socket outside the 0700 root and opened to everyone, as a misconfiguration would: only SO_PEERCRED stands.
        let publicDirectory = test.path("public")
        try FileManager.default.createDirectory(atPath: publicDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        chmod(test.directory.path, 0o755)
        let socket = (publicDirectory as NSString).appendingPathComponent("d.sock")
        let daemon = try DaemonProcess(test, extraArguments: ["--socket", socket])
        #expect(chmod(socket, 0o666) == 0)
        let script = """
            import json, socket, struct, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            m = json.dumps({"id": 1, "op": "hello", "version": 1}).encode()
            s.sendall(struct.pack(">IH", len(m) + 2, len(m)) + m)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk: break
                data += chunk
            n, j = struct.unpack(">IH", data[:6])
            print(json.loads(data[6:6 + j])["error"]["code"], "closed" if len(data) == 4 + n else "more")
            """
        let refused = try SpawnedProcess(URL(fileURLWithPath: "/usr/bin/setpriv"),
                                         ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script, socket])
        #expect(refused.nextLine() == "permission-denied closed", "\(refused.standardError)")
        // Its log line travels through a pipe of its own: wait for it.
        #expect(eventually { daemon.spawned.standardError.contains("refused a connection from uid 65534") })
        #expect(try Device.attach(root: test.root, notificationCenter: NotificationCenter()).daemonStatus()?.state == .beforeFirstUnlock)
    }
}
