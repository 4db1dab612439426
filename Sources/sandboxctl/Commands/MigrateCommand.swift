import ArgumentParser
import Foundation
import ProtectedStore

struct MigrateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Convert a device in on-disk format version 1 to format version 2, in place.",
        discussion: """
            Every file is decrypted and written again in the version 2 layout under a new key of the same class, then read \
            back and compared; names and Inbox records are encrypted; containers are renamed by id. The new containers are \
            built beside the old ones and switched in by two renames, so a crash or power cut at any instant leaves a \
            device that is version 1 or version 2 with nothing lost: run the command again to finish. Asks for the \
            passcode (wrong ones count towards the throttle). Refused while a daemon serves the device: stop it first. \
            On a device already in version 2 it does nothing.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Read the passcode as one line from standard input instead of the terminal.")
    var passcodeStdin = false

    @Flag(help: "Print the result as JSON: result (migrated, finished, already-current), counts and skipped paths.")
    var json = false

    private struct Report: Encodable {
        var root: String
        var result: String
        var containers: Int
        var directories: Int
        var files: Int
        var bytes: Int64
        var inboxRecords: Int
        var skipped: [String]
    }

    func run() throws {
        try reportingErrors {
            let root = device.resolvedRoot
            let summary = try DeviceFormat.migrate(root: root, deviceSecretPath: device.resolvedDeviceSecret) {
                try PasscodeInput.read(prompt: "Passcode: ", fromStandardInput: passcodeStdin)
            }
            if json {
                try printJSON(Report(root: root, result: summary.outcome.rawValue, containers: summary.containers, directories: summary.directories,
                                     files: summary.files, bytes: summary.bytes, inboxRecords: summary.inboxRecords, skipped: summary.skipped))
                return
            }
            switch summary.outcome {
            case .alreadyCurrent:
                print("The device in \(root) is already in format version 2: nothing to do")
            case .finished:
                print("Finished the interrupted migration of \(root): it is in format version 2")
            case .migrated:
                print("Migrated \(root) to format version 2: \(summary.containers) container(s), \(summary.directories) folder(s), "
                      + "\(summary.files) file(s) (\(summary.bytes) bytes, each read back and compared), \(summary.inboxRecords) Inbox record(s)")
                for path in summary.skipped {
                    print("  not carried over (left half-made by an interrupted version 1 operation, never readable): \(path)")
                }
            }
        }
    }
}
