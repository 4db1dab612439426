import ArgumentParser
import Foundation
import ProtectedStore
import ProtectedStoreCore

struct SetupCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "setup",
        abstract: "Make sandboxctl part of the system: systemd units.",
        subcommands: [SetupSystemdCommand.self]
    )
}

struct SetupSystemdCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "systemd",
        abstract: "Write the systemd units that start the key daemon on demand (socket activation) and mount containers.",
        discussion: """
            Writes three units for the device: sandboxctl.socket (the daemon's socket, mode 0600; the daemon starts at \
            the first connection and takes the socket over), sandboxctl.service (the daemon), and \
            sandboxctl-mount@.service (the mount of the container named by the instance, at the mount point its line in \
            $XDG_CONFIG_HOME/sandboxctl/mounts.conf gives: `BUNDLE MOUNTPOINT`). Prints each file it writes, then the \
            systemctl commands that turn them on; it runs none itself.

            With --user, into $XDG_CONFIG_HOME/systemd/user (default ~/.config/systemd/user), for the user's manager; the \
            default device root is then written as %h/.local/share/sandboxctl, so the same units serve every user. \
            Otherwise into /etc/systemd/system, for a daemon that runs as root and serves the device root given \
            (--root, $SANDBOXCTL_ROOT, else root's default), written as an absolute path. A --root or $SANDBOXCTL_ROOT \
            is always written as given.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Write user units (systemctl --user) instead of system ones.")
    var user = false

    @Flag(help: "Print what would be written, write nothing.")
    var dryRun = false

    @Option(help: ArgumentHelp("Write the units into this folder instead.", valueName: "dir"))
    var unitDirectory: String?

    @Option(help: ArgumentHelp("The sandboxctl the units run (default: this one).", valueName: "path"))
    var executable: String?

    func run() throws {
        try reportingErrors {
            let units = SystemdUnits(executable: try resolvedExecutable(), root: unitRoot, deviceSecret: device.resolvedDeviceSecret)
            let folder = unitDirectory ?? defaultUnitDirectory
            for (name, text) in units.files {
                let path = (folder as NSString).appendingPathComponent(name)
                if dryRun {
                    print("# \(path)\n\(text)")
                    continue
                }
                try FileSystem.createDirectories(folder)
                try FileSystem.writeAtomically(Array(text.utf8), to: FileLocation(path: path), replacing: true, permissions: [.ownerReadWrite, .groupRead, .otherRead])
                print("wrote \(path)")
            }
            let systemctl = user ? "systemctl --user" : "systemctl"
            print(dryRun ? "# Nothing written (--dry-run). Then:" : "Now turn them on:")
            print("  \(systemctl) daemon-reload")
            print("  \(systemctl) enable --now sandboxctl.socket")
            print("  \(systemctl) enable --now sandboxctl-mount@BUNDLE.service   # after a line `BUNDLE MOUNTPOINT` in \(MountCommand.MountsConfiguration.path)")
        }
    }

    /// The device root as the units name it: for user units, the default one relative to the user's home (`%h`), so
    /// the units fit any user; otherwise, and one given explicitly, as an absolute path.
    private var unitRoot: String {
        if user, device.givenRoot == nil { return "%h/" + DeviceOptions.defaultRootInHome }
        return Device.absolute(device.resolvedRoot)
    }

    private var defaultUnitDirectory: String {
        guard user else { return "/etc/systemd/system" }
        return (configHome as NSString).appendingPathComponent("systemd/user")
    }

    private func resolvedExecutable() throws -> String {
        if let executable {
            guard executable.hasPrefix("/") else {
                throw ProtectedStoreError(.invalidArgument, path: executable, problem: "the executable must be an absolute path (systemd requires it)", remedy: "Give the full path")
            }
            return executable
        }
        return try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    }
}

/// The units `setup systemd` writes: one socket-activated daemon per device, and one mount unit per container.
struct SystemdUnits {
    let executable: String
    /// The device root as the units name it (may use the `%h` specifier).
    let root: String
    let deviceSecret: String?

    /// An argument for ExecStart=: systemd splits at spaces and expands `%` specifiers and `\` escapes, so a path is
    /// quoted if it has a space and its `%`, `"` and `\` are escaped. The `%h` of the default root is meant.
    private func quoted(_ argument: String) -> String {
        guard argument != root || !root.hasPrefix("%h/") else { return argument }
        let escaped = argument.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "%", with: "%%")
        return escaped.contains(" ") ? "\"\(escaped)\"" : escaped
    }

    private var deviceArguments: String {
        "--root \(quoted(root))" + (deviceSecret.map { " --device-secret \(quoted(Device.absolute($0)))" } ?? "")
    }

    var files: [(name: String, text: String)] {
        [("sandboxctl.socket", """
            [Unit]
            Description=ProtectedStore key daemon socket (\(root))

            [Socket]
            ListenStream=\(root)/daemon.sock
            SocketMode=0600
            DirectoryMode=0700

            [Install]
            WantedBy=sockets.target

            """),
         ("sandboxctl.service", """
            [Unit]
            Description=ProtectedStore key daemon (\(root))
            Requires=sandboxctl.socket
            After=sandboxctl.socket

            [Service]
            # Started at the first connection to the socket, which it takes over (LISTEN_FDS). Its keys are in memory only.
            ExecStart=\(quoted(executable)) daemon \(deviceArguments)
            LimitCORE=0
            # One descriptor per connection: room for thousands of subscribers and a flood besides (PROTOCOL.md §1).
            LimitNOFILE=65536
            # Launched apps get cgroups of their own below the daemon's, frozen to suspend them (DESIGN.md, "The app lifecycle").
            Delegate=yes
            Restart=on-failure

            [Install]
            Also=sandboxctl.socket

            """),
         ("sandboxctl-mount@.service", """
            [Unit]
            Description=ProtectedStore mount of %i (\(root))
            Requires=sandboxctl.socket
            After=sandboxctl.socket

            [Service]
            # The mount point is the one the line `%i MOUNTPOINT` of $XDG_CONFIG_HOME/sandboxctl/mounts.conf gives.
            ExecStart=\(quoted(executable)) mount %i --foreground \(deviceArguments)
            # It handles plaintext: no core file.
            LimitCORE=0

            [Install]
            WantedBy=default.target

            """)]
    }
}
