import Foundation
import ProtectedStoreCore

/// When a keychain item can be read and written: Security.framework's `kSecAttrAccessible…` values, each tied to a
/// protection class as iOS ties them (docs/DESIGN.md, "The keychain").
///
/// `kSecAttrAccessibleAlways` and `…AlwaysThisDeviceOnly`, deprecated since iOS 12, are not offered: an item readable
/// before first unlock would need a class D key, and nothing iOS code should still write depends on it.
public enum KeychainAccessibility: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// `kSecAttrAccessibleWhenUnlocked`, the default: class A, readable and writable only while unlocked.
    case whenUnlocked = 1
    /// `kSecAttrAccessibleAfterFirstUnlock`: class C, readable and writable from the first unlock until a reboot.
    case afterFirstUnlock = 2
    /// `kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly`: class A, and never leaves this device. Every device here has a
    /// passcode, so it behaves as `whenUnlockedThisDeviceOnly`.
    case whenPasscodeSetThisDeviceOnly = 3
    /// `kSecAttrAccessibleWhenUnlockedThisDeviceOnly`: class A, and never leaves this device.
    case whenUnlockedThisDeviceOnly = 4
    /// `kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly`: class C, and never leaves this device.
    case afterFirstUnlockThisDeviceOnly = 5

    /// The class whose key seals the item's own key.
    public var protectionClass: ProtectionClass {
        switch self {
        case .whenUnlocked, .whenPasscodeSetThisDeviceOnly, .whenUnlockedThisDeviceOnly: .complete
        case .afterFirstUnlock, .afterFirstUnlockThisDeviceOnly: .completeUntilFirstUserAuthentication
        }
    }

    /// Bound to this device: a backup of the device must leave the item out.
    public var isThisDeviceOnly: Bool { self != .whenUnlocked && self != .afterFirstUnlock }

    /// The value of `kSecAttrAccessible` Security.framework uses for it ("ak", "ck", …).
    public var securityValue: String {
        switch self {
        case .whenUnlocked: "ak"
        case .afterFirstUnlock: "ck"
        case .whenPasscodeSetThisDeviceOnly: "akpu"
        case .whenUnlockedThisDeviceOnly: "aku"
        case .afterFirstUnlockThisDeviceOnly: "cku"
        }
    }

    /// The spelling `sandboxctl keychain --accessible` takes ("when-unlocked", …).
    public var name: String {
        switch self {
        case .whenUnlocked: "when-unlocked"
        case .afterFirstUnlock: "after-first-unlock"
        case .whenPasscodeSetThisDeviceOnly: "when-passcode-set-this-device-only"
        case .whenUnlockedThisDeviceOnly: "when-unlocked-this-device-only"
        case .afterFirstUnlockThisDeviceOnly: "after-first-unlock-this-device-only"
        }
    }

    public var description: String { name }

    /// The value named `name` or `securityValue`; nil for anything else.
    public init?(named name: String) {
        guard let match = Self.allCases.first(where: { $0.name == name || $0.securityValue == name }) else { return nil }
        self = match
    }
}
