import Foundation

/// The four data protection classes (Apple's A–D), each with its own class key in the keybag.
public enum ProtectionClass: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// A: readable only while the device is unlocked.
    case complete = 1
    /// B: files can be created while locked; an open file stays readable; a closed one can't be reopened.
    case completeUnlessOpen = 2
    /// C: readable from the first unlock after boot until the next boot.
    case completeUntilFirstUserAuthentication = 3
    /// D: protected by the device secret only; always readable.
    case none = 4

    /// The CLI's name for the class.
    public var name: String {
        switch self {
        case .complete: "complete"
        case .completeUnlessOpen: "complete-unless-open"
        case .completeUntilFirstUserAuthentication: "complete-until-first-user-authentication"
        case .none: "none"
        }
    }

    /// Apple's letter for the class.
    public var letter: String {
        switch self {
        case .complete: "A"
        case .completeUnlessOpen: "B"
        case .completeUntilFirstUserAuthentication: "C"
        case .none: "D"
        }
    }

    public var description: String { name }

    /// Foundation's name for the class, as used in `FileAttributeKey.protectionKey`.
    public var fileProtectionType: FileProtectionType {
        switch self {
        case .complete: .complete
        case .completeUnlessOpen: .completeUnlessOpen
        case .completeUntilFirstUserAuthentication: .completeUntilFirstUserAuthentication
        case .none: .none
        }
    }

    /// The `Data.WritingOptions` member that asks for this class.
    public var writingOption: Data.WritingOptions {
        switch self {
        case .complete: .completeFileProtection
        case .completeUnlessOpen: .completeFileProtectionUnlessOpen
        case .completeUntilFirstUserAuthentication: .completeFileProtectionUntilFirstUserAuthentication
        case .none: .noFileProtection
        }
    }

    /// The class behind a Foundation protection type; nil for a type Foundation may add later.
    public init?(_ type: FileProtectionType) {
        guard let match = Self.allCases.first(where: { $0.fileProtectionType == type }) else { return nil }
        self = match
    }

    /// Parses a CLI name, a letter A–D, or a Foundation raw value (`NSFileProtectionComplete`…), ignoring case.
    public init?(name: String) {
        let lowered = name.lowercased()
        guard let match = Self.allCases.first(where: {
            $0.name == lowered || $0.letter.lowercased() == lowered || $0.fileProtectionType.rawValue.lowercased() == lowered
        }) else { return nil }
        self = match
    }

    /// The names `init(name:)` accepts, for error messages and help.
    public static let acceptedNames = "complete, complete-unless-open, complete-until-first-user-authentication, none (or A-D, or NSFileProtection… names)"
}
