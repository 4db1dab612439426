import ArgumentParser
import Dispatch
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreDaemon

struct DaemonCommand: ParsableCommand {
    /// `$XDG_CONFIG_HOME/sandboxctl/daemon.conf`: `name = value` lines, `#` comments; `lock-on` is read.
    static var configurationPath: String {
        return (configHome as NSString).appendingPathComponent("sandboxctl/daemon.conf")
    }

    static func configuredLockTriggers() throws -> String? {
        for line in try configurationLines(at: configurationPath, what: "the daemon's configuration", shape: "`name = value` lines") {
            let parts = line.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            if parts.count == 2, parts[0] == "lock-on" { return parts[1] }
        }
        return nil
    }

    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "Hold the device's keys for every program: serve lock, unlock and events on a Unix socket (foreground).",
        discussion: """
            Starting the daemon is a reboot: the device is before first unlock until `sandboxctl unlock`. While it runs, \
            `lock`, `unlock`, `watch` and `status` talk to it, file commands use its state, and programs using the library \
            attach with Device.attach(root:). Only the root's owner (and root) may connect; the socket is mode 0600.

            The daemon disables its core dumps and tracing by other processes (PR_SET_DUMPABLE 0) and keeps every key in \
            mlocked memory (best effort: raise `ulimit -l` for a non-root daemon). Passcode work runs on a stack it wipes, \
            so nothing derived from the passcode outlives an unlock; unlocks run one at a time, so parallel guesses never \
            stall the owner's. A lock, unlock or status always gets through however many connections a program of the \
            same user opens (docs/PROTOCOL.md §1): a connection that sends no hello within 3 s is closed, a uid keeps at \
            most 32 idle connections beyond those active in the last second, the soft descriptor limit is raised to the \
            hard one and 64 descriptors are kept free, and subscriptions stop 1,024 short of the limit (`busy`). SIGINT or SIGTERM zeroes the keys, removes the socket and exits 0. Log lines go to standard error; \
            repeated refusals and bad frames are counted, one line a second.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Option(help: ArgumentHelp("Socket path.", discussion: "Default: <root>/daemon.sock. Clients find it through <root>/daemon.json.", valueName: "path"))
    var socket: String?

    @Option(help: ArgumentHelp("Seconds between 'will become unavailable' and discarding the keys when a subscriber has not acknowledged (0 to 3600).", valueName: "seconds"))
    var grace: Double = Device.defaultGracePeriod

    @Option(name: .customLong("lock-on"),
            help: ArgumentHelp("Also lock when: session-lock (the session locks), sleep (the machine suspends; logind waits for the keys to go), idle[=SECONDS] (the session is idle that long; default 300). Comma-separated.",
                               discussion: "Default: the `lock-on = ...` line of $XDG_CONFIG_HOME/sandboxctl/daemon.conf, else none. Followed through systemd-logind on the system bus; without it the daemon runs as usual and `sandboxctl status` says the triggers are not connected.",
                               valueName: "triggers"))
    var lockOn: String?

    @Flag(help: "Log every connection, not only state changes and refusals.")
    var verbose = false

    func validate() throws {
        guard grace >= 0, grace <= 3600 else { throw ValidationError("--grace must be 0 to 3600 seconds") }
    }

    func run() throws {
        let level: Logger.Level = verbose ? .debug : .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        try reportingErrors {
            try KeyDaemon.hardenProcess()
            let triggers = try LockTriggers(parsing: try lockOn ?? Self.configuredLockTriggers() ?? "")
            let daemon = try KeyDaemon.start(root: device.resolvedRoot, deviceSecretPath: device.resolvedDeviceSecret, socketPath: socket, gracePeriod: grace,
                                             lockTriggers: triggers)
            var sources: [any DispatchSourceSignal] = []
            for signalNumber in [SIGINT, SIGTERM] {
                signal(signalNumber, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
                source.setEventHandler { daemon.stop() }
                source.resume()
                sources.append(source)
            }
            daemon.waitUntilStopped()
            sources.forEach { $0.cancel() }
        }
    }
}
