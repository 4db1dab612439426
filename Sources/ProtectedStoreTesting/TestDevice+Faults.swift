import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// An error the disk gives, for `TestDevice.failingWrites` and friends.
public enum InjectedFailure: Sendable {
    /// ENOSPC: the disk is full (`CocoaError.fileWriteOutOfSpace`).
    case noSpace
    /// EDQUOT: the user's quota is used up (`CocoaError.fileWriteOutOfSpace`).
    case quotaExceeded
    /// EIO: the disk failed (`CocoaError.fileReadUnknown` or `.fileWriteUnknown`).
    case ioError

    var errno: Errno {
        switch self {
        case .noSpace: .noSpace
        case .quotaExceeded: .diskQuotaExceeded
        case .ioError: .ioError
        }
    }
}

extension TestDevice {
    /// Runs `body` with the device's disk full: once `bytes` more bytes have been written to the device's files, every
    /// write fails with `failure` (the store's I/O layer answers as the kernel would, so code sees the `CocoaError`
    /// and errno it would on Linux). `pattern` limits it to files whose path inside the container matches the glob
    /// (`"Library/*.sqlite*"`; `*` crosses folders). Cleared when `body` returns or throws.
    public func failingWrites<Result>(isolation: isolated (any Actor)? = #isolation, after bytes: Int = 0, with failure: InjectedFailure = .noSpace,
                                      matching pattern: String? = nil, _ body: () async throws -> Result) async rethrows -> Result {
        try await injecting(.write(allowedBytes: Int64(bytes)), failure, pattern, body)
    }

    /// Runs `body` with reads of the device's encrypted files (those matching `pattern` inside the container, if
    /// given) failing with `failure`, as a failing disk does. Cleared when `body` returns or throws.
    public func failingReads<Result>(isolation: isolated (any Actor)? = #isolation, with failure: InjectedFailure = .ioError,
                                     matching pattern: String? = nil, _ body: () async throws -> Result) async rethrows -> Result {
        try await injecting(.read, failure, pattern, body)
    }

    /// Runs `body` with every fsync of the device's files (those matching `pattern` inside the container, if given)
    /// failing with EIO: the write returned, but the data may not be on the disk (PostgreSQL's "fsyncgate"). Code
    /// must report the failure, not carry on as if the data were safe. Cleared when `body` returns or throws.
    public func failingSynchronize<Result>(isolation: isolated (any Actor)? = #isolation, matching pattern: String? = nil,
                                           _ body: () async throws -> Result) async rethrows -> Result {
        try await injecting(.synchronize, .ioError, pattern, body)
    }

    private func injecting<Result>(isolation: isolated (any Actor)? = #isolation, _ operation: FaultInjection.Operation, _ failure: InjectedFailure,
                                   _ pattern: String?, _ body: () async throws -> Result) async rethrows -> Result {
        // A pattern names files in the container; without one, every file of the device (the keybag too) fails.
        let folder = pattern == nil ? root : container.dataPath
        let directory = container.directory
        let token = FaultInjection.install(FaultInjection.Rule(operation, folder: folder, pattern: pattern,
                                                               plaintextPath: { try? directory.plaintextPath(ofStored: $0) }, errno: failure.errno))
        defer { FaultInjection.remove(token) }
        return try await body()
    }
}
