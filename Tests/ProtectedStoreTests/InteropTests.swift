import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing

/// tools/independent_decrypt.py was written from docs/FORMAT.md alone (Python, PyNaCl); if it reads what we write,
/// the spec is complete and the code matches it.
@Suite("Independent decryptor (docs/FORMAT.md)")
struct InteropTests {
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("tools/independent_decrypt.py").path

    static let pyNaClAvailable: Bool = {
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        probe.arguments = ["python3", "-c", "import nacl.bindings"]
        probe.standardOutput = FileHandle.nullDevice
        probe.standardError = FileHandle.nullDevice
        guard (try? probe.run()) != nil else { return false }
        probe.waitUntilExit()
        return probe.terminationStatus == 0
    }()

    static func decrypt(root: String, secret: String, passcode: String, out: String, files: [String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script, "--root", root, "--device-secret", secret, "--out", out] + files
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = output
        try process.run()
        input.fileHandleForWriting.write(Data((passcode + "\n").utf8))
        try input.fileHandleForWriting.close()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }

    @Test("every class and size written here decrypts there, tampering is rejected there too",
          .enabled(if: pyNaClAvailable, "python3 with PyNaCl is not installed (pip install pynacl); skipping the independent decryptor"))
    func independentDecryptorReadsOurFiles() throws {
        let test = try TestDevice()
        var expected: [String: [UInt8]] = [:]
        for protectionClass in ProtectionClass.allCases {
            for size in [0, 1, 4095, 4096, 4097, 3 * 4096 + 5] {
                let path = test.path("\(protectionClass.letter)-\(size)")
                let contents = pattern(size, seed: protectionClass.rawValue)
                try test.device.writeFile(contents, to: path, protection: protectionClass)
                expected[path] = contents
            }
        }
        let reclassed = test.path("A-4097")
        let file = try EncryptedFile.open(at: reclassed, keys: test.device, writable: true)
        try file.write([9, 9, 9], at: 4000)
        try file.changeProtectionClass(to: .completeUnlessOpen, keys: test.device)
        try file.close()
        expected[reclassed]!.replaceSubrange(4000..<4003, with: [9, 9, 9])
        // Holes, a stale tail left by a shrink, and growth by truncate (FORMAT.md §4.3).
        let sparse = test.path("C-sparse")
        let holes = try EncryptedFile.create(at: sparse, protectionClass: .completeUntilFirstUserAuthentication, keys: test.device)
        try holes.write([1, 2, 3], at: 3 * 4096 + 10)
        try holes.truncate(to: 6 * 4096)
        try holes.close()
        expected[sparse] = [UInt8](repeating: 0, count: 3 * 4096 + 10) + [1, 2, 3] + [UInt8](repeating: 0, count: 3 * 4096 - 13)
        let shrunk = test.path("D-shrunk")
        let cut = try EncryptedFile.create(at: shrunk, protectionClass: .none, keys: test.device)
        try cut.write(pattern(3 * 4096, seed: 5), at: 0)
        try cut.truncate(to: 4096 + 100)
        try cut.truncate(to: 3 * 4096)
        try cut.close()
        expected[shrunk] = pattern(4096 + 100, seed: 5) + [UInt8](repeating: 0, count: 2 * 4096 - 100)
        try test.device.changePasscode(from: try Passcode(TestDevice.passcode), to: try Passcode("pässcode ✓"))

        let out = test.path("out")
        let files = expected.keys.sorted()
        let (status, log) = try Self.decrypt(root: test.root, secret: test.secretPath, passcode: "pässcode ✓", out: out, files: files)
        #expect(status == 0, "\(log)")
        for path in files {
            #expect(readRaw((out as NSString).appendingPathComponent((path as NSString).lastPathComponent)) == expected[path], "\(path)")
        }
        #expect(log.contains("A-4097: OK 4097 bytes class B"))

        let (wrongStatus, _) = try Self.decrypt(root: test.root, secret: test.secretPath, passcode: TestDevice.passcode, out: out, files: files)
        #expect(wrongStatus == 2)
        var tampered = readRaw(files[0])
        tampered[tampered.count - 1] ^= 1
        writeRaw(tampered, files[0])
        let (tamperedStatus, tamperedLog) = try Self.decrypt(root: test.root, secret: test.secretPath, passcode: "pässcode ✓", out: out, files: [files[0]])
        #expect(tamperedStatus == 1, "\(tamperedLog)")
    }
}
