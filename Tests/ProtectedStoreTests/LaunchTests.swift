import Foundation
@testable import ProtectedStore
import ProtectedStoreDaemon
import Testing
import SuiteThreads

/// Whether apps can be launched here: FUSE for the container, bubblewrap for the sandbox.
enum LaunchAvailability {
    static let problem: String? = FUSEAvailability.problem ?? (FUSEAvailability.executable("bwrap") == nil ? "bubblewrap is not installed (apt-get install bubblewrap)" : nil)

    static var isAvailable: Bool { canRun("launch tests", unless: problem) }
}

/// `sandboxctl launch`: a real bubblewrap sandbox around a real shell, its container mounted as HOME.
@Suite("sandboxctl launch", .ownThread, .enabled(if: LaunchAvailability.isAvailable, "needs FUSE and bubblewrap"))
struct LaunchTests {
    static let other = "com.example.other"

    /// A device with two containers and a daemon, unlocked, with a class A and a class C file in the app's Documents.
    func device(_ bundle: String) throws -> (TestDevice, DaemonProcess) {
        let test = try TestDevice()
        _ = try test.makeContainer(bundle)
        _ = try test.makeContainer(Self.other)
        let daemon = try DaemonProcess(test, grace: 1)
        try MountedDevice.unlock(test)
        for (path, protection, text) in [("a.txt", "complete", "class A"), ("c.txt", "complete-until-first-user-authentication", "class C")] {
            let put = try sandboxctl(test, ["put", "--protection", protection, "-", "\(bundle):Documents/\(path)"], stdin: text + "\n")
            #expect(put.status == 0, "\(put.stderr)")
        }
        let secret = try sandboxctl(test, ["put", "-", "\(Self.other):Documents/other.txt"], stdin: "another app's\n")
        #expect(secret.status == 0, "\(secret.stderr)")
        return (test, daemon)
    }

    /// The folder of the Swift runtime this build links, for running sandboxctl itself inside the sandbox.
    static var swiftRuntimeFolder: String? {
        // /proc files report no size, so they are read to their end rather than by their size.
        let maps = String(decoding: FileHandle(forReadingAtPath: "/proc/self/maps")?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
        return maps.split(separator: "\n").compactMap { line in line.split(separator: " ").last.map(String.init) }
            .first { $0.hasSuffix("/libswiftCore.so") }.map { ($0 as NSString).deletingLastPathComponent }
    }

    func launch(_ test: TestDevice, _ bundle: String, _ extra: [String] = [], _ command: [String]) throws -> SpawnedProcess {
        try SpawnedProcess(CLI.executable, ["launch", bundle, "--root", test.root, "--device-secret", test.secretPath] + extra + ["--"] + command)
    }

    /// `sandboxctl watch --json` run as the app inside its sandbox (this build and its Swift runtime shown read-only).
    func launchWatch(_ test: TestDevice, _ bundle: String, _ watchArguments: [String] = [], launchArguments: [String] = []) throws -> SpawnedProcess {
        let tool = CLI.executable.deletingLastPathComponent().path
        let runtime = try #require(Self.swiftRuntimeFolder)
        return try launch(test, bundle, ["--read-only", tool, "--read-only", runtime] + launchArguments, ["\(tool)/sandboxctl", "watch", "--json"] + watchArguments)
    }

    /// Runs one line in the launched shell; returns its output lines and status.
    func run(_ shell: SpawnedProcess, _ line: String) -> (output: [String], status: Int?) {
        shell.send("{ \(line); } 2>&1; echo \"@@ $?\"\n")
        var output: [String] = []
        while let next = shell.nextLine(timeout: 30) {
            if next.hasPrefix("@@ ") { return (output, Int(next.dropFirst(3))) }
            output.append(next)
        }
        return (output + ["(no answer; launch stderr: \(shell.standardError))"], nil)
    }

    private func isMounted(_ bundle: String) -> Bool {
        String(decoding: FileHandle(forReadingAtPath: "/proc/mounts")?.readDataToEndOfFile() ?? Data(), as: UTF8.self).contains("sandboxctl:\(bundle) ")
    }

    /// `sandboxctl launch` with the device options before the program's `--`.
    private func launchNow(_ test: TestDevice, _ bundle: String, environment: [String: String] = [:]) throws -> CLI.Result {
        try CLI.run(["launch", bundle, "--root", test.root, "--device-secret", test.secretPath, "--", "/bin/true"], environment: environment)
    }

    @Test("inside, the container is HOME and nothing else of the device is there; its files read and write, the Inbox refuses writes, a lock from inside fails")
    func sandboxView() throws {
        let bundle = "com.example.launch.view"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let tool = CLI.executable.deletingLastPathComponent().path
        let runtime = try #require(Self.swiftRuntimeFolder)
        let shell = try launch(test, bundle, ["--read-only", tool, "--read-only", runtime, "--env", "EXTRA=yes"], ["/bin/sh"])
        #expect(run(shell, "echo $HOME $TMPDIR $SANDBOXCTL_BUNDLE $EXTRA").output == ["/home/app /home/app/tmp \(bundle) yes"])
        #expect(run(shell, "cat Documents/a.txt Documents/c.txt").output == ["class A", "class C"])
        #expect(run(shell, "echo made > Documents/made.txt").status == 0)
        #expect(try sandboxctl(test, ["cat", "\(bundle):Documents/made.txt"]).stdout == "made\n")
        let inbox = run(shell, "echo x > Documents/Inbox/x.txt")
        #expect(inbox.status != 0 && inbox.output.joined().contains("Permission denied"), "\(inbox)")
        // Nothing of the device or the user outside: the root (keybag, other containers, the daemon's socket), /root.
        for path in [test.root, "\(test.root)/daemon.sock", "\(test.root)/keybag", test.secretPath, "/root"] {
            #expect(run(shell, "test -e '\(path)'").status == 1, "\(path) is visible inside")
        }
        #expect(run(shell, "grep -c '\(Self.other)' /proc/mounts").output == ["0"])
        // No network but its own loopback.
        #expect(run(shell, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").output == ["lo"])
        // The daemon's control socket is unreachable: a lock from inside finds no daemon (exit 69).
        let lock = run(shell, "\(tool)/sandboxctl lock --root '\(test.root)'")
        #expect(lock.status == 69, "\(lock)")
        #expect(try sandboxctl(test, ["status"]).stdout.contains("unlocked"))

        // A lock outside reaches the app's files at once: class A refused, class C readable, class B creatable.
        #expect(run(shell, "mkdir Documents/b && setfattr -n user.protection.class -v complete-unless-open Documents/b").status == 0)
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        let locked = run(shell, "cat Documents/a.txt")
        #expect(locked.status == 1 && locked.output.joined().contains("Operation not permitted"), "\(locked)")
        #expect(run(shell, "cat Documents/c.txt").output == ["class C"])
        #expect(run(shell, "echo while locked > Documents/b/new.txt").status == 0)
        try MountedDevice.unlock(test)
        #expect(run(shell, "cat Documents/a.txt Documents/b/new.txt").output == ["class A", "while locked"])

        shell.send("exit 7\n")
        #expect(shell.waitForExit(timeout: 30) == 7, "the program's status is launch's")
        #expect(!isMounted(bundle), "the container is unmounted when the app exits")
    }

    @Test("one instance per bundle; ps lists it; terminate ends it and its mount")
    func oneInstanceAndTerminate() throws {
        let bundle = "com.example.launch.single"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launch(test, bundle, ["--launch-timeout", "5"], ["/bin/sh", "-c", "echo started; exec sleep 600"])
        #expect(app.nextLine(timeout: 30) == "started", "\(app.standardError)")
        let listed = try sandboxctl(test, ["ps", "--json"])
        let apps = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
        #expect(apps.count == 1)
        #expect(apps.first?["bundle"] as? String == bundle)
        #expect(apps.first?["pid"] as? Int == Int(app.pid))
        #expect(apps.first?["state"] as? String == "inactive", "a program with no observer: inactive until its launch timeout")
        #expect(eventually(timeout: 30) { (try? sandboxctl(test, ["ps", "--json"]).stdout.contains("\"state\":\"active\"")) == true }, "then active")

        let second = try launchNow(test, bundle)
        #expect(second.status == 1)
        #expect(second.stderr.contains("already running (pid \(app.pid))"), "\(second.stderr)")

        let terminated = try sandboxctl(test, ["terminate", bundle])
        #expect(terminated.status == 0, "\(terminated.stderr)")
        #expect(app.waitForExit(timeout: 30) == 128 + SIGTERM)
        #expect(!isMounted(bundle))
        #expect(try sandboxctl(test, ["ps"]).stdout == "No apps running.\n")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 1, "nothing left to terminate")
    }

    /// The next JSON line `sandboxctl watch --json` printed inside the sandbox: its event and application state.
    func nextEvent(_ app: SpawnedProcess, timeout: TimeInterval = 30) -> (event: String, applicationState: String)? {
        guard let line = app.nextLine(timeout: timeout),
              let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
              let event = object["event"] as? String else { return nil }
        return (event, object["applicationState"] as? String ?? "")
    }

    /// The events an app's observer gets first: will and did finish launching, then did become active, inactive until it.
    func expectLaunchEvents(_ app: SpawnedProcess, sourceLocation: SourceLocation = #_sourceLocation) {
        let events = (0..<3).compactMap { _ in nextEvent(app) }
        #expect(events.map(\.event) == ["willFinishLaunching", "didFinishLaunching", "didBecomeActive"], "\(app.standardError)", sourceLocation: sourceLocation)
        #expect(events.map(\.applicationState) == ["inactive", "inactive", "active"], sourceLocation: sourceLocation)
    }

    private func processStates(_ sandboxPID: Int) -> [String] {
        AppProcesses.inSandbox(of: pid_t(sandboxPID)).compactMap { pid in
            let status = String(decoding: FileHandle(forReadingAtPath: "/proc/\(pid)/status")?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
            return status.split(separator: "\n").first { $0.hasPrefix("State:") }.map { String($0.dropFirst(6).trimmingCharacters(in: .whitespaces).prefix(1)) }
        }
    }

    @Test("the README's walk-through: launch events, an interruption, the background, nothing while frozen, the net change and did-become-active after resume, a suspended app ended without notice")
    func lifecycle() throws {
        let bundle = "com.example.launch.life"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle)
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)

        // An interruption: inactive, then active again.
        #expect(try sandboxctl(test, ["interrupt", bundle]).stdout == "\(bundle) is inactive.\n")
        let interrupted = nextEvent(app)
        #expect(interrupted?.event == "willResignActive" && interrupted?.applicationState == "active", "\(String(describing: interrupted))")
        #expect(try sandboxctl(test, ["interrupt", bundle, "--end"]).stdout == "\(bundle) is active.\n")
        let back = nextEvent(app)
        #expect(back?.event == "didBecomeActive" && back?.applicationState == "active", "\(String(describing: back))")

        #expect(try sandboxctl(test, ["suspend", bundle, "--background-time", "10"]).status == 0)
        let resign = nextEvent(app)
        #expect(resign?.event == "willResignActive" && resign?.applicationState == "active", "\(String(describing: resign))")
        let background = nextEvent(app)
        #expect(background?.event == "didEnterBackground" && background?.applicationState == "background", "\(app.standardError)")
        let listed = try sandboxctl(test, ["ps", "--json"])
        let entry = try #require((try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])?.first)
        #expect(entry["state"] as? String == "suspended")
        let sandboxPID = try #require(entry["sandboxPID"] as? Int)
        if entry["freezer"] as? String == "cgroup" {
            #expect(processStates(sandboxPID).allSatisfy { $0 != "T" }, "frozen, not stopped with a signal the app could see")
            #expect(try cgroupEvents(of: sandboxPID).contains("frozen 1"))
        } else {
            #expect(processStates(sandboxPID).allSatisfy { $0 == "T" }, "every process of the app is stopped")
        }

        // A lock and an unlock while it is stopped: the lock does not wait for it, and it is sent nothing.
        let lockStart = Date()
        #expect(try sandboxctl(test, ["lock", "--grace", "20"]).status == 0)
        #expect(Date().timeIntervalSince(lockStart) < 15, "the lock waited for a suspended app")
        try MountedDevice.unlock(test)
        #expect(app.nextLine(timeout: 1) == nil, "a suspended app printed something")

        #expect(try sandboxctl(test, ["resume", bundle]).status == 0)
        // It last saw did-become-available; a lock came and went: one event for the net change, did, after
        // will-enter-foreground (its class A files opened before the lock were revoked).
        let resumed = (0..<3).compactMap { _ in nextEvent(app) }
        #expect(resumed.map(\.event) == ["willEnterForeground", "didBecomeAvailable", "didBecomeActive"], "\(resumed)")
        #expect(app.nextLine(timeout: 1) == nil, "one event per kind")
        #expect(resumed.map(\.applicationState) == ["background", "inactive", "active"], "still in the background while it handles will-enter-foreground")
        #expect(processStates(sandboxPID).allSatisfy { $0 != "T" })
        #expect(try !cgroupEvents(of: sandboxPID).contains("frozen 1"))

        // As the README ends it: suspended again, then terminated: killed without notice.
        #expect(try sandboxctl(test, ["suspend", bundle]).status == 0)
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(app.waitForExit(timeout: 30) == 128 + SIGKILL)
        #expect(app.nextLine(timeout: 1) == nil, "a suspended app is sent no will-terminate")
    }

    /// The lines of `cgroup.events` of the cgroup the sandbox's first process is in (v2 hierarchy).
    private func cgroupEvents(of sandboxPID: Int) throws -> [String] {
        try String(contentsOfFile: cgroupFolder(of: sandboxPID) + "/cgroup.events", encoding: .utf8).split(separator: "\n").map(String.init)
    }

    private func cgroupFolder(of sandboxPID: Int) throws -> String {
        let line = try #require(try String(contentsOfFile: "/proc/\(sandboxPID)/cgroup", encoding: .utf8).split(separator: "\n").first { $0.hasPrefix("0::") })
        let mount = try #require(String(decoding: FileHandle(forReadingAtPath: "/proc/self/mountinfo")?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
            .split(separator: "\n").first { $0.contains(" - cgroup2 ") }?.split(separator: " ")[4])
        return String(mount) + line.dropFirst(3)
    }

    /// The CPU time the app's cgroup has used, in microseconds (`cpu.stat`, a core file of every v2 cgroup).
    private func cpuMicroseconds(of sandboxPID: Int) throws -> Int {
        let stat = try String(contentsOfFile: cgroupFolder(of: sandboxPID) + "/cpu.stat", encoding: .utf8)
        return try #require(stat.split(separator: "\n").first { $0.hasPrefix("usage_usec ") }.flatMap { Int($0.dropFirst(11)) })
    }

    @Test("the freezer: an app forking in a loop uses no CPU while suspended and sees no signal; ended while suspended, its SIGTERM handler never runs")
    func freezer() throws {
        let bundle = "com.example.launch.freezer"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        // A SIGTERM handler that would leave a marker, and a loop forking children that fork too.
        let script = "trap 'echo handled > $HOME/Documents/terminated; exit 0' TERM; trap 'echo cont > $HOME/Documents/continued' CONT; echo started; "
            + "while true; do (sh -c 'i=0; while [ $i -lt 200 ]; do i=$((i+1)); done' &); sleep 0.01; done"
        let app = try launch(test, bundle, [], ["/bin/sh", "-c", script])
        #expect(app.nextLine(timeout: 30) == "started", "\(app.standardError)")
        let suspended = try sandboxctl(test, ["suspend", bundle])
        #expect(suspended.status == 0 && suspended.stdout.contains("Suspended"), "\(suspended.stdout)\(suspended.stderr)")
        let entry = try #require((try JSONSerialization.jsonObject(with: Data(try sandboxctl(test, ["ps", "--json"]).stdout.utf8)) as? [[String: Any]])?.first)
        #expect(entry["state"] as? String == "suspended")
        let sandboxPID = try #require(entry["sandboxPID"] as? Int)
        guard entry["freezer"] as? String == "cgroup" else {
            print("freezer test: the daemon has no cgroup of its own here (freezer \(entry["freezer"] ?? "none")): only the SIGSTOP fallback ran")
            #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
            return
        }
        let processes = AppProcesses.inSandbox(of: pid_t(sandboxPID)).count
        let before = try cpuMicroseconds(of: sandboxPID)
        Thread.sleep(forTimeInterval: 2)
        #expect(try cpuMicroseconds(of: sandboxPID) == before, "a frozen app ran")
        #expect(AppProcesses.inSandbox(of: pid_t(sandboxPID)).count == processes, "a process was forked while frozen")
        #expect(processStates(sandboxPID).allSatisfy { $0 != "T" })

        let terminated = try sandboxctl(test, ["terminate", bundle])
        #expect(terminated.status == 0, "\(terminated.stderr)")
        #expect(app.waitForExit(timeout: 30) == 128 + SIGKILL, "killed while frozen, not asked")
        let left = try sandboxctl(test, ["ls", "\(bundle):Documents"])
        #expect(!left.stdout.contains("terminated") && !left.stdout.contains("continued"), "a handler of the suspended app ran: \(left.stdout)")
        let group = try cgroupFolder(of: Int(daemon.spawned.pid)) + "/sandboxctl-app-\(bundle)-\(sandboxPID)"
        #expect(eventually(timeout: 10) { !FileManager.default.fileExists(atPath: group) }, "the app's cgroup \(group) is removed")
    }

    @Test("an app whose did-enter-background outlives its background time is ended, never frozen mid-work; a lock then waits for nothing")
    func backgroundTimeRunsOut() throws {
        let bundle = "com.example.launch.overrun"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle, ["--background-work", "20"])
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)
        let suspended = try sandboxctl(test, ["suspend", bundle, "--background-time", "1"])
        #expect(suspended.status == 0, "\(suspended.stderr)")
        #expect(suspended.stdout.contains("Ended \(bundle)") && suspended.stdout.contains("background time (1.0 s)"), "\(suspended.stdout)")
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        #expect(app.waitForExit(timeout: 30) == 128 + SIGKILL)
        let lockStart = Date()
        #expect(try sandboxctl(test, ["lock", "--grace", "20"]).status == 0)
        #expect(Date().timeIntervalSince(lockStart) < 15, "the lock waited for an ended app")
    }

    @Test("a background task extends the background time: the suspension waits for its end; one never ended is expired, then the app is ended")
    func backgroundTasks() throws {
        let bundle = "com.example.launch.tasks"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle, ["--background-task", "3"])
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)
        let suspend = try SpawnedProcess(CLI.executable, ["suspend", bundle, "--background-time", "1", "--root", test.root, "--device-secret", test.secretPath])
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        let began = try #require(app.nextLine(timeout: 30))
        let remaining = try #require((try JSONSerialization.jsonObject(with: Data(began.utf8)) as? [String: Any])?["remaining"] as? Double, "\(began)")
        #expect(remaining > 0 && remaining <= 30, "\(began)")
        let during = try #require((try JSONSerialization.jsonObject(with: Data(try sandboxctl(test, ["ps", "--json"]).stdout.utf8)) as? [[String: Any]])?.first)
        #expect(during["state"] as? String == "background", "the task holds off the suspension")
        #expect(suspend.nextLine(timeout: 30) == "Suspended \(bundle).", "\(suspend.standardError)")
        #expect(suspend.waitForExit(timeout: 30) == 0)
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(app.waitForExit(timeout: 30) == 128 + SIGKILL)

        // A task never ended, with 4 s at most: its expiration handler runs, then the app is ended.
        let stuck = try launchWatch(test, bundle, ["--background-task", "0"], launchArguments: ["--background-task-time", "4"])
        #expect(eventually(timeout: 30) { stuck.standardError.contains("Watching \(bundle) as the app") }, "\(stuck.standardError)")
        expectLaunchEvents(stuck)
        let ended = try sandboxctl(test, ["suspend", bundle, "--background-time", "1"])
        #expect(ended.stdout.contains("Ended \(bundle): its background tasks (watch) were not ended"), "\(ended.stdout)\(ended.stderr)")
        let events = (0..<4).compactMap { _ in nextEvent(stuck)?.event }
        #expect(events == ["willResignActive", "didEnterBackground", "backgroundTaskBegan", "backgroundTaskExpiring"], "\(events)")
        #expect(stuck.waitForExit(timeout: 30) == 128 + SIGKILL)
    }

    @Test("sandboxctl open: launches a stopped app with the item as its launch option; brings a suspended one to the front (will enter foreground, the URL, did become active); bad input changes nothing")
    func open() throws {
        let bundle = "com.example.launch.open"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let file = test.path("invoice.txt")
        try Data("an invoice\n".utf8).write(to: URL(fileURLWithPath: file))

        let unknown = try sandboxctl(test, ["open", "com.example.missing", "--deliver", file])
        #expect(unknown.status == 1 && unknown.stderr.contains("com.example.missing"), "\(unknown.stderr)")
        let notRunning = try sandboxctl(test, ["open", bundle, "--deliver", file])
        #expect(notRunning.status == 1 && notRunning.stderr.contains("-- COMMAND"), "\(notRunning.stderr)")
        #expect(try sandboxctl(test, ["open", bundle]).status == 64)
        #expect(try sandboxctl(test, ["inbox", "list", bundle, "--json"]).stdout.contains("invoice") == false, "a refused open delivered nothing")

        let tool = CLI.executable.deletingLastPathComponent().path
        let runtime = try #require(Self.swiftRuntimeFolder)
        let app = try SpawnedProcess(CLI.executable, ["open", bundle, "--deliver", file, "--from", "com.example.mail", "--root", test.root, "--device-secret", test.secretPath,
                                                       "--read-only", tool, "--read-only", runtime, "--", "\(tool)/sandboxctl", "watch", "--json"])
        let launch = (0..<2).compactMap { _ in app.nextLine(timeout: 30) }
        #expect(launch.allSatisfy { $0.contains("\"url\":\"Documents/Inbox/invoice.txt\"") && $0.contains("com.example.mail") }, "\(launch) \(app.standardError)")
        #expect(nextEvent(app)?.event == "openURL")
        #expect(nextEvent(app)?.event == "didBecomeActive")

        #expect(try sandboxctl(test, ["suspend", bundle]).status == 0)
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        let opened = try sandboxctl(test, ["open", bundle, "invoice.txt"])
        #expect(opened.status == 0 && opened.stdout.contains("Opened Documents/Inbox/invoice.txt"), "\(opened.stdout)\(opened.stderr)")
        #expect((0..<3).compactMap { _ in nextEvent(app)?.event } == ["willEnterForeground", "openURL", "didBecomeActive"])
        let missing = try sandboxctl(test, ["open", bundle, "nothing.txt"])
        #expect(missing.status == 1 && missing.stderr.contains("inbox list"), "\(missing.stderr)")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(app.waitForExit(timeout: 30) == 128 + SIGTERM)
    }

    @Test("--background-on-lock: a lock sends the app to the background and freezes it, the unlock brings it back, as an iPhone's side button")
    func backgroundOnLock() throws {
        let bundle = "com.example.launch.sidebutton"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle, launchArguments: ["--background-on-lock"])
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        #expect(eventually(timeout: 30) { (try? sandboxctl(test, ["ps", "--json"]).stdout.contains("\"state\":\"suspended\"")) == true })
        try MountedDevice.unlock(test)
        var events: [String] = []
        while events.last != "didBecomeActive", events.count < 8, let event = nextEvent(app)?.event { events.append(event) }
        #expect(events == ["willResignActive", "didEnterBackground", "willBecomeUnavailable", "willEnterForeground", "didBecomeAvailable", "didBecomeActive"], "\(events)")
        #expect(try sandboxctl(test, ["ps", "--json"]).stdout.contains("\"state\":\"active\""))
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
    }

    @Test("resume during the background time cancels the suspension: will-enter-foreground follows did-enter-background, the app stays active")
    func resumeDuringBackgroundTime() throws {
        let bundle = "com.example.launch.comeback"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle, ["--background-work", "2"])
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)
        let suspend = try SpawnedProcess(CLI.executable, ["suspend", bundle, "--background-time", "30", "--root", test.root, "--device-secret", test.secretPath])
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        let state = try #require((try JSONSerialization.jsonObject(with: Data(try sandboxctl(test, ["ps", "--json"]).stdout.utf8)) as? [[String: Any]])?.first)
        #expect(state["state"] as? String == "background", "in its background time")
        let resumed = try sandboxctl(test, ["resume", bundle])
        #expect(resumed.status == 0, "\(resumed.stderr)")
        let answer = suspend.nextLine(timeout: 30)
        #expect(answer?.contains("came back to the foreground") == true, "\(answer ?? suspend.standardError)")
        #expect(suspend.waitForExit(timeout: 30) == 0)
        let foreground = nextEvent(app)
        #expect(foreground?.event == "willEnterForeground" && foreground?.applicationState == "background", "\(String(describing: foreground))")
        #expect(nextEvent(app)?.event == "didBecomeActive")
        let after = try #require((try JSONSerialization.jsonObject(with: Data(try sandboxctl(test, ["ps", "--json"]).stdout.utf8)) as? [[String: Any]])?.first)
        #expect(after["state"] as? String == "active")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(nextEvent(app)?.event == "willTerminate")
    }

    @Test("an Inbox delivery before the launch is the app's launch option: its first observer gets the open-URL event, then it is recorded delivered")
    func inboxLaunchOption() throws {
        let bundle = "com.example.launch.inbox"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let item = test.path("report.txt")
        try Data("a report\n".utf8).write(to: URL(fileURLWithPath: item))
        let delivered = try sandboxctl(test, ["inbox", "deliver", bundle, item, "--from", "com.example.mail", "--annotation", #"{"subject":"Q3"}"#])
        #expect(delivered.status == 0, "\(delivered.stderr)")
        let app = try launchWatch(test, bundle)
        // The launch options name the item, in both launch events; then its open-URL event, then did become active.
        for name in ["willFinishLaunching", "didFinishLaunching"] {
            let line = try #require(app.nextLine(timeout: 30), "\(app.standardError)")
            let launch = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            #expect(launch["event"] as? String == name && launch["url"] as? String == "Documents/Inbox/report.txt", "\(line)")
            #expect(launch["sourceApplication"] as? String == "com.example.mail")
            #expect((launch["annotation"] as? [String: Any])?["subject"] as? String == "Q3")
        }
        let line = try #require(app.nextLine(timeout: 30), "\(app.standardError)")
        let event = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(event["event"] as? String == "openURL")
        #expect(event["path"] as? String == "Documents/Inbox/report.txt")
        #expect(event["sourceApplication"] as? String == "com.example.mail")
        #expect((event["annotation"] as? [String: Any])?["subject"] as? String == "Q3")
        #expect(nextEvent(app)?.event == "didBecomeActive")
        // Handled by the app: recorded delivered once the relay returned (the next one is asked for).
        #expect(eventually(timeout: 20) { (try? sandboxctl(test, ["inbox", "list", bundle, "--json"]).stdout.contains("\"delivered\"")) == true })
        // A delivery while it runs reaches it too.
        try Data("later\n".utf8).write(to: URL(fileURLWithPath: test.path("later.txt")))
        #expect(try sandboxctl(test, ["inbox", "deliver", bundle, test.path("later.txt")]).status == 0)
        let later = try #require(app.nextLine(timeout: 30))
        #expect(later.contains("Documents/Inbox/later.txt"), "\(later)")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(app.waitForExit(timeout: 30) == 128 + SIGTERM)
    }

    @Test("a daemon restart while the app runs: the app keeps running, hears the loss, and the new daemon's events once it is back")
    func daemonRestart() throws {
        let bundle = "com.example.launch.restart"
        let (test, daemon) = try device(bundle)
        let app = try launchWatch(test, bundle)
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)

        daemon.spawned.signal(SIGTERM)
        #expect(daemon.spawned.waitForExit(timeout: 20) == 0)
        #expect(nextEvent(app)?.event == "willBecomeUnavailable", "without the daemon, protected data is gone")
        let restarted = try DaemonProcess(test, grace: 1)
        defer { _ = restarted }
        // The launcher registers the app again, and the app's observer reconnects to its socket.
        #expect(eventually(timeout: 20) { (try? sandboxctl(test, ["ps", "--json"]).stdout.contains(bundle)) == true })
        #expect(app.process.isRunning)
        try MountedDevice.unlock(test)
        #expect(nextEvent(app)?.event == "didBecomeAvailable", "\(app.standardError)")
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        #expect(nextEvent(app)?.event == "willBecomeUnavailable")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(app.waitForExit(timeout: 30) == 128 + SIGTERM)
    }

    @Test("a daemon killed while the app is suspended: the next daemon thaws it when the launcher registers it again")
    func daemonKilledWhileSuspended() throws {
        let bundle = "com.example.launch.thaw"
        let (test, daemon) = try device(bundle)
        let app = try launch(test, bundle, [], ["/bin/sh", "-c", "echo started; exec sleep 600"])
        #expect(app.nextLine(timeout: 30) == "started", "\(app.standardError)")
        #expect(try sandboxctl(test, ["suspend", bundle]).status == 0)
        let entry = try #require((try JSONSerialization.jsonObject(with: Data(try sandboxctl(test, ["ps", "--json"]).stdout.utf8)) as? [[String: Any]])?.first)
        let sandboxPID = try #require(entry["sandboxPID"] as? Int)
        guard entry["freezer"] as? String == "cgroup" else {
            print("thaw test: no cgroup of its own here (freezer \(entry["freezer"] ?? "none")): skipped")
            return
        }
        #expect(try cgroupEvents(of: sandboxPID).contains("frozen 1"))
        daemon.spawned.signal(SIGKILL)
        _ = daemon.spawned.waitForExit(timeout: 20)
        let restarted = try DaemonProcess(test, grace: 1)
        defer { _ = restarted }
        #expect(eventually(timeout: 30) { (try? sandboxctl(test, ["ps", "--json"]).stdout.contains("\"state\":\"active\"")) == true })
        #expect(eventually(timeout: 10) { (try? cgroupEvents(of: sandboxPID).contains("frozen 0")) == true }, "registered again means running")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
        #expect(app.waitForExit(timeout: 30) == 128 + SIGTERM)
    }

    @Test("the app's own socket serves its events and nothing else: a lock through it is refused and closes it")
    func appSocketRefusesDeviceOperations() throws {
        let bundle = "com.example.launch.socket"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        // A raw client inside the sandbox: hello (answered with the bundle), then lock.
        let client = """
            import json, os, socket, struct
            s = socket.socket(socket.AF_UNIX); s.connect(os.environ["SANDBOXCTL_APP_SOCKET"])
            def call(request):
                message = json.dumps(request).encode()
                s.sendall(struct.pack(">IH", len(message) + 2, len(message)) + message)
                header = s.recv(6, socket.MSG_WAITALL)
                size, length = struct.unpack(">IH", header)
                return json.loads(s.recv(size - 2, socket.MSG_WAITALL)[:length])
            print(call({"id": 1, "op": "hello", "version": 1}).get("bundle"))
            print(call({"id": 2, "op": "lock"})["error"]["code"])
            print(s.recv(1) == b"")
            """
        let app = try launch(test, bundle, [], ["/usr/bin/python3", "-c", client])
        #expect(app.nextLine(timeout: 30) == bundle, "\(app.standardError)")
        #expect(app.nextLine(timeout: 30) == "permission-denied")
        #expect(app.nextLine(timeout: 30) == "True", "the daemon closed the connection")
        #expect(app.waitForExit(timeout: 30) == 0)
        #expect(try sandboxctl(test, ["status"]).stdout.contains("unlocked"), "the device is still unlocked")
    }

    @Test("an app flooding its own socket with connections as fast as it can: the owner's lock, unlock and status still get through")
    func appSocketFlood() throws {
        let bundle = "com.example.launch.flood"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let tool = CLI.executable.deletingLastPathComponent().path
        let runtime = try #require(Self.swiftRuntimeFolder)
        let flood = try launch(test, bundle, ["--read-only", tool, "--read-only", runtime],
                               ["\(tool)/ps-verify", "flood", "--socket", "/run/sandboxctl/app.sock", "--mode", "idle", "--open", "64"])
        #expect(eventually(timeout: 30) { (try? daemonConnections(daemon.pid)) ?? 0 >= 4 }, "\(flood.standardError)")
        let slowest = try DaemonFloodTests.ownerGetsThrough(test, rounds: 3)
        flood.closeInput()
        let line = try #require(flood.nextLine(timeout: 60), "the flood printed no report: \(flood.standardError)")
        let report = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        let made = report["connections"] as? Int ?? 0
        print("daemon floods: an app's own socket: \(made) connections at \(Int(report["perSecond"] as? Double ?? 0)) a second; 9 owner commands and 3 new connections, \(slowest)")
        #expect(made >= 1000, "the flood made only \(made) connections: it tested nothing")
        #expect(flood.waitForExit(timeout: 30) == 0)
    }

    @Test("after a lock, the launcher holds none of a class A file's plaintext the app read or wrote before it")
    func launcherHoldsNoPlaintextAfterTheLock() throws {
        let bundle = "com.example.launch.plaintext"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        // Text (put reads it as a line), random so that a copy found is a copy.
        let read = PlaintextAfterLockTests.random(600_000).base64EncodedString(), copied = PlaintextAfterLockTests.random(600_000).base64EncodedString()
        for (name, text) in [("read.txt", read), ("copied.txt", copied)] {
            let put = try sandboxctl(test, ["put", "--protection", "complete", "-", "\(bundle):Documents/\(name)"], stdin: text)
            #expect(put.status == 0, "\(put.stderr)")
        }
        let shell = try launch(test, bundle, [], ["/bin/sh"])
        #expect(run(shell, "wc -c < Documents/read.txt && cp Documents/copied.txt Documents/copy.txt && wc -c < Documents/copy.txt").output == ["\(read.utf8.count)", "\(copied.utf8.count)"])
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        let plaintexts = [Data(read.utf8), Data(copied.utf8)]
        guard PlaintextAfterLockTests.canScan(shell.pid) else { return }
        #expect(try PlaintextScan(pid: getpid(), plaintexts: plaintexts).foundBytes >= read.utf8.count + copied.utf8.count, "the scan is blind")
        let scan = try PlaintextScan(pid: shell.pid, plaintexts: plaintexts)
        print("plaintext after the lock: sandboxctl launch: \(scan.foundBytes) bytes of \(plaintexts.map(\.count).reduce(0, +)) found in \(scan.scannedBytes >> 20) MiB \(scan.found)")
        #expect(scan.foundBytes == 0, "left in the launcher after the lock: \(scan.found) at \(scan.addresses)")
        shell.send("exit 0\n")
        #expect(shell.waitForExit(timeout: 30) == 0)
    }

    @Test("an app that crashes: launch exits with its signal's status, its mount and record are gone, and it launches again")
    func crash() throws {
        let bundle = "com.example.launch.crash"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let arguments = ["launch", bundle, "--root", test.root, "--device-secret", test.secretPath, "--"]
        let crashed = try CLI.run(arguments + ["/bin/sh", "-c", "kill -SEGV $$"])
        #expect(crashed.status == 128 + SIGSEGV, "\(crashed.stderr)")
        #expect(!isMounted(bundle))
        #expect(try sandboxctl(test, ["ps"]).stdout == "No apps running.\n")
        #expect(try CLI.run(arguments + ["/bin/true"]).status == 0)
    }

    @Test("launched by root, the app is no root of the host: no capability, no host uid 0, /proc/sys unwritable, no host path, environment or key ring of ours",
          .enabled(if: getuid() == 0, "needs root: it is root's launch that is checked"))
    func rootLaunchHasNoPrivilege() throws {
        let bundle = "com.example.launch.root"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let shell = try launch(test, bundle, [], ["/bin/sh"])
        for field in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
            #expect(run(shell, "grep ^\(field): /proc/self/status | cut -f2").output == ["0000000000000000"], "\(field)")
        }
        #expect(run(shell, "id -u").output != ["0"])
        let sandboxPID = try #require(try JSONSerialization.jsonObject(with: Data(try sandboxctl(test, ["ps", "--json"]).stdout.utf8)) as? [[String: Any]]).first?["pid"] as? Int
        for pid in AppProcesses.inSandbox(of: pid_t(try #require(sandboxPID))) {
            let status = String(decoding: FileHandle(forReadingAtPath: "/proc/\(pid)/status")?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
            let ids = status.split(separator: "\n").filter { $0.hasPrefix("Uid:") || $0.hasPrefix("Gid:") }.flatMap { $0.split(separator: "\t").dropFirst() }
            #expect(ids.count == 8 && !ids.contains("0"), "process \(pid) of the sandbox runs with a host id 0: \(ids)")
        }
        // Writing the value back would change nothing, had it been allowed; core_pattern would run a program as root.
        let printk = run(shell, "v=$(cat /proc/sys/kernel/printk); echo \"$v\" > /proc/sys/kernel/printk")
        #expect(printk.status != 0 && printk.output.joined().contains("denied"), "\(printk)")
        #expect(run(shell, "test -w /proc/sys/kernel/core_pattern").status == 1)
        #expect(run(shell, "test -w /proc/sysrq-trigger").status == 1)
        // Nothing of ours in any process's environment inside (bubblewrap's, pid 1, is the sandbox's first), in the
        // mount table, or in the key rings it can see.
        let environments = run(shell, "cat /proc/[0-9]*/environ | tr '\\0' '\\n'").output
        let mounts = run(shell, "cat /proc/self/mountinfo").output
        for line in environments + mounts {
            for ours in [test.root, test.secretPath, (test.root as NSString).deletingLastPathComponent, "SANDBOXCTL_ROOT", "SANDBOXCTL_DEVICE_SECRET"] {
                #expect(!line.contains(ours), "\(line) shows \(ours)")
            }
        }
        let keys = run(shell, "cat /proc/keys")
        #expect(keys.status == 0 && !keys.output.contains { $0.hasSuffix(".0: empty") || $0.contains("_uid.0") || $0.contains("_uid_ses.0") }, "\(keys)")
        // It still works as an app: its files read and write.
        #expect(run(shell, "cat Documents/a.txt && echo made > Documents/made.txt").output == ["class A"])
        #expect(try sandboxctl(test, ["cat", "\(bundle):Documents/made.txt"]).stdout == "made\n")
        shell.send("exit 0\n")
        #expect(shell.waitForExit(timeout: 30) == 0)
    }

    @Test("bad input: no command, an unknown bundle, no daemon, no bubblewrap; each says what to do")
    func badInput() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let noCommand = try sandboxctl(test, ["launch", TestDevice.bundleIdentifier])
        #expect(noCommand.status == 64 && noCommand.stderr.contains("after --"), "\(noCommand.stderr)")
        let noDaemon = try launchNow(test, TestDevice.bundleIdentifier)
        #expect(noDaemon.status == 69, "\(noDaemon.stderr)")
        let daemon = try DaemonProcess(test, grace: 1)
        defer { _ = daemon }
        let unknown = try launchNow(test, "com.example.missing")
        #expect(unknown.status == 1 && unknown.stderr.contains("com.example.missing"), "\(unknown.stderr)")
        // The daemon registers only a sandbox the registering process started, in a PID namespace of its own: a
        // suspend of anything else would stop the host's processes, the daemon's among them.
        do {
            _ = try Device.attach(root: test.root).appRequest(.appRegister, bundle: TestDevice.bundleIdentifier, sandboxPID: getpid(),
                                                              socketPath: test.path("app.sock"))
            Issue.record("a pid of the host's PID namespace was registered as a sandbox")
        } catch let error as ProtectedStoreError {
            #expect(error.kind == .invalidArgument && error.problem.contains("not a sandbox"), "\(error)")
        }
        let noBubblewrap = try launchNow(test, TestDevice.bundleIdentifier, environment: ["PATH": "/nonexistent"])
        #expect(noBubblewrap.status == 1 && noBubblewrap.stderr.contains("apt-get install bubblewrap"), "\(noBubblewrap.stderr)")
    }
}
