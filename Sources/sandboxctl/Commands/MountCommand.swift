import ArgumentParser
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import ProtectedStoreMount

struct MountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Serve a container as a real file system (FUSE) at MOUNTPOINT, with data protection enforced by the kernel boundary.",
        discussion: """
            Any program can then use the container's files by path: reads and writes are decrypted and encrypted on the way. \
            Needs a running `sandboxctl daemon` (exit 69 without): the mount attaches to it for keys and events, so \
            `sandboxctl lock` and `unlock` apply at once. While locked, class A files fail with EPERM (open, read, write, \
            also on descriptors opened before the lock, and no cached plaintext is served); class B files open before the \
            lock keep working and new ones can be created. Documents/Inbox is read-and-delete only (EACCES). The extended \
            attribute user.protection.class reads and sets an item's class (getfattr/setfattr, class names as elsewhere); \
            it is never listed, so copies (cp -a, rsync -aX, tar --xattrs) take their new folder's class, and removing it \
            gives a file its folder's. Other user.* attributes are kept encrypted, and POSIX ACLs work as on ext4.

            By default the mount runs in the background and this command returns once it is ready; its log goes to \
            $XDG_STATE_HOME/sandboxctl/logs/<keybag id>/mount-<container id>.log (outside the root: log lines name paths; the file name is the container's folder id, not its bundle identifier). Unmount with `fusermount3 -u MOUNTPOINT`, or send the mount's process \
            SIGINT or SIGTERM. With --foreground it stays attached and logs to standard error.

            Where root has turned on FUSE over io_uring (echo Y > /sys/module/fuse/parameters/enable_uring, Linux 6.14+) \
            before the mount starts, the mount takes its requests over it: each processor's requests are answered by \
            threads on that processor, which makes a round trip several times cheaper; the log says "requests come over \
            io_uring now". Otherwise, or with --no-io-uring, over /dev/fuse.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Argument(help: ArgumentHelp("The container's bundle identifier.", valueName: "bundle"))
    var bundleIdentifier: String

    @Argument(help: ArgumentHelp("An empty directory outside the device root.",
                                 discussion: "Default: the one a line `BUNDLE MOUNTPOINT` of $XDG_CONFIG_HOME/sandboxctl/mounts.conf gives (how sandboxctl-mount@BUNDLE.service finds it).",
                                 valueName: "mountpoint"))
    var mountPoint: String?

    @Flag(help: "Stay in the foreground and log to standard error until unmounted or interrupted.")
    var foreground = false

    @Flag(help: "Also log every refusal (data protection, Inbox rule, reserved names), not only errors.")
    var verbose = false

    @Flag(help: ArgumentHelp("Let every user reach the mount, the kernel checking modes and ACLs for each as ext4 would (off by default: only you).",
                             discussion: "FUSE's allow_other with default_permissions. As root, a new item belongs to the user who made it; as anyone else, to you, and fusermount3 allows it only with a line user_allow_other in /etc/fuse.conf."))
    var allowOther = false

    @OptionGroup var transport: TransportOptions

    /// Set on the background process this command starts: detach, then say "ready" on standard output once mounted.
    @Flag(help: .private)
    var backgroundChild = false

    func run() throws {
        try reportingErrors {
            let root = device.resolvedRoot
            let checkedMountPoint = try MountPoint.check(try mountPoint ?? MountsConfiguration.mountPoint(of: bundleIdentifier), deviceRoot: root)
            let attached = try device.attach()
            let container = try attached.container(bundleIdentifier: bundleIdentifier)
            if foreground || backgroundChild {
                try serve(container, at: checkedMountPoint)
            } else {
                try startInBackground(root: root, mountPoint: checkedMountPoint, container: container)
            }
        }
    }

    private func serve(_ container: Container, at mountPoint: String) throws {
        if backgroundChild { setsid() }
        try PlaintextHygiene.hardenProcess()
        Self.bootstrapLogging(verbose: verbose)
        let mount = FUSEMount(container: container, mountPoint: mountPoint, logger: Logger(label: "sandboxctl.mount"), sharing: allowOther ? .everyone : .owner)
        try mount.run(overIOUring: transport.overIOUring) {
            guard backgroundChild else {
                FileHandle.standardError.write(Data("Serving \(container.bundleIdentifier) at \(mountPoint); Ctrl-C or `fusermount3 -u \(mountPoint)` to stop\n".utf8))
                return
            }
            Self.announceReady()
        }
    }

    /// The mount points of `$XDG_CONFIG_HOME/sandboxctl/mounts.conf`: one `BUNDLE MOUNTPOINT` per line, `#` comments.
    enum MountsConfiguration {
        static var path: String {
            return (configHome as NSString).appendingPathComponent("sandboxctl/mounts.conf")
        }

        static func mountPoint(of bundle: String) throws -> String {
            for line in try configurationLines(at: path, what: "the mount configuration", shape: "`BUNDLE MOUNTPOINT` lines") {
                let fields = line.split(maxSplits: 1, whereSeparator: { $0 == " " || $0 == "\t" }).map { $0.trimmingCharacters(in: .whitespaces) }
                if fields.count == 2, fields[0] == bundle, !fields[1].isEmpty { return fields[1] }
            }
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "no mount point given, and no line for \(bundle) here",
                                      remedy: "Give MOUNTPOINT, or add the line `\(bundle) /path/to/mountpoint` to \(path)")
        }
    }

    /// Where background mounts log: `$XDG_STATE_HOME/sandboxctl/logs/<keybag id>/`, outside the device root, since log
    /// lines name paths in clear and the root keeps every name encrypted.
    static func logDirectory(root: String) throws -> String {
        let keybagPath = (root as NSString).appendingPathComponent("keybag")
        let keybagID = try Keybag.peekID(try FileLocation(path: keybagPath).readPrefix(count: Keybag.size, what: "keybag"), path: keybagPath)
        return (DeviceSecret.stateFolder as NSString).appendingPathComponent("logs/\(keybagID.hex)")
    }

    /// Starts this command again as a detached process and waits until it has mounted (or failed, with its log).
    private func startInBackground(root: String, mountPoint: String, container: Container) throws {
        var arguments = ["mount", bundleIdentifier, mountPoint, "--background-child", "--root", root]
        if let secret = device.resolvedDeviceSecret { arguments += ["--device-secret", secret] }
        if verbose { arguments.append("--verbose") }
        if allowOther { arguments.append("--allow-other") }
        arguments += transport.arguments
        let started = try Self.startDetached(arguments: arguments, root: root, logName: "mount-\(container.storageIdentifier).log")
        print("Mounted \(bundleIdentifier) at \(mountPoint) (pid \(started.process), log \(started.log)).")
        print("Unmount with: fusermount3 -u \(mountPoint)")
    }

    /// Runs sandboxctl with `arguments` (a command with `--background-child`) as a detached process logging to
    /// `logName` in the device's log folder, and waits until it says "ready"; if it fails first, prints its log and
    /// exits with its status. Returns its process id and log path.
    static func startDetached(arguments: [String], root: String, logName: String) throws -> (process: pid_t, log: String) {
        let logDirectory = try logDirectory(root: root)
        try FileManager.default.createDirectory(atPath: logDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let logPath = (logDirectory as NSString).appendingPathComponent(logName)
        if !FileManager.default.fileExists(atPath: logPath) {
            _ = FileManager.default.createFile(atPath: logPath, contents: nil, attributes: [.posixPermissions: 0o600])
        }
        guard let log = FileHandle(forWritingAtPath: logPath) else {
            throw ProtectedStoreError(.io, path: logPath, problem: "cannot open the mount's log", remedy: "Check the permissions of \(logDirectory)")
        }
        let logStart = log.seekToEndOfFile()
        let child = Process()
        child.executableURL = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
        child.arguments = arguments
        let ready = Pipe()
        child.standardInput = FileHandle.nullDevice
        child.standardOutput = ready
        child.standardError = log
        try child.run()
        try? log.close()
        var answer = ""
        while !answer.contains("\n") {
            let chunk = ready.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            answer += String(decoding: chunk, as: UTF8.self)
        }
        guard answer.hasPrefix("ready") else {
            child.waitUntilExit()
            let output = (try? FileHandle(forReadingAtPath: logPath).map { handle in
                defer { try? handle.close() }
                try handle.seek(toOffset: logStart)
                return String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
            }) ?? nil
            FileHandle.standardError.write(Data((output ?? "").utf8))
            throw ExitCode(child.terminationStatus == 0 ? ExitStatus.failure : child.terminationStatus)
        }
        return (child.processIdentifier, logPath)
    }

    /// In a background child: says "ready" to the starting command, then leaves its pipe.
    static func announceReady() {
        print("ready")
        fflush(nil)
        let null = open("/dev/null", O_WRONLY)
        dup2(null, STDOUT_FILENO)
        close(null)
    }

    /// Logs to standard error at `verbose`'s level (the background child's standard error is its log file).
    static func bootstrapLogging(verbose: Bool) { bootstrapLogging(level: verbose ? .debug : .info) }

    static func bootstrapLogging(level: Logger.Level) {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}
