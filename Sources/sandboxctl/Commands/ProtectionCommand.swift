import ArgumentParser
import Foundation
import ProtectedStore

struct ProtectionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "protection",
        abstract: "Show or change the class of a file or directory (FileAttributeKey.protectionKey).",
        discussion: "Changing a file's class re-wraps its key without touching its contents; it needs the current class's key (the passcode is asked if needed). A directory's class applies to new items in it."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions

    @Option(help: ProtectionClass.optionHelp("The new class"))
    var set: ProtectionClass?

    @Flag(help: "Print JSON for scripts.")
    var json = false

    @Argument(help: ArgumentHelp("The file or directory.", valueName: "bundle:path"))
    var target: ContainerReference

    struct Report: Encodable {
        var path, protection, letter, fileProtectionType: String
        var inherited: Bool
    }

    func run() throws {
        try reportingErrors {
            let session = try KeySession(device, passcode)
            let container = try session.container(target)
            if let set {
                let path = try target.requireItemPath()
                try session.withKeys { try container.setProtection(set.fileProtectionType, ofItemAtPath: path) }
            }
            let item = try container.itemInfo(atPath: target.path)
            let explicitClass = item.protectionClass
            let effective = explicitClass ?? ProtectionClass(container.defaultProtection)!
            let inherited = explicitClass == nil && item.type == .typeDirectory
            if json {
                try printJSON(Report(path: target.description, protection: effective.name, letter: effective.letter,
                                     fileProtectionType: effective.fileProtectionType.rawValue, inherited: inherited))
            } else {
                print("\(target): \(effective.name) (class \(effective.letter), \(effective.fileProtectionType.rawValue))\(inherited ? ", the container default" : "")")
            }
        }
    }
}
