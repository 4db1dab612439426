import Foundation
import ProtectedStore
import ProtectedStoreCore

/// The bodies of the libFuzzer targets in Fuzz/ (docs/SECURITY.md), kept here so the suite's regression test runs
/// every committed seed and crash input through exactly the code the fuzzers run. Each body must only ever throw:
/// a crash, a trap or a hang on any input is a bug.
public enum FuzzHarness {
    /// The keybag parser on the raw bytes; then, so the fuzzer gets past the MAC to the fields behind it, on the same
    /// bytes given a valid MAC under a fixed device secret.
    public static func keybag(_ bytes: [UInt8]) {
        _ = try? Keybag.peekID(bytes, path: "fuzz")
        _ = try? Keybag.parse(bytes, path: "fuzz", deviceSecret: fuzzingSecret)
        guard bytes.count >= Keybag.size - Keybag.macBytes else { return }
        let body = Array(bytes.prefix(Keybag.size - Keybag.macBytes))
        guard let mac = try? Keybag.mac(body, keybagID: Array(body[12..<28]), deviceSecret: fuzzingSecret) else { return }
        if let keybag = try? Keybag.parse(body + mac, path: "fuzz", deviceSecret: fuzzingSecret) {
            _ = try? keybag.serialized(deviceSecret: fuzzingSecret)
        }
    }

    /// The file header parser and, on the length record's sector behind it, the keyless record parser that listings
    /// use; the record a second time with its checksum made valid, so the fuzzer reaches the fields behind it.
    /// Format version 1's header parser and size arithmetic (what `sandboxctl migrate` reads) run on the same bytes.
    public static func fileHeader(_ bytes: [UInt8]) {
        if let old = try? Version1File.parseHeader(bytes, path: "fuzz") {
            _ = Version1Layout.plaintextSize(storedSize: Int64(bytes.count) * 97, blockSize: old.blockSize)
        }
        let layout = (try? FileHeader.parse(bytes, path: "fuzz"))?.layout ?? BlockLayout(blockSize: EncryptedFile.defaultBlockSize, cipher: .xChaCha20Poly1305)
        let start = Int(BlockLayout.recordOffset)
        guard bytes.count > start else { return }
        let sector = Array(bytes[start...].prefix(Int(BlockLayout.sectorSize)))
        _ = LengthRecord.parse(sector[...], layout: layout)
        guard sector.count >= LengthRecord.checksumOffset else { return }
        let fields = Array(sector.prefix(LengthRecord.checksumOffset))
        if let parsed = LengthRecord.parse((fields + Blake2b.hash(fields))[...], layout: layout) {
            _ = layout.storedOffset(ofBlock: parsed.extent)
        }
    }

    /// The daemon's frame decoder as its read loop uses it: frames one after another, each message decoded as a request
    /// (the daemon's side) and as a reply (a client's side).
    public static func frames(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                guard let decoded = try? Frame.decode(UnsafeRawBufferPointer(rebasing: buffer[offset...])) else { return }
                precondition(decoded.consumed > 0 && decoded.consumed <= buffer.count - offset, "the decoder consumed \(decoded.consumed) bytes")
                offset += decoded.consumed
                let message = Data(decoded.frame.message)
                if let request = try? JSONDecoder().decode(DaemonRequest.self, from: message) {
                    _ = request.operation
                    // The keychain requests' fields, as the daemon reads them (PROTOCOL.md §7).
                    _ = request.keychainItem?.item()
                    _ = request.keychainQuery?.query()
                    _ = request.keychainChanges?.changes(secret: nil)
                }
                if let reply = try? JSONDecoder().decode(DaemonReply.self, from: message) { _ = reply.keychainItems?.map { $0.item() } }
                _ = try? KeychainSecrets.unpack(decoded.frame.attachment)
                decoded.frame.attachment?.discard()
            }
        }
    }

    /// The stored-name parsers on text from the input (the first 16 bytes are the directory's IV): a stored name,
    /// a long name's encrypted name, a link target, base64url. Then, so the fuzzer reaches past authentication, the
    /// text as a plaintext name, which must round-trip through the cipher.
    public static func names(_ bytes: [UInt8]) {
        guard bytes.count >= NameCipher.directoryIVBytes else { return }
        let iv = Array(bytes.prefix(NameCipher.directoryIVBytes))
        let text = String(decoding: bytes.dropFirst(NameCipher.directoryIVBytes), as: UTF8.self)
        _ = fuzzingNames.name(fromEncrypted: text, directoryIV: iv)
        _ = fuzzingNames.linkTarget(fromSealed: text, directoryIV: iv)
        _ = NameCipher.isLongEntry(text)
        if let decoded = Base64URL.decode(text) { precondition(Base64URL.encode(decoded) == text, "base64url is not canonical") }
        let isName = !text.isEmpty && text != "." && text != ".." && !text.containsSlash && !text.utf8.contains(0) && text.utf8.count <= 255
        guard isName, let stored = try? fuzzingNames.storedName(for: text, directoryIV: iv) else { return }
        let encrypted: String
        switch stored {
        case .short(let name): encrypted = name
        case .long(let entry, let name):
            precondition(entry.utf8.count <= NameCipher.maximumEntryBytes && NameCipher.isLongEntry(entry), "a long entry is too long")
            encrypted = name
        }
        precondition(fuzzingNames.name(fromEncrypted: encrypted, directoryIV: iv) == text, "a name did not round-trip")
    }

    private static let fuzzingNames = try! NameCipher(nameKey: SecureBytes(count: AEAD.keyBytes) { $0.initializeMemory(as: UInt8.self, repeating: 9) })

    /// A device secret made once per process, in a temporary file removed at once (it lives on in memory).
    private static let fuzzingSecret: DeviceSecret = {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ps-fuzz-secret-\(getpid())-\(UUID().uuidString)").path
        let secret = try! DeviceSecret.create(at: path, keybagID: Array(repeating: 7, count: FileHeader.idBytes))
        unlink(path)
        return secret
    }()
}
