import ArgumentParser
import Foundation
import ProtectedStore

struct PsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ps",
        abstract: "List the apps running through `sandboxctl launch`: bundle, pid, state (inactive, active, background or suspended) and since when.",
        discussion: """
            The state is the key daemon's (exit 69 without one): inactive (launching, or interrupted: `sandboxctl \
            interrupt`; a program that attaches no observer is inactive until its --launch-timeout), active (in the \
            foreground), background (sent 'did \
            enter background', in its background time) or suspended (frozen); "suspended (SIGSTOP)" where the app \
            could not get a cgroup of its own and is stopped with signals instead (the daemon's log says why). pid is \
            the `sandboxctl launch` process.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON: an array of {bundle, pid, sandboxPID, state, freezer (cgroup or sigstop), since, command}.")
    var json = false

    func run() throws {
        try reportingErrors {
            let root = device.resolvedRoot
            let tracked = try device.attach().appRequest(.apps)
            let launched = Dictionary(try AppRuntime.running(root: root).map { ($0.bundle, $0) }, uniquingKeysWith: { first, _ in first })
            let rows: [(status: AppStatus, record: AppRecord)] = tracked.compactMap { status in launched[status.bundle].map { (status, $0) } }
            let formatter = ISO8601DateFormatter()
            if json {
                let objects: [[String: Any]] = rows.map {
                    ["bundle": $0.status.bundle, "pid": Int($0.record.launcherPID), "sandboxPID": Int($0.status.pid), "state": $0.status.state,
                     "freezer": $0.status.freezer ?? "",
                     "since": formatter.string(from: Date(timeIntervalSince1970: $0.status.since)), "command": $0.record.command]
                }
                print(String(decoding: try JSONSerialization.data(withJSONObject: objects, options: [.sortedKeys]), as: UTF8.self))
                return
            }
            guard !rows.isEmpty else { return print("No apps running.") }
            print("BUNDLE".padding(toLength: 32, withPad: " ", startingAt: 0) + "PID      STATE                SINCE                 COMMAND")
            for (status, record) in rows {
                print(status.bundle.padding(toLength: 32, withPad: " ", startingAt: 0)
                      + "\(record.launcherPID)".padding(toLength: 9, withPad: " ", startingAt: 0)
                      + (status.state == "suspended" && status.freezer == "sigstop" ? "suspended (SIGSTOP)" : status.state)
                        .padding(toLength: 21, withPad: " ", startingAt: 0)
                      + formatter.string(from: Date(timeIntervalSince1970: status.since)).padding(toLength: 22, withPad: " ", startingAt: 0)
                      + record.command.joined(separator: " "))
            }
        }
    }
}

struct SuspendCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "suspend",
        abstract: "Send a launched app to the background: 'did enter background' to its observers, then, once they returned, freeze it.",
        discussion: """
            The app is in the background (`ps`) while its observers handle 'did enter background': they have \
            --background-time seconds to save their state and return (iOS gives about 5). Then its cgroup is frozen: no \
            process of it runs, none sees a signal, no fork escapes (SIGSTOP where it has no cgroup of its own; `ps` \
            says so). An app whose observers have not all returned when the time is up is ended, as iOS ends it, never \
            frozen in the middle of its work: the command prints why. While suspended the app is sent nothing: a lock \
            does not wait for it. `sandboxctl resume`, also during the background time, brings it back with 'will enter \
            foreground', then one protected-data event for the net change (a lock and an unlock: 'did become \
            available' alone), then the Inbox items that came meanwhile. Needs the key daemon (69 without).
            """
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    @Option(help: ArgumentHelp("Seconds the app's observers have to handle 'did enter background'.", valueName: "seconds"))
    var backgroundTime: Double = 5

    func validate() throws {
        guard backgroundTime >= 0, backgroundTime <= 600 else { throw ValidationError("--background-time must be between 0 and 600 seconds.") }
    }

    func run() throws {
        try reportingErrors {
            let status = try device.attach().appRequest(.appSuspend, bundle: bundleIdentifier, timeout: backgroundTime).first
            switch status?.state {
            case "ended": print("Ended \(bundleIdentifier): \(status?.reason ?? "ended by the daemon").")
            case "active": print("\(bundleIdentifier) came back to the foreground during its background time: not suspended.")
            default: print("Suspended \(bundleIdentifier).")
            }
        }
    }
}

struct ResumeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resume",
        abstract: "Bring an app back to the foreground: thawed if suspended, 'will enter foreground', then one protected-data event for the net change.",
        discussion: "During its background time this cancels the suspension. Needs the key daemon (69 without)."
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    func run() throws {
        try reportingErrors {
            _ = try device.attach().appRequest(.appResume, bundle: bundleIdentifier)
            print("Resumed \(bundleIdentifier).")
        }
    }
}

struct InterruptCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "interrupt",
        abstract: "Interrupt an active app, as an incoming call or an alert does: 'will resign active', and it is inactive until --end.",
        discussion: """
            With --end: 'did become active', and it is active again. An app that is not in the state to leave (not \
            active, or with --end not inactive; still launching; in the background) is left as it is. Needs the key \
            daemon (69 without).
            """
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    @Flag(help: "End the interruption instead: the app becomes active again.")
    var end = false

    func run() throws {
        try reportingErrors {
            let status = try device.attach().appRequest(.appInterrupt, bundle: bundleIdentifier, endingInterruption: end).first
            print("\(bundleIdentifier) is \(status?.state ?? "gone").")
        }
    }
}

struct MemoryWarningCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "memory-warning",
        abstract: "Send 'did receive memory warning' to a running app, or to every running app: free what can be rebuilt.",
        discussion: """
            As Xcode's "Simulate Memory Warning", but to a real launched app, in any lock state. A suspended app gets \
            none: it is frozen (under lasting pressure iOS ends such apps without notice instead). Returns once each app's \
            observers have handled it, or after --timeout. Exits 1 when BUNDLE is not running; needs the key daemon (69 \
            without).
            """
    )

    @OptionGroup var target: RunningAppOptions

    func run() throws {
        try reportingErrors {
            let attached = try target.device.attach()
            for (bundle, state) in try target.apps(of: attached, receiving: "a memory warning") {
                guard state != "suspended" else {
                    print("\(bundle): suspended, so not sent (a frozen app hears nothing).")
                    continue
                }
                _ = try attached.appRequest(.appMemoryWarning, bundle: bundle, timeout: target.timeout)
                print("\(bundle): did receive memory warning.")
            }
        }
    }
}

struct TimeChangeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "time-change",
        abstract: "Send 'significant time change' to a running app, or to every running app, as a clock set by hand would.",
        discussion: """
            The daemon sends it on its own when the clock is set (a step, by a user or NTP), at local midnight and at a \
            daylight-saving transition. A suspended app gets one at its resume, however many came meanwhile. Returns \
            once each running app's observers have handled it, or after --timeout. Exits 1 when BUNDLE is not running; \
            needs the key daemon (69 without).
            """
    )

    @OptionGroup var target: RunningAppOptions

    func run() throws {
        try reportingErrors {
            let attached = try target.device.attach()
            for (bundle, state) in try target.apps(of: attached, receiving: "a time change") {
                _ = try attached.appRequest(.appTimeChange, bundle: bundle, timeout: target.timeout)
                print(state == "suspended" ? "\(bundle): suspended; it gets it at its resume." : "\(bundle): significant time change.")
            }
        }
    }
}

/// The device, the app (or every running app) and the time its observers have: `memory-warning` and `time-change`.
struct RunningAppOptions: ParsableArguments {
    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier; every running app without it.", valueName: "bundle"))
    var bundleIdentifier: String?

    @Option(help: ArgumentHelp("Seconds each app's observers have to handle it.", valueName: "seconds"))
    var timeout: Double = 5

    func validate() throws {
        guard timeout >= 0, timeout <= 600 else { throw ValidationError("--timeout must be between 0 and 600 seconds.") }
    }

    /// The apps concerned, with their states: BUNDLE (an error naming `what` if it is not running), or every running app.
    func apps(of device: Device, receiving what: String) throws -> [(bundle: String, state: String)] {
        let running = try device.appRequest(.apps)
        if let bundleIdentifier {
            guard let app = running.first(where: { $0.bundle == bundleIdentifier }) else {
                throw ProtectedStoreError(.notFound, path: bundleIdentifier, problem: "no app of this bundle is running, so none can receive \(what)",
                                          remedy: "Start it with `sandboxctl launch \(bundleIdentifier) -- COMMAND`")
            }
            return [(app.bundle, app.state)]
        }
        if running.isEmpty { print("No app is running.") }
        return running.map { ($0.bundle, $0.state) }
    }
}

struct TerminateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "terminate",
        abstract: "End a launched app: 'will terminate' to its observers, SIGTERM to its processes, SIGKILL after its launch's --terminate-timeout.",
        discussion: """
            A suspended app is ended without notice, as iOS ends one: killed while frozen, never thawed, so no handler \
            of it runs. Returns once the app has exited and its container is unmounted.
            """
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
            let slot = (try AppRuntime.appsFolder(root: root) as NSString).appendingPathComponent(bundleIdentifier)
            while LaunchSlot.isHeld(slot) {
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
