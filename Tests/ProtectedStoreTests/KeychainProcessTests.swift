import Foundation
@testable import ProtectedStore
import Testing
import SuiteThreads

/// The keychain across processes: the command with and without a daemon, a launched app through its own socket
/// (its groups only), and eight processes changing one item at once.
@Suite("Keychain across processes", .ownThread)
struct KeychainProcessTests {
    static let bundle = "com.example.keychain"

    @Test("sandboxctl keychain through the daemon: the lock refuses when-unlocked items with errSecInteractionNotAllowed, after-first-unlock ones stay; exit codes name each status")
    func commandThroughDaemon() throws {
        let test = try TestDevice()
        let daemon = try DaemonProcess(test, grace: 0)
        defer { _ = daemon }
        try MountedDevice.unlock(test)
        func keychain(_ arguments: [String], stdin: String? = nil) throws -> CLI.Result { try sandboxctl(test, ["keychain"] + arguments, stdin: stdin) }
        #expect(try keychain(["add", Self.bundle, "--service", "api", "--account", "alice"], stdin: "token-a\n").status == 0)
        let added = try keychain(["add", Self.bundle, "--service", "api", "--account", "bob", "--accessible", "after-first-unlock", "--label", "Bob", "--json"], stdin: "token-c")
        #expect(added.status == 0 && added.stdout.contains("\"accessible\" : \"after-first-unlock\""), "\(added)")
        let duplicate = try keychain(["add", Self.bundle, "--service", "api", "--account", "alice"], stdin: "again")
        #expect(duplicate.status == 1 && duplicate.stderr.contains("errSecDuplicateItem (-25299)"), "\(duplicate)")
        #expect(try keychain(["find", Self.bundle, "--service", "api", "--account", "alice"]).stdout == "token-a")

        #expect(try sandboxctl(test, ["lock"]).status == 0)
        let denied = try keychain(["find", Self.bundle, "--service", "api", "--account", "alice"])
        #expect(denied.status == 77 && denied.stderr.contains("errSecInteractionNotAllowed (-25308)") && denied.stdout.isEmpty, "\(denied)")
        #expect(try keychain(["find", Self.bundle, "--service", "api", "--account", "bob"]).stdout == "token-c")
        let deniedUpdate = try keychain(["update", Self.bundle, "--service", "api", "--account", "alice", "--secret"], stdin: "changed while locked")
        #expect(deniedUpdate.status == 77, "\(deniedUpdate)")
        let listing = try keychain(["list", Self.bundle])
        #expect(listing.status == 0 && listing.stdout == "api  bob  after-first-unlock  \"Bob\"\n" && listing.stderr.contains("1 more item(s)"), "\(listing)")
        #expect(try keychain(["update", Self.bundle, "--service", "api", "--account", "bob", "--secret"], stdin: "token-c2\n").status == 0)

        try MountedDevice.unlock(test)
        #expect(try keychain(["find", Self.bundle, "--service", "api", "--account", "alice"]).stdout == "token-a", "the refused update changed nothing")
        let json = try keychain(["find", Self.bundle, "--service", "api", "--account", "bob", "--json"])
        #expect(json.stdout.contains("\"secret\" : \"token-c2\"") && json.stdout.contains("\"label\" : \"Bob\""), "\(json)")
        #expect(try keychain(["delete", Self.bundle, "--service", "api", "--account", "alice"]).status == 0)
        let missing = try keychain(["find", Self.bundle, "--service", "api", "--account", "alice"])
        #expect(missing.status == 1 && missing.stderr.contains("errSecItemNotFound (-25300)"), "\(missing)")
        let tooBig = try keychain(["add", Self.bundle, "--service", "big", "--account", "a"], stdin: String(repeating: "x", count: 16 * 1024 + 1))
        #expect(tooBig.status == 64 && tooBig.stderr.contains("errSecParam (-50)") && tooBig.stderr.contains("16384"), "\(tooBig)")
        let badPort = try keychain(["add", Self.bundle, "--class", "internet-password", "--server", "example.com", "--port", "99999"], stdin: "x")
        #expect(badPort.status == 64 && badPort.stderr.contains("65535"), "\(badPort)")
        #expect(try keychain(["delete", Self.bundle]).status == 64, "delete without a selector or --all is refused")
    }

    @Test("the README's keychain walk-through runs as printed")
    func readmeWalkthrough() throws {
        let readme = try String(contentsOfFile: #filePath.components(separatedBy: "/Tests/")[0] + "/README.md", encoding: .utf8)
        let lines = readme.components(separatedBy: "\n")
        let first = try #require(lines.firstIndex { $0.hasPrefix("printf 'tok-123' | sandboxctl keychain add") })
        let last = try #require(lines[first...].firstIndex { $0.hasPrefix("sandboxctl keychain delete") })
        let test = try TestDevice()
        let daemon = try DaemonProcess(test, grace: 0)
        defer { _ = daemon }
        try MountedDevice.unlock(test)
        // The passcode the README's `sandboxctl unlock` asks for on the terminal comes from standard input here.
        let script = lines[first...last].joined(separator: "\n")
            .replacingOccurrences(of: "\nsandboxctl unlock\n", with: "\nsandboxctl unlock --passcode-stdin <<< '\(TestDevice.passcode)'\n")
        let bin = SpawnedProcess.builtExecutable("sandboxctl").deletingLastPathComponent().path
        let result = try CLI.run(executable: URL(fileURLWithPath: "/bin/bash"), ["-c", """
            set -e; export PATH='\(bin)':"$PATH" SANDBOXCTL_ROOT='\(test.root)' SANDBOXCTL_DEVICE_SECRET='\(test.secretPath)'
            \(script)
            """])
        #expect(result.status == 0, "\(result.stderr)")
        for expected in ["api.example.com  alice  when-unlocked\n", "api.example.com  alice-refresh  after-first-unlock\n", "exit 77\n", "refresh-456\n", "tok-123\n",
                         "\"secret\" : \"tok-124\""] {
            #expect(result.stdout.contains(expected), "\(expected) missing from: \(result.stdout)")
        }
        #expect(result.stderr.contains("errSecInteractionNotAllowed (-25308)"), "\(result.stderr)")
        let after = try sandboxctl(test, ["keychain", "list", "com.example.notes"])
        #expect(after.status == 0 && after.stdout.isEmpty, "the walk-through's delete removed both items: \(after)")
    }

    @Test("in embedded mode (no daemon) the command asks for the passcode before first unlock and takes it from standard input")
    func commandEmbedded() throws {
        let test = try TestDevice()
        let added = try sandboxctl(test, ["keychain", "add", Self.bundle, "--service", "s", "--account", "a", "--passcode-stdin"], stdin: "\(TestDevice.passcode)\nthe secret\n")
        #expect(added.status == 0, "\(added)")
        let refused = try sandboxctl(test, ["keychain", "find", Self.bundle, "--service", "s"])
        #expect(refused.status == 77 && refused.stderr.contains("before first unlock") && refused.stderr.contains("--passcode-stdin"), "\(refused)")
        #expect(try sandboxctl(test, ["keychain", "find", Self.bundle, "--service", "s", "--passcode-stdin"], stdin: TestDevice.passcode + "\n").stdout == "the secret")
    }

    @Test("eight processes updating one item and adding their own at once, through one database: no update lost or torn, every add kept, the store intact")
    func eightProcesses() throws {
        let test = try TestDevice()
        let daemon = try DaemonProcess(test, grace: 0)
        defer { _ = daemon }
        try MountedDevice.unlock(test)
        let padding = String(repeating: "p", count: 3000)
        #expect(try sandboxctl(test, ["keychain", "add", Self.bundle, "--service", "shared", "--account", "one"], stdin: "start").status == 0)
        let rounds = runsUnderSanitizer ? 10 : 40
        // Eight processes of the owner, each with its own connection to the database and to the daemon.
        let workers = try (0..<8).map { worker in
            try SpawnedProcess(SpawnedProcess.builtExecutable("ProtectedStoreProbe"), ["keychain-worker", test.root, "\(worker)", "\(rounds)"])
        }
        for (index, worker) in workers.enumerated() {
            #expect(worker.waitForExit(timeout: 300) == 0, "worker \(index): \(worker.standardError)")
        }
        let final = try sandboxctl(test, ["keychain", "find", Self.bundle, "--service", "shared"])
        let written = Set((0..<8).map { "w\($0)-\(rounds)-\(padding)" })
        #expect(written.contains(final.stdout), "the shared item holds a whole last write of one worker, not \(final.stdout.prefix(40))… (\(final.stdout.count) bytes)")
        let listing = try sandboxctl(test, ["keychain", "list", Self.bundle, "--service", "mine", "--json"])
        #expect(listing.stdout.components(separatedBy: "\"account\"").count - 1 == 8 * rounds, "\(listing.stdout.prefix(200))")
        // A keychain opened afresh checks every row against the digest.
        let device = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        defer { device.powerOff() }
        #expect(try Keychain(device: device).list(matching: KeychainQuery(itemClass: .genericPassword, limit: .all)).items.count == 8 * rounds + 1)
    }

    @Test("a launched app uses its own groups through its socket: another app's items are invisible, the lock applies inside",
          .enabled(if: LaunchAvailability.isAvailable, "needs FUSE and bubblewrap"))
    func launchedApp() throws {
        let test = try TestDevice()
        _ = try test.makeContainer(Self.bundle)
        let daemon = try DaemonProcess(test, grace: 0)
        defer { _ = daemon }
        try MountedDevice.unlock(test)
        #expect(try sandboxctl(test, ["keychain", "add", "com.example.other", "--service", "token", "--account", "x"], stdin: "another app's").status == 0)
        let tool = CLI.executable.deletingLastPathComponent().path
        let runtime = try #require(LaunchTests.swiftRuntimeFolder)
        let shell = try SpawnedProcess(CLI.executable, ["launch", Self.bundle, "--root", test.root, "--device-secret", test.secretPath, "--read-only", tool,
                                                        "--read-only", runtime, "--keychain-group", "group.shared", "--", "/bin/sh"])
        func run(_ line: String) -> (output: [String], status: Int?) {
            shell.send("{ \(line); } 2>&1; echo \"@@ $?\"\n")
            var output: [String] = []
            while let next = shell.nextLine(timeout: 30) {
                if next.hasPrefix("@@ ") { return (output, Int(next.dropFirst(3))) }
                output.append(next)
            }
            return (output + ["(no answer; launch stderr: \(shell.standardError))"], nil)
        }
        let keychain = "\(tool)/sandboxctl keychain"
        #expect(run("printf mine | \(keychain) add \(Self.bundle) --service token --account me").status == 0)
        #expect(run("printf both | \(keychain) add group.shared --service shared --account me --accessible after-first-unlock").status == 0)
        #expect(run("\(keychain) find \(Self.bundle) --service token; echo").output == ["mine"])
        let other = run("\(keychain) find com.example.other --service token")
        #expect(other.status == 77 && other.output.joined().contains("errSecMissingEntitlement (-34018)"), "\(other)")
        #expect(run("\(keychain) list group.shared").output == ["shared  me  after-first-unlock"])
        // The owner sees the app's items where it put them.
        #expect(try sandboxctl(test, ["keychain", "find", Self.bundle, "--service", "token"]).stdout == "mine")
        #expect(try sandboxctl(test, ["keychain", "find", "group.shared", "--service", "shared"]).stdout == "both")

        #expect(try sandboxctl(test, ["lock"]).status == 0)
        let locked = run("\(keychain) find \(Self.bundle) --service token")
        #expect(locked.status == 77 && locked.output.joined().contains("errSecInteractionNotAllowed (-25308)"), "\(locked)")
        #expect(run("\(keychain) find group.shared --service shared; echo").output == ["both"])
        try MountedDevice.unlock(test)
        #expect(run("\(keychain) find \(Self.bundle) --service token; echo").output == ["mine"])
        shell.send("exit 0\n")
        #expect(shell.waitForExit(timeout: 30) == 0)

        // Nor can a launch show the device's folder, where the keychain's database is, read-only.
        for path in [test.root, (test.root as NSString).deletingLastPathComponent, Keychain.folder(root: test.root)] {
            let refused = try CLI.run(["launch", Self.bundle, "--root", test.root, "--device-secret", test.secretPath, "--read-only", path, "--", "/bin/true"])
            #expect(refused.status == 64 && refused.stderr.contains("device's folder"), "\(path): \(refused)")
        }
    }
}
