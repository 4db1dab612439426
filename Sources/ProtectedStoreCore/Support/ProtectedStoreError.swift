import Foundation
import SystemPackage

/// The one error type the library throws: what went wrong, where, and what to do about it.
public struct ProtectedStoreError: Error, Sendable, CustomStringConvertible, LocalizedError {
    /// Broad categories, so callers (and the CLI's exit codes) can react without parsing text.
    public enum Kind: Sendable, Equatable {
        /// Stored bytes failed authentication or do not parse: tampering or corruption.
        case integrity
        /// A format version or parameter this build does not understand.
        case unsupportedFormat
        /// The passcode did not unwrap the keybag.
        case wrongPasscode
        /// Too many wrong passcodes: no attempt is allowed until a delay has passed.
        case throttled
        /// The key needed is not available in the current protection state.
        case protectedDataUnavailable
        /// Something that must exist does not.
        case notFound
        /// Something that must not exist already does.
        case alreadyExists
        /// The caller passed a value the API cannot accept.
        case invalidArgument
        /// The operating system refused or failed an I/O call.
        case io
        /// No key daemon serves the device, or it stopped or refused this process.
        case daemonUnavailable
        /// The operation is not allowed on that item whatever the lock state (Documents/Inbox is read-and-delete only).
        case permissionDenied
    }

    /// What kind of failure it is, which decides its `CocoaError` code and the command's exit status.
    public let kind: Kind
    /// The file or directory concerned, when there is one.
    public let path: String?
    /// What went wrong, in one sentence without a trailing period.
    public let problem: String
    /// What the user can do about it.
    public let remedy: String
    /// The errno behind an I/O failure, when there was one.
    public let errno: Errno?

    /// An error of `kind` about `path`: `problem` says what went wrong, `remedy` what to do about it.
    public init(_ kind: Kind, path: String? = nil, problem: String, remedy: String, errno: Errno? = nil) {
        self.kind = kind
        self.path = path
        self.problem = problem
        self.remedy = remedy
        self.errno = errno
    }

    public var description: String {
        var text = path.map { "\($0): \(problem)" } ?? problem
        if let errno { text += " (\(errno))" }
        return remedy.isEmpty ? text : "\(text). \(remedy)"
    }

    public var errorDescription: String? { description }

    /// This error, naming `path` if it named no path yet (key holders don't know which file asked).
    func naming(_ path: String) -> ProtectedStoreError {
        self.path == nil ? ProtectedStoreError(kind, path: path, problem: problem, remedy: remedy, errno: errno) : self
    }

    /// Wraps a failed system call on `path` with a remedy suited to the errno.
    package static func io(_ errno: Errno, path: String, doing action: String) -> ProtectedStoreError {
        let remedy: String
        let kind: Kind
        switch errno {
        case .noSuchFileOrDirectory:
            kind = .notFound
            remedy = "Check the path"
        case .permissionDenied, .notPermitted:
            kind = .io
            remedy = "Check the permissions of the file and its directories"
        case .noSpace, .diskQuotaExceeded:
            kind = .io
            remedy = errno == .noSpace ? "Free some disk space and try again" : "Free some space within your disk quota and try again"
        case .fileExists:
            kind = .alreadyExists
            remedy = "Choose another name or remove the existing item first"
        case .isDirectory:
            kind = .invalidArgument
            remedy = "It is a directory; give the path of a file"
        case .notDirectory:
            kind = .invalidArgument
            remedy = "A component of the path is a file, not a directory; check the path"
        case .tooManySymbolicLinkLevels:
            kind = .invalidArgument
            remedy = "It is a symbolic link, which is not followed here; give the path of the item itself"
        case .fileNameTooLong:
            kind = .invalidArgument
            remedy = "Use a shorter name"
        case .directoryNotEmpty:
            kind = .alreadyExists
            remedy = "Remove the directory's contents first"
        default:
            kind = .io
            remedy = "Check the file system"
        }
        return ProtectedStoreError(kind, path: path, problem: "cannot \(action)", remedy: remedy, errno: errno)
    }
}
