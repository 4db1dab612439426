import Foundation
import Testing
import SuiteThreads

/// What `make dist`, `make install`, `make uninstall` and `make deb` ship, made by their own scripts from the release
/// build `make test` makes (`PROTECTEDSTORE_RELEASE_BIN`): nothing here builds Swift.
enum Packaging {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static let problem: String? = {
        guard let folder = ProcessInfo.processInfo.environment["PROTECTEDSTORE_RELEASE_BIN"] else {
            return "no release build (PROTECTEDSTORE_RELEASE_BIN; make test sets it)"
        }
        guard FileManager.default.isExecutableFile(atPath: folder + "/generate-manual") else {
            return "\(folder)/generate-manual is missing (make release builds it)"
        }
        for tool in ["python3", "strip", "readelf", "cc", "bash", "man"] where FUSEAvailability.executable(tool) == nil {
            return "\(tool) is not installed"
        }
        return nil
    }()

    static var isAvailable: Bool { canRun("packaging tests", unless: problem) }

    static var debianProblem: String? {
        for tool in ["dpkg-deb", "dpkg-shlibdeps", "lintian"] where FUSEAvailability.executable(tool) == nil {
            return "\(tool) is not installed (make deps installs dpkg-dev and lintian)"
        }
        return nil
    }

    static var canBuildDebian: Bool { canRun("the Debian package tests", unless: debianProblem) }

    /// Why the package can't be installed into this machine by the test, if it can't. dpkg would silently take over
    /// files no package owns (a module or pages from an earlier `make install PREFIX=/usr`) and remove them with the
    /// package, so any such file stops it.
    static var systemInstallProblem: String? {
        if let debianProblem { return debianProblem }
        guard getuid() == 0 else { return "not root: apt installs into the system" }
        guard FUSEAvailability.executable("apt-get") != nil else { return "apt-get is not installed" }
        if let known = try? run("dpkg-query", ["-W", "-f", "${db:Status-Status}", "sandboxctl"]),
           known.status == 0, !["", "not-installed", "config-files"].contains(known.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) {
            return "the sandboxctl package is installed (by you, or left by an interrupted run: apt remove sandboxctl)"
        }
        let ours = ["/usr/bin/sandboxctl", "/usr/share/man/man1/sandboxctl.1", "/usr/share/man/man1/sandboxctl.1.gz",
                    "/usr/share/bash-completion/completions/sandboxctl", "/usr/lib/systemd/user/sandboxctl.service"]
            + ["/usr/lib", "/lib"].flatMap { lib in
                ((try? FileManager.default.contentsOfDirectory(atPath: lib)) ?? []).map { "\(lib)/\($0)/security/pam_sandboxctl.so" }
            }
        if let present = ours.first(where: { FileManager.default.fileExists(atPath: $0) }) {
            return "\(present) exists: the test would replace and then remove someone's installation"
        }
        return nil
    }

    static var canInstallIntoSystem: Bool { canRun("the apt install and remove test", unless: systemInstallProblem) }

    @discardableResult
    static func run(_ tool: String, _ arguments: [String], environment: [String: String] = [:], stdin: String? = nil) throws -> CLI.Result {
        let path = tool.hasPrefix("/") ? tool : (FUSEAvailability.executable(tool) ?? tool)
        return try CLI.run(executable: URL(fileURLWithPath: path), arguments, stdin: stdin, environment: environment)
    }

    /// scripts/dist.sh into a new folder.
    static func dist(in directory: TemporaryDirectory) throws -> String {
        let folder = directory.file("dist")
        let made = try run(repository.path + "/scripts/dist.sh", [ProcessInfo.processInfo.environment["PROTECTEDSTORE_RELEASE_BIN"]!, folder])
        try #require(made.status == 0, "dist.sh: \(made.stdout)\(made.stderr)")
        return folder
    }

    /// Every page the argument parser's definitions call for: sandboxctl(1) and one per subcommand, git-style
    /// (sandboxctl-inbox-deliver), from the command's own `--experimental-dump-help`.
    static func expectedManPages() throws -> Set<String> {
        let dump = try CLI.run(["--experimental-dump-help"])
        let tool = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])
        var names = Set<String>()
        func walk(_ command: [String: Any], _ prefix: String) {
            guard let name = command["commandName"] as? String, name != "help" else { return }
            let page = prefix.isEmpty ? name : "\(prefix)-\(name)"
            names.insert(page + ".1")
            for subcommand in command["subcommands"] as? [[String: Any]] ?? [] { walk(subcommand, page) }
        }
        walk(try #require(tool["command"] as? [String: Any]), "")
        return names
    }

    /// What bash's completion for sandboxctl offers for the words typed so far, from the completion file at `path`.
    static func bashCompletions(_ path: String, _ words: [String]) throws -> [String] {
        let line = words.joined(separator: " ")
        let script = """
            source '\(path)'
            COMP_LINE='\(line)'; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(\(words.map { "'\($0)'" }.joined(separator: " "))); COMP_CWORD=\(words.count - 1)
            _sandboxctl sandboxctl '\(words.last!)' '\(words[words.count - 2])'
            printf '%s\\n' "${COMPREPLY[@]}"
            """
        let result = try run("bash", ["-c", script])
        return result.stdout.split(separator: "\n").map(String.init)
    }
}

@Suite("packaging", .ownThread, .enabled(if: Packaging.isAvailable, "needs make test's release build"))
struct PackagingTests {
    @Test("make install into a temporary prefix: binary, a man page per subcommand, completions, units naming it, the PAM module; uninstall leaves no file")
    func installAndUninstall() throws {
        let directory = TemporaryDirectory()
        let dist = try Packaging.dist(in: directory)
        let version = try String(contentsOfFile: dist + "/VERSION", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(version == (try CLI.run(["--version"])).stdout.trimmingCharacters(in: .whitespacesAndNewlines), "one version for the command and the package")
        #expect(version.range(of: #"^[0-9]+\.[0-9]+\.[0-9]+$"#, options: .regularExpression) != nil, "version \(version)")

        let destdir = directory.file("stage root"), prefix = "/opt/sandboxctl-test"
        let environment = ["DESTDIR": destdir, "PREFIX": prefix]
        // Another program's files beside ours, which uninstall must leave.
        let foreign = [destdir + prefix + "/bin/other", destdir + prefix + "/share/man/man1/other.1"]
        for file in foreign {
            try FileManager.default.createDirectory(atPath: (file as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Data("other".utf8).write(to: URL(fileURLWithPath: file))
        }
        // A folder given at install time only: uninstall must find the file through the install's manifest.
        let installed = try Packaging.run(Packaging.repository.path + "/scripts/install.sh", [dist],
                                          environment: environment.merging(["ZSHCOMPDIR": prefix + "/share/zsh/own"]) { $1 })
        #expect(installed.status == 0, "\(installed.stdout)\(installed.stderr)")
        let root = destdir + prefix

        let binary = try Packaging.run(root + "/bin/sandboxctl", ["--version"])
        #expect(binary.status == 0 && binary.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == version)
        let libraries = try Packaging.run("readelf", ["-d", root + "/bin/sandboxctl"]).stdout
        #expect(!libraries.contains("libswift") && !libraries.contains("RUNPATH") && !libraries.contains("RPATH"),
                "the installed binary must not need the Swift toolchain: \(libraries)")

        let pages = Set(try FileManager.default.contentsOfDirectory(atPath: root + "/share/man/man1").filter { $0.hasPrefix("sandboxctl") })
        #expect(pages == (try Packaging.expectedManPages()), "man pages and subcommands differ")
        for page in pages {
            // How lintian checks pages: groff's warnings, which a broken page produces.
            let checked = try Packaging.run("man", ["--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", root + "/share/man/man1/" + page],
                                            environment: ["MANROFFSEQ": "", "MANWIDTH": "80", "LC_ALL": "C.UTF-8"])
            #expect(checked.status == 0 && checked.stderr.isEmpty, "\(page): \(checked.stderr)")
        }
        let rootPage = try Packaging.run("man", ["-l", root + "/share/man/man1/sandboxctl.1"], environment: ["MANWIDTH": "200", "LC_ALL": "C.UTF-8"]).stdout
        for section in ["ENVIRONMENT", "SANDBOXCTL_DEVICE_SECRET", "EXIT STATUS", "denied by data protection", "sandboxctl-inbox(1)"] {
            #expect(rootPage.contains(section), "sandboxctl(1) lacks \(section)")
        }
        let lockPage = try Packaging.run("man", ["-l", root + "/share/man/man1/sandboxctl-lock.1"], environment: ["MANWIDTH": "200", "LC_ALL": "C.UTF-8"]).stdout
        #expect(lockPage.contains("sandboxctl lock [--root dir]") && lockPage.contains("--grace") && lockPage.contains("no key daemon serves the device")
                && lockPage.contains("sandboxctl(1)"), "\(lockPage)")

        let bash = root + "/share/bash-completion/completions/sandboxctl"
        #expect(!(try String(contentsOfFile: bash, encoding: .utf8)).hasPrefix("#!"))
        #expect(try Packaging.bashCompletions(bash, ["sandboxctl", "lo"]) == ["lock"])
        #expect(try Packaging.bashCompletions(bash, ["sandboxctl", "lock", "--g"]) == ["--grace"])
        #expect(try String(contentsOfFile: root + "/share/zsh/own/_sandboxctl", encoding: .utf8).hasPrefix("#compdef sandboxctl"))
        #expect(try String(contentsOfFile: root + "/share/fish/vendor_completions.d/sandboxctl.fish", encoding: .utf8).contains("complete -c 'sandboxctl'"))

        for unit in ["sandboxctl.socket", "sandboxctl.service", "sandboxctl-mount@.service"] {
            let text = try String(contentsOfFile: root + "/lib/systemd/user/" + unit, encoding: .utf8)
            #expect(unit == "sandboxctl.socket" || text.contains("ExecStart=\(prefix)/bin/sandboxctl "), "\(unit) runs another sandboxctl:\n\(text)")
        }
        let pamModule = try #require(FileManager.default.enumerator(atPath: root + "/lib")?.compactMap { $0 as? String }
            .first { $0.hasSuffix("security/pam_sandboxctl.so") })
        let pamLibraries = try Packaging.run("readelf", ["-d", root + "/lib/" + pamModule]).stdout
        #expect(pamLibraries.contains("libpam.so") && !pamLibraries.contains("libswift"), "a login program must not load the Swift runtime: \(pamLibraries)")

        let removed = try Packaging.run(Packaging.repository.path + "/scripts/install.sh", ["--uninstall"], environment: environment)
        #expect(removed.status == 0, "\(removed.stderr)")
        let left = FileManager.default.enumerator(atPath: destdir)?.compactMap { $0 as? String }
            .filter { (try? FileManager.default.attributesOfItem(atPath: destdir + "/" + $0)[.type] as? FileAttributeType) != .typeDirectory } ?? []
        #expect(Set(left.map { destdir + "/" + $0 }) == Set(foreign), "uninstall left \(left), or removed another program's files")
        let again = try Packaging.run(Packaging.repository.path + "/scripts/install.sh", ["--uninstall"], environment: environment)
        #expect(again.status == 1 && again.stderr.contains("nothing to remove"), "\(again.stderr)")
    }

    @Test("install and uninstall refuse a relative PREFIX and a missing dist folder; an install that fails part-way removes what it installed")
    func badInput() throws {
        let directory = TemporaryDirectory()
        let dist = try Packaging.dist(in: directory)
        let install = Packaging.repository.path + "/scripts/install.sh"
        let relative = try Packaging.run(install, [dist], environment: ["DESTDIR": directory.file("stage"), "PREFIX": "usr/local"])
        #expect(relative.status == 64 && relative.stderr.contains("PREFIX must be an absolute path"), "\(relative.stderr)")
        let relativeRemoval = try Packaging.run(install, ["--uninstall"], environment: ["DESTDIR": directory.file("stage"), "PREFIX": "usr/local"])
        #expect(relativeRemoval.status == 64, "\(relativeRemoval.stderr)")
        let missing = try Packaging.run(install, [directory.file("nothing")], environment: ["DESTDIR": directory.file("stage")])
        #expect(missing.status == 64 && missing.stderr.contains("scripts/dist.sh"), "\(missing.stderr)")
        #expect(!FileManager.default.fileExists(atPath: directory.file("stage")))

        // The PAM module's folder can't be made (a file is in the way), after the binary, pages and completions.
        let staged = directory.file("partial")
        try FileManager.default.createDirectory(atPath: staged, withIntermediateDirectories: true)
        try Data().write(to: URL(fileURLWithPath: staged + "/blocker"))
        func files() -> Set<String> {
            Set(FileManager.default.enumerator(atPath: staged)?.compactMap { $0 as? String }
                .filter { (try? FileManager.default.attributesOfItem(atPath: staged + "/" + $0)[.type] as? FileAttributeType) != .typeDirectory } ?? [])
        }
        let failed = try Packaging.run(install, [dist], environment: ["DESTDIR": staged, "PAMDIR": "/blocker/security"])
        #expect(failed.status != 0 && failed.stderr.contains("nothing was changed"), "\(failed.stderr)")
        #expect(files() == ["blocker"], "a failed install left \(files())")

        // The same failure over an earlier installation leaves that installation whole.
        let first = try Packaging.run(install, [dist], environment: ["DESTDIR": staged])
        try #require(first.status == 0, "\(first.stderr)")
        let before = files()
        let binary = staged + "/usr/local/bin/sandboxctl"
        try Data("an earlier sandboxctl".utf8).write(to: URL(fileURLWithPath: binary))
        let again = try Packaging.run(install, [dist], environment: ["DESTDIR": staged, "PAMDIR": "/blocker/security"])
        #expect(again.status != 0, "\(again.stderr)")
        #expect(files() == before, "a failed reinstall changed the files: \(files().symmetricDifference(before))")
        #expect(try Data(contentsOf: URL(fileURLWithPath: binary)) == Data("an earlier sandboxctl".utf8), "a failed reinstall replaced the binary")
    }

    @Test("make deb: the version is the command's, Depends computed from the binaries, lintian reports no error and no warning",
          .enabled(if: Packaging.canBuildDebian))
    func debianPackage() throws {
        let directory = TemporaryDirectory()
        let dist = try Packaging.dist(in: directory)
        let version = try String(contentsOfFile: dist + "/VERSION", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let built = try Packaging.run(Packaging.repository.path + "/scripts/build-deb.sh", [dist, directory.file("deb")])
        #expect(built.status == 0, "\(built.stdout)\(built.stderr)")
        let package = built.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(package.hasSuffix("/sandboxctl_\(version)_\(try Packaging.run("dpkg", ["--print-architecture"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)).deb"))

        #expect(try Packaging.run("dpkg-deb", ["-f", package, "Version"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines) == version)
        let depends = try Packaging.run("dpkg-deb", ["-f", package, "Depends"]).stdout
        // By family, not exact names, which change with each library's soname (libfuse3-3, libfuse3-4). libsodium only
        // when linked as a shared library: a build with scripts/fetch-libsodium.sh's has it inside.
        let names = depends.split(separator: ",").map { $0.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: " ")[0] }
        let needed = try Packaging.run("readelf", ["-d", dist + "/bin/sandboxctl"]).stdout
        let families = ["libfuse3-", "libsystemd", "libpam", "libc6"] + (needed.contains("libsodium.so") ? ["libsodium"] : [])
        for family in families {
            #expect(names.contains { $0.hasPrefix(family) }, "Depends lacks \(family): \(depends)")
        }
        #expect(names.contains("fuse3"), "Depends lacks fuse3, whose fusermount3 mounts: \(depends)")
        #expect(!depends.contains("swift"), "\(depends)")
        #expect(try Packaging.run("dpkg-deb", ["-f", package, "Recommends"]).stdout.contains("bubblewrap"))

        let contents = try Packaging.run("dpkg-deb", ["-c", package]).stdout
        for file in ["./usr/bin/sandboxctl", "./usr/share/man/man1/sandboxctl.1.gz", "./usr/share/man/man1/sandboxctl-launch.1.gz",
                     "./usr/share/bash-completion/completions/sandboxctl", "./usr/share/zsh/vendor-completions/_sandboxctl",
                     "./usr/share/fish/vendor_completions.d/sandboxctl.fish", "./usr/lib/systemd/user/sandboxctl.socket",
                     "pam_sandboxctl.so", "./usr/share/doc/sandboxctl/copyright", "./usr/share/doc/sandboxctl/changelog.gz"] {
            #expect(contents.contains(file), "the package lacks \(file)")
        }
        #expect(contents.split(separator: "\n").allSatisfy { $0.contains("root/root") }, "files must belong to root")

        let lintian = try Packaging.run("lintian", ["--fail-on", "error,warning", package])
        #expect(lintian.status == 0, "lintian:\n\(lintian.stdout)\(lintian.stderr)")
        #expect(!lintian.stdout.split(separator: "\n").contains { $0.hasPrefix("E:") || $0.hasPrefix("W:") }, "\(lintian.stdout)")
    }

    @Test("apt install of the package gives a working sandboxctl, man page and completion; apt remove leaves no file",
          .enabled(if: Packaging.canInstallIntoSystem))
    func aptInstallAndRemove() throws {
        let directory = TemporaryDirectory()
        let built = try Packaging.run(Packaging.repository.path + "/scripts/build-deb.sh", [try Packaging.dist(in: directory), directory.file("deb")])
        try #require(built.status == 0, "\(built.stderr)")
        let package = built.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let files = try Packaging.run("dpkg-deb", ["-c", package]).stdout.split(separator: "\n")
            .filter { !$0.hasPrefix("d") }.map { String($0.split(separator: " ").last!.dropFirst()) }
        let present = files.filter { FileManager.default.fileExists(atPath: $0) }
        try #require(present.isEmpty, "these files exist already and would be taken over, then removed, by the package: \(present)")
        let apt = ["DEBIAN_FRONTEND": "noninteractive"], wait = ["-o", "DPkg::Lock::Timeout=120"]
        defer { _ = try? Packaging.run("apt-get", wait + ["remove", "--purge", "-y", "sandboxctl"], environment: apt) }

        let installed = try Packaging.run("apt-get", wait + ["install", "-y", package], environment: apt)
        try #require(installed.status == 0, "\(installed.stdout)\(installed.stderr)")
        let help = try Packaging.run("/usr/bin/sandboxctl", ["--help"])
        #expect(help.status == 0 && help.stdout.contains("iOS-style data protection"))
        #expect(try Packaging.run("man", ["-w", "sandboxctl"]).stdout.contains("/usr/share/man/man1/sandboxctl.1.gz"))
        let page = try Packaging.run("man", ["sandboxctl-unlock"], environment: ["MANWIDTH": "200", "LC_ALL": "C.UTF-8", "MANPAGER": "cat", "PAGER": "cat"])
        #expect(page.status == 0 && page.stdout.contains("sandboxctl unlock"), "\(page.stderr)")
        #expect(try Packaging.bashCompletions("/usr/share/bash-completion/completions/sandboxctl", ["sandboxctl", "unl"]) == ["unlock"])

        let removed = try Packaging.run("apt-get", wait + ["remove", "--purge", "-y", "sandboxctl"], environment: apt)
        #expect(removed.status == 0, "\(removed.stderr)")
        let left = files.filter { FileManager.default.fileExists(atPath: $0) }
        #expect(left.isEmpty, "apt remove left \(left)")
        #expect(try Packaging.run("dpkg-query", ["-W", "sandboxctl"]).status != 0)
    }
}
