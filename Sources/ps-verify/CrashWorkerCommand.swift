import ArgumentParser
import Foundation
import ProtectedStore

/// The process the crash harness kills: opens the device, reports `ready`, then performs operations of one kind back
/// to back, reporting `done N` the moment version N is complete, until it is killed (or `--limit` is reached).
struct CrashWorkerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash-worker", abstract: "Internal: the writer that `ps-verify crash` kills. Reads the passcode from standard input.",
        shouldDisplay: false)

    @Option(help: "Device root.") var root: String
    @Option(help: "Device secret file.") var deviceSecret: String
    @Option(help: "Operation kind.") var kind: CrashKind
    @Option(help: "Trial number (names this run's files).") var trial: Int
    @Option(help: "The version the device holds now; the first operation makes version+1.") var version: Int
    @Option(help: "Stop after this many operations.") var limit = 10_000
    @Flag(help: "Stay before first unlock (Inbox deliveries only).") var locked = false

    func run() throws {
        guard let passcode = readLine() else { throw ValidationError("the passcode is read from standard input") }
        let device = try Device.open(root: root, deviceSecretPath: deviceSecret, notificationCenter: NotificationCenter())
        if !locked { try device.unlock(passcode: try Passcode(passcode)) }
        let container = try device.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
        // Beside the device, so the harness removes it with the device even though this process is killed.
        let sources = ((root as NSString).deletingLastPathComponent as NSString).appendingPathComponent("sources-\(getpid())")
        if kind == .inbox { try FileManager.default.createDirectory(atPath: sources, withIntermediateDirectories: true) }
        defer { try? FileManager.default.removeItem(atPath: sources) }
        emitLine("ready")
        var current = version
        var currentPasscode = passcode
        for _ in 0..<limit {
            let next = current + 1
            try kind.perform(version: next, trial: trial, device: device, container: container, passcode: &currentPasscode, sources: sources)
            emitLine("done \(next)")
            current = next
        }
    }
}
