import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Throughput of the file format against its block cipher alone (libsodium, one core) and against plain files,
/// measured in one run.
public struct CryptoBenchmark: Sendable {
    /// Figures in MB/s (10^6 bytes per second), each the median of `rounds` runs.
    public struct Result: Sendable, Codable {
        /// XChaCha20-Poly1305 alone, one core: the baseline the targets are stated against.
        public var aeadRawMBps: Double
        /// The cipher new files get on this machine (docs/FORMAT.md §4.4), and its throughput alone on one core.
        public var cipher: String
        public var cipherRawMBps: Double
        /// AES-256-GCM alone with a fresh seed for every block rather than one per write (so stored nonce fields would
        /// not show which blocks one write sealed), where the CPU has AES-NI: what hiding that would cost.
        public var gcmSeedPerBlockRawMBps: Double?
        /// AES-256-GCM alone as the format seals it, one seed per write, in the same run (nil without AES-NI).
        public var gcmSeedPerPassRawMBps: Double?
        public var writeMBps: Double
        public var readMBps: Double
        public var plainWriteMBps: Double
        public var plainReadMBps: Double
        public var blockSize: Int
        public var sizeMiB: Int
        public var cores: Int
        public var rounds: Int

        // The JSON keys scripts read (`sandboxctl bench crypto --json`).
        enum CodingKeys: String, CodingKey {
            case aeadRawMBps = "aead_raw_MBps", cipher, cipherRawMBps = "cipher_raw_MBps", writeMBps = "write_MBps", readMBps = "read_MBps"
            case gcmSeedPerBlockRawMBps = "gcm_seed_per_block_raw_MBps", gcmSeedPerPassRawMBps = "gcm_seed_per_pass_raw_MBps"
            case plainWriteMBps = "plain_write_MBps", plainReadMBps = "plain_read_MBps"
            case blockSize = "block_size", sizeMiB = "size_mib", cores, rounds
        }

        /// Encrypted write throughput over XChaCha20-Poly1305 alone on one core.
        public var writeRatio: Double { writeMBps / aeadRawMBps }
        /// Encrypted read throughput over XChaCha20-Poly1305 alone on one core.
        public var readRatio: Double { readMBps / aeadRawMBps }
    }

    public static let callSize = 1 << 20

    public var sizeMiB: Int
    public var blockSize: Int
    public var rounds: Int
    /// Directory for the benchmark files (they are removed afterwards).
    public var directory: String

    public init(sizeMiB: Int, blockSize: Int = EncryptedFile.defaultBlockSize, rounds: Int = 5, directory: String) {
        self.sizeMiB = sizeMiB
        self.blockSize = blockSize
        self.rounds = rounds
        self.directory = directory
    }

    public func run() throws -> Result {
        let root = (directory as NSString).appendingPathComponent("sandboxctl-bench-\(Random.bytes(4).hex)")
        try FileSystem.createDirectories(root)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let device = try Device.create(root: (root as NSString).appendingPathComponent("device"),
                                       deviceSecretPath: (root as NSString).appendingPathComponent("device.secret"),
                                       passcode: try Passcode("benchmark"), kdf: .fast)
        var payload = Random.bytes(Self.callSize)
        defer { zeroize(&payload) }
        let bytes = Double(sizeMiB * Self.callSize)
        func throughput(_ body: () throws -> Void) rethrows -> Double {
            var samples: [Double] = []
            for _ in 0..<rounds {
                let start = ContinuousClock.now
                try body()
                let elapsed = ContinuousClock.now - start
                let seconds = elapsed / .seconds(1)
                samples.append(bytes / seconds / 1e6)
            }
            return samples.sorted()[samples.count / 2]
        }

        let encryptedPath = (root as NSString).appendingPathComponent("encrypted")
        let plainPath = (root as NSString).appendingPathComponent("plain")
        let cipher = FileHeader.Cipher.preferred
        let xChaChaMBps = try throughput { try sealAlone(payload: payload, cipher: .xChaCha20Poly1305) }
        let gcm = FileHeader.Cipher.aes256GCM.isAvailable
        return Result(
            aeadRawMBps: xChaChaMBps,
            cipher: cipher.name,
            cipherRawMBps: cipher == .xChaCha20Poly1305 ? xChaChaMBps : try throughput { try sealAlone(payload: payload, cipher: cipher) },
            gcmSeedPerBlockRawMBps: gcm ? try throughput { try sealAlone(payload: payload, cipher: .aes256GCM, seedPerBlock: true) } : nil,
            gcmSeedPerPassRawMBps: gcm ? try throughput { try sealAlone(payload: payload, cipher: .aes256GCM) } : nil,
            writeMBps: try throughput {
                unlink(encryptedPath)
                let file = try EncryptedFile.create(at: encryptedPath, protectionClass: .complete, keys: device, blockSize: blockSize)
                for call in 0..<sizeMiB { try file.write(payload, at: Int64(call * Self.callSize)) }
                try file.close()
            },
            readMBps: try throughput {
                let file = try EncryptedFile.open(at: encryptedPath, keys: device, writable: false)
                var buffer = [UInt8](repeating: 0, count: Self.callSize)
                for call in 0..<sizeMiB {
                    _ = try buffer.withUnsafeMutableBytes { try file.read(into: $0, at: Int64(call * Self.callSize)) }
                }
                try file.close()
            },
            plainWriteMBps: try throughput {
                unlink(plainPath)
                let fd = try FileLocation(path: plainPath).open(.writeOnly, options: [.create, .exclusiveCreate], permissions: [.ownerReadWrite], doing: "create")
                try fd.closeAfter {
                    for call in 0..<sizeMiB { _ = try fd.writeAll(toAbsoluteOffset: Int64(call * Self.callSize), payload) }
                }
            },
            plainReadMBps: try throughput {
                let fd = try FileLocation(path: plainPath).open(.readOnly, doing: "open")
                var buffer = [UInt8](repeating: 0, count: Self.callSize)
                try fd.closeAfter {
                    for call in 0..<sizeMiB {
                        _ = try buffer.withUnsafeMutableBytes { try fd.read(fromAbsoluteOffset: Int64(call * Self.callSize), into: $0) }
                    }
                }
            },
            blockSize: blockSize, sizeMiB: sizeMiB, cores: ProcessInfo.processInfo.activeProcessorCount, rounds: rounds)
    }

    /// One cipher alone, one core, in memory, as the format seals blocks: same block size, associated-data length and
    /// nonce fields, one sealing pass per 1 MiB call.
    private func sealAlone(payload: [UInt8], cipher: FileHeader.Cipher, seedPerBlock: Bool = false) throws {
        let key = SecureBytes.random(count: FileHeader.fileKeyBytes)
        defer { key.discard() }
        try key.withUnsafeBytes { fileKey in
            payload.withUnsafeBytes { calls in
                for _ in 0..<sizeMiB { BlockCipher.sealDiscarding(calls, blockSize: blockSize, cipher: cipher, fileKey: fileKey, seedPerBlock: seedPerBlock) }
            }
        }
    }
}
