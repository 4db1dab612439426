import ArgumentParser
import CSupport
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreDaemon
import ProtectedStoreMount

struct LaunchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "launch",
        abstract: "Run COMMAND as the app BUNDLE, inside its sandbox (bubblewrap), with its container as HOME.",
        discussion: """
            The program sees its own container and nothing else of the user's data: the container is mounted (as \
            `sandboxctl mount` does, with every protection rule) at \(LaunchCommand.home), which is its HOME; TMPDIR is \
            its tmp folder. It runs in its own mount, PID, IPC, UTS and user namespaces, without network unless \
            --share-network, with the system's /usr and the few /etc files programs need read-only, and its own /tmp, \
            /proc and /dev. The device root, the keybag, the device secret, other containers and the daemon's socket \
            are not there. The environment is HOME, TMPDIR, SANDBOXCTL_BUNDLE, SANDBOXCTL_APP_SOCKET, PATH, TERM, LANG (the \
            launcher's, else C.UTF-8) and the launcher's LANGUAGE, LC_* and TZ when set, and \
            what --env adds. The program has no capability, and never runs as host root: launched by root, the sandbox \
            runs (through setpriv) as the device root's owner, or as uid and gid 2147483646, which no account has, when \
            root owns the device; its mount and socket are then in /run/sandboxctl-apps, and --read-only paths and \
            the program must be readable by that user.

            SANDBOXCTL_APP_SOCKET is the app's own socket to the daemon, which serves its events only: protected data, \
            its lifecycle (`sandboxctl suspend`, `resume`, `terminate`) and its Inbox items (the ones pending at launch \
            first, each recorded delivered once the app handled it); and its keychain, for its bundle identifier's \
            access group and those of --keychain-group only. The library's Application, `sandboxctl watch` and \
            `sandboxctl keychain` run inside attach through it; it refuses lock, unlock and everything else about the device.

            Needs a running `sandboxctl daemon` (exit 69 without) and bubblewrap (apt-get install bubblewrap). One \
            instance per bundle: a second launch is refused with the running one's pid. The command stays in the \
            foreground; its exit status is the program's. SIGINT, SIGTERM or SIGHUP to it, or `sandboxctl terminate \
            BUNDLE`, ends the program ('will terminate' to its observers, SIGTERM, then SIGKILL after \
            --terminate-timeout seconds). The mount lives as long as the program and is unmounted when it exits, \
            however it exits. Like `sandboxctl mount`, the mount takes its requests over FUSE's io_uring transport where \
            root has turned it on (/sys/module/fuse/parameters/enable_uring) before it starts; --no-io-uring keeps them \
            on /dev/fuse.
            """
    )

    /// Where the container is mounted inside the sandbox, the app's HOME.
    static let home = "/home/app"

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The container's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    @Option(name: .customLong("env"), help: ArgumentHelp("Set an environment variable inside the sandbox (repeatable).", valueName: "name=value"))
    var environment: [String] = []

    @Flag(help: "Let the program use the network (by default it has none: only its own loopback).")
    var shareNetwork = false

    @Option(name: .customLong("read-only"), help: ArgumentHelp("Also show this host path inside, read-only, at the same place (a toolchain, the program's own folder; repeatable). Never the device's folder, a folder holding it or anything in it.", valueName: "path"))
    var readOnlyPaths: [String] = []

    @Option(help: ArgumentHelp("Seconds between SIGTERM and SIGKILL when the program is ended.", valueName: "seconds"))
    var terminateTimeout: Double = 5

    @Option(help: ArgumentHelp("Seconds the app's observers have for each of 'will finish launching' and 'did finish launching' before the app is ended (iOS's watchdog gives about 20); a program that attaches no observer within them is active without launch events.", valueName: "seconds"))
    var launchTimeout: Double = 20

    @Option(help: ArgumentHelp("Seconds from 'did enter background' that the app's background tasks (Application.beginBackgroundTask) may extend its background time to; an app whose tasks are still open then is ended.", valueName: "seconds"))
    var backgroundTaskTime: Double = 30

    @Option(name: .customLong("keychain-group"), help: ArgumentHelp("A keychain access group the app may use besides its bundle identifier (an app group or a shared keychain group; repeatable).", valueName: "group"))
    var keychainGroups: [String] = []

    @Flag(help: "As an iPhone's side button: a lock sends the app to the background ('will resign active', 'did enter background', a suspension after 5 s) and the unlock brings it back. Off by default: on a desktop a lock does not mean the user left the app.")
    var backgroundOnLock = false

    @OptionGroup var transport: TransportOptions

    @Argument(parsing: .postTerminator, help: ArgumentHelp("The program and its arguments, after --.", valueName: "command"))
    var command: [String] = []

    func validate() throws {
        guard !command.isEmpty else { throw ValidationError("Give the program to run after --, e.g. `sandboxctl launch \(bundleIdentifier) -- /bin/sh`.") }
        for setting in environment where !setting.contains("=") || setting.hasPrefix("=") {
            throw ValidationError("--env \(setting): give NAME=VALUE.")
        }
        for path in readOnlyPaths where !path.hasPrefix("/") {
            throw ValidationError("--read-only \(path): give an absolute path.")
        }
        guard terminateTimeout >= 0, terminateTimeout <= 3600 else { throw ValidationError("--terminate-timeout must be between 0 and 3600 seconds.") }
        guard backgroundTaskTime >= 0, backgroundTaskTime <= 600 else { throw ValidationError("--background-task-time must be between 0 and 600 seconds.") }
        guard launchTimeout > 0, launchTimeout <= 600 else { throw ValidationError("--launch-timeout must be more than 0 and at most 600 seconds.") }
        for group in keychainGroups where group.isEmpty || group.utf8.count > 1024 {
            throw ValidationError("--keychain-group \(group): give 1 to 1024 bytes.")
        }
        guard keychainGroups.count <= 32 else { throw ValidationError("--keychain-group: at most 32 groups.") }
    }

    /// A read-only path may not show the device's folder (its keybag, other apps' containers, the keychain's
    /// database): not the folder, nothing in it, nothing holding it.
    static func checkReadOnlyPaths(_ paths: [String], keepClearOf root: String) throws {
        let device = URL(fileURLWithPath: root).resolvingSymlinksInPath().path
        for path in paths {
            let shown = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
            let overlaps = shown == device || device.hasPrefix(shown == "/" ? "/" : shown + "/") || shown.hasPrefix(device + "/")
            guard !overlaps else {
                throw ProtectedStoreError(.invalidArgument, path: path, problem: "--read-only would show the device's folder \(root) inside the sandbox",
                                          remedy: "Give a path that neither holds nor lies in the device's folder")
            }
        }
    }

    func run() throws {
        // The program's standard error is the terminal's too: only the mount's errors join it.
        MountCommand.bootstrapLogging(level: .warning)
        let status = try reportingErrors { () throws -> Int32 in
            // This process serves the container's plaintext to the app.
            try PlaintextHygiene.hardenProcess()
            let bubblewrap = try Sandbox.findBubblewrap()
            try Sandbox.checkUserNamespaces()
            let root = device.resolvedRoot
            try Self.checkReadOnlyPaths(readOnlyPaths, keepClearOf: root)
            let attached = try device.attach()
            let container = try attached.container(bundleIdentifier: bundleIdentifier)
            let slot = try LaunchSlot.claim(bundleIdentifier, root: root)
            defer { slot.release() }
            let app = try Sandbox(device: attached, container: container, slot: slot, bubblewrap: bubblewrap, command: command,
                                  environment: environment, shareNetwork: shareNetwork, readOnlyPaths: readOnlyPaths,
                                  terminateTimeout: terminateTimeout, launchTimeout: launchTimeout, backgroundTaskTime: backgroundTaskTime,
                                  backgroundOnLock: backgroundOnLock, keychainGroups: keychainGroups)
            return try app.run(overIOUring: transport.overIOUring)
        }
        if status != 0 { throw ExitCode(status) }
    }
}

/// Passes the container's open-URL events to the launched app through the daemon, returning only once the app handled
/// one: until then the Inbox keeps it pending (also across a daemon restart, and if this process ends).
private final class OpenURLRelay: OpenURLRequestRelay, @unchecked Sendable {
    private let device: Device
    private let bundle: String
    private let isEnding: @Sendable () -> Bool

    init(device: Device, bundle: String, isEnding: @escaping @Sendable () -> Bool) {
        self.device = device
        self.bundle = bundle
        self.isEnding = isEnding
    }

    func relay(_ request: OpenURLRequest, from container: Container) {
        while true {
            if (try? device.appRequest(.appOpenURL, bundle: bundle, openURL: request)) != nil { return }
            // The daemon is away (or restarting): try again. Once the app is ending, never return: returning would
            // record the event delivered, and the next launch must get it.
            if isEnding() { while true { pause() } }
            usleep(500_000)
        }
    }
}

/// One launched app: the container mounted for it in this process, bubblewrap started on it, the record for `ps`,
/// and the ending (SIGTERM, then SIGKILL) when asked.
final class Sandbox: @unchecked Sendable {
    /// Where the app's own daemon socket appears inside the sandbox (`Application.attach()` reads it from the environment).
    static let appSocketInside = "/run/sandboxctl/app.sock"

    private let device: Device
    private let container: Container
    private let slot: LaunchSlot
    private let bubblewrap: String
    private let command: [String]
    private let environment: [String]
    private let shareNetwork: Bool
    private let readOnlyPaths: [String]
    private let terminateTimeout: Double
    private let launchTimeout: Double
    private let backgroundTaskTime: Double
    private let backgroundOnLock: Bool
    /// Who the sandbox runs as on the host when that is not this process's user: only a root launcher's sandbox.
    private let hostIdentity: HostIdentity?
    private let keychainGroups: [String]
    private let logger = Logger(label: "sandboxctl.launch")
    private let mutex = NSLock()
    private var sandboxPID: pid_t = 0
    private var ending = false

    init(device: Device, container: Container, slot: LaunchSlot, bubblewrap: String, command: [String], environment: [String], shareNetwork: Bool,
         readOnlyPaths: [String], terminateTimeout: Double, launchTimeout: Double, backgroundTaskTime: Double,
         backgroundOnLock: Bool, keychainGroups: [String]) throws {
        self.keychainGroups = keychainGroups
        self.device = device
        self.container = container
        self.slot = slot
        self.bubblewrap = bubblewrap
        self.command = command
        self.environment = environment
        self.shareNetwork = shareNetwork
        self.readOnlyPaths = readOnlyPaths
        self.terminateTimeout = terminateTimeout
        self.launchTimeout = launchTimeout
        self.backgroundTaskTime = backgroundTaskTime
        self.backgroundOnLock = backgroundOnLock
        self.hostIdentity = try HostIdentity.forSandbox(deviceRoot: device.root)
    }

    /// A host uid and gid a sandbox runs as.
    struct HostIdentity: Equatable {
        /// The ids a root launcher's sandbox of a root-owned device runs as: no account has them, so no process of
        /// the host shares them (as `nobody` would: a process of the same uid may read the app's memory).
        static let unprivileged = HostIdentity(uid: 0x7FFF_FFFE, gid: 0x7FFF_FFFE)

        let uid: uid_t
        let gid: gid_t

        /// nil when not root: bubblewrap runs the sandbox as this user, with no capability on the host. As root the
        /// sandbox runs as the device root's owner, or `unprivileged` when root owns it: never as host uid 0, whose
        /// files, key rings and /proc/sys its user namespace would reach.
        static func forSandbox(deviceRoot: String) throws -> HostIdentity? {
            guard geteuid() == 0 else { return nil }
            var info = stat()
            guard stat(deviceRoot, &info) == 0 else {
                throw ProtectedStoreError(.io, path: deviceRoot, problem: "cannot read the device root's owner (\(String(cString: strerror(errno))))",
                                          remedy: "Check the device root")
            }
            return info.st_uid == 0 ? unprivileged : HostIdentity(uid: info.st_uid, gid: info.st_gid)
        }
    }

    static func findBubblewrap() throws -> String {
        if let bubblewrap = FileSystem.executable(named: "bwrap") { return bubblewrap }
        throw ProtectedStoreError(.notFound, path: "bwrap", problem: "bubblewrap is not installed (no bwrap on PATH)",
                                  remedy: "Install it: apt-get install bubblewrap")
    }

    /// setpriv (util-linux), which starts a root launcher's bubblewrap under the sandbox's own ids.
    private static func findSetpriv() throws -> String {
        if let setpriv = FileSystem.executable(named: "setpriv") { return setpriv }
        throw ProtectedStoreError(.notFound, path: "setpriv", problem: "launching as root needs setpriv, to run the sandbox under an unprivileged uid, and it is not on PATH",
                                  remedy: "Install it: apt-get install util-linux")
    }

    /// bubblewrap needs user namespaces; say which setting turns them off rather than let it fail obscurely.
    static func checkUserNamespaces() throws {
        func setting(_ path: String) -> Int? {
            (try? String(contentsOfFile: path, encoding: .utf8)).flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }
        if setting("/proc/sys/user/max_user_namespaces") == 0 {
            throw ProtectedStoreError(.permissionDenied, path: "/proc/sys/user/max_user_namespaces", problem: "user namespaces are turned off (user.max_user_namespaces = 0)",
                                      remedy: "Turn them on: sysctl -w user.max_user_namespaces=15000")
        }
        // Also as root: its sandbox runs as another user (HostIdentity).
        if setting("/proc/sys/kernel/unprivileged_userns_clone") == 0 {
            throw ProtectedStoreError(.permissionDenied, path: "/proc/sys/kernel/unprivileged_userns_clone", problem: "user namespaces are turned off for users other than root",
                                      remedy: "Turn them on: sysctl -w kernel.unprivileged_userns_clone=1")
        }
    }

    /// Mounts (`overIOUring` false: over /dev/fuse even where FUSE over io_uring is on), runs the program to its end,
    /// unmounts; returns the program's exit status.
    func run(overIOUring: Bool) throws -> Int32 {
        guard resolvedProgram() != nil else {
            throw ProtectedStoreError(.notFound, path: command[0], problem: "the program is not found (as a path, or in PATH)",
                                      remedy: "Give its absolute path; a program outside /usr is shown in the sandbox where it is")
        }
        for path in hostPathsNotInSandbox() {
            FileHandle.standardError.write(Data("sandboxctl: note: \(path) is not inside the sandbox (it shows /usr, a few /etc files, the container and --read-only paths): add --read-only \((path as NSString).deletingLastPathComponent) if the program needs it\n".utf8))
        }
        if let hostIdentity { try slot.shareSandboxFolder(uid: hostIdentity.uid, gid: hostIdentity.gid) }
        let home = slot.homeMount
        try prepareMountPoint(home)
        defer { rmdir(home) }
        let mount = FUSEMount(container: container, mountPoint: home, logger: logger, sharing: hostIdentity != nil ? .sandbox : .owner)
        let mounted = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var unmount: (@Sendable () -> Void)?
        nonisolated(unsafe) var mountFailure: (any Error)?
        let server = Thread {
            do {
                try mount.run(overIOUring: overIOUring, unmountedBy: { unmount = $0 }, ready: { mounted.signal() })
            } catch {
                mountFailure = error
                mounted.signal()
            }
            finished.signal()
        }
        server.start()
        mounted.wait()
        if let mountFailure { throw mountFailure }
        defer {
            unmount?()
            finished.wait()
        }
        let signals = [SIGINT, SIGTERM, SIGHUP].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { [self] in end() }
            source.resume()
            return source
        }
        defer { signals.forEach { $0.cancel() } }
        try FileSystem.createDirectories(slot.socketFolder)
        // The sandbox's user enters the socket's folder (the daemon gives it the socket); still no one else can.
        if let hostIdentity, chown(slot.socketFolder, hostIdentity.uid, hostIdentity.gid) != 0 || chmod(slot.socketFolder, 0o700) != 0 {
            throw ProtectedStoreError(.io, path: slot.socketFolder, problem: "cannot give the socket's folder to uid \(hostIdentity.uid) (\(String(cString: strerror(errno))))",
                                      remedy: "Check the permissions of \(slot.folder)")
        }
        let (bubblewrapPID, info, go) = try spawnBubblewrap(home: home)
        // bubblewrap reports its first process in the sandbox (as seen from here) on the info descriptor, then waits
        // for a byte on the block descriptor before it runs the program: by then the daemon knows the app and listens
        // on its socket, so the program's first `Application.attach()` finds it.
        let reported = String(decoding: info.readDataToEndOfFile(), as: UTF8.self)
        do {
            guard let childPID = (try? JSONSerialization.jsonObject(with: Data(reported.utf8)) as? [String: Any])?["child-pid"] as? Int else {
                throw ProtectedStoreError(.io, path: bubblewrap, problem: "bubblewrap did not start the sandbox (see its message above)", remedy: "Fix what it says and launch again")
            }
            mutex.withLock { sandboxPID = pid_t(childPID) }
            try register(again: false)
            try slot.write(AppRecord(bundle: container.bundleIdentifier, launcherPID: getpid(), sandboxPID: pid_t(childPID), command: command))
            try go.write(contentsOf: Data([1]))
            try? go.close()
        } catch {
            kill(bubblewrapPID, SIGKILL)
            var status: Int32 = 0
            while waitpid(bubblewrapPID, &status, 0) < 0 && errno == EINTR {}
            throw error
        }
        let reregistration = keepRegistered()
        defer { reregistration.cancel() }
        // This process is the container's Inbox receiver: the app's open-URL events go through the daemon to its
        // observers, pending ones (delivered before the launch) first, each recorded delivered once the app handled it.
        let relay = OpenURLRelay(device: device, bundle: container.bundleIdentifier, isEnding: { [self] in mutex.withLock { ending } })
        container.addOpenURLDelegate(relay)
        defer { container.removeOpenURLDelegate(relay) }
        var status: Int32 = 0
        while waitpid(bubblewrapPID, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED / WTERMSIG, which Glibc's Swift overlay does not bring.
        let signalNumber = status & 0x7f
        return signalNumber == 0 ? (status >> 8) & 0xff : 128 + signalNumber
    }

    /// Tells the daemon about the app: its sandbox's first process, and the socket the app's own connections come in on.
    /// `again`: after a daemon restart, so the app, launched already, gets no launch events.
    private func register(again: Bool) throws {
        _ = try device.appRequest(.appRegister, bundle: container.bundleIdentifier, timeout: launchTimeout, sandboxPID: mutex.withLock { sandboxPID },
                                  socketPath: slot.appSocket, sandboxUID: hostIdentity?.uid, launched: again,
                                  backgroundTaskTime: backgroundTaskTime, backgroundOnLock: backgroundOnLock, keychainGroups: keychainGroups)
    }

    /// A restarted daemon knows no apps: registers again once one serves the device, so the app's observers, which
    /// reconnect to their socket, hear the daemon again.
    private func keepRegistered() -> any DispatchSourceTimer {
        let timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + 0.5, repeating: 0.5)
        timer.setEventHandler { [self] in
            guard !mutex.withLock({ ending }), let apps = try? device.appRequest(.apps),
                  !apps.contains(where: { $0.bundle == container.bundleIdentifier }) else { return }
            do {
                try register(again: true)
                logger.warning("the key daemon came back: \(container.bundleIdentifier) registered again")
            } catch {
                logger.warning("cannot register \(container.bundleIdentifier) with the key daemon again: \(error)")
            }
        }
        timer.resume()
        return timer
    }

    /// Ends the program: 'will terminate' to its observers (within the timeout), SIGTERM to every process of the
    /// sandbox, SIGKILL to all after the timeout.
    func end() {
        let pid: pid_t? = mutex.withLock {
            guard !ending, sandboxPID > 0 else { return nil }
            ending = true
            return sandboxPID
        }
        guard let pid else { return }
        // The daemon sends 'will terminate' to a running app, and ends a suspended one itself, without notice.
        let endedByDaemon = (try? device.appRequest(.appTerminate, bundle: container.bundleIdentifier, timeout: terminateTimeout))?
            .contains { $0.state == "ended" } ?? false
        if !endedByDaemon {
            // bubblewrap's init (the first process) passes nothing on; the program and its children get SIGTERM.
            for process in AppProcesses.inSandbox(of: pid).dropFirst() { kill(process, SIGTERM) }
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + terminateTimeout) {
            // Killing the namespace's first process kills every process in it; checked first, since the number may
            // have been reused by then (the sandbox gone, a process of ours under that pid).
            if !AppProcesses.inSandbox(of: pid).isEmpty { kill(pid, SIGKILL) }
        }
    }

    /// An empty directory to mount on; one left mounted by a launcher that was killed is unmounted first.
    private func prepareMountPoint(_ path: String) throws {
        var info = stat()
        if stat(path, &info) != 0 && errno == ENOTCONN {
            let cleanup = Process()
            cleanup.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
            cleanup.arguments = ["-u", "-z", path]
            try? cleanup.run()
            cleanup.waitUntilExit()
        }
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw ProtectedStoreError(.io, path: path, problem: "cannot create the mount point (\(String(cString: strerror(errno))))", remedy: "Check the permissions of \(slot.folder)")
        }
    }

    /// bubblewrap's arguments: what the sandbox contains.
    private func bubblewrapArguments(home: String, infoDescriptor: Int32, blockDescriptor: Int32) -> [String] {
        // No user namespace inside: without one the app can't make a nested PID namespace a suspension would miss.
        var arguments = ["--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
                         "--info-fd", "\(infoDescriptor)", "--block-fd", "\(blockDescriptor)", "--hostname", "app"]
        if !shareNetwork { arguments.append("--unshare-net") }
        // The sandbox's own /proc, /dev, /tmp and /run first: binds below them (a program in /tmp) go on top.
        arguments += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/run", "--ro-bind", "/usr", "/usr"]
        // Merged /usr (Debian 12 and later): the top-level folders are links into it; else their own read-only binds.
        for folder in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/\(folder)") {
                arguments += ["--symlink", target, "/\(folder)"]
            } else if FileManager.default.fileExists(atPath: "/\(folder)") {
                arguments += ["--ro-bind", "/\(folder)", "/\(folder)"]
            }
        }
        // What dynamic linking, name lookup, time zones, certificates and `alternatives` links need; nothing about users
        // beyond the account files, no secrets.
        var etc = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group", "alternatives",
                   "ssl", "ca-certificates", "mime.types"]
        if shareNetwork { etc += ["resolv.conf", "hosts", "host.conf", "gai.conf"] }
        for name in etc { arguments += ["--ro-bind-try", "/etc/\(name)", "/etc/\(name)"] }
        for path in readOnlyPaths { arguments += ["--ro-bind", path, path] }
        // The program itself, when it lives outside /usr.
        if let program = resolvedProgram(), !program.hasPrefix("/usr/"), !readOnlyPaths.contains(where: { program.hasPrefix($0) }) {
            arguments += ["--ro-bind", program, program]
        }
        // The folder, not the socket: a restarted daemon makes a new socket there, which the sandbox then sees.
        // Read-only (connecting needs no write access to the mount): the app can't replace the socket or fill the folder.
        arguments += ["--ro-bind", slot.socketFolder, (Self.appSocketInside as NSString).deletingLastPathComponent]
        arguments += ["--bind", home, LaunchCommand.home, "--chdir", LaunchCommand.home, "--clearenv",
                      "--setenv", Application.socketEnvironmentVariable, Self.appSocketInside,
                      "--setenv", "HOME", LaunchCommand.home, "--setenv", "TMPDIR", "\(LaunchCommand.home)/tmp",
                      "--setenv", "SANDBOXCTL_BUNDLE", container.bundleIdentifier,
                      "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
        // The user's locale and time zone reach the app, as a phone's settings do; C.UTF-8 when none is set.
        let host = ProcessInfo.processInfo.environment
        arguments += ["--setenv", "LANG", host["LANG"].flatMap { $0.isEmpty ? nil : $0 } ?? "C.UTF-8"]
        for name in Self.localeVariables { if let value = host[name], !value.isEmpty { arguments += ["--setenv", name, value] } }
        if let terminal = host["TERM"] { arguments += ["--setenv", "TERM", terminal] }
        for setting in environment {
            let name = String(setting.prefix { $0 != "=" })
            arguments += ["--setenv", name, String(setting.dropFirst(name.count + 1))]
        }
        return arguments + ["--"] + command
    }

    /// Besides LANG, the locale and time-zone variables the launcher passes on when they are set.
    static let localeVariables = ["LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES",
                                  "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION", "TZ"]

    /// Absolute paths among the arguments (words of a `sh -c` script too) that exist here but not in the sandbox: the
    /// program would fail with a bare "not found".
    private func hostPathsNotInSandbox() -> [String] {
        let visible = ["/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/etc/", "/proc/", "/dev/", LaunchCommand.home + "/"] + readOnlyPaths.map { $0.hasSuffix("/") ? $0 : $0 + "/" }
        let words = command.dropFirst().flatMap { $0.split(whereSeparator: { " \t\n;&|'\"()<>=".contains($0) }) }.map(String.init)
        var seen: Set<String> = []
        return words.filter { word in
            word.hasPrefix("/") && word.count > 1 && !visible.contains { (word + "/").hasPrefix($0) } && FileManager.default.fileExists(atPath: word)
                && seen.insert(word).inserted
        }
    }

    /// The program's path on this machine: as given if it has a "/", else found in PATH's absolute folders; nil if not
    /// found (bubblewrap then reports it).
    private func resolvedProgram() -> String? {
        let program = command[0]
        if program.contains("/") {
            return URL(fileURLWithPath: program).standardizedFileURL.resolvingSymlinksInPath().path
        }
        return FileSystem.executable(named: program)
    }

    /// Starts bubblewrap (as root: through setpriv, under the sandbox's own ids) with the info descriptor as fd 3 and
    /// the block descriptor as fd 4; returns its pid, the read end of the first, and the write end of the second (a
    /// byte lets the program start).
    private func spawnBubblewrap(home: String) throws -> (pid_t, FileHandle, FileHandle) {
        let info = Pipe(), block = Pipe()
        let infoDescriptor: Int32 = 3, blockDescriptor: Int32 = 4
        var arguments = [bubblewrap] + bubblewrapArguments(home: home, infoDescriptor: infoDescriptor, blockDescriptor: blockDescriptor)
        if let hostIdentity {
            arguments = [try Self.findSetpriv(), "--reuid=\(hostIdentity.uid)", "--regid=\(hostIdentity.gid)", "--clear-groups",
                         "--inh-caps=-all", "--bounding-set=-all", "--"] + arguments
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Both through descriptors above the targets first, so one dup2 can't overwrite the other's source.
        let infoSource = fcntl(info.fileHandleForWriting.fileDescriptor, F_DUPFD_CLOEXEC, 10)
        let blockSource = fcntl(block.fileHandleForReading.fileDescriptor, F_DUPFD_CLOEXEC, 10)
        defer { close(infoSource); close(blockSource) }
        posix_spawn_file_actions_adddup2(&actions, infoSource, infoDescriptor)
        posix_spawn_file_actions_adddup2(&actions, blockSource, blockDescriptor)
        // Nothing else of this process reaches the sandbox: not the daemon connection, not the FUSE device.
        ps_spawn_close_from(&actions, blockDescriptor + 1)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // The program gets the default dispositions and an empty mask, not this process's ignored SIGINT, SIGTERM and
        // SIGHUP, which Dispatch's signal sources also block.
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for number in [SIGINT, SIGTERM, SIGHUP, SIGPIPE] { sigaddset(&defaults, number) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var unblocked = sigset_t()
        sigemptyset(&unblocked)
        posix_spawnattr_setsigmask(&attributes, &unblocked)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        var argv = arguments.map { strdup($0) }
        argv.append(nil)
        defer { argv.forEach { free($0) } }
        // No environment: bubblewrap's own is the sandbox's /proc/1/environ, and the app's is built by --setenv.
        var environ: [UnsafeMutablePointer<CChar>?] = [nil]
        var pid: pid_t = 0
        let result = posix_spawn(&pid, arguments[0], &actions, &attributes, &argv, &environ)
        try? info.fileHandleForWriting.close()
        try? block.fileHandleForReading.close()
        guard result == 0 else {
            throw ProtectedStoreError(.io, path: arguments[0], problem: "cannot start bubblewrap (\(String(cString: strerror(result))))", remedy: "Check the bubblewrap installation")
        }
        return (pid, info.fileHandleForReading, block.fileHandleForWriting)
    }
}
