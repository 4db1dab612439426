import ArgumentParser
import ProtectedStore

struct PasswdCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "passwd",
        abstract: "Change the device passcode (re-wraps the class keys; no file is re-encrypted).",
        discussion: "On a terminal: the current passcode, then the new one twice. With --passcode-stdin: two lines, the current passcode and the new one. Wrong passcodes count towards the throttle."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Read the current and the new passcode as two lines of standard input.")
    var passcodeStdin = false

    func run() throws {
        try reportingErrors {
            let opened = try device.open()
            let old = try PasscodeInput.read(prompt: "Current passcode: ", fromStandardInput: passcodeStdin)
            let new = try PasscodeInput.readNew(fromStandardInput: passcodeStdin)
            try opened.changePasscode(from: old, to: new)
            print("Passcode changed for \(opened.root)")
        }
    }
}
