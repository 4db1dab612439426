import ArgumentParser
import Foundation
import ProtectedStore

struct WatchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print the device's protected-data events as they happen, one line each, until interrupted.",
        discussion: "Attaches to the daemon as a subscriber and acknowledges each event once printed. If the daemon stops, prints 'will become unavailable' and waits for it to come back. Exits 69 when no daemon runs."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON lines: {\"time\": ISO 8601, \"event\": name, \"state\": state}.")
    var json = false

    struct Line: Codable {
        var time: String
        var event: String
        var state: String
    }

    func run() async throws {
        try await reportingErrors {
            let attached = try device.attach()
            FileHandle.standardError.write(Data("Watching \(attached.root) (state: \(attached.state.rawValue)); Ctrl-C to stop\n".utf8))
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            for await event in attached.protectedDataEvents() {
                let line = Line(time: formatter.string(from: Date()), event: event.rawValue, state: attached.state.rawValue)
                if json {
                    try printJSON(line, pretty: false)
                } else {
                    print("\(line.time)  \(event == .willBecomeUnavailable ? "will become unavailable" : "did become available")")
                }
                fflush(nil)  // every stream: a pipe reader sees each line as it happens
            }
        }
    }
}
