import ArgumentParser
import Foundation
import ProtectedStore

struct DemoCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Show data protection at work in a throwaway device (what `make demo` runs).",
        discussion: "Creates a device in a temporary directory, writes a protected file, shows that its bytes on disk hold no plaintext, locks, shows the read denied, unlocks, and removes everything it made."
    )

    func run() throws {
        try reportingErrors {
            let style = Style(enabled: isatty(STDOUT_FILENO) == 1)
            let workspace = FileManager.default.temporaryDirectory.appendingPathComponent("sandboxctl-demo-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: workspace) }
            let root = (workspace as NSString).appendingPathComponent("device")
            let secret = (workspace as NSString).appendingPathComponent("device.secret")
            let passcode = try Passcode("correct horse battery staple")

            print(style.heading("1. Create a device"))
            let device = try Device.create(root: root, deviceSecretPath: secret, passcode: passcode)
            print("   root \(root)\n   device secret \(secret) (outside the root)\n   keybag: class keys A–D, Argon2id passcode key entangled with the device secret")

            print(style.heading("2. Write a file with complete protection (class A)"))
            let plaintext = "Dear diary, the vault code is 4-8-15-16-23-42."
            let documents = (root as NSString).appendingPathComponent("Documents")
            try FileManager.default.createDirectory(atPath: documents, withIntermediateDirectories: true)
            let path = (documents as NSString).appendingPathComponent("diary.txt")
            try device.writeFile(Array(plaintext.utf8), to: path, protection: .complete)
            print("   wrote \(plaintext.utf8.count) bytes to \(path)")

            print(style.heading("3. Read it back"))
            print("   \"\(String(decoding: try device.readFile(at: path), as: UTF8.self))\"")

            print(style.heading("4. Look at the bytes on disk"))
            let onDisk = try Data(contentsOf: URL(fileURLWithPath: path))
            print("   \(onDisk.count) bytes; first 48: \(onDisk.prefix(48).map { String(format: "%02x", $0) }.joined())")
            let leaked = onDisk.range(of: Data(plaintext.utf8)) != nil || onDisk.range(of: Data("vault".utf8)) != nil
            print("   plaintext present on disk: " + (leaked ? style.bad("YES") : style.good("no")))

            print(style.heading("5. Lock the device"))
            device.lock()
            print("   isProtectedDataAvailable = \(device.isProtectedDataAvailable)")
            do {
                _ = try device.readFile(at: path)
                print("   read: " + style.bad("succeeded while locked (this is a bug)"))
            } catch let error as ProtectedStoreError {
                print("   read: " + style.good("denied") + " — \(error.problem)")
            }

            print(style.heading("6. Unlock with the passcode"))
            do {
                try device.unlock(with: try Passcode("wrong guess"))
            } catch let error as ProtectedStoreError {
                print("   wrong passcode: " + style.good("rejected") + " — \(error.problem)")
            }
            try device.unlock(with: passcode)
            print("   isProtectedDataAvailable = \(device.isProtectedDataAvailable)")
            print("   read: \"\(String(decoding: try device.readFile(at: path), as: UTF8.self))\"")

            print(style.heading("7. Clean up"))
            print("   removed \(workspace)")
            if leaked { throw ExitCode(ExitStatus.failure) }
        }
    }
}

/// ANSI colours on a terminal only, so piped output stays plain.
struct Style {
    let enabled: Bool
    func heading(_ text: String) -> String { enabled ? "\u{1B}[1m\(text)\u{1B}[0m" : text }
    func good(_ text: String) -> String { enabled ? "\u{1B}[32m\(text)\u{1B}[0m" : text }
    func bad(_ text: String) -> String { enabled ? "\u{1B}[31m\(text)\u{1B}[0m" : text }
}
