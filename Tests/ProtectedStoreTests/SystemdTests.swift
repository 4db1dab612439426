import CSupport
import Foundation
@testable import ProtectedStore
import Testing
import SuiteThreads

/// `sandboxctl setup systemd` and the daemon's socket activation, with systemd's own tools where they exist
/// (`systemd-analyze`, `systemd-socket-activate`); no running systemd is needed.
@Suite("systemd", .ownThread)
struct SystemdTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let unitNames = ["sandboxctl.socket", "sandboxctl.service", "sandboxctl-mount@.service"]

    @Test("the units in systemd/ are what `setup systemd --user` writes for /usr/bin/sandboxctl and the default root")
    func shippedUnits() throws {
        let directory = TemporaryDirectory()
        let result = try CLI.run(["setup", "systemd", "--user", "--unit-directory", directory.path, "--executable", "/usr/bin/sandboxctl"])
        #expect(result.status == 0, "\(result.stderr)")
        for name in Self.unitNames {
            let written = try String(contentsOfFile: directory.file(name), encoding: .utf8)
            let shipped = try String(contentsOf: Self.repository.appendingPathComponent("systemd/\(name)"), encoding: .utf8)
            #expect(written == shipped, "systemd/\(name) is out of date: run `sandboxctl setup systemd --user --unit-directory systemd --executable /usr/bin/sandboxctl`")
        }
        let dryRun = try CLI.run(["setup", "systemd", "--user", "--dry-run", "--unit-directory", directory.file("none")])
        #expect(dryRun.status == 0 && dryRun.stdout.contains("ListenStream=%h/.local/share/sandboxctl/daemon.sock"))
        #expect(!FileManager.default.fileExists(atPath: directory.file("none")), "--dry-run wrote something")
    }

    @Test("systemd-analyze verify accepts the units written for this sandboxctl, a mount instance included; it rejects a broken one",
          .enabled(if: FUSEAvailability.executable("systemd-analyze") != nil, "systemd-analyze is not installed"))
    func verify() throws {
        let test = try TestDevice()
        let units = TemporaryDirectory()
        let written = try sandboxctl(test, ["setup", "systemd", "--user", "--unit-directory", units.path])
        #expect(written.status == 0, "\(written.stderr)")
        #expect(try String(contentsOfFile: units.file("sandboxctl.socket"), encoding: .utf8).contains("ListenStream=\(test.root)/daemon.sock"))
        try FileManager.default.copyItem(atPath: units.file("sandboxctl-mount@.service"), toPath: units.file("sandboxctl-mount@com.example.test.service"))
        let runtime = TemporaryDirectory()
        chmod(runtime.path, 0o700)
        let analyze = URL(fileURLWithPath: FUSEAvailability.executable("systemd-analyze")!)
        let files = ["sandboxctl.socket", "sandboxctl.service", "sandboxctl-mount@com.example.test.service"].map(units.file)
        let verified = try CLI.run(executable: analyze, ["verify", "--user"] + files, environment: ["XDG_RUNTIME_DIR": runtime.path])
        #expect(verified.status == 0, "\(verified.stdout)\(verified.stderr)")
        // The check can fail: a unit whose program does not exist is refused.
        let broken = try String(contentsOfFile: units.file("sandboxctl.service"), encoding: .utf8)
            .replacingOccurrences(of: CLI.executable.path, with: "/nonexistent/sandboxctl")
        try broken.write(toFile: units.file("sandboxctl.service"), atomically: true, encoding: .utf8)
        let refused = try CLI.run(executable: analyze, ["verify", "--user", units.file("sandboxctl.service")], environment: ["XDG_RUNTIME_DIR": runtime.path])
        #expect(refused.status != 0)
    }

    /// The daemon started as systemd starts it for sandboxctl.socket: a listening socket at `socket` (mode `mode`)
    /// as descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` its own pid (set by a shell that then execs it). Its output goes
    /// to `log`; returns its pid.
    private func activate(_ test: TestDevice, socket: String, mode: mode_t, log: String) throws -> pid_t {
        let listener = ps_unix_listen(socket, 16)
        try #require(listener >= 0, "cannot listen on \(socket)")
        defer { close(listener) }
        chmod(socket, mode)
        let output = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        defer { close(output) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, listener, 3)
        posix_spawn_file_actions_adddup2(&actions, output, 1)
        posix_spawn_file_actions_adddup2(&actions, output, 2)
        let arguments = ["/bin/sh", "-c", "LISTEN_PID=$$ exec \"$0\" \"$@\"", CLI.executable.path, "daemon", "--grace", "1",
                         "--root", test.root, "--device-secret", test.secretPath]
        var argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var environment = childEnvironment(["LISTEN_FDS": "1"]).map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { environment.forEach { free($0) } }
        var pid: pid_t = 0
        try #require(posix_spawn(&pid, "/bin/sh", &actions, nil, &argv, &environment) == 0)
        return pid
    }

    /// The exit status of `pid`, or nil if it is still running after `timeout` seconds.
    private func exitStatus(_ pid: pid_t, timeout: TimeInterval = 20) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        var status: Int32 = 0
        while Date() < deadline {
            if waitpid(pid, &status, WNOHANG) == pid { return (status >> 8) & 0xff }
            usleep(20_000)
        }
        return nil
    }

    private func text(_ path: String) -> String { (try? String(contentsOfFile: path, encoding: .utf8)) ?? "" }

    @Test("socket activation: the daemon takes over the socket systemd made, serves lock and unlock, and leaves the socket to systemd")
    func socketActivation() throws {
        let test = try TestDevice()
        let socket = "\(test.root)/daemon.sock", log = test.path("daemon.log")
        let daemon = try activate(test, socket: socket, mode: 0o600, log: log)
        var exited = false
        defer { if !exited { kill(daemon, SIGKILL); _ = exitStatus(daemon) } }
        let status = try sandboxctl(test, ["status", "--json"])
        #expect(status.status == 0 && status.stdout.contains("beforeFirstUnlock"), "\(status.stderr)\(text(log))")
        try MountedDevice.unlock(test)
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        #expect(text(log).contains("(from systemd)"), "\(text(log))")
        kill(daemon, SIGTERM)
        let stopped = exitStatus(daemon)
        exited = stopped != nil
        #expect(stopped == 0, "\(text(log))")
        var info = stat()
        #expect(lstat(socket, &info) == 0 && info.st_mode & S_IFMT == S_IFSOCK, "the socket is systemd's: it stays")
        // Started by hand afterwards, the daemon replaces that socket, as any a stopped daemon left.
        let byHand = try DaemonProcess(test, grace: 1)
        defer { _ = byHand }
        #expect(try sandboxctl(test, ["status"]).status == 0)
    }

    @Test("socket activation refuses a socket others can use, or one at another path than the device's, and says what to set")
    func socketActivationRefusals() throws {
        let test = try TestDevice()
        let openLog = test.path("open.log")
        let open = try activate(test, socket: "\(test.root)/daemon.sock", mode: 0o666, log: openLog)
        #expect(exitStatus(open) == 77, "refused as a data-protection matter: the socket would let others in")
        #expect(text(openLog).contains("SocketMode=0600"), "\(text(openLog))")

        unlink("\(test.root)/daemon.sock")
        let misplacedLog = test.path("misplaced.log")
        let misplaced = try activate(test, socket: test.path("other.sock"), mode: 0o600, log: misplacedLog)
        #expect(exitStatus(misplaced) != 0)
        #expect(text(misplacedLog).contains("ListenStream=\(test.root)/daemon.sock"), "\(text(misplacedLog))")
    }

    @Test("init --seal-secret systemd-creds: no plain secret on disk; the device opens on this machine, also in the daemon; not with another host key; erase removes it",
          .enabled(if: FUSEAvailability.executable("systemd-creds") != nil, "systemd-creds is not installed"))
    func sealedDeviceSecret() throws {
        let directory = TemporaryDirectory()
        let creds = URL(fileURLWithPath: FUSEAvailability.executable("systemd-creds")!)
        // Host keys of our own (systemd-creds reads the path from SYSTEMD_CREDENTIAL_SECRET): this machine's and another's.
        for key in ["host.secret", "other.secret"] {
            let setup = try CLI.run(executable: creds, ["setup"], environment: ["SYSTEMD_CREDENTIAL_SECRET": directory.file(key)])
            #expect(setup.status == 0, "\(setup.stderr)")
        }
        let root = directory.file("root"), state = directory.file("state")
        let here = ["SYSTEMD_CREDENTIAL_SECRET": directory.file("host.secret"), "XDG_STATE_HOME": state]
        let created = try CLI.run(["init", "--root", root, "--kdf", "fast", "--passcode-stdin", "--seal-secret", "systemd-creds"], stdin: "pw\n", environment: here)
        #expect(created.status == 0, "\(created.stderr)")
        let secrets = (FileManager.default.enumerator(atPath: state)?.allObjects as? [String] ?? []).filter { $0.contains(".secret") && !$0.hasSuffix(".binding") }
        #expect(secrets.count == 1 && secrets[0].hasSuffix(".secret.cred"), "only the sealed secret is on disk (beside its passcode binding): \(secrets)")

        #expect(try CLI.run(["create", "com.example.sealed", "--root", root], environment: here).status == 0)
        #expect(try CLI.run(["put", "--passcode-stdin", "-", "com.example.sealed:Documents/a.txt", "--root", root], stdin: "pw\nsealed\n", environment: here).status == 0)
        #expect(try CLI.run(["cat", "--passcode-stdin", "com.example.sealed:Documents/a.txt", "--root", root], stdin: "pw\n", environment: here).stdout == "sealed\n")
        // The daemon unseals it at start.
        let daemon = try SpawnedProcess(CLI.executable, ["daemon", "--grace", "1", "--root", root], environment: here)
        #expect(eventually(timeout: 20) { Device.isDaemonRunning(root: root) }, "\(daemon.standardError)")
        #expect(try CLI.run(["unlock", "--passcode-stdin", "--root", root], stdin: "pw\n", environment: here).status == 0)
        #expect(try CLI.run(["cat", "com.example.sealed:Documents/a.txt", "--root", root], environment: here).stdout == "sealed\n")
        daemon.signal(SIGTERM)
        #expect(daemon.waitForExit(timeout: 20) == 0)

        // The root and the sealed secret copied to a machine with another host key: nothing opens.
        let elsewhere = try CLI.run(["status", "--root", root], environment: ["SYSTEMD_CREDENTIAL_SECRET": directory.file("other.secret"), "XDG_STATE_HOME": state])
        #expect(elsewhere.status == 65 && elsewhere.stderr.contains("could not unseal"), "\(elsewhere.stderr)")

        let erased = try CLI.run(["erase", "--passcode-stdin", "--root", root], stdin: "pw\n", environment: here)
        #expect(erased.status == 0, "\(erased.stderr)")
        #expect((FileManager.default.enumerator(atPath: state)?.allObjects as? [String] ?? []).allSatisfy { !$0.contains(".secret") }, "erase removed the sealed secret")

        // Without systemd-creds, asking for it fails before anything is made.
        let missing = try CLI.run(["init", "--root", directory.file("root2"), "--kdf", "fast", "--passcode-stdin", "--seal-secret", "systemd-creds"],
                                  stdin: "pw\n", environment: ["PATH": "/nonexistent", "XDG_STATE_HOME": state])
        #expect(missing.status == 1 && missing.stderr.contains("systemd-creds is not installed"), "\(missing.stderr)")
        #expect(!FileManager.default.fileExists(atPath: directory.file("root2")))
    }

    @Test("mount without a mount point takes it from mounts.conf, and says where to add one when it is missing")
    func mountPointFromConfiguration() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let config = TemporaryDirectory()
        let missing = try CLI.run(["mount", TestDevice.bundleIdentifier, "--root", test.root, "--device-secret", test.secretPath],
                                  environment: ["XDG_CONFIG_HOME": config.path])
        #expect(missing.status == 64 && missing.stderr.contains("mounts.conf") && missing.stderr.contains(TestDevice.bundleIdentifier), "\(missing.stderr)")
        try FileManager.default.createDirectory(atPath: config.file("sandboxctl"), withIntermediateDirectories: true)
        try "# comment\ncom.example.other /elsewhere\n\(TestDevice.bundleIdentifier) \(test.path("mnt"))  # mine\n"
            .write(toFile: config.file("sandboxctl/mounts.conf"), atomically: true, encoding: .utf8)
        // The configured mount point is used: it does not exist yet, and the error names it.
        let configured = try CLI.run(["mount", TestDevice.bundleIdentifier, "--root", test.root, "--device-secret", test.secretPath],
                                     environment: ["XDG_CONFIG_HOME": config.path])
        #expect(configured.stderr.contains(test.path("mnt")), "\(configured.stderr)")
    }
}
