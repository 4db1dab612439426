import ArgumentParser

@main
struct Sandboxctl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sandboxctl",
        abstract: "iOS-style data protection for app containers on Linux.",
        discussion: """
            Passcodes are never taken from the command line: they are read from the terminal (with echo off) \
            or, with --passcode-stdin, as one line on standard input.

            Environment:
              SANDBOXCTL_ROOT            device root (same as --root)
              SANDBOXCTL_DEVICE_SECRET   device secret file (same as --device-secret)

            Exit status:
              0   success
              1   other failure (I/O, missing files)
              64  usage error (bad option, bad argument)
              65  integrity error (authentication failed, corrupt or unsupported data)
              77  denied by data protection (locked, before first unlock, wrong passcode)
            """,
        subcommands: [InitCommand.self, DemoCommand.self, BenchCommand.self]
    )
}
