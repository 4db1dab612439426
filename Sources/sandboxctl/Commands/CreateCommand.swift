import ArgumentParser
import ProtectedStore

struct CreateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Create an app container with the iOS layout (Documents, Documents/Inbox, Library/..., tmp).",
        discussion: "Needs no passcode. The default class plays the data-protection entitlement's role: new items whose directory sets no class get it."
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The app's bundle identifier, in reverse-DNS form (e.g. com.example.notes).", valueName: "bundle-id"))
    var bundleIdentifier: String

    @Option(help: ProtectionClass.optionHelp("Class of new items whose directory sets none"))
    var defaultProtection: ProtectionClass = .complete

    func run() throws {
        try reportingErrors {
            let opened = try device.open()
            let container = try opened.createContainer(bundleIdentifier: bundleIdentifier, defaultProtection: defaultProtection.fileProtectionType)
            print("Created container \(container.bundleIdentifier) (default class: \(defaultProtection.name))")
            for folder in Container.layout(bundleIdentifier: bundleIdentifier) { print("  \(folder)/") }
        }
    }
}
