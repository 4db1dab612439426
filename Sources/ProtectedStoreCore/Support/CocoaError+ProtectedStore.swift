import Foundation

extension ProtectedStoreError {
    /// The `CocoaError` userInfo key under which the original error travels.
    public static let userInfoKey = "ProtectedStoreError"

    /// The errno POSIX code this error corresponds to.
    var posixCode: POSIXErrorCode {
        if let errno, let code = POSIXErrorCode(rawValue: errno.rawValue) { return code }
        switch kind {
        case .protectedDataUnavailable, .wrongPasscode, .throttled: return .EPERM
        case .notFound: return .ENOENT
        case .alreadyExists: return .EEXIST
        case .invalidArgument: return .EINVAL
        case .integrity, .unsupportedFormat: return .EBADMSG
        case .io: return .EIO
        case .daemonUnavailable: return .ECONNREFUSED
        case .permissionDenied: return .EACCES
        }
    }

    /// The error as Foundation would report it for a read or a write, so iOS-style code handles it unchanged:
    /// data-protection denials are `.fileReadNoPermission` / `.fileWriteNoPermission` over `POSIXError(.EPERM)`.
    /// Code built on the library uses it to report its own denials the same way.
    public func cocoaError(writing: Bool) -> CocoaError {
        let code: CocoaError.Code
        switch kind {
        case .protectedDataUnavailable, .wrongPasscode, .throttled, .daemonUnavailable:
            code = writing ? .fileWriteNoPermission : .fileReadNoPermission
        case .notFound:
            code = writing ? .fileNoSuchFile : .fileReadNoSuchFile
        case .permissionDenied:
            code = writing ? .fileWriteNoPermission : .fileReadNoPermission
        case .alreadyExists:
            code = .fileWriteFileExists
        case .invalidArgument:
            code = writing ? .fileWriteInvalidFileName : .fileReadInvalidFileName
        case .integrity, .unsupportedFormat:
            code = .fileReadCorruptFile
        case .io:
            switch posixCode {
            case .ENOSPC, .EDQUOT: code = .fileWriteOutOfSpace
            case .EROFS: code = .fileWriteVolumeReadOnly
            case .EACCES, .EPERM: code = writing ? .fileWriteNoPermission : .fileReadNoPermission
            default: code = writing ? .fileWriteUnknown : .fileReadUnknown
            }
        }
        var userInfo: [String: Any] = [
            NSUnderlyingErrorKey: POSIXError(posixCode),
            NSLocalizedDescriptionKey: description,
            Self.userInfoKey: self,
        ]
        if let path { userInfo[NSFilePathErrorKey] = path }
        return CocoaError(code, userInfo: userInfo)
    }
}

/// Foundation's errors, as ProtectedStore throws them to code written for Apple's platforms.
extension CocoaError {
    /// The library's own error behind this one, with its problem and remedy, when ProtectedStore threw it.
    public var protectedStoreError: ProtectedStoreError? { userInfo[ProtectedStoreError.userInfoKey] as? ProtectedStoreError }

    /// Whether the operation was denied by data protection (the device is locked or before first unlock).
    public var isProtectedDataUnavailable: Bool { protectedStoreError?.kind == .protectedDataUnavailable }
}

/// Runs a file operation, turning library errors into the `CocoaError` Foundation would throw.
package func foundationErrors<R>(writing: Bool, _ body: () throws -> R) throws -> R {
    do {
        return try body()
    } catch let error as ProtectedStoreError {
        throw error.cocoaError(writing: writing)
    }
}
