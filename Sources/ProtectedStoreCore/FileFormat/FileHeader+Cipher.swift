import CSodium
import Foundation

extension FileHeader.Cipher {
    /// The cipher new files are sealed with: AES-256-GCM where libsodium can use it on this CPU (AES-NI and PCLMUL) and
    /// it seals blocks faster here than XChaCha20-Poly1305, else XChaCha20-Poly1305. Measured once per process.
    package static let preferred: Self = measuredFastest()

    /// Whether this process can seal and open blocks with it (libsodium's AES-256-GCM needs AES-NI and PCLMUL).
    package var isAvailable: Bool {
        switch self {
        case .xChaCha20Poly1305: true
        case .aes256GCM: Sodium.isAES256GCMAvailable
        }
    }

    /// The name `status` and the benchmarks print.
    package var name: String {
        switch self {
        case .xChaCha20Poly1305: "XChaCha20-Poly1305"
        case .aes256GCM: "AES-256-GCM"
        }
    }

    /// Seals the same blocks with both ciphers, alternating, and keeps the faster one's best time: about a millisecond,
    /// and AES-256-GCM has to win by a clear margin, so noise can't flip the choice on a CPU where the two are close.
    private static func measuredFastest() -> Self {
        guard FileHeader.Cipher.aes256GCM.isAvailable else { return .xChaCha20Poly1305 }
        let key = SecureBytes.random(count: FileHeader.fileKeyBytes)
        defer { key.discard() }
        let plaintext = [UInt8](repeating: 0x5A, count: 16 * 4096)
        var best: [Self: UInt64] = [:]
        for _ in 0..<3 {
            for cipher in allCases {
                let start = DispatchTime.now().uptimeNanoseconds
                try? key.withUnsafeBytes { fileKey in
                    plaintext.withUnsafeBytes { BlockCipher.sealDiscarding($0, blockSize: 4096, cipher: cipher, fileKey: fileKey) }
                }
                best[cipher] = min(best[cipher] ?? .max, DispatchTime.now().uptimeNanoseconds - start)
            }
        }
        return Double(best[.aes256GCM]!) < 0.9 * Double(best[.xChaCha20Poly1305]!) ? .aes256GCM : .xChaCha20Poly1305
    }
}
