import Foundation
@testable import ProtectedStore
import Testing

/// Whether the PAM module can be tried here: pamtester, a C compiler, libpam's headers, and root (to write a service
/// file into /etc/pam.d).
enum PAMAvailability {
    static let problem: String? = {
        guard getuid() == 0 else { return "not root: a test service file must go into /etc/pam.d" }
        guard FUSEAvailability.executable("pamtester") != nil else { return "pamtester is not installed (apt-get install pamtester)" }
        guard FUSEAvailability.executable("cc") != nil else { return "no C compiler (cc)" }
        guard FileManager.default.fileExists(atPath: "/usr/include/security/pam_modules.h") else { return "libpam's headers are missing (apt-get install libpam0g-dev)" }
        return nil
    }()

    static var isAvailable: Bool {
        if let problem { print("Skipping PAM tests: \(problem)") }
        return problem == nil
    }
}

/// pam_sandboxctl.so through real PAM: pamtester runs a test service whose stack is the module, against a real daemon.
@Suite("PAM module", .enabled(if: PAMAvailability.isAvailable, "needs root, pamtester, cc and libpam0g-dev"))
struct PAMTests {
    static let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/PAMSandboxctl/pam_sandboxctl.c")

    /// The module built from its source (what `swift build --product pam_sandboxctl` builds), and a PAM service using it.
    final class Service {
        let name = "sandboxctl-test-\(UUID().uuidString.prefix(8).lowercased())"
        let directory = TemporaryDirectory()

        init(root: String, strict: Bool) throws {
            let module = directory.file("pam_sandboxctl.so")
            let built = try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("cc")!),
                                    ["-shared", "-fPIC", "-Wall", "-Werror", "-I", PAMTests.source.deletingLastPathComponent().appendingPathComponent("include").path,
                                     "-o", module, PAMTests.source.path, "-lpam"])
            try #require(built.status == 0, "\(built.stderr)")
            // Strict: the module decides alone. As it is meant to be used: optional, beside the real login check (here pam_permit).
            let stack = strict
                ? "auth required \(module) root=\(root)\naccount required pam_permit.so\npassword required \(module) root=\(root)\n"
                : "auth optional \(module) root=\(root)\nauth required pam_permit.so\naccount required pam_permit.so\n"
            try stack.write(toFile: "/etc/pam.d/\(name)", atomically: true, encoding: .utf8)
        }

        deinit { unlink("/etc/pam.d/\(name)") }

        func run(_ operation: String, input: String) throws -> CLI.Result {
            try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("pamtester")!), [name, "root", operation], stdin: input)
        }
    }

    private func failedAttempts(_ test: TestDevice) throws -> Int {
        let status = try sandboxctl(test, ["status", "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
        return object?["failedPasscodeAttempts"] as? Int ?? -1
    }

    @Test("the right password unlocks the device; a wrong one fails authentication and counts one attempt; a password change changes the passcode")
    func unlockAtLogin() throws {
        let test = try TestDevice()
        let daemon = try DaemonProcess(test, grace: 1)
        defer { _ = daemon }
        let service = try Service(root: test.root, strict: true)

        let wrong = try service.run("authenticate", input: "not the passcode\n")
        #expect(wrong.status != 0, "\(wrong.stdout)\(wrong.stderr)")
        #expect(try sandboxctl(test, ["status"]).stdout.contains("beforeFirstUnlock"))
        #expect(try failedAttempts(test) == 1, "one attempt, no more")

        let right = try service.run("authenticate", input: TestDevice.passcode + "\n")
        #expect(right.status == 0, "\(right.stdout)\(right.stderr)")
        #expect(try sandboxctl(test, ["status"]).stdout.contains("unlocked"))
        #expect(try failedAttempts(test) == 0)

        let changed = try service.run("chauthtok", input: "\(TestDevice.passcode)\nnew login password\nnew login password\n")
        #expect(changed.status == 0, "\(changed.stdout)\(changed.stderr)")
        #expect(try sandboxctl(test, ["lock"]).status == 0)
        #expect(try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: "new login password\n").status == 0, "the new password is the passcode")
    }

    @Test("no daemon: the module stays out of the way (PAM_IGNORE), so the login goes on")
    func noDaemon() throws {
        let test = try TestDevice()
        let service = try Service(root: test.root, strict: false)
        let login = try service.run("authenticate", input: "anything\n")
        #expect(login.status == 0, "\(login.stdout)\(login.stderr)")
        #expect(!login.stderr.contains("Password:"), "the module asked for a password with no daemon to give it to")
    }
}
