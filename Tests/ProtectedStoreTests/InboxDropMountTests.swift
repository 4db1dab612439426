import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import Testing
import SuiteThreads

/// `sandboxctl inbox mount BUNDLE DIR --foreground` on a test device: the drop folder, as a separate process. Its settle
/// time is 5 s, far longer than any writer here takes between its close and its rename, even on a loaded machine.
final class DropFolder: @unchecked Sendable {
    let test: TestDevice
    let directory: String
    private(set) var mount: SpawnedProcess
    private let extra: [String]
    private let transport: MountTransport

    init(_ test: TestDevice, extra: [String] = [], transport: MountTransport = .devFuse) throws {
        self.test = test
        self.extra = extra
        self.transport = transport
        directory = test.path("drop")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        mount = try Self.start(test, directory, extra, transport)
    }

    private static func start(_ test: TestDevice, _ directory: String, _ extra: [String], _ transport: MountTransport) throws -> SpawnedProcess {
        try transport.start(at: directory) { transportArguments in
            try SpawnedProcess(SpawnedProcess.builtExecutable("sandboxctl"),
                               ["inbox", "mount", TestDevice.bundleIdentifier, directory, "--foreground", "--settle", "5",
                                "--root", test.root, "--device-secret", test.secretPath] + extra + transportArguments)
        }
    }

    /// Kills the drop folder's process with SIGKILL, clears the stale mount, and starts it again.
    func killAndRestart() throws {
        mount.signal(SIGKILL)
        _ = mount.waitForExit(timeout: 10)
        _ = try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("fusermount3") ?? "/bin/fusermount3"), ["-u", "-z", directory])
        mount = try Self.start(test, directory, extra, transport)
    }

    deinit {
        _ = try? CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("fusermount3") ?? "/bin/fusermount3"), ["-u", "-z", directory])
        mount.signal(SIGTERM)
        transport.expectEnded(mount)
    }

    func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }

    /// What the folder lists.
    var listing: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted() }

    /// The Inbox's items once `count` are there (waiting up to 20 s), by name.
    func items(_ container: Container, count: Int) throws -> [String: InboxItem] {
        _ = try eventually(timeout: 60) { try container.inboxItems().count >= count }
        return Dictionary(uniqueKeysWithValues: try container.inboxItems().map { ($0.name, $0) })
    }

    /// The plaintext of an Inbox item.
    static func content(_ container: Container, _ item: InboxItem) throws -> Data {
        let handle = try container.fileHandle(forReadingAtPath: item.path)
        defer { try? handle.close() }
        return try handle.read(upToCount: Int(item.size) + 1, atOffset: 0)
    }
}

/// Runs a shell command line; returns its exit status and standard error.
@discardableResult
private func shell(_ command: String) throws -> (status: Int32, stderr: String) {
    let result = try CLI.run(executable: URL(fileURLWithPath: "/bin/sh"), ["-c", command])
    return (result.status, result.stderr)
}

@Suite("Inbox drop folder (sandboxctl inbox mount)", .ownThread, .serialized, .enabled(if: FUSEAvailability.isAvailable, "needs /dev/fuse and fusermount3"))
struct InboxDropMountTests {
    @Test("cp, rsync --partial, Python's tempfile + os.replace and a setfattr annotation each deliver once, under the final name; nothing reads back",
          arguments: MountTransport.testable)
    func everydayWriters(over transport: MountTransport) throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let drop = try DropFolder(test, transport: transport)
        let source = test.path("report.pdf")
        try Data("a report".utf8).write(to: URL(fileURLWithPath: source))
        #expect(try shell("cp '\(source)' '\(drop.directory)/'").status == 0)
        if FUSEAvailability.executable("rsync") != nil {
            try Data("synced by rsync".utf8).write(to: URL(fileURLWithPath: test.path("synced.txt")))
            let rsync = try shell("rsync -a --partial '\(test.path("synced.txt"))' '\(drop.directory)/'")
            #expect(rsync.status == 0, "\(rsync.stderr)")
        } else {
            print("rsync step skipped: rsync is not installed (apt-get install rsync)")
        }
        let python = try shell("""
            python3 -c "
            import tempfile, os
            fd, path = tempfile.mkstemp(dir='\(drop.directory)')
            os.write(fd, b'saved through a temporary file'); os.close(fd)
            os.replace(path, '\(drop.path("notes.txt"))')"
            """)
        #expect(python.status == 0, "\(python.stderr)")
        // A download: a .part file, annotated, then renamed.
        try Data("downloaded".utf8).write(to: URL(fileURLWithPath: drop.path("movie.mkv.part")))
        if FUSEAvailability.executable("setfattr") != nil {
            #expect(try shell("setfattr -n user.inbox.annotation -v '{\"url\": \"https://example.com/movie\"}' '\(drop.path("movie.mkv.part"))'").status == 0)
            #expect(try shell("setfattr -n user.inbox.annotation -v '{bad json' '\(drop.path("movie.mkv.part"))'").status != 0, "bad JSON is refused")
        }
        // Renamed files went at their rename; cp's waits out the settle time; a temporary name waits for its rename.
        // (The kernel sends a close's release after close(2) returns, so a rename's delivery may trail the rename.)
        #expect(eventually(timeout: 20) { drop.listing.filter { $0 != "report.pdf" } == ["movie.mkv.part"] }, "\(drop.listing)")
        #expect(rename(drop.path("movie.mkv.part"), drop.path("movie.mkv")) == 0)

        let expected = FUSEAvailability.executable("rsync") != nil ? 4 : 3
        let items = try drop.items(container, count: expected)
        #expect(items.count == expected, "\(items.keys.sorted())")
        #expect(try items["report.pdf"].map { try DropFolder.content(container, $0) } == Data("a report".utf8))
        #expect(try items["notes.txt"].map { try DropFolder.content(container, $0) } == Data("saved through a temporary file".utf8))
        #expect(try items["movie.mkv"].map { try DropFolder.content(container, $0) } == Data("downloaded".utf8))
        if expected == 4 { #expect(try items["synced.txt"].map { try DropFolder.content(container, $0) } == Data("synced by rsync".utf8)) }
        #expect(items["report.pdf"]?.sourceApplication == "local.cp", "the writer's executable is the source")
        if FUSEAvailability.executable("setfattr") != nil {
            #expect(items["movie.mkv"]?.annotationJSON == "{\"url\":\"https://example.com/movie\"}")
        }
        #expect(drop.listing.isEmpty, "delivered files are not listed")
        #expect(try container.inboxQueue.entries().count == expected, "one event each")

        // Nothing can be read back, and the folder is flat.
        try Data("still writing".utf8).write(to: URL(fileURLWithPath: drop.path(".pending")))
        #expect(open(drop.path(".pending"), O_RDONLY) == -1 && errno == EACCES)
        #expect(open(drop.path(".pending"), O_RDWR) == -1 && errno == EACCES)
        #expect(mkdir(drop.path("folder"), 0o755) == -1 && errno == EPERM)
        #expect(open(drop.path("report.pdf"), O_RDONLY) == -1 && errno == ENOENT, "a delivered file is not reachable")
        #expect(unlink(drop.path(".pending")) == 0)
        #expect(drop.listing.isEmpty)
    }

    @Test("a 256 MiB dd streams through the drop folder in constant memory (peak resident under 64 MiB)")
    func largeDrop() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let drop = try DropFolder(test)
        let dd = try shell("dd if=/dev/zero of='\(drop.path("disk.img"))' bs=1M count=256 status=none")
        #expect(dd.status == 0, "\(dd.stderr)")
        let item = try #require(try drop.items(container, count: 1)["disk.img"])
        #expect(item.size == 256 << 20)
        let status = (try? String(contentsOfFile: "/proc/\(drop.mount.pid)/status", encoding: .utf8)) ?? ""
        let peakKiB = Int(status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }?.split(separator: " ").dropFirst().first ?? "") ?? 0
        print("256 MiB drop: the drop folder's peak resident \(peakKiB / 1024) MiB")
        #expect(peakKiB > 0 && peakKiB < (runsUnderSanitizer ? 256 : 64) * 1024, "peak resident \(peakKiB) KiB")
    }

    @Test("a writer killed mid-file delivers nothing; two writers of one name at once deliver two items under free names")
    func killedAndConcurrentWriters() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let drop = try DropFolder(test)
        let writer = try SpawnedProcess(URL(fileURLWithPath: "/usr/bin/env"), ["python3", "-c", """
            import sys, time
            f = open('\(drop.path("partial.bin"))', 'wb')
            f.write(b'x' * 100000); f.flush()
            print('written', flush=True)
            time.sleep(60)
            """])
        #expect(writer.nextLine(timeout: 20) == "written")
        writer.signal(SIGKILL)
        _ = writer.waitForExit()
        #expect(eventually(timeout: 10) { drop.listing.isEmpty }, "the killed writer's file is dropped: \(drop.listing)")

        let both = try shell("""
            python3 -c "
            a = open('\(drop.path("same.txt"))', 'wb'); b = open('\(drop.path("same.txt"))', 'wb')
            a.write(b'first writer'); b.write(b'second writer'); a.close(); b.close()"
            """)
        #expect(both.status == 0, "\(both.stderr)")
        let items = try drop.items(container, count: 2)
        #expect(Set(items.keys) == ["same.txt", "same-1.txt"], "\(items.keys.sorted())")
        let contents = try Set(items.values.filter { $0.name.hasPrefix("same") }.map { String(decoding: try DropFolder.content(container, $0), as: UTF8.self) })
        #expect(contents == ["first writer", "second writer"])
        #expect(items["partial.bin"] == nil)
        #expect(!drop.mount.standardError.contains("delivered partial.bin"))
    }

    @Test("drops while locked are sealed for class B; after the unlock the app gets did-become-available, then the open-URL events")
    func dropWhileLocked() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 1)
        defer { _ = daemon }
        #expect(try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode + "\n").status == 0)
        let observer = try Device.attach(root: test.root)
        let watcher = try Watcher(test, observer: observer)
        let drop = try DropFolder(test)
        #expect(try sandboxctl(test, ["lock", "--grace", "0"]).status == 0)
        #expect(watcher.next(1) == ["willBecomeUnavailable"])
        try Data("arrived while locked".utf8).write(to: URL(fileURLWithPath: drop.path("letter.txt")))
        let container = try observer.container(bundleIdentifier: TestDevice.bundleIdentifier)
        let item = try #require(try drop.items(container, count: 1)["letter.txt"])
        #expect(item.awaitsDefaultClass && item.protectionClass == .completeUnlessOpen, "\(item)")
        #expect(watcher.spawned.nextLine(timeout: 0.5) == nil, "no event while locked")
        #expect(try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode + "\n").status == 0)
        #expect(watcher.next(2) == ["didBecomeAvailable", "openURL Documents/Inbox/letter.txt #1"])
        #expect(try DropFolder.content(container, item) == Data("arrived while locked".utf8))
    }

    @Test("the drop folder killed mid-file and restarted: what was delivered stays, once; the unfinished file is swept; drops go on")
    func killedDropFolder() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let drop = try DropFolder(test)
        try Data("before the kill".utf8).write(to: URL(fileURLWithPath: drop.path("kept.txt")))
        _ = try drop.items(container, count: 1)
        let writer = try SpawnedProcess(URL(fileURLWithPath: "/usr/bin/env"), ["python3", "-c", """
            import time
            f = open('\(drop.path("cut.bin"))', 'wb')
            for _ in range(4): f.write(b'y' * (1 << 20)); f.flush()
            print('written', flush=True)
            time.sleep(60)
            """])
        #expect(writer.nextLine(timeout: 20) == "written")
        let inbox = try container.directory.openDirectory(container.inboxPath)
        let stagedBefore = try DirectoryNames.entries(in: try inbox.reopened(), displayPath: "Inbox").filter { $0.hasPrefix(InboxDrop.stagingPrefix) }
        #expect(stagedBefore.count == 1, "the file being written is staged in the Inbox: \(stagedBefore)")
        try drop.killAndRestart()
        writer.signal(SIGKILL)
        _ = writer.waitForExit()
        let staged = try DirectoryNames.entries(in: try inbox.reopened(), displayPath: "Inbox").filter { $0.hasPrefix(FileSystem.temporaryPrefix) }
        #expect(staged.isEmpty, "the restart swept the unfinished file: \(staged)")
        try Data("after the restart".utf8).write(to: URL(fileURLWithPath: drop.path("next.txt")))
        let items = try drop.items(container, count: 2)
        #expect(Set(items.keys) == ["kept.txt", "next.txt"])
        #expect(try container.inboxQueue.entries().map(\.name).sorted() == ["kept.txt", "next.txt"], "each event once")
    }

    @Test("the drop folder SIGKILLed again and again while it delivers: every item in the Inbox is whole, recorded once; nothing staged is left")
    func killedWhileDelivering() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let drop = try DropFolder(test, extra: ["--settle", "0"])
        for round in 0..<5 {
            // 1 MiB files of one byte value each, so a delivered item shows whether it is whole.
            let writer = try SpawnedProcess(URL(fileURLWithPath: "/usr/bin/env"), ["python3", "-c", """
                import os
                for i in range(30):
                    try:
                        with open(os.path.join('\(drop.directory)', 'f-\(round)-%d.bin' % i), 'wb') as f:
                            f.write(bytes([i]) * (1 << 20))
                    except OSError:
                        break
                """])
            // Killed once this round's deliveries are under way, at a different point of one each round.
            _ = try eventually(timeout: 30) { try container.inboxItems().contains { $0.name.hasPrefix("f-\(round)-") } }
            usleep(useconds_t(round * 7_000))
            try drop.killAndRestart()
            _ = writer.waitForExit(timeout: 60)
        }
        try Data("last".utf8).write(to: URL(fileURLWithPath: drop.path("last.txt")))
        _ = try drop.items(container, count: 1)
        _ = try eventually(timeout: 30) { try container.inboxItems().contains { $0.name == "last.txt" } }
        let items = try container.inboxItems()
        for item in items where item.name.hasPrefix("f-") {
            let index = try #require(UInt8(item.name.split(separator: "-")[2].split(separator: ".")[0]))
            let content = try DropFolder.content(container, item)
            #expect(content.count == 1 << 20 && content.allSatisfy { $0 == index }, "\(item.name) is whole")
        }
        let entries = try container.inboxQueue.entries()
        #expect(Set(entries.map(\.sequence)).count == entries.count && Set(entries.map(\.name)).count == entries.count, "each delivery recorded once")
        #expect(Set(entries.map(\.name)) == Set(items.map(\.name)), "every item has its record and every record its item")
        let inbox = try container.directory.openDirectory(container.inboxPath)
        let staged = try DirectoryNames.entries(in: try inbox.reopened(), displayPath: "Inbox").filter { $0.hasPrefix(InboxDrop.stagingPrefix) }
        #expect(staged.isEmpty, "nothing staged is left: \(staged)")
        print("drop folder killed 5 times while delivering: \(items.count - 1) files delivered whole, each recorded once")
    }

    @Test("the README's drop folder walkthrough works as printed")
    func readmeWalkthrough() throws {
        let readme = try String(contentsOfFile: #filePath.components(separatedBy: "/Tests/")[0] + "/README.md", encoding: .utf8)
        let lines = readme.components(separatedBy: "\n")
        let first = try #require(lines.firstIndex(of: "mkdir -p /tmp/to-notes"))
        let last = try #require(lines[first...].firstIndex(of: "fusermount3 -u /tmp/to-notes"))
        let test = try TestDevice()
        _ = try test.makeContainer("com.example.notes")
        try Data("%PDF-1.7".utf8).write(to: URL(fileURLWithPath: test.path("report.pdf")))
        // Its own folder instead of /tmp/to-notes, so parallel runs do not meet; sandboxctl from this build.
        let script = lines[first...last].joined(separator: "\n").replacingOccurrences(of: "/tmp/to-notes", with: test.path("to-notes"))
        let bin = SpawnedProcess.builtExecutable("sandboxctl").deletingLastPathComponent().path
        let result = try CLI.run(executable: URL(fileURLWithPath: "/bin/bash"), ["-c", """
            cd '\(test.directory.path)' && export PATH='\(bin)':"$PATH" SANDBOXCTL_ROOT='\(test.root)' \
            SANDBOXCTL_DEVICE_SECRET='\(test.secretPath)' XDG_STATE_HOME='\(test.path("state"))'
            \(script)
            """])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("draft.txt.part\n"), "ls shows the file waiting for its rename: \(result.stdout)")
        #expect(result.stderr.contains("Permission denied"), "\(result.stderr)")
        let listed = try sandboxctl(test, ["inbox", "list", "com.example.notes", "--json"])
        let items = (try? JSONSerialization.jsonObject(with: Data(listed.stdout.utf8))) as? [[String: Any]] ?? []
        #expect(items.compactMap { $0["name"] as? String }.sorted() == ["draft.txt", "report.pdf"], "\(listed.stdout)")
        #expect(items.first { $0["name"] as? String == "draft.txt" }?["annotation"] as? String == "{\"subject\":\"Q3\"}")
        #expect(items.allSatisfy { $0["sourceApplication"] as? String == "com.example.browser" })
    }

    @Test("bad input: a non-empty or busy directory, an unknown bundle, a bad annotation or source: clear errors, documented exit codes")
    func badInput() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let full = test.path("full")
        try FileManager.default.createDirectory(atPath: full, withIntermediateDirectories: true)
        try Data().write(to: URL(fileURLWithPath: (full as NSString).appendingPathComponent("x")))
        let empty = test.path("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        func run(_ arguments: [String]) throws -> CLI.Result { try sandboxctl(test, ["inbox", "mount"] + arguments) }

        let notEmpty = try run([TestDevice.bundleIdentifier, full])
        #expect(notEmpty.status == 64 && notEmpty.stderr.contains("not empty"), "\(notEmpty.stderr)")
        let unknown = try run(["com.example.missing", empty])
        #expect(unknown.status == 1 && unknown.stderr.contains("com.example.missing"), "\(unknown.stderr)")
        let badJSON = try run([TestDevice.bundleIdentifier, empty, "--annotation", "{nope"])
        #expect(badJSON.status == 64 && badJSON.stderr.contains("not valid JSON"), "\(badJSON.stderr)")
        let badSource = try run([TestDevice.bundleIdentifier, empty, "--from", "not a bundle"])
        #expect(badSource.status == 64 && badSource.stderr.contains("source application"), "\(badSource.stderr)")
        let drop = try DropFolder(test)
        let busy = try run([TestDevice.bundleIdentifier, drop.directory])
        #expect(busy.status == 1 && busy.stderr.contains("busy"), "\(busy.stderr)")
        #expect(MountPoint.mountedFileSystem(at: empty) == nil, "nothing was mounted by the refused calls")
    }
}
