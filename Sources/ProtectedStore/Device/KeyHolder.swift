import Foundation
import ProtectedStoreCore

/// Who holds a device's class keys, chosen once when the device is made: this process (`EmbeddedKeyHolder`, from
/// `Device.create` and `Device.open`) or a key daemon (`DaemonKeyHolder`, from `Device.attach`).
///
/// Every operation that needs a class key, or changes which class keys exist, asks the holder; the device keeps the
/// state and the events its observers see. A third holder (one backed by a system credential store, say) is one more
/// type conforming to this protocol.
protocol KeyHolder: AnyObject, Sendable {
    /// Seals a per-file key under the key of class A, C or D, as `ClassKeyProviding.wrapFileKey` promises.
    func wrapFileKey(_ fileKey: SecureBytes, for protectionClass: ProtectionClass, associatedData: [UInt8], device: Device) throws -> [UInt8]
    /// Opens a sealed per-file key, as `ClassKeyProviding.unwrapFileKey` promises.
    func unwrapFileKey(_ wrapped: WrappedFileKey, device: Device) throws -> SecureBytes?
    /// A new file's key, id and sealed key, as `ClassKeyProviding.newWrappedFileKey` promises.
    func newWrappedFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8], device: Device) throws -> NewWrappedFileKey
    /// The name key of a container, or the device's own with nil (docs/FORMAT.md §7), available in every lock state.
    func nameKey(forContainer bundleIdentifier: String?, device: Device) throws -> SecureBytes
    /// Locks, as `Device.lock(gracePeriod:)` promises; `then` runs once the keys are gone or an unlock cancelled the lock.
    func lock(_ device: Device, gracePeriod: TimeInterval?, then: @escaping @Sendable () -> Void)
    /// Checks the passcode and makes every class available, as `Device.unlock(passcode:)` promises.
    func unlock(_ device: Device, passcode: Passcode) throws
    /// Re-wraps the class keys under a new passcode, as `Device.changePasscode(from:to:)` promises.
    func changePasscode(_ device: Device, from oldPasscode: Passcode, to newPasscode: Passcode) throws
    /// Throws unless this holder may erase the device: only a process that alone holds the keys may.
    func checkErasable(_ device: Device) throws
    /// Destroys the device secret and the keybag, then removes the containers and settings.
    func erase(_ device: Device) throws
    /// Zeroes every class key this process holds. Called under the device's mutex, so it must not take it.
    func discardClassKeys()
    /// Ends the holder for good: no later unlock brings keys back to this device object.
    func shutDown()
    /// The daemon's own view of the device; nil when the keys are in this process.
    func daemonStatus() throws -> DaemonStatus?
}

extension KeyHolder {
    /// Sealed now, one call per file; a daemon's client seals ahead in batches instead.
    func newWrappedFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8], device: Device) throws -> NewWrappedFileKey {
        try device.sealingNewFileKey(for: protectionClass, associatedData: associatedData)
    }
}
