import ArgumentParser
import Foundation
import ProtectedStore

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show the device: lock state, passcode attempts, containers and how many files each class protects.",
        discussion: "Needs no passcode. With a daemon running, shows its state and subscribers; without one each command is its own key holder, which starts before first unlock, so the state shown is that of this command."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON for scripts.")
    var json = false

    struct Report: Codable {
        struct ContainerReport: Codable {
            var bundleIdentifier: String
            var defaultProtection: String
            /// Files per class name.
            var files: [String: Int]
            var bytes: UInt64
            var unreadable: Int
            /// Damaged items (paths in the container): counted nowhere else, so the counts above are short by these.
            var damaged: [Damage]
        }

        struct Damage: Codable {
            var path: String
            var problem: String
        }

        var root: String
        var keybagID: String
        var deviceSecret: String
        var state: String
        var protectedDataAvailable: Bool
        var failedPasscodeAttempts: Int
        /// nil when no daemon serves the device.
        var daemon: DaemonStatus?
        var containers: [ContainerReport]
        /// Folders of the device's containers whose description is missing or does not open.
        var damagedContainers: [Damage]
    }

    func run() throws {
        try reportingErrors {
            let opened = try device.open()
            let listing = try opened.containerListing()
            let containers = try listing.identifiers.map { id in
                let container = try opened.container(bundleIdentifier: id)
                var report = Report.ContainerReport(bundleIdentifier: id, defaultProtection: ProtectionClass(container.defaultProtection)!.name,
                                                    files: [:], bytes: 0, unreadable: 0, damaged: [])
                try count(in: container, path: "", into: &report)
                return report
            }
            let daemon = try opened.daemonStatus()
            let state = daemon?.state ?? opened.state
            let report = Report(root: opened.root, keybagID: opened.keybagID.map { String(format: "%02x", $0) }.joined(),
                                deviceSecret: opened.deviceSecretPath, state: state.rawValue,
                                protectedDataAvailable: state == .unlocked || state == .locking,
                                failedPasscodeAttempts: daemon?.failedPasscodeAttempts ?? opened.failedPasscodeAttempts, daemon: daemon, containers: containers,
                                damagedContainers: listing.damaged.map { Report.Damage(path: "containers/\($0.folder)", problem: $0.problem) })
            let damage = (report.damagedContainers + containers.flatMap { container in
                container.damaged.map { Report.Damage(path: "\(container.bundleIdentifier):\($0.path)", problem: $0.problem) }
            }).map { (path: $0.path, problem: $0.problem) }
            if json {
                try printJSON(report)
                try failIfDamaged(damage)
                return
            }
            print("Device \(report.root)")
            print("  keybag id:      \(report.keybagID)")
            print("  device secret:  \(report.deviceSecret)")
            if let daemon {
                print("  state:          \(report.state) (held by the daemon, pid \(daemon.pid))")
                print("  daemon:         socket \(daemon.socketPath), \(daemon.subscribers) subscriber(s) including this command, grace \(daemon.gracePeriod) s")
                print("  lock triggers:  " + (daemon.lockTriggers.isEmpty ? "none (only `sandboxctl lock`; see `sandboxctl daemon --lock-on`)"
                    : daemon.lockTriggers.joined(separator: ", ") + (daemon.lockTriggersConnected ? " (following logind on the system bus)" : " (not active: no system bus or logind yet)")))
                print("  daemon memory:  core dumps \(daemon.coreDumpsDisabled ? "disabled" : "ENABLED"), \(daemon.lockedMemoryKiB.map { "\($0) KiB" } ?? "unknown") locked")
            } else {
                print("  state:          \(report.state) (no daemon: this command's own key holder)")
            }
            print("  failed passcode attempts: \(report.failedPasscodeAttempts)")
            print("  containers:     \(report.containers.count)")
            for container in report.containers {
                let counts = ProtectionClass.allCases.map { "\($0.letter) \(container.files[$0.name] ?? 0)" }.joined(separator: ", ")
                print("    \(container.bundleIdentifier)  default \(container.defaultProtection); files: \(counts); \(container.bytes) bytes"
                      + (container.unreadable > 0 ? "; \(container.unreadable) unreadable" : "")
                      + (container.damaged.isEmpty ? "" : "; \(container.damaged.count) damaged"))
            }
            for damaged in report.damagedContainers {
                print("    \(damaged.path)  damaged: \(damaged.problem)")
            }
            try failIfDamaged(damage)
        }
    }

    private func count(in container: Container, path: String, into report: inout Report.ContainerReport) throws {
        for item in try container.contentsOfDirectory(atPath: path) {
            if let problem = item.problem, item.type != .typeRegular {
                report.damaged.append(Report.Damage(path: item.path, problem: problem))
                continue
            }
            switch item.type {
            case .typeDirectory:
                try count(in: container, path: item.path, into: &report)
            case .typeRegular:
                if let protectionClass = item.protectionClass {
                    report.files[protectionClass.name, default: 0] += 1
                    report.bytes += item.size
                } else {
                    report.unreadable += 1
                    report.damaged.append(Report.Damage(path: item.path, problem: item.problem ?? "unreadable"))
                }
            default:
                break
            }
        }
    }
}
