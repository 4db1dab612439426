import Foundation
import ProtectedStore
import Testing
import SuiteThreads

/// The file commands end to end, through the real binary, in embedded mode.
@Suite("sandboxctl file commands", .ownThread)
struct CLIContainerTests {
    /// A device made with `sandboxctl init`, addressed through the environment like a user's shell would.
    struct Shell {
        let directory = TemporaryDirectory()
        var environment: [String: String] { ["SANDBOXCTL_ROOT": directory.file("root"), "SANDBOXCTL_DEVICE_SECRET": directory.file("secret")] }

        init() throws {
            let created = try run(["init", "--kdf", "fast", "--passcode-stdin"], stdin: "pin-1234\n")
            #expect(created.status == 0, "\(created.stderr)")
        }

        @discardableResult
        func run(_ arguments: [String], stdin: String? = nil) throws -> CLI.Result {
            try CLI.run(arguments, stdin: stdin, environment: environment)
        }

        /// Where a container path is stored under the root (names are encrypted at rest).
        func storedPath(_ bundleIdentifier: String, _ path: String) throws -> String {
            let device = try Device.open(root: directory.file("root"), deviceSecretPath: directory.file("secret"))
            return try device.container(bundleIdentifier: bundleIdentifier).storedPath(path)
        }

        /// Every file under the root with its bytes, to prove a failed command changed nothing.
        func snapshot() -> [String: Data] {
            var result: [String: Data] = [:]
            let root = directory.file("root")
            for path in FileManager.default.enumerator(atPath: root)?.allObjects as? [String] ?? [] {
                result[path] = FileManager.default.contents(atPath: root + "/" + path) ?? Data()
            }
            return result
        }
    }

    @Test("create, put, cat, ls, mkdir, protection, mv, rm and status work together")
    func workflow() throws {
        let shell = try Shell()
        let created = try shell.run(["create", "com.example.notes"])
        #expect(created.status == 0, "\(created.stderr)")
        #expect(created.stdout.contains("Documents/Inbox/"))
        #expect(created.stdout.contains("Library/Application Support/com.example.notes/"))

        let source = shell.directory.file("hello.txt")
        try Data("hello, protected world\n".utf8).write(to: URL(fileURLWithPath: source))
        let put = try shell.run(["put", source, "com.example.notes:Documents/hello.txt", "--passcode-stdin"], stdin: "pin-1234\n")
        #expect(put.status == 0, "\(put.stderr)")
        #expect(put.stdout.contains("23 bytes, complete"))

        // A class A read needs the passcode; without a terminal the command says how to give it.
        let denied = try shell.run(["cat", "com.example.notes:Documents/hello.txt"])
        #expect(denied.status == 77)
        #expect(denied.stderr.contains("before first unlock"))
        #expect(denied.stderr.contains("--passcode-stdin"))
        let cat = try shell.run(["cat", "com.example.notes:Documents/hello.txt", "--passcode-stdin"], stdin: "pin-1234\n")
        #expect(cat.status == 0, "\(cat.stderr)")
        #expect(cat.stdout == "hello, protected world\n")
        let wrong = try shell.run(["cat", "com.example.notes:Documents/hello.txt", "--passcode-stdin"], stdin: "nope\n")
        #expect(wrong.status == 77)
        #expect(wrong.stderr.contains("wrong passcode"))

        // Class D needs no passcode at all; stdin after the passcode line is the data.
        let fromStdin = try shell.run(["put", "-", "com.example.notes:Library/Caches/open.txt", "--protection", "none"], stdin: "cached bytes")
        #expect(fromStdin.status == 0, "\(fromStdin.stderr)")
        #expect(try shell.run(["cat", "com.example.notes:Library/Caches/open.txt"]).stdout == "cached bytes")
        let both = try shell.run(["put", "-", "com.example.notes:Documents/both.txt", "--passcode-stdin", "--protection", "C"], stdin: "pin-1234\nline one\nline two\n")
        #expect(both.status == 0, "\(both.stderr)")
        #expect(try shell.run(["cat", "com.example.notes:Documents/both.txt", "--passcode-stdin"], stdin: "pin-1234\n").stdout == "line one\nline two\n")
        // Class B can be written before first unlock without any passcode.
        let classB = try shell.run(["put", source, "com.example.notes:Documents/", "--protection", "NSFileProtectionCompleteUnlessOpen"])
        #expect(classB.status == 0, "\(classB.stderr)")
        #expect(classB.stdout.contains("Documents/hello.txt"), "a directory destination keeps the source name")

        #expect(try shell.run(["mkdir", "-p", "com.example.notes:Documents/a/b", "--protection", "complete-until-first-user-authentication"]).status == 0)
        let ls = try shell.run(["ls", "-l", "com.example.notes:Documents"])
        #expect(ls.status == 0, "\(ls.stderr)")
        #expect(ls.stdout.contains("complete-unless-open"), "\(ls.stdout)")
        #expect(ls.stdout.contains("a/"))
        #expect(ls.stdout.contains("23  "), "plaintext size shown")
        let top = try shell.run(["ls", "com.example.notes"])
        #expect(top.status == 0, "\(top.stderr)")
        #expect(top.stdout == "Documents/\nLibrary/\ntmp/\n")
        #expect(try shell.run(["protection", "com.example.notes"]).stdout.contains("complete (class A"))
        let json = try shell.run(["ls", "--json", "com.example.notes:Documents/a"])
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
        #expect(entries.first?["name"] as? String == "b")
        #expect(entries.first?["protection"] as? String == "complete-until-first-user-authentication")

        let protection = try shell.run(["protection", "com.example.notes:Documents/hello.txt", "--json"])
        let protectionReport = try #require(try JSONSerialization.jsonObject(with: Data(protection.stdout.utf8)) as? [String: Any])
        #expect(protectionReport["protection"] as? String == "complete-unless-open", "\(protection.stdout)")
        #expect(protectionReport["letter"] as? String == "B")
        #expect(protectionReport["inherited"] as? Bool == false)
        let changed = try shell.run(["protection", "com.example.notes:Documents/hello.txt", "--set", "none", "--passcode-stdin"], stdin: "pin-1234\n")
        #expect(changed.status == 0, "\(changed.stderr)")
        #expect(changed.stdout.contains("none (class D"))
        #expect(try shell.run(["cat", "com.example.notes:Documents/hello.txt"]).stdout == "hello, protected world\n")

        #expect(try shell.run(["mv", "com.example.notes:Documents/hello.txt", "com.example.notes:Documents/a"]).status == 0)
        #expect(try shell.run(["cat", "com.example.notes:Documents/a/hello.txt"]).stdout == "hello, protected world\n")
        let rmDirectory = try shell.run(["rm", "com.example.notes:Documents/a"])
        #expect(rmDirectory.status == 64)
        #expect(rmDirectory.stderr.contains("-r"))
        #expect(try shell.run(["rm", "-r", "com.example.notes:Documents/a"]).status == 0)

        let status = try shell.run(["status", "--json"])
        #expect(status.status == 0, "\(status.stderr)")
        let report = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        #expect(report["state"] as? String == "beforeFirstUnlock")
        let containers = try #require(report["containers"] as? [[String: Any]])
        #expect(containers.first?["bundleIdentifier"] as? String == "com.example.notes")
        let files = try #require(containers.first?["files"] as? [String: Int])
        #expect(files == ["complete-until-first-user-authentication": 1, "none": 1], "\(files)")
        #expect(report["failedPasscodeAttempts"] as? Int == 0, "the right passcode after the wrong one reset the count")
    }

    @Test("a device made by the CLI holds no name, bundle identifier or content in clear anywhere under its root (grep -r)")
    func nothingInClear() throws {
        let shell = try Shell()
        #expect(try shell.run(["create", "com.example.secretapp"]).status == 0)
        #expect(try shell.run(["mkdir", "com.example.secretapp:Documents/Quarterly Reports"]).status == 0)
        #expect(try shell.run(["put", "-", "com.example.secretapp:Documents/Quarterly Reports/merger-plan.txt", "--protection", "D"],
                              stdin: "confidential merger figures").status == 0)
        let source = shell.directory.file("invoice-from-mail.pdf")
        writeRaw(Array("invoice body text".utf8), source)
        #expect(try shell.run(["inbox", "deliver", "com.example.secretapp", source, "--from", "com.example.mailer",
                               "--annotation", #"{"subject": "overdue invoice"}"#]).status == 0)
        #expect(try shell.run(["ls", "com.example.secretapp:Documents/Quarterly Reports"]).stdout.contains("merger-plan.txt"))
        for secret in ["secretapp", "Quarterly", "merger", "confidential", "invoice", "mailer", "overdue", "Documents", "Inbox", "Caches"] {
            let grep = try CLI.run(executable: URL(fileURLWithPath: "/bin/grep"), ["-r", "-l", "-a", secret, shell.directory.file("root")])
            #expect(grep.status == 1, "\(secret) is in clear under the root: \(grep.stdout)")
            let names = FileManager.default.enumerator(atPath: shell.directory.file("root"))?.allObjects as? [String] ?? []
            #expect(!names.contains { $0.contains(secret) }, "\(secret) is in a stored name")
        }
    }

    @Test("bad input: one clear error each, the documented exit code, and nothing changed on disk")
    func badInput() throws {
        let shell = try Shell()
        #expect(try shell.run(["create", "com.example.notes"]).status == 0)
        #expect(try shell.run(["put", "-", "com.example.notes:Documents/x", "--protection", "D"], stdin: "x").status == 0)
        let foreign = try Shell()
        #expect(try foreign.run(["create", "com.example.notes"]).status == 0)
        #expect(try foreign.run(["put", "-", "com.example.notes:Documents/theirs", "--protection", "D"], stdin: "theirs").status == 0)
        let stolen = try Data(contentsOf: URL(fileURLWithPath: try foreign.storedPath("com.example.notes", "Documents/theirs")))
        try stolen.write(to: URL(fileURLWithPath: try shell.storedPath("com.example.notes", "Documents/theirs")))
        try Data(String(repeating: "just text, not an encrypted file. ", count: 10).utf8).write(to: URL(fileURLWithPath: try shell.storedPath("com.example.notes", "Documents/text")))
        let before = shell.snapshot()

        let cases: [(arguments: [String], status: Int32, message: String)] = [
            (["cat", "com.example.missing:Documents/x"], 1, "no such container"),
            (["create", "not a bundle"], 64, "bundle identifier"),
            (["create", "com.example.notes"], 1, "already exists"),
            (["put", "-", "com.example.notes:Documents/y", "--protection", "secret"], 64, "secret"),
            (["cat", "com.example.notes:../../../keybag"], 64, "\"..\""),
            (["cat", "com.example.notes:/etc/passwd"], 64, "absolute"),
            (["put", "-", "com.example.notes:Documents/../../escape"], 64, "\"..\""),
            (["cat", "com.example.notes:Documents/theirs"], 65, "another device"),
            (["cat", "com.example.notes:Documents/text"], 65, "not a ProtectedStore encrypted file"),
            (["cat", "com.example.notes:Documents"], 64, "directory"),
            (["cat", "com.example.notes:Documents/missing"], 1, "No such file"),
            (["cat", "com.example.notes"], 64, "names a container"),
            (["put", shell.directory.file("no-such-source"), "com.example.notes:Documents/z"], 1, "no such local file"),
            (["rm", "-r", "com.example.notes:Documents"], 64, "own folders"),
            (["mv", "com.example.notes:Documents/x", "com.example.other:Documents/x"], 64, "only inside one container"),
            (["mkdir", "com.example.notes:Documents/none/deeper"], 1, "does not exist"),
            (["rm", "com.example.notes:Documents/x", "com.example.notes:Documents/missing"], 1, "no such file"),
        ]
        for (arguments, status, message) in cases {
            let result = try shell.run(arguments, stdin: "")
            #expect(result.status == status, "\(arguments): \(result.stderr)")
            #expect(result.stderr.contains(message), "\(arguments): \(result.stderr)")
            #expect(result.stderr.lowercased().components(separatedBy: "error:").count == 2, "one clear error: \(result.stderr)")
        }
        #expect(shell.snapshot() == before, "no failed command changed anything on disk")
    }

    @Test("passwd changes the passcode; erase needs it and leaves an empty root")
    func passwdAndErase() throws {
        let shell = try Shell()
        #expect(try shell.run(["create", "com.example.notes"]).status == 0)
        #expect(try shell.run(["put", "-", "com.example.notes:Documents/x", "--passcode-stdin"], stdin: "pin-1234\nsecret").status == 0)
        let badOld = try shell.run(["passwd", "--passcode-stdin"], stdin: "wrong\nnew-pin\n")
        #expect(badOld.status == 77)
        let changed = try shell.run(["passwd", "--passcode-stdin"], stdin: "pin-1234\nnew-pin\n")
        #expect(changed.status == 0, "\(changed.stderr)")
        #expect(try shell.run(["cat", "com.example.notes:Documents/x", "--passcode-stdin"], stdin: "pin-1234\n").status == 77)
        #expect(try shell.run(["cat", "com.example.notes:Documents/x", "--passcode-stdin"], stdin: "new-pin\n").stdout == "secret")
        #expect(try shell.run(["erase", "--passcode-stdin"], stdin: "pin-1234\n").status == 77)
        let erased = try shell.run(["erase", "--passcode-stdin"], stdin: "new-pin\n")
        #expect(erased.status == 0, "\(erased.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: shell.directory.file("root")).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: shell.directory.file("secret")))
        #expect(try shell.run(["status"]).status == 1)
    }

    @Test("help documents every command, the class names and the exit codes")
    func help() throws {
        let top = try CLI.run(["--help"])
        for command in ["create", "status", "ls", "cat", "put", "rm", "mv", "mkdir", "protection", "passwd", "erase", "demo", "inbox", "watch"] {
            #expect(top.stdout.contains("  \(command) "), "\(command) listed")
            let help = try CLI.run([command, "--help"])
            #expect(help.status == 0)
        }
        #expect(top.stdout.contains("complete-unless-open"))
        #expect(top.stdout.contains("BUNDLE:PATH"))
    }
}
