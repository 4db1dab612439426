import CSodium
import Foundation

extension FileHeader.Cipher {
    /// The cipher new files are sealed with: of those libsodium can use here, the one that seals blocks fastest, if it
    /// beats XChaCha20-Poly1305 by a clear margin; else XChaCha20-Poly1305. Measured once per process.
    package static let preferred: Self = measuredFastest()

    /// Whether this process can seal and open blocks with it: libsodium's AES-256-GCM needs AES-NI and PCLMUL, and
    /// AEGIS-256 a libsodium of 1.0.19 or later.
    package var isAvailable: Bool {
        switch self {
        case .xChaCha20Poly1305: true
        case .aes256GCM: Sodium.isAES256GCMAvailable
        case .aegis256: Sodium.isAEGIS256Available
        }
    }

    /// The name `status` and the benchmarks print.
    package var name: String {
        switch self {
        case .xChaCha20Poly1305: "XChaCha20-Poly1305"
        case .aes256GCM: "AES-256-GCM"
        case .aegis256: "AEGIS-256"
        }
    }

    /// Bytes of the tag that follows each block's ciphertext (docs/FORMAT.md §4.3).
    package var tagBytes: Int {
        switch self {
        case .xChaCha20Poly1305, .aes256GCM: 16
        case .aegis256: Int(PS_AEGIS256_TAGBYTES)
        }
    }

    /// Why a file of this cipher can't be opened in this process, for the error that refuses it; nil where it can.
    var unavailability: (problem: String, remedy: String)? {
        guard !isAvailable else { return nil }
        switch self {
        case .xChaCha20Poly1305:
            return nil
        case .aes256GCM:
            return ("libsodium can't use it on this CPU (it needs AES-NI and PCLMUL)",
                    "Open it on a machine whose CPU has them (grep -w -e aes -e pclmulqdq /proc/cpuinfo), or copy it out there and back in")
        case .aegis256:
            return ("this build of ProtectedStore was compiled against libsodium headers without it (AEGIS-256 came with libsodium 1.0.19; support is fixed when the package is built, whatever libsodium \(Sodium.version) is loaded now)",
                    "Open it with a build compiled against libsodium 1.0.19 or later (README, \"A faster cipher\"), or copy it out there and back in")
        }
    }

    /// Seals the same blocks with each cipher, alternating, and keeps each one's best time: about a millisecond per
    /// cipher. Another cipher has to beat XChaCha20-Poly1305 by a clear margin, so noise can't flip the choice on a CPU
    /// where the two are close.
    private static func measuredFastest() -> Self {
        let candidates = allCases.filter(\.isAvailable)
        guard candidates.count > 1 else { return .xChaCha20Poly1305 }
        let key = SecureBytes.random(count: FileHeader.fileKeyBytes)
        defer { key.discard() }
        let plaintext = [UInt8](repeating: 0x5A, count: 16 * 4096)
        var best: [Self: UInt64] = [:]
        for _ in 0..<3 {
            for cipher in candidates {
                let start = DispatchTime.now().uptimeNanoseconds
                try? key.withUnsafeBytes { fileKey in
                    plaintext.withUnsafeBytes { BlockCipher.sealDiscarding($0, blockSize: 4096, cipher: cipher, fileKey: fileKey) }
                }
                best[cipher] = min(best[cipher] ?? .max, DispatchTime.now().uptimeNanoseconds - start)
            }
        }
        let fastest = candidates.min { best[$0]! < best[$1]! }!
        return Double(best[fastest]!) < 0.9 * Double(best[.xChaCha20Poly1305]!) ? fastest : .xChaCha20Poly1305
    }
}
