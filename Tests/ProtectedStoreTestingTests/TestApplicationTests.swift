import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing

/// Records what an app's delegate is told, with the application's state at that moment.
private final class LifecycleLog: ApplicationDelegate, @unchecked Sendable {
    private let mutex = NSLock()
    private var lines: [String] = []
    var acceptsLaunchItem = true
    var backgroundWork: TimeInterval = 0
    var taskSeconds: TimeInterval?
    var launchURL: URL?

    var events: [String] { mutex.withLock { lines } }
    private func note(_ line: String, _ application: Application) { mutex.withLock { lines.append("\(line) \(application.applicationState.rawValue)") } }

    func application(_ application: Application, willFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool {
        launchURL = launchOptions?[.url] as? URL
        note("willFinishLaunching", application)
        return acceptsLaunchItem
    }
    func application(_ application: Application, didFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool {
        note("didFinishLaunching", application)
        return true
    }
    func applicationDidBecomeActive(_ application: Application) { note("didBecomeActive", application) }
    func applicationWillResignActive(_ application: Application) { note("willResignActive", application) }
    func applicationDidEnterBackground(_ application: Application) {
        note("didEnterBackground", application)
        if let taskSeconds {
            let task = application.beginBackgroundTask(withName: "upload") { [self] in mutex.withLock { lines.append("expiring") } }
            if taskSeconds > 0 { DispatchQueue.global().asyncAfter(deadline: .now() + taskSeconds) { application.endBackgroundTask(task) } }
        }
        Thread.sleep(forTimeInterval: backgroundWork)
    }
    func applicationWillEnterForeground(_ application: Application) { note("willEnterForeground", application) }
    func applicationWillTerminate(_ application: Application) { note("willTerminate", application) }
    func applicationProtectedDataWillBecomeUnavailable(_ application: Application) { note("willBecomeUnavailable", application) }
    func applicationProtectedDataDidBecomeAvailable(_ application: Application) { note("didBecomeAvailable", application) }
    func application(_ application: Application, open url: URL, sourceApplication: String?, annotation: Any?) {
        note("open \(url.lastPathComponent)", application)
    }
}

/// Polls `condition` for up to 10 s.
private func eventually(_ condition: () -> Bool) -> Bool {
    for _ in 0..<1_000 {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

@Suite("TestApplication: the app lifecycle in a user's test")
struct TestApplicationTests {
    private func launched(_ device: TestDevice, _ log: LifecycleLog, item: String? = nil, backgroundTaskTime: TimeInterval = 30) throws -> TestApplication {
        let app = TestApplication(device, backgroundTaskTime: backgroundTaskTime)
        try app.application.addDelegate(log)
        try app.launch(openingInboxItem: item, sourceApplication: "com.example.mail")
        return app
    }

    @Test("launch: will and did finish launching with the item as launch options, its open-URL event, then did become active")
    func launch() throws {
        let device = try TestDevice()
        let log = LifecycleLog()
        let app = try launched(device, log, item: "Documents/Inbox/report.pdf")
        #expect(log.events == ["willFinishLaunching inactive", "didFinishLaunching inactive", "open report.pdf inactive", "didBecomeActive active"])
        #expect(log.launchURL?.lastPathComponent == "report.pdf")
        #expect(app.state == .active)

        let declining = LifecycleLog()
        declining.acceptsLaunchItem = false
        let other = TestApplication(device)
        try other.application.addDelegate(declining)
        #expect(try other.launch(openingInboxItem: "Documents/Inbox/report.pdf") == false)
        #expect(declining.events == ["willFinishLaunching inactive", "didFinishLaunching inactive", "didBecomeActive active"], "declined: no open-URL event")
    }

    @Test("an interruption, the background, a lock while suspended, the way back, and a suspended app's end without notice")
    func roundTrip() async throws {
        let device = try TestDevice()
        let log = LifecycleLog()
        let app = try launched(device, log)
        app.interrupt()
        #expect(app.state == .inactive)
        app.endInterruption()
        #expect(app.enterBackground() == .suspended)
        #expect(app.state == .suspended)
        await device.lock(gracePeriod: 0)
        try await device.unlock()
        app.resume()
        #expect(Array(log.events.dropFirst(3)) == ["willResignActive active", "didBecomeActive active", "willResignActive active", "didEnterBackground background",
                                                   "willEnterForeground background", "didBecomeAvailable inactive", "didBecomeActive active"])
        #expect(app.enterBackground() == .suspended)
        let before = log.events.count
        app.terminate()
        #expect(log.events.count == before, "a suspended app is sent no will-terminate")
        #expect(app.state == .notRunning)
    }

    @Test("an overrun of the background time ends the app; a task extends it, one never ended is expired, then the app is ended")
    func backgroundTime() throws {
        let device = try TestDevice()
        let slow = LifecycleLog()
        slow.backgroundWork = 1
        #expect(try launched(device, slow).enterBackground(backgroundTime: 0.2) == .ended(reason: "it did not return from did-enter-background within its background time (0.2 s)"))

        let uploading = LifecycleLog()
        uploading.taskSeconds = 0.5
        #expect(try launched(device, uploading).enterBackground(backgroundTime: 0.1) == .suspended)

        let stuck = LifecycleLog()
        stuck.taskSeconds = 0
        let outcome = try launched(device, stuck, backgroundTaskTime: 1).enterBackground(backgroundTime: 0.1)
        #expect(outcome == .ended(reason: "its background tasks were not ended within its background time (1 s at most)"))
        #expect(stuck.events.last == "expiring")
    }

    @Test("a launch before first unlock: protected data is unavailable from will-finish-launching on, until the unlock")
    func launchBeforeFirstUnlock() async throws {
        let device = try TestDevice()
        try device.reboot()
        let log = LifecycleLog()
        let app = try launched(device, log)
        #expect(!app.application.isProtectedDataAvailable)
        #expect(log.events.first == "willFinishLaunching inactive")
        try await device.unlock()
        #expect(eventually { log.events.last == "didBecomeAvailable active" }, "\(log.events)")
        #expect(app.application.isProtectedDataAvailable)
    }

    @Test("a running app is sent will-terminate")
    func terminateRunning() throws {
        let device = try TestDevice()
        let log = LifecycleLog()
        let app = try launched(device, log)
        app.terminate()
        #expect(log.events.last == "willTerminate active")
    }
}

@Test("a test app's keychain is its bundle identifier's group on the device's keys, under the lock")
func testApplicationKeychain() async throws {
    let device = try TestDevice()
    let app = TestApplication(device)
    let keychain = try app.application.keychain
    let added = try keychain.add(.genericPassword(service: "api", account: "me", secret: Data("token".utf8)))
    #expect(added.accessGroup == TestDevice.defaultBundleIdentifier)
    #expect(try device.keychain.secret(matching: .genericPassword(service: "api")) == Data("token".utf8), "the device's view of the app is the same item")
    await device.lock()
    #expect(throws: KeychainError.self) { _ = try keychain.secret(matching: .genericPassword(service: "api")) }
    do {
        _ = try keychain.secret(matching: .genericPassword(service: "api"))
    } catch let error as KeychainError {
        #expect(error.code == .interactionNotAllowed && error.status == -25308)
    }
    try await device.unlock()
    #expect(try keychain.secret(matching: .genericPassword(service: "api")) == Data("token".utf8))
    #expect(throws: KeychainError.self) { try keychain.add(.genericPassword(service: "api", account: "x", secret: Data(), accessGroup: "com.example.other")) }
}

/// Frees its cache on a memory warning, as UIKit apps are asked to.
private final class CacheOwner: ApplicationDelegate, @unchecked Sendable {
    private let mutex = NSLock()
    private var cached: [String] = ["thumbnail"]
    private var notified = 0
    var cache: [String] { mutex.withLock { cached } }
    var notifications: Int { mutex.withLock { notified } }
    func noteNotification() { mutex.withLock { notified += 1 } }
    func applicationDidReceiveMemoryWarning(_ application: Application) { mutex.withLock { cached.removeAll() } }
}

@Test("memoryWarning(): the delegate, the notification and the stream hear it while running; a suspended app hears nothing")
func testApplicationMemoryWarning() throws {
    let device = try TestDevice()
    let app = TestApplication(device)
    let owner = CacheOwner()
    try app.application.addDelegate(owner)
    let observer = app.application.notificationCenter.addObserver(forName: Application.didReceiveMemoryWarningNotification, object: nil, queue: nil) { _ in
        owner.noteNotification()
    }
    defer { app.application.notificationCenter.removeObserver(observer) }
    try app.launch()
    #expect(app.memoryWarning())
    #expect(owner.cache.isEmpty)
    #expect(owner.notifications == 1)
    #expect(app.enterBackground() == .suspended)
    #expect(!app.memoryWarning(), "a suspended app is frozen: nothing is sent")
    #expect(owner.notifications == 1)
}

@Test("significantTimeChange(): a running app hears it at once; a suspended one hears one at its resume, however many came")
func testApplicationSignificantTimeChange() async throws {
    let device = try TestDevice()
    let app = TestApplication(device)
    let events = try app.application.events()
    try app.launch()
    app.significantTimeChange()
    #expect(app.enterBackground() == .suspended)
    app.significantTimeChange()
    app.significantTimeChange()
    app.resume()
    var seen: [ApplicationEvent] = []
    for await event in events {
        seen.append(event)
        if event == .lifecycle(.didBecomeActive) && seen.contains(.lifecycle(.willEnterForeground)) { break }
    }
    let lifecycle = seen.compactMap { if case .lifecycle(let event) = $0 { event } else { nil } }
    #expect(lifecycle == [.willFinishLaunching, .didFinishLaunching, .didBecomeActive, .significantTimeChange, .willResignActive, .didEnterBackground,
                          .willEnterForeground, .significantTimeChange, .didBecomeActive], "\(lifecycle)")
}
