import Foundation
import ProtectedStoreCore

/// Security.framework's result type: 0 for success, a negative `errSec…` code for a failure.
public typealias OSStatus = Int32

/// A keychain call that failed: the `OSStatus` Security.framework would have returned, and what went wrong, where,
/// and what to do, as every error of this package says.
public struct KeychainError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The failures a keychain call reports, with Security.framework's codes as raw values.
    public enum Code: OSStatus, Sendable, CaseIterable {
        /// `errSecParam`: a query or attribute the keychain cannot accept (an unknown key, a wrong type, a value too large).
        case param = -50
        /// `errSecDiskFull`: the disk had no room for the change; nothing was changed.
        case diskFull = -34
        /// `errSecIO`: the keychain's storage failed a read or write; nothing was changed.
        case io = -36
        /// `errSecNotAvailable`: no keychain can be opened here (the device's folder is missing, say).
        case notAvailable = -25291
        /// `errSecDuplicateItem`: an item with the same primary key (class, access group, service and account, …) exists.
        case duplicateItem = -25299
        /// `errSecItemNotFound`: nothing matches the query.
        case itemNotFound = -25300
        /// `errSecInteractionNotAllowed`: the item's class key is not available now (locked, or before first unlock).
        case interactionNotAllowed = -25308
        /// `errSecDecode`: the keychain's store failed authentication or does not parse (tampering or corruption).
        case decode = -26275
        /// `errSecMissingEntitlement`: the access group is not one this caller is entitled to.
        case missingEntitlement = -34018

        /// Security.framework's constant name, `errSecInteractionNotAllowed` and so on.
        public var name: String {
            switch self {
            case .param: "errSecParam"
            case .diskFull: "errSecDiskFull"
            case .io: "errSecIO"
            case .notAvailable: "errSecNotAvailable"
            case .duplicateItem: "errSecDuplicateItem"
            case .itemNotFound: "errSecItemNotFound"
            case .interactionNotAllowed: "errSecInteractionNotAllowed"
            case .decode: "errSecDecode"
            case .missingEntitlement: "errSecMissingEntitlement"
            }
        }
    }

    /// Which failure it is; its raw value is the `OSStatus`.
    public let code: Code
    /// What went wrong, in one sentence without a trailing period.
    public let problem: String
    /// What the caller can do about it.
    public let remedy: String
    /// The keychain's file concerned, when a file is.
    public let path: String?

    /// An error of `code`: `problem` says what went wrong, `remedy` what to do.
    public init(_ code: Code, problem: String, remedy: String, path: String? = nil) {
        self.code = code
        self.problem = problem
        self.remedy = remedy
        self.path = path
    }

    /// The status Security.framework's functions return for it.
    public var status: OSStatus { code.rawValue }

    /// Names the status as Security.framework does, `errSecInteractionNotAllowed (-25308)`.
    public var statusName: String { "\(code.name) (\(code.rawValue))" }

    public var description: String {
        let text = "\(statusName): \(path.map { "\($0): " } ?? "")\(problem)"
        return remedy.isEmpty ? text : "\(text). \(remedy)"
    }

    public var errorDescription: String? { description }

    /// The keychain's reading of a failure below it: a denial by the lock is `errSecInteractionNotAllowed`, damage is
    /// `errSecDecode`, a full disk `errSecDiskFull`, other I/O `errSecIO`.
    package init(_ error: any Error, path: String?) {
        if let keychainError = error as? KeychainError {
            self = keychainError
            return
        }
        guard let underlying = error as? ProtectedStoreError ?? (error as? CocoaError)?.protectedStoreError else {
            self.init(.io, problem: "the keychain's storage failed: \(error)", remedy: "Check the device's folder and the free space", path: path)
            return
        }
        let code: Code = switch underlying.kind {
        case .protectedDataUnavailable: .interactionNotAllowed
        case .integrity, .unsupportedFormat: .decode
        case .io where underlying.errno == .noSpace || underlying.errno == .diskQuotaExceeded: .diskFull
        case .invalidArgument: .param
        case .notFound: .notAvailable
        default: .io
        }
        self.init(code, problem: underlying.problem, remedy: underlying.remedy, path: underlying.path ?? path)
    }
}
