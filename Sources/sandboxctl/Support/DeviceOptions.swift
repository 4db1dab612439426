import ArgumentParser
import Foundation
import ProtectedStore

/// Where the device lives: options shared by every command that touches one.
struct DeviceOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Device root directory.", discussion: "Default: $SANDBOXCTL_ROOT, else ~/.local/share/sandboxctl.", valueName: "dir"))
    var root: String?

    @Option(help: ArgumentHelp("Device secret file, kept outside the root.",
                               discussion: "Default: $SANDBOXCTL_DEVICE_SECRET, else $XDG_STATE_HOME/sandboxctl/device-secrets/<keybag-id>.secret (XDG_STATE_HOME defaults to ~/.local/state).",
                               valueName: "path"))
    var deviceSecret: String?

    /// The default root, relative to the home folder.
    static let defaultRootInHome = ".local/share/sandboxctl"

    /// The root given by --root or $SANDBOXCTL_ROOT; nil when the default applies.
    var givenRoot: String? { root ?? environment("SANDBOXCTL_ROOT") }

    var resolvedRoot: String {
        givenRoot ?? (NSHomeDirectory() as NSString).appendingPathComponent(Self.defaultRootInHome)
    }

    /// nil means the library's default for the keybag's id.
    var resolvedDeviceSecret: String? { deviceSecret ?? environment("SANDBOXCTL_DEVICE_SECRET") }

    /// The device these options name: attached to the daemon serving it when one runs, else opened in this process
    /// before first unlock.
    func open() throws -> Device {
        Device.isDaemonRunning(root: resolvedRoot) ? try attach() : try openInProcess()
    }

    /// The device held by this process alone, before first unlock.
    func openInProcess() throws -> Device { try Device.open(root: resolvedRoot, deviceSecretPath: resolvedDeviceSecret) }

    /// The device attached to its daemon; exits 69 with the command that starts one when none runs.
    func attach() throws -> Device { try Device.attach(root: resolvedRoot) }

    private func environment(_ name: String) -> String? {
        ProcessInfo.processInfo.environment[name].flatMap { $0.isEmpty ? nil : $0 }
    }
}
