import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// `sandboxctl watch BUNDLE --json` on a test device: the app, as far as these tests are concerned.
final class Watcher {
    let spawned: SpawnedProcess

    init(_ test: TestDevice, observer: Device) throws {
        let before = try observer.daemonStatus()?.subscribers ?? 0
        spawned = try SpawnedProcess(SpawnedProcess.builtExecutable("sandboxctl"),
                                     ["watch", TestDevice.bundleIdentifier, "--json", "--root", test.root, "--device-secret", test.secretPath])
        // Subscribed once the daemon counts it.
        #expect(try eventually { (try observer.daemonStatus()?.subscribers ?? 0) > before }, "the watcher did not attach: \(spawned.standardError)")
    }

    /// The next event line, parsed.
    func next(timeout: TimeInterval = 20) -> [String: Any]? {
        guard let line = spawned.nextLine(timeout: timeout) else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
    }

    /// Event names and, for open-URL events, "openURL <path> #<sequence>", for the next `count` lines.
    func next(_ count: Int) -> [String] {
        (0..<count).map { _ in
            guard let line = next() else { return "(nothing)" }
            let event = line["event"] as? String ?? "?"
            guard event == "openURL" else { return event }
            return "openURL \(line["path"] as? String ?? "?") #\(line["sequence"] as? Int ?? 0)"
        }
    }
}

@Suite("Inbox across processes", .ownThread, .serialized)
struct InboxProcessTests {
    private func deliver(_ test: TestDevice, _ files: [String], _ extra: [String] = []) throws -> CLI.Result {
        try sandboxctl(test, ["inbox", "deliver", TestDevice.bundleIdentifier] + files + extra)
    }

    private func unlock(_ test: TestDevice) throws {
        let result = try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode + "\n")
        #expect(result.status == 0, "\(result.stderr)")
    }

    private func inboxList(_ test: TestDevice) throws -> [[String: Any]] {
        let result = try sandboxctl(test, ["inbox", "list", TestDevice.bundleIdentifier, "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        return (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8))) as? [[String: Any]] ?? []
    }

    @Test("daemon restarted between delivery and unlock: the running app gets every event once, in order, after did")
    func daemonRestart() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        var daemon = try DaemonProcess(test, grace: 1)
        try unlock(test)
        let observer = try Device.attach(root: test.root)
        let watcher = try Watcher(test, observer: observer)
        #expect(try sandboxctl(test, ["lock", "--grace", "0"]).status == 0)
        #expect(watcher.next(1) == ["willBecomeUnavailable"])
        let first = try deliver(test, [sourceFile(test, "one.txt", "one"), sourceFile(test, "two.txt", "two")], ["--from", "com.example.mail"])
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdout.contains("sealed for class B while locked"))

        daemon.spawned.signal(SIGKILL)
        #expect(daemon.spawned.waitForExit() != nil)
        daemon = try DaemonProcess(test, grace: 1)
        #expect(try deliver(test, [sourceFile(test, "three.txt", "three")]).status == 0)
        let restartedObserver = try Device.attach(root: test.root)
        #expect(try eventually { (try restartedObserver.daemonStatus()?.subscribers ?? 0) >= 2 }, "the watcher reconnects")
        try unlock(test)
        #expect(watcher.next(4) == ["didBecomeAvailable", "openURL Documents/Inbox/one.txt #1", "openURL Documents/Inbox/two.txt #2",
                                    "openURL Documents/Inbox/three.txt #3"])
        #expect(watcher.spawned.nextLine(timeout: 0.5) == nil, "no duplicate")
        #expect(try inboxList(test).map { $0["state"] as? String } == ["delivered", "delivered", "delivered"])
        #expect(try sandboxctl(test, ["cat", "\(TestDevice.bundleIdentifier):Documents/Inbox/two.txt"]).stdout == "two")
        withExtendedLifetime(daemon) {}
    }

    @Test("reboot (daemon restarted before first unlock) between delivery and unlock: an app launched before first unlock gets the events once")
    func reboot() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        var daemon = try DaemonProcess(test)
        // Before first unlock: sealed for class B.
        #expect(try deliver(test, [sourceFile(test, "a.txt", "alpha"), sourceFile(test, "b.txt", "beta")]).status == 0)
        daemon.spawned.signal(SIGTERM)
        #expect(daemon.spawned.waitForExit() == 0)
        daemon = try DaemonProcess(test)
        let observer = try Device.attach(root: test.root)
        let watcher = try Watcher(test, observer: observer)
        #expect(watcher.spawned.nextLine(timeout: 0.5) == nil, "nothing before first unlock")
        try unlock(test)
        #expect(watcher.next(3) == ["didBecomeAvailable", "openURL Documents/Inbox/a.txt #1", "openURL Documents/Inbox/b.txt #2"])
        let items = try inboxList(test)
        #expect(items.map { $0["state"] as? String } == ["delivered", "delivered"])
        #expect(items.map { $0["awaitsDefaultClass"] as? Bool } == [true, true], "not opened yet")
        #expect(try sandboxctl(test, ["cat", "\(TestDevice.bundleIdentifier):Documents/Inbox/a.txt"]).stdout == "alpha")
        #expect(try inboxList(test).map { $0["protection"] as? String } == ["complete", "complete-unless-open"], "a.txt took the default at its first open")

        // Relaunched: nothing comes again.
        watcher.spawned.signal(SIGTERM)
        _ = watcher.spawned.waitForExit()
        #expect(try eventually { try observer.daemonStatus()?.subscribers == 1 }, "the daemon saw the watcher go")
        let relaunched = try Watcher(test, observer: observer)
        #expect(relaunched.spawned.nextLine(timeout: 0.7) == nil, "each event exactly once")
        withExtendedLifetime(daemon) {}
    }

    @Test("sandboxctl inbox deliver: bad arguments are refused before anything is delivered, with the documented exit codes")
    func commandLineErrors() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let good = sourceFile(test, "good.pdf", "good")
        let cases: [(arguments: [String], status: Int32, message: String)] = [
            ([good, test.path("missing.pdf")], 1, "missing.pdf: cannot open the file to deliver"),
            ([good, test.directory.path], 64, "it is a directory"),
            ([good, "--annotation", "{"], 64, "the annotation is not valid JSON"),
            ([good, "--annotation", "[1, null]"], 64, "holds null at [1]"),
            ([good, "--from", "not a bundle"], 64, "the source application is not a bundle identifier"),
        ]
        for testCase in cases {
            let result = try deliver(test, testCase.arguments)
            #expect(result.status == testCase.status, "\(testCase.arguments): \(result.stderr)")
            #expect(result.stderr.contains(testCase.message), "\(testCase.arguments): \(result.stderr)")
        }
        let unknown = try sandboxctl(test, ["inbox", "deliver", "com.example.unknown", good])
        #expect(unknown.status == 1 && unknown.stderr.contains("no such container"), "\(unknown.stderr)")
        #expect(try sandboxctl(test, ["inbox", "list", TestDevice.bundleIdentifier]).stdout.contains("is empty"), "nothing was delivered")

        let delivered = try deliver(test, [good, good, "--annotation", #"{"to": "you/me"}"#, "--json"])
        #expect(delivered.status == 0, "\(delivered.stderr)")
        let items = (try? JSONSerialization.jsonObject(with: Data(delivered.stdout.utf8))) as? [[String: Any]] ?? []
        #expect(items.map { $0["name"] as? String } == ["good.pdf", "good-1.pdf"])
        #expect(items.first?["annotation"] as? String == #"{"to":"you/me"}"#)
        let listing = try sandboxctl(test, ["inbox", "list", TestDevice.bundleIdentifier])
        #expect(listing.stdout.contains("pending-event") && listing.stdout.contains("good-1.pdf"), "\(listing.stdout)")
    }

    @Test("a full disk fails the delivery with nothing half-delivered; the files before it stay delivered and are reported")
    func fullDisk() throws {
        guard getuid() == 0 else {
            print("skipped: mounting a small tmpfs to fill needs root")
            return
        }
        let directory = TemporaryDirectory()
        let mountPoint = directory.file("small")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let mounted = Process()
        mounted.executableURL = URL(fileURLWithPath: "/bin/mount")
        mounted.arguments = ["-t", "tmpfs", "-o", "size=3m", "tmpfs", mountPoint]
        try mounted.run()
        mounted.waitUntilExit()
        guard mounted.terminationStatus == 0 else {
            print("skipped: cannot mount a tmpfs here (mount exited \(mounted.terminationStatus))")
            return
        }
        defer { _ = try? CLI.run(["--version"]); umount2(mountPoint, Int32(MNT_DETACH)) }
        let root = (mountPoint as NSString).appendingPathComponent("root")
        let secret = directory.file("secret")
        let arguments = ["--root", root, "--device-secret", secret]
        #expect(try CLI.run(["init", "--kdf", "fast", "--passcode-stdin"] + arguments, stdin: "1234\n").status == 0)
        #expect(try CLI.run(["create", "com.example.full"] + arguments).status == 0)
        let small = directory.file("small.txt"), big = directory.file("big.bin")
        writeRaw(Array("small".utf8), small)
        writeRaw(pattern(5 << 20), big)
        let result = try CLI.run(["inbox", "deliver", "com.example.full", small, big] + arguments)
        #expect(result.status == 1, "\(result.stderr)")
        #expect(result.stderr.contains("No space left on device") || result.stderr.contains("Free some disk space"), "\(result.stderr)")
        #expect(result.stderr.contains("delivered before the failure: Documents/Inbox/small.txt"), "\(result.stderr)")
        let container = try Device.open(root: root, deviceSecretPath: secret).container(bundleIdentifier: "com.example.full")
        #expect(try container.contentsOfDirectory(atPath: "Documents/Inbox").map(\.name) == ["small.txt"])
        let stored = try FileManager.default.contentsOfDirectory(atPath: try container.storedPath("Documents/Inbox"))
        #expect(!stored.contains { $0.hasPrefix(FileSystem.temporaryPrefix) }, "no staged file left: \(stored)")
        #expect(try container.inboxQueue.entries().map(\.name) == ["small.txt"], "the queue holds the one delivery")
    }

    @Test("a 1 GiB delivery streams in constant memory: peak resident size under 64 MiB")
    func largeDelivery() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/python3") else {
            print("skipped: needs /usr/bin/python3 to measure the delivering process's peak memory on its own")
            return
        }
        let test = try TestDevice()
        let container = try test.makeContainer()
        let source = test.path("disk.img")
        let fd = open(source, O_CREAT | O_WRONLY, 0o600)
        #expect(ftruncate(fd, 1 << 30) == 0)
        let marker = Array("end of the image".utf8)
        #expect(pwrite(fd, marker, marker.count, (1 << 30) - off_t(marker.count)) == marker.count)
        close(fd)
        defer { unlink(source) }

        let (status, peakKiB) = try runMeasuringPeakMemory(SpawnedProcess.builtExecutable("sandboxctl").path,
                                                           ["inbox", "deliver", TestDevice.bundleIdentifier, source, "--root", test.root, "--device-secret", test.secretPath])
        #expect(status == 0)
        print("1 GiB delivery: peak resident \(peakKiB / 1024) MiB")
        // The sanitizers (make verify) keep freed memory in quarantine and map shadow memory: the bound there is
        // looser but still far below the 1 GiB a whole-file read would take.
        #expect(peakKiB < (runsUnderSanitizer ? 256 : 64) * 1024, "peak resident \(peakKiB) KiB")
        let item = try #require(try container.inboxItems().first)
        #expect(item.size == 1 << 30)
        let handle = try container.fileHandle(forReadingAtPath: item.path)
        #expect(try handle.read(upToCount: 64, atOffset: (1 << 30) - 16) == Data(marker))
        try handle.close()
    }
}

/// Runs a program to completion and reports its exit status and peak resident memory (KiB, wait4's ru_maxrss).
/// Through a small python3 parent: a child spawned straight from this (large, multithreaded) test process shares its
/// memory until exec (vfork-style posix_spawn), and the kernel counts that in the child's peak.
func runMeasuringPeakMemory(_ executable: String, _ arguments: [String]) throws -> (status: Int32, peakKiB: Int) {
    let script = """
        import os, subprocess, sys
        child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
        """
    let result = try CLI.run(executable: URL(fileURLWithPath: "/usr/bin/python3"), ["-c", script, executable] + arguments)
    let fields = result.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    guard result.status == 0, fields.count == 2 else {
        throw ProtectedStoreError(.io, problem: "the measuring wrapper failed: \(result.stderr)", remedy: "Install python3")
    }
    return (Int32(fields[0]), fields[1])
}
