import Dispatch
import Foundation
import ProtectedStoreCore

/// The key holder of a device attached to a key daemon (`Device.attach`): the class keys stay in the daemon, which
/// checks passcodes, locks and unlocks every attached program, and wraps and unwraps per-file keys over the socket.
/// This process's state follows the daemon's events (Device+Daemon.swift), not the replies here.
final class DaemonKeyHolder: KeyHolder {
    let link: DaemonLink
    /// New files' keys, sealed by the daemon in batches: one round trip per batch instead of one per create.
    let prewrapped: PrewrappedFileKeys

    init(link: DaemonLink, hello: DaemonReply) {
        self.link = link
        self.prewrapped = PrewrappedFileKeys(link: link, daemonSealsBatches: Self.sealsBatches(hello))
    }

    /// Whether the daemon that said `hello` serves `wrap-batch`.
    static func sealsBatches(_ hello: DaemonReply) -> Bool {
        hello.operations?.contains(DaemonRequest.Operation.wrapBatch.rawValue) == true
    }

    deinit { link.close() }

    func wrapFileKey(_ fileKey: SecureBytes, for protectionClass: ProtectionClass, associatedData: [UInt8], device: Device) throws -> [UInt8] {
        try link.wrapFileKey(fileKey, for: protectionClass, associatedData: associatedData)
    }

    func newWrappedFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8], device: Device) throws -> NewWrappedFileKey {
        try prewrapped.take(for: protectionClass, associatedData: associatedData, device: device)
    }

    func nameKey(forContainer bundleIdentifier: String?, device: Device) throws -> SecureBytes {
        try link.nameKey(forContainer: bundleIdentifier)
    }

    func unwrapFileKey(_ wrapped: WrappedFileKey, device: Device) throws -> SecureBytes? {
        try link.unwrapFileKey(wrapped)
    }

    /// Asks the daemon, which locks every program using the device (`gracePeriod` nil: the daemon's own); if the
    /// daemon can't be reached, this process drops its class A file keys and counts as locked.
    func lock(_ device: Device, gracePeriod: TimeInterval?, then: @escaping @Sendable () -> Void) {
        var request = DaemonRequest(id: 0, op: .lock)
        request.grace = gracePeriod.map { min($0, 3600) }
        // The call blocks until the keys are gone: on a thread of its own, not one the caller may need.
        DispatchQueue.global().async { [link, request] in
            do {
                _ = try link.call(request)
            } catch let error as ProtectedStoreError where error.kind == .daemonUnavailable {
                // No daemon: nothing can unwrap keys any more; what this process still holds goes now.
                device.daemonLost()
            } catch {
                // Refused (a grace out of range): nothing changed.
            }
            then()
        }
    }

    /// Returns once this process has been told (*did become available*), so a class A file opened next works;
    /// waits at most the grace period for an earlier event this process is still handling.
    func unlock(_ device: Device, passcode: Passcode) throws {
        _ = try link.call(DaemonRequest(id: 0, op: .unlock), attachment: passcode.bytes)
        // The reply comes ahead of the *did* it caused; the event sets the state (a link refused its subscription,
        // `busy`, hears none, and its state stays what the daemon said at hello).
        if link.hearsEvents { device.waitUntilUnlocked(timeout: max(device.gracePeriod, 1)) }
    }

    func changePasscode(_ device: Device, from oldPasscode: Passcode, to newPasscode: Passcode) throws {
        try link.changePasscode(from: oldPasscode, to: newPasscode)
    }

    func checkErasable(_ device: Device) throws {
        throw ProtectedStoreError(.invalidArgument, path: device.root, problem: "a key daemon holds this device's keys, so it can't be erased from here",
                                  remedy: "Stop the daemon (Ctrl-C or SIGTERM), then erase")
    }

    func erase(_ device: Device) throws { try checkErasable(device) }

    /// The class keys are in the daemon; this process holds only the keys it had sealed ahead for new files.
    func discardClassKeys() { prewrapped.discardAll() }

    func shutDown() { link.close() }

    func daemonStatus() throws -> DaemonStatus? {
        let reply = try link.call(DaemonRequest(id: 0, op: .status)).reply
        return DaemonStatus(pid: reply.pid ?? 0, socketPath: link.socketPath, state: reply.state.flatMap(Device.State.init(rawValue:)) ?? .locked,
                            subscribers: reply.subscribers ?? 0, gracePeriod: reply.gracePeriod ?? Device.defaultGracePeriod,
                            failedPasscodeAttempts: reply.failedPasscodeAttempts ?? 0, coreDumpsDisabled: reply.coreDumpsDisabled ?? false,
                            lockedMemoryKiB: reply.lockedMemoryKiB, lockTriggers: reply.lockTriggers ?? [],
                            lockTriggersConnected: reply.lockTriggersConnected ?? false)
    }
}
