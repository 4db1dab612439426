import ArgumentParser
import Foundation
import ProtectedStore

struct LockCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Lock the device in its daemon: every attached program gets 'will become unavailable', then the keys go.",
        discussion: "Returns once the class A and B keys are discarded: when every subscriber has acknowledged, or the grace period has passed. During another lock's grace period, the sooner deadline wins: `lock --grace 0` locks now, and the earlier `lock` returns too. Exits 69 when no daemon runs."
    )

    @OptionGroup var device: DeviceOptions

    @Option(help: ArgumentHelp("Seconds to wait for subscribers that have not acknowledged (default: the daemon's --grace).", valueName: "seconds"))
    var grace: Double?

    func validate() throws {
        if let grace, !(grace >= 0 && grace <= 3600) { throw ValidationError("--grace must be 0 to 3600 seconds") }
    }

    func run() async throws {
        try await reportingErrors {
            let attached = try device.attach()
            let start = ContinuousClock.now
            await attached.lock(gracePeriod: grace)
            let elapsed = ContinuousClock.now - start
            // The daemon's own view: also how a daemon that died meanwhile is reported (exit 69).
            guard let status = try attached.daemonStatus() else { return }
            print("Locked \(attached.root): state \(status.state.rawValue), \(status.subscribers - 1) other subscriber(s), keys discarded after \(String(format: "%.0f", elapsed / .milliseconds(1))) ms")
        }
    }
}
