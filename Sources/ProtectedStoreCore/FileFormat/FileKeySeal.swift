/// Sealing per-file keys under class keys (docs/FORMAT.md §3): the one place that knows how, used by every key holder.
package enum FileKeySeal {
    /// Seals `fileKey` under a symmetric class key (A, C, D).
    package static func seal(_ fileKey: SecureBytes, classKey: SecureBytes, associatedData: [UInt8]) throws -> [UInt8] {
        try AEAD.wrap(fileKey, with: classKey, associatedData: associatedData)
    }

    /// A one-pass key agreement against class B's public key: the ephemeral public key to store in the header, and the
    /// key to seal the file key under (with `seal`, once the associated data, which contains the ephemeral key, is known).
    static func sealForClassB(classBPublicKey: [UInt8]) throws -> (ephemeralPublicKey: [UInt8], wrappingKey: SecureBytes) {
        let ephemeral = X25519.generateKeyPair()
        defer { ephemeral.secret.discard() }
        let wrappingKey = try classBWrappingKey(secret: ephemeral.secret, peerPublicKey: classBPublicKey,
                                                ephemeralPublicKey: ephemeral.publicKey, classBPublicKey: classBPublicKey)
        return (ephemeral.publicKey, wrappingKey)
    }

    /// Opens a sealed key with its class key (class B: the class secret key); nil when it fails authentication.
    package static func open(_ wrapped: WrappedFileKey, classKey: SecureBytes, classBPublicKey: [UInt8]) throws -> SecureBytes? {
        guard wrapped.protectionClass == .completeUnlessOpen else {
            return try AEAD.unwrap(wrapped.sealed[...], with: classKey, associatedData: wrapped.associatedData)
        }
        let wrappingKey = try classBWrappingKey(secret: classKey, peerPublicKey: wrapped.ephemeralPublicKey,
                                                ephemeralPublicKey: wrapped.ephemeralPublicKey, classBPublicKey: classBPublicKey)
        defer { wrappingKey.discard() }
        return try AEAD.unwrap(wrapped.sealed[...], with: wrappingKey, associatedData: wrapped.associatedData)
    }

    /// BLAKE2b-256("ProtectedStore v1 class B wrap" ‖ ephemeral public ‖ class B public ‖ X25519 shared secret).
    private static func classBWrappingKey(secret: SecureBytes, peerPublicKey: [UInt8], ephemeralPublicKey: [UInt8],
                                          classBPublicKey: [UInt8]) throws -> SecureBytes {
        guard let shared = try X25519.sharedSecret(secret: secret, publicKey: peerPublicKey) else {
            throw ProtectedStoreError(.integrity, problem: "class B key agreement produced an invalid shared secret (low-order public key)",
                                      remedy: "The file header or keybag was tampered with; restore it from a backup")
        }
        defer { shared.discard() }
        return try Blake2b.derive(key: nil, parts: [Array("ProtectedStore v1 class B wrap".utf8), ephemeralPublicKey, classBPublicKey],
                                  secretParts: [shared])
    }
}
