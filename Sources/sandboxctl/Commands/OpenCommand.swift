import ArgumentParser
import Foundation
import ProtectedStore

struct OpenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "open",
        abstract: "Open an Inbox item in an app, as a tap on a shared file does: a background or suspended app comes to the foreground first.",
        discussion: """
            ITEM is an item already in the app's Inbox (its name, or its container path Documents/Inbox/NAME); \
            --deliver FILE delivers FILE first (with --from and --annotation, as `sandboxctl inbox deliver`). A running \
            app in the background or suspended gets 'will enter foreground', the protected-data change it missed, the \
            open URL, then 'did become active'; an active one gets the open URL. An app that is not running is launched \
            with --deliver FILE -- COMMAND (as `sandboxctl launch BUNDLE -- COMMAND` with the device options given \
            here): the item is then its launch option, after any delivered before it and not yet handled. Returns \
            once the app handled the open URL. Needs the key daemon (69 without); an unknown bundle, an unknown item or \
            a bad file changes nothing (exit 1, or 64 for bad arguments).
            """
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    @Argument(help: ArgumentHelp("An item in the app's Inbox: its name or Documents/Inbox/NAME.", valueName: "item"))
    var item: String?

    @Option(help: ArgumentHelp("Deliver this file into the Inbox first, and open it.", valueName: "file"))
    var deliver: String?

    @Option(name: .customLong("from"), help: ArgumentHelp("With --deliver: the delivering app's bundle identifier.", valueName: "bundle-id"))
    var sourceApplication: String?

    @Option(help: ArgumentHelp("With --deliver: a JSON annotation for the app.", valueName: "json"))
    var annotation: String?

    @Option(name: .customLong("read-only"), help: ArgumentHelp("With a command: passed to `sandboxctl launch` (repeatable).", valueName: "path"))
    var readOnlyPaths: [String] = []

    @Option(name: .customLong("env"), help: ArgumentHelp("With a command: passed to `sandboxctl launch` (repeatable).", valueName: "name=value"))
    var environment: [String] = []

    @Argument(parsing: .postTerminator, help: ArgumentHelp("With --deliver: the program to launch the app with when it is not running, after --.", valueName: "command"))
    var command: [String] = []

    func validate() throws {
        guard (item == nil) != (deliver == nil) else { throw ValidationError("Give an Inbox item, or --deliver FILE (one of them).") }
        guard deliver != nil || (sourceApplication == nil && annotation == nil && command.isEmpty) else {
            throw ValidationError("--from, --annotation and a command after -- go with --deliver FILE.")
        }
        guard !command.isEmpty || (readOnlyPaths.isEmpty && environment.isEmpty) else {
            throw ValidationError("--read-only and --env go with a command after --.")
        }
    }

    func run() throws {
        try reportingErrors {
            let attached = try device.attach()
            let container = try attached.container(bundleIdentifier: bundleIdentifier)
            let running = try attached.appRequest(.apps).first { $0.bundle == bundleIdentifier }
            if let deliver {
                try Container.checkInboxDelivery(fileAtPath: deliver, sourceApplication: sourceApplication, annotationJSON: annotation)
                guard let running else { return try launch(delivering: deliver, into: container) }
                try bringToFront(running, attached)
                let delivered = try container.deliverToInbox(fileAtPath: deliver, sourceApplication: sourceApplication, annotationJSON: annotation)
                print("Delivered \(deliver) as \(delivered.path); \(bundleIdentifier) opens it.")
                return
            }
            let name = item.map { $0.hasPrefix("Documents/Inbox/") ? String($0.dropFirst("Documents/Inbox/".count)) : $0 } ?? ""
            let items = try container.inboxItems()
            guard let found = items.first(where: { $0.name == name }), let request = container.openURLRequest(for: found) else {
                throw ProtectedStoreError(.notFound, path: "\(bundleIdentifier):Documents/Inbox/\(name)",
                                          problem: items.contains { $0.name == name } ? "the item has no delivery record" : "no such item in the app's Inbox",
                                          remedy: "See `sandboxctl inbox list \(bundleIdentifier)`, or deliver a file with --deliver FILE")
            }
            guard let running else {
                throw ProtectedStoreError(.notFound, path: bundleIdentifier, problem: "the app is not running: an item already in its Inbox opens in a running app",
                                          remedy: "Launch it with `sandboxctl launch \(bundleIdentifier) -- COMMAND`, or deliver the file again with --deliver FILE -- COMMAND")
            }
            try bringToFront(running, attached)
            _ = try attached.appRequest(.appOpenURL, bundle: bundleIdentifier, openURL: request)
            print("Opened \(found.path) in \(bundleIdentifier).")
        }
    }

    /// Resumes an app in the background or suspended, its *did become active* held back until the open URL is sent.
    private func bringToFront(_ status: AppStatus, _ attached: Device) throws {
        guard status.state == "background" || status.state == "suspended" else { return }
        _ = try attached.appRequest(.appResume, bundle: bundleIdentifier, awaitingURL: true)
    }

    /// Delivers the file, then runs the app as `sandboxctl launch` would: the item is among its launch options.
    private func launch(delivering file: String, into container: Container) throws {
        guard !command.isEmpty else {
            throw ProtectedStoreError(.notFound, path: bundleIdentifier, problem: "the app is not running",
                                      remedy: "Give the program to launch it with after --: `sandboxctl open \(bundleIdentifier) --deliver \(file) -- COMMAND`")
        }
        let delivered = try container.deliverToInbox(fileAtPath: file, sourceApplication: sourceApplication, annotationJSON: annotation)
        FileHandle.standardError.write(Data("Delivered \(file) as \(delivered.path); launching \(bundleIdentifier)\n".utf8))
        var options = [bundleIdentifier]
        if let root = device.root { options += ["--root", root] }
        if let secret = device.deviceSecret { options += ["--device-secret", secret] }
        options += readOnlyPaths.flatMap { ["--read-only", $0] } + environment.flatMap { ["--env", $0] }
        let launch = try LaunchCommand.parse(options + ["--"] + command)
        try launch.run()
    }
}
