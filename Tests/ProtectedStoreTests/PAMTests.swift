import Foundation
@testable import ProtectedStore
import Testing
import SuiteThreads

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

    static var isAvailable: Bool { canRun("PAM tests", unless: problem) }
}

/// pam_sandboxctl.so through real PAM: pamtester runs a test service whose stack is the module, against a real daemon.
@Suite("PAM module", .ownThread, .enabled(if: PAMAvailability.isAvailable, "needs root, pamtester, cc and libpam0g-dev"))
struct PAMTests {
    static let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/PAMSandboxctl/pam_sandboxctl.c")

    /// The module built from its source with cc (as scripts/dist.sh builds it), and a PAM service using it.
    final class Service {
        let name = "sandboxctl-test-\(UUID().uuidString.prefix(8).lowercased())"
        let directory = TemporaryDirectory()

        /// `stack`: the service's lines, with MODULE for the module built here, and CHECKER for a stand-in of
        /// pam_unix's auth: it asks for the password, keeps it as PAM_AUTHTOK, and accepts it.
        init(_ stack: String) throws {
            let module = directory.file("pam_sandboxctl.so"), checker = directory.file("pam_checker.so")
            try compile(PAMTests.source.path, to: module)
            let checkerSource = directory.file("checker.c")
            try """
                #include <security/pam_ext.h>
                #include <security/pam_modules.h>
                PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
                    (void)flags; (void)argc; (void)argv;
                    const char *password = 0;
                    return pam_get_authtok(pamh, PAM_AUTHTOK, &password, 0) == PAM_SUCCESS && password ? PAM_SUCCESS : PAM_AUTH_ERR;
                }
                PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
                    (void)pamh; (void)flags; (void)argc; (void)argv;
                    return PAM_SUCCESS;
                }

                """.write(toFile: checkerSource, atomically: true, encoding: .utf8)
            try compile(checkerSource, to: checker)
            try stack.replacingOccurrences(of: "MODULE", with: module).replacingOccurrences(of: "CHECKER", with: checker)
                .write(toFile: "/etc/pam.d/\(name)", atomically: true, encoding: .utf8)
        }

        private func compile(_ source: String, to library: String) throws {
            let built = try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("cc")!),
                                    ["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", PAMTests.source.deletingLastPathComponent().appendingPathComponent("include").path,
                                     "-o", library, source, "-lpam"])
            try #require(built.status == 0, "\(built.stderr)")
        }

        deinit { unlink("/etc/pam.d/\(name)") }

        func run(_ operations: String..., input: String) throws -> CLI.Result {
            try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("pamtester")!), [name, "root"] + operations, stdin: input)
        }
    }

    private func failedAttempts(_ test: TestDevice) throws -> Int {
        let status = try sandboxctl(test, ["status", "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
        return object?["failedPasscodeAttempts"] as? Int ?? -1
    }

    @Test("auth: the right password unlocks the device but vouches for nothing; a wrong one fails authentication and counts one attempt; a password change changes the passcode")
    func unlockAtLogin() throws {
        let test = try TestDevice()
        let daemon = try DaemonProcess(test, grace: 1)
        defer { _ = daemon }
        let service = try Service("""
            auth required MODULE root=\(test.root)
            auth required pam_permit.so
            account required pam_permit.so
            password required MODULE root=\(test.root)

            """)
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

        // The daemon is the user's own process: its yes must never let anyone in.
        let vouching = try Service("auth sufficient MODULE root=\(test.root)\nauth required pam_deny.so\n")
        #expect(try vouching.run("authenticate", input: "new login password\n").status != 0, "the module granted a login")
    }

    @Test("after a checked password: auth unlocks at once, or, with no daemon yet, keeps it for the session, which unlocks; the module asks nothing")
    func unlockAfterCheckedPassword() throws {
        let test = try TestDevice()
        let daemon = try DaemonProcess(test, grace: 1)
        defer { _ = daemon }
        let atAuth = try Service("""
            auth required CHECKER
            auth optional MODULE root=\(test.root)
            account required pam_permit.so

            """)
        let login = try atAuth.run("authenticate", input: TestDevice.passcode + "\n")
        #expect(login.status == 0, "\(login.stdout)\(login.stderr)")
        #expect(try sandboxctl(test, ["status"]).stdout.contains("unlocked"))
        #expect(try sandboxctl(test, ["lock"]).status == 0)

        // At auth time no daemon answers (here: a socket path nothing listens on); the session's line finds it.
        let atSession = try Service("""
            auth required CHECKER
            auth optional MODULE root=\(test.root) socket=\(test.path("nobody.sock"))
            account required pam_permit.so
            session optional MODULE root=\(test.root)
            session required pam_permit.so

            """)
        let session = try atSession.run("authenticate", "open_session", input: TestDevice.passcode + "\n")
        #expect(session.status == 0, "\(session.stdout)\(session.stderr)")
        #expect(try sandboxctl(test, ["status"]).stdout.contains("unlocked"), "the session's line unlocked with the kept password")
        #expect(session.stderr.components(separatedBy: "Password:").count == 2, "one prompt, the checker's")
    }

    @Test("no daemon: the module stays out of the way (PAM_IGNORE) and asks nothing, so the login goes on")
    func noDaemon() throws {
        let test = try TestDevice()
        let service = try Service("auth optional MODULE root=\(test.root)\nauth required pam_permit.so\naccount required pam_permit.so\n")
        let login = try service.run("authenticate", input: "anything\n")
        #expect(login.status == 0, "\(login.stdout)\(login.stderr)")
        #expect(!login.stderr.contains("Password:"), "the module asked for a password with no daemon to give it to")
    }
}
