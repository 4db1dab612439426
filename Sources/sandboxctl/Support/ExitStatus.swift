import ArgumentParser
import Foundation
import ProtectedStore

/// The exit codes documented in `sandboxctl --help` (sysexits.h values).
enum ExitStatus {
    static let failure: Int32 = 1
    static let usage: Int32 = 64
    static let integrity: Int32 = 65
    static let unavailable: Int32 = 69
    static let denied: Int32 = 77

    static func code(for keychainError: KeychainError.Code) -> Int32 {
        switch keychainError {
        case .param: usage
        case .decode: integrity
        case .interactionNotAllowed, .missingEntitlement: denied
        case .notAvailable: unavailable
        case .duplicateItem, .itemNotFound, .io, .diskFull: failure
        }
    }

    static func code(for kind: ProtectedStoreError.Kind) -> Int32 {
        switch kind {
        case .integrity, .unsupportedFormat: integrity
        case .wrongPasscode, .throttled, .protectedDataUnavailable, .permissionDenied: denied
        case .invalidArgument: usage
        case .notFound, .alreadyExists, .io: failure
        case .daemonUnavailable: unavailable
        }
    }
}

/// Runs a command body, printing library errors as one clear line and exiting with the documented code.
func reportingErrors<R>(_ body: () throws -> R) throws -> R {
    do {
        return try body()
    } catch {
        throw exitCode(reporting: error)
    }
}

func reportingErrors<R>(_ body: () async throws -> R) async throws -> R {
    do {
        return try await body()
    } catch {
        throw exitCode(reporting: error)
    }
}

/// Prints a library error (also one wrapped in a `CocoaError`) and returns the exit code to throw;
/// ArgumentParser's own errors pass through untouched.
private func exitCode(reporting error: any Error) -> any Error {
    if let libraryError = libraryError(in: error) {
        // A format this build can't use concerns the command as a whole (a device to migrate, say): say which one.
        printError(libraryError.kind == .unsupportedFormat ? "`\(invokedCommand())` cannot run: \(libraryError)" : "\(libraryError)")
        return ExitCode(ExitStatus.code(for: libraryError.kind))
    }
    if let keychainError = error as? KeychainError {
        printError("\(keychainError)")
        return ExitCode(ExitStatus.code(for: keychainError.code))
    }
    if let cocoa = error as? CocoaError {
        printError("\(cocoa.filePath.map { "\($0): " } ?? "")\(cocoa.localizedDescription)")
        return ExitCode(ExitStatus.failure)
    }
    return error
}

/// The subcommand as typed (`sandboxctl inbox deliver`), from the command line's leading words.
func invokedCommand() -> String {
    var words = ["sandboxctl"]
    var candidates = Sandboxctl.configuration.subcommands
    for argument in CommandLine.arguments.dropFirst() {
        guard let match = candidates.first(where: { $0._commandName == argument }) else { break }
        words.append(argument)
        candidates = match.configuration.subcommands
    }
    return words.joined(separator: " ")
}

/// The library's error behind `error`, thrown directly or inside the `CocoaError` of a file operation.
func libraryError(in error: any Error) -> ProtectedStoreError? {
    (error as? ProtectedStoreError) ?? (error as? CocoaError)?.protectedStoreError
}

func printWarning(_ message: String) {
    FileHandle.standardError.write(Data("sandboxctl: warning: \(message)\n".utf8))
}

func printError(_ message: String) {
    FileHandle.standardError.write(Data("sandboxctl: error: \(message)\n".utf8))
}
