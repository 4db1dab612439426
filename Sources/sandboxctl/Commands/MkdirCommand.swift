import ArgumentParser
import ProtectedStore

struct MkdirCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mkdir",
        abstract: "Create a directory in a container, optionally with a class for the new items in it.",
        discussion: "Needs no passcode. Without --protection the directory takes its parent's class, if one is set."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(name: .short, help: "Create missing parent directories; an existing directory is not an error.")
    var parents = false

    @Option(help: ProtectionClass.optionHelp("Class for new items in the directory"))
    var protection: ProtectionClass?

    @Argument(help: ArgumentHelp("The directory to create.", valueName: "bundle:path"))
    var target: ContainerReference

    func run() throws {
        let path = try target.requireItemPath()
        try reportingErrors {
            try device.open()
                .container(bundleIdentifier: target.bundleIdentifier)
                .createDirectory(atPath: path, withIntermediateDirectories: parents,
                                 attributes: protection.map { [.protectionKey: $0.fileProtectionType] } ?? [:])
        }
    }
}
