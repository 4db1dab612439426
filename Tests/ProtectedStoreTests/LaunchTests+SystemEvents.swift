import Foundation
import Testing

/// The events the system sends a launched app on its own (issue 53): memory warnings so far; and the user's locale.
extension LaunchTests {
    @Test("the launcher's locale and time zone reach the app (LANG, LC_*, TZ); C.UTF-8 when LANG is unset")
    func localeReachesTheApp() throws {
        let bundle = "com.example.launch.locale"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let arguments = ["launch", bundle, "--root", test.root, "--device-secret", test.secretPath, "--", "/bin/sh"]
        let shell = try SpawnedProcess(CLI.executable, arguments, environment: ["LANG": "en_GB.UTF-8", "LC_TIME": "de_DE.UTF-8", "TZ": "Europe/Berlin"])
        #expect(run(shell, "echo $LANG $LC_TIME $TZ").output == ["en_GB.UTF-8 de_DE.UTF-8 Europe/Berlin"])
        shell.send("exit 0\n")
        #expect(shell.waitForExit(timeout: 30) == 0)
        let plain = try SpawnedProcess(CLI.executable, arguments, environment: ["LANG": "", "LC_TIME": "", "TZ": ""])
        #expect(run(plain, "echo \"$LANG|$LC_TIME|$TZ\"").output == ["C.UTF-8||"])
        plain.send("exit 0\n")
        #expect(plain.waitForExit(timeout: 30) == 0)
    }

    @Test("sandboxctl memory-warning: a running app's observers get did-receive-memory-warning in any lock state; a suspended app gets none; an app not running is an error")
    func memoryWarning() throws {
        let bundle = "com.example.launch.memory"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle)
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)

        let sent = try sandboxctl(test, ["memory-warning", bundle])
        #expect(sent.status == 0 && sent.stdout == "\(bundle): did receive memory warning.\n", "\(sent)")
        let warning = nextEvent(app)
        #expect(warning?.event == "didReceiveMemoryWarning" && warning?.applicationState == "active", "\(String(describing: warning))")
        // While locked too: it is the system's, not the user's.
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        #expect(nextEvent(app)?.event == "willBecomeUnavailable")
        #expect(try sandboxctl(test, ["memory-warning"]).stdout == "\(bundle): did receive memory warning.\n", "without BUNDLE: every running app")
        #expect(nextEvent(app)?.event == "didReceiveMemoryWarning")
        try MountedDevice.unlock(test)
        #expect(nextEvent(app)?.event == "didBecomeAvailable")

        // Suspended: frozen, so it hears nothing, now or at its resume.
        #expect(try sandboxctl(test, ["suspend", bundle]).status == 0)
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        #expect(eventually(timeout: 20) { (try? sandboxctl(test, ["ps"]).stdout.contains("suspended")) == true })
        let skipped = try sandboxctl(test, ["memory-warning", bundle])
        #expect(skipped.status == 0 && skipped.stdout.contains("suspended, so not sent"), "\(skipped)")
        #expect(try sandboxctl(test, ["resume", bundle]).status == 0)
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willEnterForeground", "didBecomeActive"], "no memory warning kept for the resume")

        let missing = try sandboxctl(test, ["memory-warning", "com.example.not.running"])
        #expect(missing.status == 1 && missing.stderr.contains("no app of this bundle is running"), "\(missing)")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
    }

    @Test("sandboxctl time-change: a running app gets significant-time-change; a suspended one gets one at its resume, however many came, between will-enter-foreground and did-become-active")
    func timeChange() throws {
        let bundle = "com.example.launch.time"
        let (test, daemon) = try device(bundle)
        defer { _ = daemon }
        let app = try launchWatch(test, bundle)
        #expect(eventually(timeout: 30) { app.standardError.contains("Watching \(bundle) as the app") }, "\(app.standardError)")
        expectLaunchEvents(app)
        let sent = try sandboxctl(test, ["time-change", bundle])
        #expect(sent.status == 0 && sent.stdout == "\(bundle): significant time change.\n", "\(sent)")
        let changed = nextEvent(app)
        #expect(changed?.event == "significantTimeChange" && changed?.applicationState == "active", "\(String(describing: changed))")

        #expect(try sandboxctl(test, ["suspend", bundle]).status == 0)
        #expect((0..<2).compactMap { _ in nextEvent(app)?.event } == ["willResignActive", "didEnterBackground"])
        #expect(eventually(timeout: 20) { (try? sandboxctl(test, ["ps"]).stdout.contains("suspended")) == true })
        for _ in 0..<3 {
            #expect(try sandboxctl(test, ["time-change"]).stdout == "\(bundle): suspended; it gets it at its resume.\n")
        }
        #expect(try sandboxctl(test, ["resume", bundle]).status == 0)
        let resumed = (0..<3).compactMap { _ in nextEvent(app)?.event }
        #expect(resumed == ["willEnterForeground", "significantTimeChange", "didBecomeActive"], "one, coalesced: \(resumed)")
        #expect(app.nextLine(timeout: 1) == nil)
        let missing = try sandboxctl(test, ["time-change", "com.example.not.running"])
        #expect(missing.status == 1 && missing.stderr.contains("no app of this bundle is running"), "\(missing)")
        #expect(try sandboxctl(test, ["terminate", bundle]).status == 0)
    }
}
