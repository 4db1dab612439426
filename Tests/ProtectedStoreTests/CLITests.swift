import Foundation
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// Runs the real `sandboxctl` binary built beside the test bundle.
struct CLI {
    static let executable: URL = {
        let testBinary = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        return testBinary.deletingLastPathComponent().appendingPathComponent("sandboxctl")
    }()

    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    static func run(executable: URL = executable, _ arguments: [String], stdin: String? = nil, environment: [String: String] = [:]) throws -> Result {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        process.environment = childEnvironment(environment)
        let input = Pipe(), output = Pipe(), errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        if let stdin { writeToChild(input.fileHandleForWriting, Data(stdin.utf8)) }
        try input.fileHandleForWriting.close()
        let out = output.fileHandleForReading.readDataToEndOfFile()
        let err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, stdout: String(decoding: out, as: UTF8.self), stderr: String(decoding: err, as: UTF8.self))
    }
}

@Suite("sandboxctl", .ownThread)
struct CLITests {
    @Test("init creates a device from a passcode on stdin and refuses to run over it")
    func initCommand() throws {
        let dir = TemporaryDirectory()
        let arguments = ["init", "--root", dir.file("root"), "--device-secret", dir.file("secret"), "--kdf", "fast", "--passcode-stdin"]
        let created = try CLI.run(arguments, stdin: "hunter2\n")
        #expect(created.status == 0, "\(created.stderr)")
        #expect(created.stdout.contains("Created a device"))
        #expect(FileManager.default.fileExists(atPath: dir.file("root/keybag")))
        let keybag = readRaw(dir.file("root/keybag"))

        let again = try CLI.run(arguments, stdin: "other\n")
        #expect(again.status == 1)
        #expect(again.stderr.contains("a device already exists here"))
        #expect(readRaw(dir.file("root/keybag")) == keybag)

        let viaEnvironment = try CLI.run(["init", "--kdf", "fast", "--passcode-stdin"], stdin: "pw\n",
                                         environment: ["SANDBOXCTL_ROOT": dir.file("env-root"), "SANDBOXCTL_DEVICE_SECRET": dir.file("env-secret")])
        #expect(viaEnvironment.status == 0, "\(viaEnvironment.stderr)")
        #expect(FileManager.default.fileExists(atPath: dir.file("env-secret")))
    }

    @Test("bad input exits 64 with a message, and creates nothing")
    func usageErrors() throws {
        let dir = TemporaryDirectory()
        let empty = try CLI.run(["init", "--root", dir.file("a"), "--device-secret", dir.file("s"), "--kdf", "fast", "--passcode-stdin"], stdin: "")
        #expect(empty.status == 64)
        #expect(empty.stderr.contains("no passcode was given"))
        #expect(!FileManager.default.fileExists(atPath: dir.file("a")))
        let argvPasscode = try CLI.run(["init", "--root", dir.file("b"), "--passcode", "secret"])
        #expect(argvPasscode.status == 64)
        let badPreset = try CLI.run(["init", "--root", dir.file("c"), "--kdf", "quick", "--passcode-stdin"], stdin: "x\n")
        #expect(badPreset.status == 64)
        #expect(badPreset.stderr.contains("quick"))
        let badBench = try CLI.run(["bench", "crypto", "--block-size", "1000"])
        #expect(badBench.status == 64)
    }

    @Test("help lists the exit codes and labels the fast KDF insecure")
    func help() throws {
        let top = try CLI.run(["--help"])
        #expect(top.stdout.contains("77  denied by data protection"))
        let initHelp = try CLI.run(["init", "--help"])
        #expect(initHelp.stdout.contains("INSECURE"))
        #expect(initHelp.stdout.contains("--passcode-stdin"))
    }

    @Test("bench crypto --json prints every figure the issue names")
    func benchJSON() throws {
        let dir = TemporaryDirectory()
        let result = try CLI.run(["bench", "crypto", "--size-mib", "2", "--json", "--directory", dir.path])
        #expect(result.status == 0, "\(result.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        for key in ["aead_raw_MBps", "cipher_raw_MBps", "write_MBps", "read_MBps", "plain_write_MBps", "plain_read_MBps"] {
            let value = try #require(object[key] as? Double, "\(key) missing")
            #expect(value > 0)
        }
        // The child measures which cipher to seal with on its own; on a loaded machine its choice and this process's
        // can differ, so the figure is checked to name a cipher this build can use, not this process's choice.
        let usable = FileHeader.Cipher.allCases.filter(\.isAvailable).map(\.name)
        #expect(usable.contains(object["cipher"] as? String ?? ""), "\(object["cipher"] ?? "no cipher") is not one of \(usable)")
        #expect(object["block_size"] as? Int == 4096)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path).isEmpty, "benchmark files removed")
    }

    @Test("demo tells the story and finds no plaintext on disk")
    func demo() throws {
        let result = try CLI.run(["demo"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("plaintext present on disk (files, keychain secrets and attributes): no"))
        #expect(result.stdout.contains("read the session token:                     denied — errSecInteractionNotAllowed (-25308)"), "the keychain's class A item while locked")
        #expect(result.stdout.contains("denied — CocoaError.fileReadNoPermission, EPERM"))
        #expect(!result.stdout.contains("expected"), "every class behaved as the reference table says")
        #expect(result.stdout.contains("1. async stream  willBecomeUnavailable") || result.stdout.contains("1. delegate") || result.stdout.contains("1. notification"))
        #expect(result.stdout.contains("delegate      open URL postcard.txt from com.example.mail"), "the Inbox delivery's event after the unlock")
        #expect(result.stdout.contains("denied — CocoaError.fileWriteNoPermission, EACCES"), "the Inbox is read-and-delete only")
        #expect(!result.stdout.contains("\u{1B}["), "no colour codes when not on a terminal")
    }
}
