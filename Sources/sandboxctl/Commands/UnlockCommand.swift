import ArgumentParser
import ProtectedStore

struct UnlockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock the device in its daemon: every attached program gets 'did become available'.",
        discussion: "Asks for the passcode on the terminal, or reads one line with --passcode-stdin. Wrong passcodes are counted and throttled (exit 77). Exits 69 when no daemon runs."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Read the passcode as one line from standard input instead of the terminal.")
    var passcodeStdin = false

    func run() throws {
        try reportingErrors {
            let attached = try device.attach()
            try attached.unlock(passcode: try PasscodeInput.read(prompt: "Passcode: ", fromStandardInput: passcodeStdin))
            print("Unlocked \(attached.root)")
        }
    }
}
