import ArgumentParser
import Foundation
import ProtectedStore
import ProtectedStoreBenchmarks

struct BenchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure performance against a baseline taken in the same run.",
        subcommands: [CryptoBench.self, LockBench.self, FreezerBench.self, KeychainBench.self]
    )
}

struct CryptoBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crypto",
        abstract: "Encrypted file throughput against the ciphers alone and against plain files.",
        discussion: "Sequential writes and reads in 1 MiB calls through the file format on disk (page cache, no fsync), beside libsodium's XChaCha20-Poly1305 alone in memory on one core (the baseline of the targets), the cipher new files get here (it depends on the CPU and the linked libsodium) alone on one core, AES-256-GCM with a seed per write (as stored) and per block (what hiding which blocks one write sealed would cost) where the CPU has AES-NI, and plain files of the same size. MB/s are 10^6 bytes per second; each figure is the median of 5 rounds."
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
                print(name.padding(toLength: 34, withPad: " ", startingAt: 0) + String(format: "%9.1f MB/s", value) + note)
            }
            print("\(sizeMib) MiB, \(blockSize)-byte blocks, \(result.cores) cores, new files sealed with \(result.cipher), median of \(result.rounds) rounds")
            row("XChaCha20-Poly1305 alone (1 core)", result.aeadRawMBps)
            if result.cipher != FileHeader.Cipher.xChaCha20Poly1305.name { row("\(result.cipher) alone (1 core)", result.cipherRawMBps) }
            if let perBlock = result.gcmSeedPerBlockRawMBps, let perPass = result.gcmSeedPerPassRawMBps {
                row("AES-256-GCM, a seed per write", perPass)
                row("AES-256-GCM, a seed per block", perBlock, String(format: "   %.2f x a seed per write (what hiding passes would cost)", perBlock / perPass))
            }
            func ratios(_ value: Double, _ ratio: Double, target: Double) -> String {
                String(format: "   %.2f x XChaCha20-Poly1305 alone (target >= %.1f), %.2f x ", ratio, target, value / result.cipherRawMBps) + "\(result.cipher) alone"
            }
            row("encrypted write", result.writeMBps, ratios(result.writeMBps, result.writeRatio, target: 1.3))
            row("encrypted read", result.readMBps, ratios(result.readMBps, result.readRatio, target: 1.6))
            row("plain write", result.plainWriteMBps)
            row("plain read", result.plainReadMBps)
        }
    }
}

struct LockBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Key daemon: lock fan-out to N subscribers, key discard, and unlock overhead over Argon2id.",
        discussion: "Runs a daemon on a temporary device in this process (real Unix socket) and N subscriber connections served by one thread that acknowledges each event on arrival. Each figure is the median of the rounds. Targets: fan-out to 1000 within 100 ms; keys discarded within 10 ms of the last acknowledgement (N=100); unlock overhead under 5 ms."
    )

    @Option(help: ArgumentHelp("Number of subscriber connections.", valueName: "n"))
    var subscribers = 100

    @Option(help: ArgumentHelp("Rounds per figure.", valueName: "n"))
    var rounds = 7

    @Option(help: ArgumentHelp("Argon2id cost of the temporary device: \(KDFPreset.allCases.map(\.rawValue).joined(separator: ", ")).", valueName: "preset"))
    var kdf: KDFPreset = .interactive

    @Option(help: ArgumentHelp("Directory for the temporary device.", valueName: "dir"))
    var directory = FileManager.default.temporaryDirectory.path

    @Flag(help: "Print one JSON object instead of a table.")
    var json = false

    func validate() throws {
        guard subscribers >= 1, subscribers <= 5000 else { throw ValidationError("--subscribers must be 1 to 5000") }
        guard rounds >= 1 else { throw ValidationError("--rounds must be at least 1") }
    }

    func run() throws {
        try reportingErrors {
            let result = try LockBenchmark(subscribers: subscribers, rounds: rounds, kdf: kdf, directory: directory).run()
            if json {
                try printJSON(result)
                return
            }
            func row(_ name: String, _ value: Double, _ note: String) {
                print(name.padding(toLength: 40, withPad: " ", startingAt: 0) + String(format: "%9.2f ms", value) + "   " + note)
            }
            print("\(subscribers) subscribers, KDF \(kdf.rawValue), median of \(rounds) rounds")
            row("status round trip (baseline)", result.statusRoundTripMilliseconds, "")
            row("lock fan-out, grace 0", result.fanOutMilliseconds,
                String(format: "%.0f x round trip; target <= 100 ms for 1000", result.fanOutMilliseconds / result.statusRoundTripMilliseconds))
            row("lock until keys discarded, grace 0", result.keysDiscardedMilliseconds, "")
            row("keys discarded after last ack", result.discardAfterLastAcknowledgementMilliseconds, "target <= 10 ms for 100")
            row("Argon2id alone (baseline)", result.argon2idMilliseconds, "")
            row("unlock", result.unlockMilliseconds,
                String(format: "overhead %.2f ms (%.3f x Argon2id); target < 5 ms", result.unlockOverheadMilliseconds, result.unlockMilliseconds / result.argon2idMilliseconds))
        }
    }
}

struct FreezerBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "freezer",
        abstract: "Launched apps: suspend and resume latency of 1 and of 100 processes, the cgroup freezer beside SIGSTOP.",
        discussion: """
            Starts the processes in a PID namespace of their own (unshare; with a user namespace when not root) and \
            suspends and resumes them as the daemon does an app's: through the app's own cgroup (cgroup.freeze, until \
            cgroup.events says frozen) and through SIGSTOP to each process (until every one is stopped). Each figure is \
            the median of the rounds. The cgroup rows need a writable cgroup v2 hierarchy (root, or a delegated unit).
            """
    )

    @Option(help: ArgumentHelp("Rounds per figure.", valueName: "n"))
    var rounds = 21

    @Flag(help: "Print one JSON object instead of a table.")
    var json = false

    func validate() throws {
        guard rounds >= 1, rounds <= 10_000 else { throw ValidationError("--rounds must be 1 to 10000") }
    }

    func run() throws {
        try reportingErrors {
            let result = try FreezerBenchmark(rounds: rounds).run()
            if json { return try printJSON(result) }
            print("median of \(rounds) rounds")
            print("PROCESSES  MECHANISM   SUSPEND (ms)  RESUME (ms)  SUSPEND vs SIGSTOP")
            for row in result.rows {
                let baseline = result.rows.first { $0.processes == row.processes && $0.mechanism == "sigstop" }
                let ratio = baseline.map { String(format: "%.2f x", row.suspendMilliseconds / $0.suspendMilliseconds) } ?? ""
                print("\(row.processes)".padding(toLength: 11, withPad: " ", startingAt: 0) + row.mechanism.padding(toLength: 12, withPad: " ", startingAt: 0)
                      + String(format: "%12.3f  %11.3f  ", row.suspendMilliseconds, row.resumeMilliseconds) + ratio)
            }
            if let reason = result.cgroupUnavailable { print("cgroup freezer not measured: \(reason)") }
        }
    }
}

struct KeychainBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keychain",
        abstract: "Keychain add and find, in process and through the key daemon, against plain SQLite.",
        discussion: "For each size: a fresh device, N adds (one transaction each, synchronous = FULL) of 64-byte secrets, then random finds with the secret. In process: this process opens the items. Attached: this process opens the database, the daemon (in this process, on a real socket) unwraps each item's key. Through the daemon: each call is one keychain request, as a launched app's. The floor is the same rows in a plain SQLite table on the same disk, same journal and synchronous settings, nothing sealed. Means in µs per call."
    )

    @Option(parsing: .upToNextOption, help: ArgumentHelp("Keychain sizes to measure.", valueName: "n"))
    var items: [Int] = [10, 10_000]

    @Option(help: ArgumentHelp("Finds per size.", valueName: "n"))
    var finds = 1_000

    @Option(help: ArgumentHelp("Directory for the temporary devices (on the disk to measure).", valueName: "dir"))
    var directory = "/var/tmp"

    @Flag(help: "Print one JSON object instead of a table.")
    var json = false

    func validate() throws {
        guard !items.isEmpty, items.allSatisfy({ $0 >= 1 && $0 <= 1_000_000 }) else { throw ValidationError("--items must be 1 to 1000000") }
        guard finds >= 1 else { throw ValidationError("--finds must be at least 1") }
    }

    func run() throws {
        try reportingErrors {
            let result = try KeychainBenchmark(sizes: items, finds: finds, directory: directory).run()
            if json {
                try printJSON(result)
                return
            }
            for size in result.sizes {
                print("\(size.items) items, \(size.finds) finds (µs per call, × the plain SQLite floor)")
                func row(_ name: String, _ value: Double, _ floor: Double) {
                    print(name.padding(toLength: 36, withPad: " ", startingAt: 0) + String(format: "%10.1f µs   %6.2f ×", value, value / floor))
                }
                row("plain SQLite insert (floor)", size.sqliteInsertMicroseconds, size.sqliteInsertMicroseconds)
                row("add, in process", size.inProcess.addMicroseconds, size.sqliteInsertMicroseconds)
                row("add, attached to the daemon", size.attached.addMicroseconds, size.sqliteInsertMicroseconds)
                row("add, through the daemon", size.throughDaemon.addMicroseconds, size.sqliteInsertMicroseconds)
                row("plain SQLite lookup (floor)", size.sqliteLookupMicroseconds, size.sqliteLookupMicroseconds)
                row("find, in process", size.inProcess.findMicroseconds, size.sqliteLookupMicroseconds)
                row("find, attached to the daemon", size.attached.findMicroseconds, size.sqliteLookupMicroseconds)
                row("find, through the daemon", size.throughDaemon.findMicroseconds, size.sqliteLookupMicroseconds)
            }
        }
    }
}
