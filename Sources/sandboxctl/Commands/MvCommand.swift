import ArgumentParser
import ProtectedStore

struct MvCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mv",
        abstract: "Move or rename an item inside a container; files keep their class.",
        discussion: "Needs no passcode. The destination must not exist, unless it is a directory, into which the item moves under its own name."
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The item to move.", valueName: "bundle:path"))
    var source: ContainerReference

    @Argument(help: ArgumentHelp("The new path, in the same container.", valueName: "bundle:path"))
    var destination: ContainerReference

    func run() throws {
        guard source.bundleIdentifier == destination.bundleIdentifier else {
            throw ValidationError("Items move only inside one container (\(source.bundleIdentifier) and \(destination.bundleIdentifier) differ); copy with cat and put instead")
        }
        let from = try source.requireItemPath()
        try reportingErrors {
            let container = try device.open()
                .container(bundleIdentifier: source.bundleIdentifier)
            var target = destination
            if (try? container.itemInfo(atPath: destination.path))?.type == .typeDirectory || destination.path.isEmpty {
                target = destination.appending(from.splitAtSlashes(omittingEmpty: true).last ?? from)
            }
            try container.moveItem(atPath: from, toPath: target.path)
        }
    }
}
