import Foundation
import Testing

/// The events the system sends a launched app on its own (issue 53): memory warnings so far.
extension LaunchTests {
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
}
