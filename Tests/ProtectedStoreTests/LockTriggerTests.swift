import Foundation
@testable import ProtectedStore
import ProtectedStoreDaemon
import Testing
import SuiteThreads

/// Whether a private D-Bus and a stand-in logind can run here: dbus-daemon, and Debian's Python with dbus and gi.
enum DBusAvailability {
    static let python = "/usr/bin/python3"
    static let problem: String? = {
        guard FUSEAvailability.executable("dbus-daemon") != nil else { return "dbus-daemon is not installed (apt-get install dbus)" }
        let check = try? CLI.run(executable: URL(fileURLWithPath: python), ["-c", "import dbus, dbus.service, dbus.mainloop.glib; from gi.repository import GLib"])
        guard check?.status == 0 else { return "Debian's python3 lacks dbus or gi (apt-get install python3-dbus python3-gi)" }
        return nil
    }()

    static var isAvailable: Bool { canRun("lock trigger tests", unless: problem) }
}

/// `daemon --lock-on`: a private dbus-daemon as the system bus, and a stand-in owning org.freedesktop.login1 that
/// emits logind's signals and hands out inhibitors, as logind does.
@Suite("lock triggers (logind)", .ownThread, .enabled(if: DBusAvailability.isAvailable, "needs dbus-daemon and python3-dbus"))
struct LockTriggerTests {
    static let standIn = """
        import os, sys, dbus, dbus.service, dbus.mainloop.glib
        from gi.repository import GLib
        dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
        bus = dbus.bus.BusConnection(sys.argv[1])
        uid = int(sys.argv[2])
        name = dbus.service.BusName("org.freedesktop.login1", bus)
        SESSION = "/org/freedesktop/login1/session/_31"

        def released(fd, condition):
            print("released", flush=True)
            os.close(fd)
            return False

        class Manager(dbus.service.Object):
            @dbus.service.method("org.freedesktop.login1.Manager", in_signature="ssss", out_signature="h")
            def Inhibit(self, what, who, why, mode):
                read, write = os.pipe()
                GLib.io_add_watch(read, GLib.IO_HUP | GLib.IO_ERR, released)
                handed = dbus.types.UnixFd(write)
                os.close(write)
                print("inhibited", what, mode, flush=True)
                return handed
            @dbus.service.signal("org.freedesktop.login1.Manager", signature="b")
            def PrepareForSleep(self, starting): pass

        class Session(dbus.service.Object):
            def __init__(self, bus, path, owner):
                dbus.service.Object.__init__(self, bus, path)
                self.owner = owner
            @dbus.service.signal("org.freedesktop.login1.Session", signature="")
            def Lock(self): pass
            @dbus.service.method("org.freedesktop.DBus.Properties", in_signature="ss", out_signature="v")
            def Get(self, interface, prop):
                return dbus.Struct((dbus.UInt32(self.owner), dbus.ObjectPath("/org/freedesktop/login1/user/_%d" % self.owner)), signature="uo")
            @dbus.service.signal("org.freedesktop.DBus.Properties", signature="sa{sv}as")
            def PropertiesChanged(self, interface, changed, invalidated): pass

        manager = Manager(bus, "/org/freedesktop/login1")
        session = Session(bus, SESSION, uid)
        other = Session(bus, "/org/freedesktop/login1/session/_32", uid + 1)
        loop = GLib.MainLoop()

        def command(source, condition):
            line = sys.stdin.readline().strip()
            if line == "lock": session.Lock()
            elif line == "lock-other": other.Lock()
            elif line == "sleep": manager.PrepareForSleep(True)
            elif line == "wake": manager.PrepareForSleep(False)
            elif line == "locked-hint": session.PropertiesChanged("org.freedesktop.login1.Session", {"LockedHint": dbus.Boolean(True)}, dbus.Array([], signature="s"))
            elif line == "idle": session.PropertiesChanged("org.freedesktop.login1.Session", {"IdleHint": dbus.Boolean(True)}, dbus.Array([], signature="s"))
            else:
                loop.quit()
                return False
            print("sent", line, flush=True)
            return True

        GLib.io_add_watch(sys.stdin, GLib.IO_IN | GLib.IO_HUP, command)
        print("ready", flush=True)
        loop.run()
        """

    /// A dbus-daemon at `address`, and the stand-in on it.
    final class FakeLogind {
        let bus: SpawnedProcess
        let standIn: SpawnedProcess

        init(socket: String, script: String) throws {
            unlink(socket)
            bus = try SpawnedProcess(URL(fileURLWithPath: FUSEAvailability.executable("dbus-daemon")!),
                                     ["--session", "--nofork", "--print-address", "--address=unix:path=\(socket)"])
            try #require(bus.nextLine(timeout: 20) != nil, "dbus-daemon did not start: \(bus.standardError)")
            standIn = try SpawnedProcess(URL(fileURLWithPath: DBusAvailability.python), ["-c", script, "unix:path=\(socket)", String(getuid())])
            try #require(standIn.nextLine(timeout: 20) == "ready", "the stand-in did not start: \(standIn.standardError)")
        }

        func stop() {
            standIn.signal(SIGKILL)
            _ = standIn.waitForExit(timeout: 10)
            bus.signal(SIGTERM)
            _ = bus.waitForExit(timeout: 10)
        }

        deinit { stop() }

        /// Sends a command and returns the stand-in's lines up to its "sent" acknowledgement.
        func send(_ command: String) -> [String] {
            standIn.send(command)
            var lines: [String] = []
            while let line = standIn.nextLine(timeout: 20) {
                lines.append(line)
                if line.hasPrefix("sent") { break }
            }
            return lines
        }
    }

    private func state(_ test: TestDevice) throws -> String {
        let status = try sandboxctl(test, ["status", "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
        return object?["state"] as? String ?? "?"
    }

    private func daemonStatus(_ test: TestDevice) throws -> [String: Any] {
        let status = try sandboxctl(test, ["status", "--json"])
        return (try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])?["daemon"] as? [String: Any] ?? [:]
    }

    @Test("a session lock, a LockedHint, and sleep lock the device; sleep holds a delay inhibitor released once the keys are gone and taken again on wake; waking locks nothing; a restarted bus is followed again")
    func triggers() throws {
        let test = try TestDevice()
        let socket = test.path("system_bus")
        var logind: FakeLogind? = try FakeLogind(socket: socket, script: Self.standIn)
        let daemon = try SpawnedProcess(CLI.executable, ["daemon", "--grace", "1", "--root", test.root, "--device-secret", test.secretPath,
                                                         "--lock-on", "session-lock,sleep,idle=1"],
                                        environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=\(socket)"])
        defer { daemon.signal(SIGTERM); _ = daemon.waitForExit(timeout: 20) }
        #expect(eventually(timeout: 20) { Device.isDaemonRunning(root: test.root) })
        #expect(logind!.standIn.nextLine(timeout: 20)?.hasPrefix("inhibited sleep delay") == true, "the daemon takes a delay inhibitor for sleep")
        #expect(eventually(timeout: 20) { (try? daemonStatus(test)["lockTriggersConnected"] as? Bool) == true })
        #expect(try daemonStatus(test)["lockTriggers"] as? [String] == ["session-lock", "sleep", "idle=1"])
        #expect(try sandboxctl(test, ["status"]).stdout.contains("lock triggers:  session-lock, sleep, idle=1 (following logind"))

        try MountedDevice.unlock(test)
        _ = logind!.send("lock-other")
        Thread.sleep(forTimeInterval: 1)
        #expect(try state(test) == "unlocked", "another user's session locking locks nothing here")
        _ = logind!.send("lock")
        #expect(eventually(timeout: 20) { (try? state(test)) == "locked" }, "Session.Lock locked the device")

        try MountedDevice.unlock(test)
        let hinted = logind!.send("locked-hint")
        #expect(eventually(timeout: 20) { (try? state(test)) == "locked" }, "LockedHint locked the device: \(hinted) \(logind!.standIn.standardError)")

        try MountedDevice.unlock(test)
        let sleeping = logind!.send("sleep")
        var released = sleeping.contains("released")
        if !released { released = logind!.standIn.nextLine(timeout: 20) == "released" }
        #expect(released, "the inhibitor was released: \(sleeping)")
        #expect(try state(test) == "locked", "the keys were gone before the inhibitor was released")
        try MountedDevice.unlock(test)
        let woken = logind!.send("wake")
        let inhibitedAgain = woken.contains { $0.hasPrefix("inhibited") } || logind!.standIn.nextLine(timeout: 20)?.hasPrefix("inhibited") == true
        #expect(inhibitedAgain, "a new inhibitor for the next sleep")
        #expect(try state(test) == "unlocked", "waking locks nothing")

        // Sleep while a lock waits out a long grace period (a subscriber stopped with SIGSTOP never acknowledges):
        // the keys go before the inhibitor, not after the grace.
        let stalled = try SpawnedProcess(CLI.executable, ["watch", "--root", test.root, "--device-secret", test.secretPath])
        defer { stalled.signal(SIGCONT); stalled.signal(SIGKILL) }
        #expect(eventually(timeout: 20) { stalled.standardError.contains("Watching") })
        stalled.signal(SIGSTOP)
        let pending = try SpawnedProcess(CLI.executable, ["lock", "--grace", "60", "--root", test.root, "--device-secret", test.secretPath])
        #expect(eventually(timeout: 20) { (try? state(test)) == "locking" })
        let started = Date()
        let slept = logind!.send("sleep")
        var releasedAgain = slept.contains("released")
        if !releasedAgain { releasedAgain = logind!.standIn.nextLine(timeout: 20) == "released" }
        #expect(releasedAgain && Date().timeIntervalSince(started) < 10, "\(slept)")
        #expect(try state(test) == "locked", "locked before the inhibitor went, not 60 s later")
        #expect(pending.waitForExit(timeout: 20) == 0)
        stalled.signal(SIGCONT)
        stalled.signal(SIGKILL)
        if !logind!.send("wake").contains(where: { $0.hasPrefix("inhibited") }) { _ = logind!.standIn.nextLine(timeout: 20) }
        try MountedDevice.unlock(test)

        _ = logind!.send("idle")
        #expect(eventually(timeout: 20) { (try? state(test)) == "locked" }, "an idle session locked the device after its second")
        try MountedDevice.unlock(test)

        // The bus restarts: the daemon follows the new one.
        logind?.stop()
        logind = nil
        #expect(eventually(timeout: 20) { (try? daemonStatus(test)["lockTriggersConnected"] as? Bool) == false })
        logind = try FakeLogind(socket: socket, script: Self.standIn)
        #expect(eventually(timeout: 20) { (try? daemonStatus(test)["lockTriggersConnected"] as? Bool) == true })
        _ = logind!.send("lock")
        #expect(eventually(timeout: 20) { (try? state(test)) == "locked" }, "a lock after the bus came back")
    }

    @Test("--lock-on is checked; daemon.conf gives the default; without a system bus the daemon runs as usual and says its triggers are not active")
    func withoutBus() throws {
        let test = try TestDevice()
        let bad = try sandboxctl(test, ["daemon", "--lock-on", "sleep,naps"])
        #expect(bad.status == 64 && bad.stderr.contains("naps") && bad.stderr.contains("session-lock, sleep and idle"), "\(bad.stderr)")
        let config = TemporaryDirectory()
        try FileManager.default.createDirectory(atPath: config.file("sandboxctl"), withIntermediateDirectories: true)
        try "# triggers\nlock-on = idle=60\n".write(toFile: config.file("sandboxctl/daemon.conf"), atomically: true, encoding: .utf8)
        let daemon = try SpawnedProcess(CLI.executable, ["daemon", "--grace", "1", "--root", test.root, "--device-secret", test.secretPath],
                                        environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=\(test.path("no_bus"))", "XDG_CONFIG_HOME": config.path])
        defer { daemon.signal(SIGTERM); _ = daemon.waitForExit(timeout: 20) }
        #expect(eventually(timeout: 20) { Device.isDaemonRunning(root: test.root) })
        try MountedDevice.unlock(test)
        #expect(try sandboxctl(test, ["status"]).stdout.contains("lock triggers:  idle=60 (not active"))
        #expect(try sandboxctl(test, ["lock"]).status == 0)
    }
}
