import Foundation
import ProtectedStoreCore

/// How wrong passcodes are throttled, as on iOS: a few free attempts, then escalating delays, and optionally an erase.
/// Chosen when the device is created and stored beside the keybag.
public struct PasscodePolicy: Codable, Sendable, Equatable {
    /// Wrong passcodes in a row allowed before any delay.
    public var freeAttempts: Int
    /// Seconds to wait after each further wrong passcode; the last delay repeats.
    public var delays: [TimeInterval]
    /// Erase the device after this many wrong passcodes in a row; nil (the default) never erases.
    public var eraseAfterFailedAttempts: Int?

    /// iOS's schedule: after 5 failures 1 minute, then 5, 15, 15 and 60 minutes; no erase.
    public static let `default` = PasscodePolicy(freeAttempts: 4, delays: [60, 300, 900, 900, 3600], eraseAfterFailedAttempts: nil)

    /// A policy with `freeAttempts` wrong passcodes without delay, then `delays` in turn, and an optional erase.
    public init(freeAttempts: Int, delays: [TimeInterval], eraseAfterFailedAttempts: Int? = nil) {
        self.freeAttempts = freeAttempts
        self.delays = delays
        self.eraseAfterFailedAttempts = eraseAfterFailedAttempts
    }

    func validate() throws {
        guard freeAttempts >= 0, !delays.isEmpty, delays.allSatisfy({ $0 >= 0 && $0.isFinite }), (eraseAfterFailedAttempts ?? 1) >= 1 else {
            throw ProtectedStoreError(.invalidArgument, problem: "invalid passcode policy (free attempts \(freeAttempts), delays \(delays), erase after \(eraseAfterFailedAttempts.map(String.init) ?? "never"))",
                                      remedy: "Use free attempts ≥ 0, at least one delay, delays ≥ 0, and an erase threshold ≥ 1")
        }
    }

    /// Seconds to wait after `failures` wrong passcodes in a row.
    func delay(afterFailures failures: Int) -> TimeInterval {
        guard failures > freeAttempts else { return 0 }
        return delays[min(failures - freeAttempts - 1, delays.count - 1)]
    }
}

/// The count of wrong passcodes in a row, persisted beside the keybag so that restarting does not reset the delay.
///
/// The file is not secret and not authenticated: whoever can write the root can reset it, but cannot skip
/// Argon2id or work without the device secret (docs/DESIGN.md, threat model).
struct PasscodeAttempts: Codable, Equatable {
    var failedAttempts = 0
    /// Seconds since 1970 of the last failure.
    var lastFailure: TimeInterval = 0

    static func load(from path: String) throws -> PasscodeAttempts {
        guard try FileSystem.exists(path) else { return PasscodeAttempts() }
        guard let attempts = try FileLocation(path: path).readJSON(PasscodeAttempts.self, what: "passcode attempt counter"), attempts.failedAttempts >= 0 else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the passcode attempt counter is unreadable",
                                      remedy: "Delete the file to reset the counter, then unlock again")
        }
        return attempts
    }

    func save(to path: String) throws {
        let bytes = try JSONEncoder().encode(self)
        try FileSystem.writeAtomically(Array(bytes), to: FileLocation(path: path), replacing: true)
    }

    /// Seconds left before another attempt is allowed (0: allowed now). A clock set back counts as no time passed.
    func remainingDelay(policy: PasscodePolicy, now: Date) -> TimeInterval {
        let delay = policy.delay(afterFailures: failedAttempts)
        let elapsed = max(0, now.timeIntervalSince1970 - lastFailure)
        return max(0, delay - elapsed)
    }
}
