import ArgumentParser
import Foundation
import ProtectedStore

/// The exit codes documented in `sandboxctl --help` (sysexits.h values).
enum ExitStatus {
    static let failure: Int32 = 1
    static let usage: Int32 = 64
    static let integrity: Int32 = 65
    static let denied: Int32 = 77

    static func code(for kind: ProtectedStoreError.Kind) -> Int32 {
        switch kind {
        case .integrity, .unsupportedFormat: integrity
        case .wrongPasscode, .protectedDataUnavailable: denied
        case .invalidArgument: usage
        case .notFound, .alreadyExists, .io: failure
        }
    }
}

/// Runs a command body, printing library errors as one clear line and exiting with the documented code.
func reportingErrors(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let error as ProtectedStoreError {
        FileHandle.standardError.write(Data("sandboxctl: error: \(error)\n".utf8))
        throw ExitCode(ExitStatus.code(for: error.kind))
    }
}
