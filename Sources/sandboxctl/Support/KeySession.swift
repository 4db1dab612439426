import ArgumentParser
import Foundation
import ProtectedStore

/// How a command that may need keys gets the passcode.
struct PasscodeOptions: ParsableArguments {
    @Flag(help: ArgumentHelp("Read the passcode from the first line of standard input (the rest is data, for `put -`).",
                             discussion: "Without it, the passcode is asked on the terminal only if the operation needs a key. Ignored (the line is still consumed) when a daemon holds the keys."))
    var passcodeStdin = false
}

/// The key holder of one file command: the daemon serving the root when one runs (its state applies, no passcode is
/// asked), else the device opened in this process before first unlock and unlocked only when an operation needs it.
struct KeySession {
    let device: Device
    private let passcodeOptions: PasscodeOptions

    init(_ deviceOptions: DeviceOptions, _ passcodeOptions: PasscodeOptions) throws {
        device = try deviceOptions.open()
        self.passcodeOptions = passcodeOptions
        guard passcodeOptions.passcodeStdin else { return }
        // Consumed in both modes, so what follows on standard input is data, never the passcode.
        let passcode = try PasscodeInput.read(prompt: "", fromStandardInput: true)
        if device.isAttachedToDaemon {
            printWarning("a key daemon holds the keys of \(device.root); its state applies and the passcode given was not used (`sandboxctl unlock` unlocks it)")
        } else {
            try device.unlock(passcode: passcode)
        }
    }

    func container(_ reference: ContainerReference) throws -> Container {
        try device.container(bundleIdentifier: reference.bundleIdentifier)
    }

    /// Runs `operation`; in-process, if data protection denies it before first unlock, asks for the passcode on the
    /// terminal, unlocks, and runs it once more. Operations here change nothing on disk when they are denied.
    func withKeys<R>(_ operation: () throws -> R) throws -> R {
        do {
            return try operation()
        } catch {
            let denied = libraryError(in: error)?.kind == .protectedDataUnavailable || (error as? KeychainError)?.code == .interactionNotAllowed
            guard denied, !device.isAttachedToDaemon, device.state == .beforeFirstUnlock, !passcodeOptions.passcodeStdin else { throw error }
            guard PasscodeInput.terminalAvailable else {
                let remedy = "Pass --passcode-stdin and write the passcode as the first line of standard input, or run in a terminal to be asked"
                if let keychainError = error as? KeychainError {
                    throw KeychainError(keychainError.code, problem: keychainError.problem, remedy: remedy, path: keychainError.path)
                }
                let denial = libraryError(in: error)!
                throw ProtectedStoreError(.protectedDataUnavailable, path: denial.path, problem: denial.problem, remedy: remedy)
            }
            try device.unlock(passcode: try PasscodeInput.read(prompt: "Passcode: ", fromStandardInput: false))
            return try operation()
        }
    }
}
