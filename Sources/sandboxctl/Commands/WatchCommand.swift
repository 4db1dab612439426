import ArgumentParser
import Foundation
import ProtectedStore

struct WatchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print the device's protected-data events as they happen, one line each, until interrupted.",
        discussion: """
            Attaches to the daemon as a subscriber and acknowledges each event once printed. If the daemon stops, prints \
            'will become unavailable' and waits for it to come back. Exits 69 when no daemon runs.

            With BUNDLE it also receives that container's open-URL events, as the app would: items delivered to its Inbox, \
            the pending ones first, each after 'did become available' and exactly once (each is recorded as delivered when \
            printed, so another receiver won't get it again).

            Inside a sandbox of `sandboxctl launch` (SANDBOXCTL_APP_SOCKET set, no --root), it attaches as the app \
            through the app's own socket and prints its lifecycle events too (willFinishLaunching and \
            didFinishLaunching with the launch options, didBecomeActive, willResignActive, didEnterBackground, \
            willEnterForeground, willTerminate, didReceiveMemoryWarning, significantTimeChange) with the app's state, and its open-URL events (the Inbox items pending at launch first), each before it is \
            acknowledged.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON lines: {\"time\": ISO 8601, \"event\": name, \"state\": state}, open-URL events with path, sourceApplication, annotation and sequence.")
    var json = false

    @Argument(help: ArgumentHelp("A container whose open-URL events to receive as well.", valueName: "bundle"))
    var bundleIdentifier: String?

    @Option(help: ArgumentHelp("As the app: work this many seconds in 'did enter background' before returning (to see what a background time running out does).", valueName: "seconds"))
    var backgroundWork: Double = 0

    @Option(help: ArgumentHelp("As the app: begin a background task at 'did enter background' and end it this many seconds later (0: never; its expiration handler prints backgroundTaskExpiring).", valueName: "seconds"))
    var backgroundTask: Double?

    func validate() throws {
        if let backgroundTask { guard backgroundTask >= 0, backgroundTask <= 600 else { throw ValidationError("--background-task must be between 0 and 600 seconds.") } }
        guard backgroundWork >= 0, backgroundWork <= 600 else { throw ValidationError("--background-work must be between 0 and 600 seconds.") }
    }

    func run() async throws {
        if device.root == nil, bundleIdentifier == nil, ProcessInfo.processInfo.environment[Application.socketEnvironmentVariable] != nil {
            return try watchAsApp()
        }
        try await reportingErrors {
            let attached = try device.attach()
            let container = try bundleIdentifier.map { try attached.container(bundleIdentifier: $0) }
            let protectionEvents = attached.protectedDataEvents()
            let openURLs = container?.openURLEvents()
            let watching = container.map { "\(attached.root), container \($0.bundleIdentifier)" } ?? attached.root
            FileHandle.standardError.write(Data("Watching \(watching) (state: \(attached.state.rawValue)); Ctrl-C to stop\n".utf8))
            let printer = LinePrinter(json: json)
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await event in protectionEvents {
                        printer.print(event: event.rawValue, state: attached.state,
                                      text: event == .willBecomeUnavailable ? "will become unavailable" : "did become available")
                    }
                }
                if let openURLs {
                    group.addTask {
                        for await request in openURLs {
                            var fields: [String: Any] = ["path": request.path, "sequence": request.sequenceNumber]
                            if let source = request.sourceApplication { fields["sourceApplication"] = source }
                            if let annotation = request.annotation { fields["annotation"] = annotation }
                            printer.print(event: "openURL", state: attached.state, text: request.description, fields: fields)
                        }
                    }
                }
            }
        }
    }
}

extension WatchCommand {
    /// As the launched app: prints each event from a delegate, so it is out before the daemon hears the acknowledgement
    /// (and, for *did enter background*, before the process is stopped).
    private func watchAsApp() throws {
        let application = try reportingErrors { try Application.attach() }
        let printer = LinePrinter(json: json)
        let observer = AppEventPrinter(printer: printer, backgroundWork: backgroundWork, backgroundTask: backgroundTask)
        try reportingErrors { try application.addDelegate(observer) }
        FileHandle.standardError.write(Data("Watching \(application.bundleIdentifier) as the app (protected data: \(application.state.rawValue)); Ctrl-C to stop\n".utf8))
        withExtendedLifetime((application, observer)) {
            while true { pause() }
        }
    }
}

/// The launched app's protected data as a device state, the way the other watch lines name it.
private extension Application {
    var state: Device.State { isProtectedDataAvailable ? .unlocked : .locked }
}

private final class AppEventPrinter: ApplicationDelegate {
    let printer: LinePrinter
    let backgroundWork: Double
    let backgroundTask: Double?

    init(printer: LinePrinter, backgroundWork: Double, backgroundTask: Double?) {
        self.printer = printer
        self.backgroundWork = backgroundWork
        self.backgroundTask = backgroundTask
    }

    private func print(_ event: String, _ text: String, _ application: Application) {
        printer.print(event: event, state: application.state, text: text, fields: ["applicationState": application.applicationState.rawValue])
    }

    func application(_ application: Application, willFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool {
        printLaunch("willFinishLaunching", "will finish launching", launchOptions, application)
    }
    func application(_ application: Application, didFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool {
        printLaunch("didFinishLaunching", "did finish launching", launchOptions, application)
    }
    /// Prints a launch event with its options (the item's path under HOME, its sender and annotation); accepts it.
    private func printLaunch(_ event: String, _ text: String, _ options: [Application.LaunchOptionsKey: Any]?, _ application: Application) -> Bool {
        var fields: [String: Any] = ["applicationState": application.applicationState.rawValue]
        if let url = options?[.url] as? URL { fields["url"] = relativePath(url) }
        if let source = options?[.sourceApplication] { fields["sourceApplication"] = source }
        if let annotation = options?[.annotation] { fields["annotation"] = annotation }
        printer.print(event: event, state: application.state, text: text + ((fields["url"] as? String).map { " to open \($0)" } ?? ""), fields: fields)
        return true
    }
    /// An item's path in the container: its URL under HOME.
    private func relativePath(_ url: URL) -> String {
        let home = (ProcessInfo.processInfo.environment["HOME"] ?? "") + "/"
        return url.path.hasPrefix(home) ? String(url.path.dropFirst(home.count)) : url.path
    }
    func applicationDidBecomeActive(_ application: Application) { print("didBecomeActive", "did become active", application) }
    func applicationWillResignActive(_ application: Application) { print("willResignActive", "will resign active", application) }
    func applicationDidEnterBackground(_ application: Application) {
        print("didEnterBackground", "did enter background", application)
        if let backgroundTask {
            let printer = printer
            let task = application.beginBackgroundTask(withName: "watch") { [printer, weak application] in
                printer.print(event: "backgroundTaskExpiring", state: application?.state ?? .locked, text: "background task expiring")
            }
            printer.print(event: "backgroundTaskBegan", state: application.state, text: "background task began",
                          fields: ["remaining": application.backgroundTimeRemaining])
            if backgroundTask > 0 {
                DispatchQueue.global().asyncAfter(deadline: .now() + backgroundTask) { application.endBackgroundTask(task) }
            }
        }
        if backgroundWork > 0 { Thread.sleep(forTimeInterval: backgroundWork) }
    }
    func applicationWillEnterForeground(_ application: Application) { print("willEnterForeground", "will enter foreground", application) }
    func applicationWillTerminate(_ application: Application) { print("willTerminate", "will terminate", application) }
    func applicationDidReceiveMemoryWarning(_ application: Application) { print("didReceiveMemoryWarning", "did receive memory warning", application) }
    func applicationSignificantTimeChange(_ application: Application) { print("significantTimeChange", "significant time change", application) }
    func applicationProtectedDataWillBecomeUnavailable(_ application: Application) {
        print(ProtectedDataEvent.willBecomeUnavailable.rawValue, "will become unavailable", application)
    }
    func applicationProtectedDataDidBecomeAvailable(_ application: Application) {
        print(ProtectedDataEvent.didBecomeAvailable.rawValue, "did become available", application)
    }

    func application(_ application: Application, open url: URL, sourceApplication: String?, annotation: Any?) {
        let path = relativePath(url)
        var fields: [String: Any] = ["applicationState": application.applicationState.rawValue, "path": path]
        if let sourceApplication { fields["sourceApplication"] = sourceApplication }
        if let annotation { fields["annotation"] = annotation }
        printer.print(event: "openURL", state: application.state,
                      text: "open URL \(path)" + (sourceApplication.map { " from \($0)" } ?? ""), fields: fields)
    }
}

/// Prints one line per event from any task, whole, flushed at once so a pipe reader sees it as it happens.
private final class LinePrinter: @unchecked Sendable {
    private let json: Bool
    private let mutex = NSLock()
    private let formatter = ISO8601DateFormatter()

    init(json: Bool) {
        self.json = json
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    }

    func print(event: String, state: Device.State, text: String, fields: [String: Any] = [:]) {
        mutex.withLock {
            let time = formatter.string(from: Date())
            if json {
                var line = fields
                line["time"] = time
                line["event"] = event
                line["state"] = state.rawValue
                let data = (try? JSONSerialization.data(withJSONObject: line, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
                Swift.print(String(decoding: data, as: UTF8.self))
            } else {
                Swift.print("\(time)  \(text)")
            }
            fflush(nil)
        }
    }
}
