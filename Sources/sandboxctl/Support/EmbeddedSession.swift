import ArgumentParser
import Foundation
import ProtectedStore

/// How a command that may need keys gets the passcode.
struct PasscodeOptions: ParsableArguments {
    @Flag(help: ArgumentHelp("Read the passcode from the first line of standard input (the rest is data, for `put -`).",
                             discussion: "Without it, the passcode is asked on the terminal only if the operation needs a key."))
    var passcodeStdin = false
}

/// The embedded key holder of one command: the device opened in this process (before first unlock, as after a boot),
/// unlocked only when an operation needs a key that isn't available.
struct EmbeddedSession {
    let device: Device
    private let passcodeOptions: PasscodeOptions

    init(_ deviceOptions: DeviceOptions, _ passcodeOptions: PasscodeOptions) throws {
        device = try deviceOptions.open()
        self.passcodeOptions = passcodeOptions
        if passcodeOptions.passcodeStdin {
            try device.unlock(passcode: try PasscodeInput.read(prompt: "", fromStandardInput: true))
        }
    }

    func container(_ reference: ContainerReference) throws -> Container {
        try device.container(bundleIdentifier: reference.bundleIdentifier)
    }

    /// Runs `operation`; if data protection denies it before first unlock, asks for the passcode on the terminal,
    /// unlocks, and runs it once more. Operations here change nothing on disk when they are denied.
    func withKeys<R>(_ operation: () throws -> R) throws -> R {
        do {
            return try operation()
        } catch {
            guard let denial = libraryError(in: error), denial.kind == .protectedDataUnavailable,
                  device.state == .beforeFirstUnlock, !passcodeOptions.passcodeStdin else { throw error }
            guard PasscodeInput.terminalAvailable else {
                throw ProtectedStoreError(.protectedDataUnavailable, path: denial.path, problem: denial.problem,
                                          remedy: "Pass --passcode-stdin and write the passcode as the first line of standard input, or run in a terminal to be asked")
            }
            try device.unlock(passcode: try PasscodeInput.read(prompt: "Passcode: ", fromStandardInput: false))
            return try operation()
        }
    }
}
