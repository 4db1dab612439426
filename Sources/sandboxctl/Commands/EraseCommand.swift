import ArgumentParser
import ProtectedStore

struct EraseCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "erase",
        abstract: "Erase the device: destroy its keys (instant, every file becomes unreadable), then remove its files.",
        discussion: "Asks for the passcode to prove ownership. Refused while a daemon serves the device: stop it first. Without the passcode, delete the root and the device secret by hand."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Read the passcode as one line from standard input instead of the terminal.")
    var passcodeStdin = false

    func run() throws {
        try reportingErrors {
            let opened = try device.openInProcess()
            try opened.requireNoDaemon()
            try opened.unlock(passcode: try PasscodeInput.read(prompt: "Passcode: ", fromStandardInput: passcodeStdin))
            try opened.erase()
            print("Erased the device in \(opened.root): its keys are destroyed and its containers removed")
        }
    }
}
