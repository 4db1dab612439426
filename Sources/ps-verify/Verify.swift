import ArgumentParser

/// `ps-verify`: attacks a throwaway device the way users' data will be attacked (crashes, load) and prints the figures
/// that docs/SECURITY.md records. `make verify` runs it with the fuzzers and the memory-hygiene test.
@main
struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ps-verify",
        abstract: "Crash-consistency, power-cut and load checks of ProtectedStore on a throwaway device, with figures.",
        discussion: "Each check creates its own device in a temporary folder (fast KDF) and removes it afterwards. Exits 1 if any check finds a violation.",
        subcommands: [CrashCommand.self, PowerCutCommand.self, LoadCommand.self, FloodCommand.self, CrashWorkerCommand.self, LoadClientCommand.self]
    )
}
