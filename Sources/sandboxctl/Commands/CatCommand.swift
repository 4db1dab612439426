import ArgumentParser
import Foundation
import ProtectedStore

struct CatCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cat",
        abstract: "Decrypt a file of a container to standard output.",
        discussion: "Asks for the passcode only when the file's class needs it (not for class D). Streams in bounded memory whatever the file's size, so it can be piped to `head`. Exits 77 when data protection denies the read."
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
            let handle = try session.withKeys { try container.fileHandle(forReadingAtPath: path) }
            defer { try? handle.close() }
            // As cat(1): a reader that stops early (head) ends this command with SIGPIPE.
            signal(SIGPIPE, SIG_DFL)
            var offset: UInt64 = 0
            while offset < handle.size {
                let chunk = try handle.read(upToCount: Self.chunkBytes, atOffset: offset)
                if chunk.isEmpty { break }
                try writeToStandardOutput(chunk)
                offset += UInt64(chunk.count)
            }
        }
    }

    /// Plaintext bytes decrypted and written per step: the command's memory, whatever the file's size.
    static let chunkBytes = 1 << 20

    private func writeToStandardOutput(_ chunk: Data) throws {
        try chunk.withUnsafeBytes { bytes in
            var done = 0
            while done < bytes.count {
                let count = write(STDOUT_FILENO, bytes.baseAddress! + done, bytes.count - done)
                if count < 0 {
                    if errno == EINTR { continue }
                    throw ProtectedStoreError(.io, path: "standard output", problem: "cannot write the file's bytes (\(String(cString: strerror(errno))))",
                                              remedy: "Check where standard output goes (a full disk, a closed pipe)")
                }
                done += count
            }
        }
    }
}
