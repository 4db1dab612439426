import ArgumentParser
import Foundation
import ProtectedStore

struct PsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ps",
        abstract: "List the apps running through `sandboxctl launch`: bundle, pid, state and since when."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON: an array of {bundle, pid, sandboxPID, state, since, command}.")
    var json = false

    func run() throws {
        try reportingErrors {
            let apps = try AppRuntime.running(root: device.resolvedRoot)
            if json {
                let objects: [[String: Any]] = apps.map {
                    ["bundle": $0.bundle, "pid": Int($0.launcherPID), "sandboxPID": Int($0.sandboxPID), "state": $0.state,
                     "since": ISO8601DateFormatter().string(from: $0.since), "command": $0.command]
                }
                print(String(decoding: try JSONSerialization.data(withJSONObject: objects, options: [.sortedKeys]), as: UTF8.self))
                return
            }
            guard !apps.isEmpty else { return print("No apps running.") }
            print("BUNDLE".padding(toLength: 32, withPad: " ", startingAt: 0) + "PID      STATE      SINCE                 COMMAND")
            for app in apps {
                print(app.bundle.padding(toLength: 32, withPad: " ", startingAt: 0)
                      + "\(app.launcherPID)".padding(toLength: 9, withPad: " ", startingAt: 0)
                      + app.state.padding(toLength: 11, withPad: " ", startingAt: 0)
                      + ISO8601DateFormatter().string(from: app.since).padding(toLength: 22, withPad: " ", startingAt: 0)
                      + app.command.joined(separator: " "))
            }
        }
    }
}

struct TerminateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "terminate",
        abstract: "End a launched app: SIGTERM to its processes, SIGKILL after its launch's --terminate-timeout.",
        discussion: "Returns once the app has exited and its container is unmounted."
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    @Option(help: ArgumentHelp("Seconds to wait for the app to end before giving up.", valueName: "seconds"))
    var wait: Double = 30

    func run() throws {
        try reportingErrors {
            let root = device.resolvedRoot
            let app = try AppRuntime.running(bundleIdentifier, root: root)
            // The launcher ends the program and unmounts; asking it keeps one way of ending an app.
            guard kill(app.launcherPID, SIGTERM) == 0 else {
                throw ProtectedStoreError(.io, path: bundleIdentifier, problem: "cannot signal its launcher (pid \(app.launcherPID)): \(String(cString: strerror(errno)))",
                                          remedy: "Check that you own the process")
            }
            let deadline = Date().addingTimeInterval(wait)
            while (try? AppRuntime.running(bundleIdentifier, root: root)) != nil {
                guard Date() < deadline else {
                    throw ProtectedStoreError(.io, path: bundleIdentifier, problem: "the app is still running after \(wait) s",
                                              remedy: "Look at its processes (launcher pid \(app.launcherPID)); kill -KILL \(app.launcherPID) ends them")
                }
                usleep(20_000)
            }
            print("Terminated \(bundleIdentifier).")
        }
    }
}
