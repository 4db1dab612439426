import ArgumentParser

@main
struct Sandboxctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sandboxctl",
        abstract: "iOS-style data protection for app containers on Linux.",
        discussion: """
            Items are named BUNDLE:PATH, the path relative to the app container (e.g. com.example.notes:Documents/a.txt).

            Key holders: when `sandboxctl daemon` serves the root, it holds the keys for every program; `lock`, `unlock` and \
            `watch` talk to it, and file commands use its state (no passcode asked; denied with 77 while locked). Without a \
            daemon each command is its own key holder (embedded mode): it opens the device before first unlock and asks \
            for the passcode only when an operation needs a key. Passcodes are never taken from the command line: they \
            are read from the terminal (with echo off) or, with --passcode-stdin, as the first line of standard input.

            Class names: complete, complete-unless-open, complete-until-first-user-authentication, none \
            (also A-D, and Foundation's NSFileProtection... names).

            Environment:
              SANDBOXCTL_ROOT            device root (same as --root)
              SANDBOXCTL_DEVICE_SECRET   device secret file (same as --device-secret)

            Exit status:
              0   success
              1   other failure (I/O, missing files; errSecItemNotFound, errSecDuplicateItem)
              64  usage error (bad option, bad argument; errSecParam)
              65  integrity error (authentication failed, corrupt or unsupported data; a device in format
                  version 1, which `sandboxctl migrate` converts; errSecDecode)
              69  no key daemon serves the device (lock, unlock, watch, mount, launch, ps,
                  suspend, resume, memory-warning, time-change), or it stopped
              77  denied by data protection (locked, before first unlock, wrong passcode; errSecInteractionNotAllowed),
                  by the Inbox's read-and-delete rule, or by an app's keychain groups (errSecMissingEntitlement)
            """,
        version: sandboxctlVersion,
        subcommands: [InitCommand.self, DaemonCommand.self, UnlockCommand.self, LockCommand.self, WatchCommand.self,
                      CreateCommand.self, StatusCommand.self, LsCommand.self, CatCommand.self, PutCommand.self, InboxCommand.self,
                      RmCommand.self, MvCommand.self, MkdirCommand.self, ProtectionCommand.self, MountCommand.self, PasswdCommand.self, MigrateCommand.self, EraseCommand.self,
                      LaunchCommand.self, PsCommand.self, SuspendCommand.self, ResumeCommand.self, InterruptCommand.self, MemoryWarningCommand.self, TimeChangeCommand.self, OpenCommand.self, TerminateCommand.self, SetupCommand.self,
                      KeychainCommand.self, DemoCommand.self, BenchCommand.self]
    )
}
