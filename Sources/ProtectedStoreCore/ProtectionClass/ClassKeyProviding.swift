/// What the file format needs from a key holder: per-file keys wrapped and unwrapped under class keys while those
/// are available, and class B's public key always. Class keys themselves never leave the holder.
///
/// A device implements it in-process, or across a socket when attached to a key daemon (which then does the unwrapping).
public protocol ClassKeyProviding: Sendable {
    /// The 16-byte identity of the keybag whose class keys wrap this device's files.
    var keybagID: [UInt8] { get }
    /// Class B's public key, available in every state so files can be created while locked.
    var classBPublicKey: [UInt8] { get }
    /// Seals a new per-file key under the key of class A, C or D (class B keys are sealed with `classBPublicKey`,
    /// without the holder); throws `.protectedDataUnavailable` when the state does not allow it.
    func wrapFileKey(_ fileKey: SecureBytes, for protectionClass: ProtectionClass, associatedData: [UInt8]) throws -> [UInt8]
    /// Opens a sealed per-file key; nil when it fails authentication, `.protectedDataUnavailable` when the class is not available.
    func unwrapFileKey(_ wrapped: WrappedFileKey) throws -> SecureBytes?
    /// A new random per-file key and file id, the key sealed under class A, C or D with the header prefix
    /// `associatedData(fileID)`. A holder may have sealed it ahead of time (a key daemon's client does, in batches);
    /// the default draws both and calls `wrapFileKey`.
    func newWrappedFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8]) throws -> NewWrappedFileKey
}

extension ClassKeyProviding {
    public func newWrappedFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8]) throws -> NewWrappedFileKey {
        try sealingNewFileKey(for: protectionClass, associatedData: associatedData)
    }

    /// Draws a new per-file key and file id and seals the key now, with `wrapFileKey`.
    public func sealingNewFileKey(for protectionClass: ProtectionClass, associatedData: ([UInt8]) -> [UInt8]) throws -> NewWrappedFileKey {
        let fileKey = SecureBytes.random(count: FileHeader.fileKeyBytes)
        let fileID = Random.bytes(FileHeader.idBytes)
        do {
            return NewWrappedFileKey(fileKey: fileKey, fileID: fileID, sealed: try wrapFileKey(fileKey, for: protectionClass, associatedData: associatedData(fileID)))
        } catch {
            fileKey.discard()
            throw error
        }
    }
}

/// A new file's key, its id, and the key as sealed in its header.
public struct NewWrappedFileKey: Sendable {
    /// The per-file key, in guarded memory.
    public var fileKey: SecureBytes
    /// The file's random 16-byte id.
    public var fileID: [UInt8]
    /// nonce ‖ encrypted key ‖ tag.
    public var sealed: [UInt8]

    /// A new file's key with its id and sealed form, as a key holder returns it.
    public init(fileKey: SecureBytes, fileID: [UInt8], sealed: [UInt8]) {
        self.fileKey = fileKey
        self.fileID = fileID
        self.sealed = sealed
    }
}

/// A per-file key as sealed in a file header, with everything needed to open it.
public struct WrappedFileKey: Sendable, Equatable {
    /// The class whose key sealed it.
    public var protectionClass: ProtectionClass
    /// The header bytes the seal authenticates (docs/FORMAT.md §3).
    public var associatedData: [UInt8]
    /// Class B only: the file's ephemeral X25519 public key.
    public var ephemeralPublicKey: [UInt8]
    /// nonce ‖ encrypted key ‖ tag.
    public var sealed: [UInt8]

    /// A sealed key read from a file header.
    public init(protectionClass: ProtectionClass, associatedData: [UInt8], ephemeralPublicKey: [UInt8], sealed: [UInt8]) {
        self.protectionClass = protectionClass
        self.associatedData = associatedData
        self.ephemeralPublicKey = ephemeralPublicKey
        self.sealed = sealed
    }
}
