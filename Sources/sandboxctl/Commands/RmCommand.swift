import ArgumentParser
import Foundation
import ProtectedStore

struct RmCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm",
        abstract: "Remove files (and, with -r, directories) from a container.",
        discussion: "Needs no passcode: removing needs no key. The container's own folders (Documents, Library/..., tmp) can't be removed."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(name: .short, help: "Remove directories and everything in them.")
    var recursive = false

    @Argument(help: ArgumentHelp("The items to remove.", valueName: "bundle:path"))
    var targets: [ContainerReference]

    func validate() throws {
        guard !targets.isEmpty else { throw ValidationError("Give at least one bundle:path to remove") }
    }

    func run() throws {
        try reportingErrors {
            let opened = try device.open()
            // Check every target before removing any, so one bad argument removes nothing.
            let checked = try targets.map { target in
                let path = try target.requireItemPath()
                let container = try opened.container(bundleIdentifier: target.bundleIdentifier)
                if try container.itemInfo(atPath: path).type == .typeDirectory {
                    guard recursive else {
                        throw ProtectedStoreError(.invalidArgument, path: target.description, problem: "it is a directory", remedy: "Pass -r to remove it and everything in it")
                    }
                    guard !Container.layout(bundleIdentifier: container.bundleIdentifier).contains(path.trimmingCharacters(in: CharacterSet(charactersIn: "/"))) else {
                        throw ProtectedStoreError(.invalidArgument, path: target.description, problem: "it is one of the container's own folders and can't be removed",
                                                  remedy: "Remove the items inside it instead")
                    }
                }
                return (container, path)
            }
            for (container, path) in checked { try container.removeItem(atPath: path) }
        }
    }
}
