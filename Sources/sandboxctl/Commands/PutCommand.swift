import ArgumentParser
import Foundation
import ProtectedStore

struct PutCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "put",
        abstract: "Encrypt a local file (or standard input) into a container, atomically.",
        discussion: "The class is --protection, else the replaced file's, else the directory's, else the container default. Class B files can be written while locked; a class A or C write asks for the passcode if needed. If the destination is a directory, the file keeps its name inside it. Streams in bounded memory whatever the source's size; a sparse source stays sparse."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions

    @Option(help: ProtectionClass.optionHelp("Class of the new file"))
    var protection: ProtectionClass?

    @Argument(help: ArgumentHelp("The local file to read, or - for standard input.", valueName: "source"))
    var source: String

    @Argument(help: ArgumentHelp("Where to write it.", valueName: "bundle:path"))
    var destination: ContainerReference

    func run() throws {
        try reportingErrors {
            let session = try KeySession(device, passcode)
            let container = try session.container(destination)
            var target = destination
            if (try? container.itemInfo(atPath: destination.path))?.type == .typeDirectory {
                guard source != "-" else { throw ValidationError("\(destination) is a directory; give the file's path, e.g. \(destination.appending("notes.txt"))") }
                target = destination.appending((source as NSString).lastPathComponent)
            }
            let path = try target.requireItemPath()
            let input = try openSource()
            defer { if source != "-" { try? input.close() } }
            let options = protection?.writingOption ?? []
            // A class A or C file before first unlock is refused when it is created, before anything is read from
            // the source, so the retry after the passcode prompt reads it whole.
            _ = try session.withKeys { try container.write(contentsOf: input, named: source == "-" ? "standard input" : source, toPath: path, options: options) }
            let written = try container.itemInfo(atPath: path)
            print("\(target): \(written.size) bytes, \(written.protectionClass?.name ?? "?")")
        }
    }

    private func openSource() throws -> FileHandle {
        if source == "-" { return FileHandle.standardInput }
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: source, isDirectory: &isDirectory) else {
            throw ProtectedStoreError(.notFound, path: source, problem: "no such local file", remedy: "Check the source path")
        }
        guard !isDirectory.boolValue else {
            throw ProtectedStoreError(.invalidArgument, path: source, problem: "it is a directory", remedy: "Put files one at a time")
        }
        guard let handle = FileHandle(forReadingAtPath: source) else {
            throw ProtectedStoreError(.io, path: source, problem: "cannot read the local file", remedy: "Check its permissions")
        }
        return handle
    }
}
