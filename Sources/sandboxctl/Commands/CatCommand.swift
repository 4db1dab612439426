import ArgumentParser
import Foundation
import ProtectedStore

struct CatCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cat",
        abstract: "Decrypt a file of a container to standard output.",
        discussion: "Asks for the passcode only when the file's class needs it (not for class D). Exits 77 when data protection denies the read."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions

    @Argument(help: ArgumentHelp("The file to print.", valueName: "bundle:path"))
    var source: ContainerReference

    func run() throws {
        let path = try source.requireItemPath()
        try reportingErrors {
            let session = try KeySession(device, passcode)
            let container = try session.container(source)
            let contents = try session.withKeys { try container.contents(atPath: path) }
            FileHandle.standardOutput.write(contents)
        }
    }
}
