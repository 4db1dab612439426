import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Throughput of the file format against libsodium's AEAD alone and against plain files, measured in one run.
public struct CryptoBenchmark: Sendable {
    /// Figures in MB/s (10^6 bytes per second), each the median of `rounds` runs.
    public struct Result: Sendable, Codable {
        public var aeadRawMBps: Double
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
            case aeadRawMBps = "aead_raw_MBps", writeMBps = "write_MBps", readMBps = "read_MBps"
            case plainWriteMBps = "plain_write_MBps", plainReadMBps = "plain_read_MBps"
            case blockSize = "block_size", sizeMiB = "size_mib", cores, rounds
        }

        /// Encrypted write throughput as a fraction of the raw single-core AEAD.
        public var writeRatio: Double { writeMBps / aeadRawMBps }
        /// Encrypted read throughput as a fraction of the raw single-core AEAD.
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
        return Result(
            aeadRawMBps: try throughput { try rawAEAD(payload: payload) },
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

    /// libsodium's XChaCha20-Poly1305 alone, one core, in memory, same block size and associated-data length as the format.
    private func rawAEAD(payload: [UInt8]) throws {
        let key = SecureBytes.random(count: AEAD.keyBytes)
        let nonce = Random.bytes(AEAD.nonceBytes)
        let associatedData = [UInt8](repeating: 7, count: FileHeader.idBytes + 9)
        var output = [UInt8](repeating: 0, count: blockSize + AEAD.tagBytes)
        try key.withUnsafeBytes { k in
            payload.withUnsafeBytes { p in
                nonce.withUnsafeBytes { n in
                    associatedData.withUnsafeBytes { ad in
                        output.withUnsafeMutableBytes { out in
                            for _ in 0..<sizeMiB {
                                for start in stride(from: 0, to: p.count, by: blockSize) {
                                    AEAD.seal(UnsafeRawBufferPointer(rebasing: p[start..<start + blockSize]), key: k, nonce: n,
                                              associatedData: ad, into: out)
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
