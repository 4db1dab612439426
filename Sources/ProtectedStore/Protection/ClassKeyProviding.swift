/// What the file format needs from a key holder: class keys while they are available, and class B's public key always.
///
/// The keybag implements it in-process; later a daemon client can implement it across a socket.
public protocol ClassKeyProviding: Sendable {
    /// The 16-byte identity of the keybag whose class keys wrap this device's files.
    var keybagID: [UInt8] { get }
    /// Class B's public key, available in every state so files can be created while locked.
    var classBPublicKey: [UInt8] { get }
    /// The symmetric key of class A, C or D, or class B's secret X25519 key;
    /// throws `ProtectedStoreError` of kind `.protectedDataUnavailable` when the state does not allow it.
    func classKey(for protectionClass: ProtectionClass) throws -> SecureBytes
}
