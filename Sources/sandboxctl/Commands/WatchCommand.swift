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
            """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON lines: {\"time\": ISO 8601, \"event\": name, \"state\": state}, open-URL events with path, sourceApplication, annotation and sequence.")
    var json = false

    @Argument(help: ArgumentHelp("A container whose open-URL events to receive as well.", valueName: "bundle"))
    var bundleIdentifier: String?

    func run() async throws {
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
