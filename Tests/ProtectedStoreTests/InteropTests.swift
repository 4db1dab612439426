import CSupport
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// tools/independent_decrypt.py was written from docs/FORMAT.md alone (Python, PyNaCl); if it reads what we write,
/// the spec is complete and the code matches it.
@Suite("Independent decryptor (docs/FORMAT.md)", .ownThread)
struct InteropTests {
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("tools/independent_decrypt.py").path

    static let pyNaClAvailable = pythonSucceeds("import nacl.bindings")

    /// The libsodium the decryptor loads for AEGIS-256 when the system's predates it: the shared library
    /// scripts/fetch-libsodium.sh puts beside the static one this build may be linked with.
    static let fetchedLibsodium = URL(fileURLWithPath: script).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent(".build-deps/libsodium/shared/libsodium.so").path

    static var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        if FileManager.default.fileExists(atPath: fetchedLibsodium) { environment["PROTECTEDSTORE_LIBSODIUM"] = fetchedLibsodium }
        return environment
    }

    /// Whether the decryptor can open AEGIS-256 blocks (its libsodium is 1.0.19 or later).
    static let decryptorHasAEGIS256 = pythonSucceeds(
        "import sys; sys.path.insert(0, sys.argv[1]); import independent_decrypt; sys.exit(0 if independent_decrypt.has_aegis256() else 1)",
        URL(fileURLWithPath: script).deletingLastPathComponent().path)

    /// Whether `python3 -c code arguments…` exits with 0, in the decryptor's environment.
    static func pythonSucceeds(_ code: String, _ arguments: String...) -> Bool {
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        probe.arguments = ["python3", "-c", code] + arguments
        probe.environment = environment
        probe.standardOutput = FileHandle.nullDevice
        probe.standardError = FileHandle.nullDevice
        guard (try? probe.run()) != nil else { return false }
        probe.waitUntilExit()
        return probe.terminationStatus == 0
    }

    static func decrypt(root: String, secret: String, passcode: String, out: String, files: [String]) throws -> (Int32, String) {
        try run(["--root", root, "--device-secret", secret, "--out", out] + files, passcode: passcode)
    }

    static func run(_ arguments: [String], passcode: String) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script] + arguments
        process.environment = environment
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = output
        try process.run()
        writeToChild(input.fileHandleForWriting, Data((passcode + "\n").utf8))
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
        // Every cipher (§4.4): the files above have the one this build prefers; these name each.
        for cipher in FileHeader.Cipher.allCases where cipher.isAvailable {
            if cipher == .aegis256 && !Self.decryptorHasAEGIS256 {
                print("note: the independent decryptor's libsodium lacks AEGIS-256 (scripts/fetch-libsodium.sh provides one); its files are not checked there")
                continue
            }
            let path = test.path("A-cipher-\(cipher.rawValue)")
            let handle = try EncryptedFile.create(at: FileLocation(path: path), protectionClass: .complete, keys: test.device, cipher: cipher)
            try handle.write(pattern(5 * 4096 + 7, seed: 7), at: 0)
            try handle.close()
            expected[path] = pattern(5 * 4096 + 7, seed: 7)
        }
        try test.device.changePasscode(from: try Passcode(TestDevice.passcode), to: try Passcode("pässcode ✓"))

        let out = test.path("out")
        let files = expected.keys.sorted()
        let (status, log) = try Self.decrypt(root: test.root, secret: test.secretPath, passcode: "pässcode ✓", out: out, files: files)
        try #require(status == 0, "\(log)")
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

    @Test("a whole container: every name, long name, link target and Inbox record decrypts there, and a planted name is refused",
          .enabled(if: pyNaClAvailable, "python3 with PyNaCl is not installed (pip install pynacl); skipping the independent decryptor"))
    func independentDecryptorReadsOurNames() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let long = String(repeating: "é", count: 100) + ".bin"
        var expected: [String: Data] = [:]
        try container.createDirectory(atPath: "Documents/Projects/" + String(repeating: "p", count: 180), withIntermediateDirectories: true)
        for (index, protectionClass) in ProtectionClass.allCases.enumerated() {
            let path = "Documents/Projects/class \(protectionClass.letter).txt"
            expected[path] = Data(pattern(4096 * index + 7, seed: UInt8(index)))
            try container.write(expected[path]!, toPath: path, options: protectionClass.writingOption)
        }
        let deep = "Documents/Projects/" + String(repeating: "p", count: 180) + "/" + long
        expected[deep] = Data("deep".utf8)
        try container.write(expected[deep]!, toPath: deep, options: .noFileProtection)
        try container.createSymbolicLink(atPath: "Documents/shortcut", withDestinationPath: "Projects/class A.txt")
        // A link as an earlier version stored it, sealed to its folder, and an item's sealed user.* attributes.
        let documents = try container.directory.openDirectory(.root.appendingComponents(["Documents"]))
        let bound = try documents.names.cipher.directoryBoundLinkTarget("Projects/class B.txt", directoryIV: documents.names.iv)
        #expect(symlinkat(bound, documents.descriptor.rawValue, try documents.entry(for: "old shortcut")) == 0)
        var attributes = SealedAttributes()
        try attributes.set("user.colour", to: Array("green".utf8))
        try attributes.set("user.checksum", to: [UInt8](repeating: 7, count: 32))
        let sealed = try attributes.sealed(with: container.directory.cipher)
        let tagged = try container.storedPath("Documents/Projects/class A.txt")
        #expect(setxattr(tagged, SealedAttributes.storedName, sealed, sealed.count, 0) == 0)
        #expect(SealedAttributes.open(sealed, with: container.directory.cipher) == attributes)
        let source = test.path("report.pdf")
        writeRaw(Array("delivered".utf8), source)
        try container.deliverToInbox(fileAtPath: source, sourceApplication: "com.example.mail")
        expected["Documents/Inbox/report.pdf"] = Data("delivered".utf8)

        let out = test.path("tree")
        let arguments = ["--root", test.root, "--device-secret", test.secretPath, "--container", TestDevice.bundleIdentifier, "--out", out]
        let (status, log) = try Self.run(arguments, passcode: TestDevice.passcode)
        #expect(status == 0, "\(log)")
        for (path, contents) in expected {
            #expect(FileManager.default.contents(atPath: (out as NSString).appendingPathComponent(path)) == contents, "\(path): \(log)")
        }
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: (out as NSString).appendingPathComponent("Documents/shortcut")) == "Projects/class A.txt")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: (out as NSString).appendingPathComponent("Documents/old shortcut")) == "Projects/class B.txt")
        #expect(log.contains("class A.txt: OK attributes user.colour (5 bytes), user.checksum (32 bytes)"), "\(log)")
        withExtendedLifetime(documents) {}
        #expect(log.contains("report.pdf") && log.contains("com.example.mail"), "the Inbox record: \(log)")

        writeRaw([1, 2, 3], try container.storedPath("Documents") + "/planted")
        let (plantedStatus, plantedLog) = try Self.run(arguments, passcode: TestDevice.passcode)
        #expect(plantedStatus == 1, "\(plantedLog)")
        #expect(plantedLog.contains("planted"), "the refusal names the stored entry: \(plantedLog)")
    }
}
