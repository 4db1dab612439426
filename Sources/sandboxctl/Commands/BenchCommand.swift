import ArgumentParser
import Foundation
import ProtectedStore

struct BenchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure performance against a baseline taken in the same run.",
        subcommands: [CryptoBench.self]
    )
}

struct CryptoBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crypto",
        abstract: "Encrypted file throughput against libsodium's AEAD alone and against plain files.",
        discussion: "Sequential writes and reads in 1 MiB calls through the file format on disk (page cache, no fsync), beside libsodium's XChaCha20-Poly1305 alone in memory on one core, and plain files of the same size. MB/s are 10^6 bytes per second; each figure is the median of 5 rounds."
    )

    @Option(help: ArgumentHelp("Data size in MiB.", valueName: "n"))
    var sizeMib = 256

    @Option(help: ArgumentHelp("Plaintext block size to measure (power of two, 512 to 1048576).", valueName: "bytes"))
    var blockSize = EncryptedFile.defaultBlockSize

    @Option(help: ArgumentHelp("Directory for the temporary benchmark files.", valueName: "dir"))
    var directory = FileManager.default.temporaryDirectory.path

    @Flag(help: "Print one JSON object instead of a table.")
    var json = false

    func validate() throws {
        guard sizeMib > 0 else { throw ValidationError("--size-mib must be at least 1") }
        guard blockSize >= 512, blockSize <= 1 << 20, blockSize & (blockSize - 1) == 0 else {
            throw ValidationError("--block-size must be a power of two from 512 to 1048576")
        }
    }

    func run() throws {
        try reportingErrors {
            let result = try CryptoBenchmark(sizeMiB: sizeMib, blockSize: blockSize, directory: directory).run()
            if json {
                try printJSON(result)
                return
            }
            func row(_ name: String, _ value: Double, _ note: String = "") {
                print(name.padding(toLength: 22, withPad: " ", startingAt: 0) + String(format: "%9.1f MB/s", value) + note)
            }
            print("\(sizeMib) MiB, \(blockSize)-byte blocks, \(result.cores) cores, median of \(result.rounds) rounds")
            row("AEAD alone (1 core)", result.aeadRawMBps)
            row("encrypted write", result.writeMBps, String(format: "   %.2f x AEAD (target >= 0.85)", result.writeRatio))
            row("encrypted read", result.readMBps, String(format: "   %.2f x AEAD (target >= 0.85)", result.readRatio))
            row("plain write", result.plainWriteMBps)
            row("plain read", result.plainReadMBps)
        }
    }
}
