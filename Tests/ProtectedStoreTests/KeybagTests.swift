import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

@Suite("Keybag, device secret and passcodes", .ownThread)
struct KeybagTests {
    @Test("a wrong passcode is its own error and loads no key")
    func wrongPasscode() throws {
        let test = try TestDevice()
        let device = try test.reopen()
        #expect(device.state == .beforeFirstUnlock)
        expectError(.wrongPasscode) { try device.unlock(passcode: try Passcode("1235-test")) }
        #expect(device.state == .beforeFirstUnlock)
        expectError(.protectedDataUnavailable) { try device.classKey(for: .complete) }
        try device.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(device.isProtectedDataAvailable)
    }

    @Test("classes available per state: D before first unlock, C stays after a lock, A and B go")
    func classAvailability() async throws {
        let test = try TestDevice()
        let device = try test.reopen()
        #expect(throws: Never.self) { try device.classKey(for: .none) }
        for protectionClass in [ProtectionClass.complete, .completeUnlessOpen, .completeUntilFirstUserAuthentication] {
            expectError(.protectedDataUnavailable) { try device.classKey(for: protectionClass) }
        }
        try device.unlock(passcode: try Passcode(TestDevice.passcode))
        await device.lock(gracePeriod: 0)
        expectError(.protectedDataUnavailable) { try device.classKey(for: .complete) }
        expectError(.protectedDataUnavailable) { try device.classKey(for: .completeUnlessOpen) }
        #expect(throws: Never.self) { try device.classKey(for: .completeUntilFirstUserAuthentication) }
        #expect(throws: Never.self) { try device.classKey(for: .none) }
    }

    @Test("changing the passcode: old rejected, new accepted, files untouched and readable")
    func changePasscode() throws {
        let test = try TestDevice()
        let path = test.path("kept")
        try test.device.writeFile(pattern(5000), to: path, protection: .complete)
        let fileBefore = readRaw(path)
        let keybagBefore = readRaw(test.device.keybagPath)
        try test.device.changePasscode(from: try Passcode(TestDevice.passcode), to: try Passcode("new passcode"))
        #expect(readRaw(path) == fileBefore)
        #expect(readRaw(test.device.keybagPath) != keybagBefore)
        let device = try test.reopen()
        expectError(.wrongPasscode) { try device.unlock(passcode: try Passcode(TestDevice.passcode)) }
        try device.unlock(passcode: try Passcode("new passcode"))
        #expect(try device.readFile(at: path) == pattern(5000))
        expectError(.wrongPasscode) {
            try test.device.changePasscode(from: try Passcode("not it"), to: try Passcode("other"))
        }
        #expect(readRaw(test.device.keybagPath).count == Keybag.size)
        #expect(try FileManager.default.contentsOfDirectory(atPath: test.root).sorted() == ["containers", "keybag", "keybag.lock", "passcode-attempts.json", "passcode-attempts.json.lock", "passcode-policy.json"], "no temporary file left behind")
    }

    @Test("class B: a file created with the public key alone reads back only after unlocking")
    func classBWithPublicKeyOnly() async throws {
        let test = try TestDevice()
        let path = test.path("inbox-item")
        let device = try test.reopen()
        #expect(device.state == .beforeFirstUnlock)
        let file = try EncryptedFile.create(at: path, protectionClass: .completeUnlessOpen, keys: device)
        try file.write(pattern(9000), at: 0)
        // The writer keeps its per-file key while the handle is open, as on iOS.
        #expect(try file.read(at: 0, count: 10) == Array(pattern(9000)[0..<10]))
        try file.close()
        expectError(.protectedDataUnavailable) { try device.readFile(at: path) }
        try device.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(try device.readFile(at: path) == pattern(9000))
        await device.lock(gracePeriod: 0)
        expectError(.protectedDataUnavailable) { try device.readFile(at: path) }
        try device.writeFile([7, 7, 7], to: test.path("while-locked"), protection: .completeUnlessOpen)
        expectError(.protectedDataUnavailable) { try device.writeFile([1], to: test.path("a"), protection: .complete) }
    }

    @Test("swapped or replayed keybag entries fail even with a valid MAC")
    func swappedEntriesDetected() throws {
        let test = try TestDevice()
        let secret = try DeviceSecret.load(at: test.secretPath)
        let keybagPath = test.device.keybagPath
        let original = try Keybag.parse(readRaw(keybagPath), path: keybagPath, deviceSecret: secret)
        // Re-MACed as a device-secret holder could, and named in the passcode binding (beside the secret) as they could too.
        let bindingPath = PasscodeBinding.path(forSecretAt: test.secretPath)
        let value = try #require(try PasscodeBinding.load(at: bindingPath, deviceSecret: secret)).entries[0].value
        func remac(_ keybag: Keybag) throws {
            let bytes = try keybag.serialized(deviceSecret: secret)
            writeRaw(bytes, keybagPath)
            try PasscodeBinding(keybagID: keybag.keybagID, entries: [.init(value: value, keybag: bytes)]).store(at: bindingPath, deviceSecret: secret)
        }

        var entries = original.entries
        (entries[0].wrappedKey, entries[2].wrappedKey) = (entries[2].wrappedKey, entries[0].wrappedKey)
        try remac(Keybag(keybagID: original.keybagID, isBound: original.isBound, kdf: original.kdf, classBPublicKey: original.classBPublicKey, entries: entries))
        expectError(.wrongPasscode) { try test.reopen().unlock(passcode: try Passcode(TestDevice.passcode)) }

        entries = original.entries
        (entries[1].wrappedKey, entries[2].wrappedKey) = (entries[2].wrappedKey, entries[1].wrappedKey)
        try remac(Keybag(keybagID: original.keybagID, isBound: original.isBound, kdf: original.kdf, classBPublicKey: original.classBPublicKey, entries: entries))
        expectError(.integrity) { try test.reopen().unlock(passcode: try Passcode(TestDevice.passcode)) }

        // An entry from another keybag, even under the same device secret and passcode, belongs to another keybag id.
        let foreign = try Keybag.create(keybagID: Random.bytes(16), passcode: try Passcode(TestDevice.passcode), preset: .fast, binding: value, deviceSecret: secret).0
        entries = original.entries
        entries[3] = foreign.entries[3]
        try remac(Keybag(keybagID: original.keybagID, isBound: original.isBound, kdf: original.kdf, classBPublicKey: original.classBPublicKey, entries: entries))
        expectError(.integrity) { try test.reopen() }

        // And without re-MACing, any swap is caught by the MAC before anything is unwrapped.
        var raw = try original.serialized(deviceSecret: secret)
        let entryStart = 96
        let a = Array(raw[entryStart + 2..<entryStart + 74]), c = Array(raw[entryStart + 2 * 74 + 2..<entryStart + 3 * 74])
        raw.replaceSubrange(entryStart + 2..<entryStart + 74, with: c)
        raw.replaceSubrange(entryStart + 2 * 74 + 2..<entryStart + 3 * 74, with: a)
        writeRaw(raw, keybagPath)
        expectError(.integrity) { try test.reopen() }
    }

    @Test("a corrupt, truncated or unknown-version keybag gets one clear error each")
    func badKeybags() throws {
        let test = try TestDevice()
        let keybagPath = test.device.keybagPath
        let original = readRaw(keybagPath)
        for position in stride(from: 0, to: original.count, by: 7) where !(8..<10).contains(position) {
            var corrupt = original
            corrupt[position] ^= 0x40
            writeRaw(corrupt, keybagPath)
            expectError(.integrity) { try test.reopen() }
        }
        writeRaw(Array(original.dropLast(5)), keybagPath)
        #expect(expectError(.integrity) { try test.reopen() }?.problem.contains("truncated") == true)
        writeRaw([], keybagPath)
        expectError(.integrity) { try test.reopen() }
        var future = original
        future[8] = 2
        writeRaw(future, keybagPath)
        #expect(expectError(.unsupportedFormat) { try test.reopen() }?.problem.contains("version 2") == true)
        writeRaw(original, keybagPath)
        #expect(throws: Never.self) { try test.reopen() }
    }

    @Test("the device secret is required: missing, foreign or exposed secrets are refused")
    func deviceSecretRequired() throws {
        let test = try TestDevice()
        let other = try TestDevice()
        expectError(.integrity) { try Device.open(root: test.root, deviceSecretPath: other.secretPath) }
        // A copy of the root plus the passcode is not enough with any other secret of the right shape.
        var forged = readRaw(other.secretPath)
        forged.replaceSubrange(16..<32, with: readRaw(test.secretPath)[16..<32])
        let forgedPath = test.path("forged.secret")
        writeRaw(forged, forgedPath)
        chmod(forgedPath, 0o600)
        expectError(.integrity) { try Device.open(root: test.root, deviceSecretPath: forgedPath) }
        chmod(test.secretPath, 0o644)
        #expect(expectError(.invalidArgument) { try test.reopen() }?.remedy.contains("chmod 600") == true)
        chmod(test.secretPath, 0o600)
        let moved = test.path("moved.secret")
        try FileManager.default.moveItem(atPath: test.secretPath, toPath: moved)
        // The passcode binding goes with the secret; without it the keybag does not open (AtRestTamperTests).
        try FileManager.default.moveItem(atPath: PasscodeBinding.path(forSecretAt: test.secretPath), toPath: PasscodeBinding.path(forSecretAt: moved))
        #expect(expectError(.notFound) { try test.reopen() }?.problem.contains("device secret is missing") == true)
        #expect(throws: Never.self) { try Device.open(root: test.root, deviceSecretPath: moved) }
        for (offset, value, kind) in [(8, UInt8(2), ProtectedStoreError.Kind.unsupportedFormat), (12, 1, .integrity), (0, UInt8(ascii: "X"), .integrity)] {
            var damaged = readRaw(moved)
            damaged[offset] = value
            let damagedPath = test.path("damaged-\(offset).secret")
            writeRaw(damaged, damagedPath)
            chmod(damagedPath, 0o600)
            expectError(kind) { try Device.open(root: test.root, deviceSecretPath: damagedPath) }
        }
    }

    @Test("init over an existing device or into a non-empty directory changes nothing")
    func initRefusesExisting() throws {
        let test = try TestDevice()
        let keybag = readRaw(test.device.keybagPath)
        expectError(.alreadyExists) {
            try Device.create(root: test.root, deviceSecretPath: test.path("second.secret"), passcode: try Passcode("x"), kdf: .fast)
        }
        #expect(readRaw(test.device.keybagPath) == keybag)
        #expect(!FileManager.default.fileExists(atPath: test.path("second.secret")))
        let busy = test.path("busy")
        try FileManager.default.createDirectory(atPath: busy, withIntermediateDirectories: true)
        writeRaw([1], (busy as NSString).appendingPathComponent("something"))
        expectError(.alreadyExists) { try Device.create(root: busy, deviceSecretPath: test.path("third.secret"), passcode: try Passcode("x"), kdf: .fast) }
        expectError(.alreadyExists) {
            try Device.create(root: test.path("fresh"), deviceSecretPath: test.secretPath, passcode: try Passcode("x"), kdf: .fast)
        }
        #expect(!FileManager.default.fileExists(atPath: test.path("fresh/keybag")))
        expectError(.invalidArgument) {
            try Device.create(root: test.path("inner"), deviceSecretPath: test.path("inner/secret"), passcode: try Passcode("x"), kdf: .fast)
        }
        expectError(.notFound) { try Device.open(root: test.path("nowhere")) }
        let plainFile = test.path("a-file")
        writeRaw([1, 2, 3], plainFile)
        expectError(.invalidArgument) { try Device.open(root: plainFile) }
        expectError(.invalidArgument) { try Device.create(root: plainFile, deviceSecretPath: test.path("fourth.secret"), passcode: try Passcode("x"), kdf: .fast) }
        #expect(readRaw(plainFile) == [1, 2, 3])
        #expect(!FileManager.default.fileExists(atPath: test.path("fourth.secret")))
        // A root that exists but cannot be listed is an I/O error, not "empty".
        let keybagAsDirectory = test.path("odd-root")
        try FileManager.default.createDirectory(atPath: keybagAsDirectory + "/keybag", withIntermediateDirectories: true)
        expectError(.invalidArgument) { try Device.open(root: keybagAsDirectory, deviceSecretPath: test.secretPath) }
        expectError(.notFound) { try Device.open(root: busy) }
    }

    @Test("erase destroys the keybag and the device secret; a saved copy of the keybag opens nothing")
    func erase() throws {
        let test = try TestDevice()
        let path = test.path("doomed")
        try test.device.writeFile(pattern(100), to: path, protection: .none)
        let savedKeybag = readRaw(test.device.keybagPath)
        try test.device.erase()
        #expect(!FileManager.default.fileExists(atPath: test.device.keybagPath))
        #expect(!FileManager.default.fileExists(atPath: test.secretPath))
        expectError(.protectedDataUnavailable) { try test.device.readFile(at: path) }
        writeRaw(savedKeybag, test.device.keybagPath)
        expectError(.notFound) { try test.reopen() }
    }

    @Test("KDF presets are Argon2id with increasing cost; fast is the minimum")
    func presets() {
        #expect(KDFPreset.fast.opsLimit < KDFPreset.interactive.opsLimit)
        #expect(KDFPreset.interactive.memLimit < KDFPreset.moderate.memLimit)
        #expect(KDFPreset.moderate.memLimit < KDFPreset.sensitive.memLimit)
        #expect(KDFPreset.allCases.allSatisfy { PasscodeKDF(preset: $0).isSupported })
    }

    @Test("class names: CLI names, letters and Foundation raw values all parse; others don't")
    func classNames() {
        for protectionClass in ProtectionClass.allCases {
            #expect(ProtectionClass(name: protectionClass.name) == protectionClass)
            #expect(ProtectionClass(name: protectionClass.letter.lowercased()) == protectionClass)
            #expect(ProtectionClass(name: protectionClass.fileProtectionType.rawValue) == protectionClass)
            #expect(ProtectionClass(protectionClass.fileProtectionType) == protectionClass)
        }
        #expect(ProtectionClass(name: "NSFileProtectionComplete") == .complete)
        #expect(ProtectionClass(name: "E") == nil)
        #expect(ProtectionClass(name: "") == nil)
    }

    @Test("secret bytes cannot be printed and compare in constant time")
    func secretsStayHidden() throws {
        let key = SecureBytes.random(count: 32)
        let hex = try key.withUnsafeBytes { Array($0).hex }
        for text in [String(describing: key), String(reflecting: key), "\(key)", String(describing: Mirror(reflecting: key).children.map { $0.value })] {
            #expect(!text.contains(hex.prefix(8)))
        }
        let copy = try key.withUnsafeBytes { bytes in SecureBytes(count: 32) { $0.copyMemory(from: bytes) } }
        #expect(try key.constantTimeEquals(copy))
        #expect(try !key.constantTimeEquals(SecureBytes.random(count: 32)))
        key.discard()
        #expect(key.isDiscarded)
        #expect(throws: SecureBytes.Discarded.self) { try key.withUnsafeBytes { _ in } }
    }

    @Test("a discard is not held off by uses that keep overlapping: a use begun after it throws, and it ends")
    func discardBeatsOverlappingUses() throws {
        // Two readers hand the key over to each other: each leaves only once the other has begun its next use, so
        // some use is always in flight. glibc's rwlock lets such readers in ahead of a waiting discard for ever.
        final class Relay: @unchecked Sendable {
            let mutex = NSCondition()
            var uses = [0, 0]
            var stopped = [false, false]
            var givenUp = false
        }
        let key = SecureBytes.random(count: 32)
        let relay = Relay()
        let readers = DispatchGroup()
        for me in 0..<2 {
            let other = 1 - me
            readers.enter()
            Thread.detachNewThread {
                defer { readers.leave() }
                while true {
                    do {
                        try key.withUnsafeBytes { _ in
                            relay.mutex.lock()
                            defer { relay.mutex.unlock() }
                            relay.uses[me] += 1
                            relay.mutex.broadcast()
                            let seen = relay.uses[other]
                            while relay.uses[other] == seen, !relay.stopped[other], !relay.givenUp { relay.mutex.wait() }
                        }
                    } catch {
                        relay.mutex.withLock { relay.stopped[me] = true; relay.mutex.broadcast() }
                        return
                    }
                    if relay.mutex.withLock({ relay.givenUp }) { return }
                }
            }
        }
        // Both readers in their relay before the discard begins.
        relay.mutex.withLock { while relay.uses.min()! < 2 { relay.mutex.wait() } }
        let discarded = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            key.discard()
            discarded.signal()
        }
        // A failure detector, not a timing: the discard waits for one use at most, which ends within microseconds.
        let ended = discarded.wait(timeout: .now() + 30) == .success
        relay.mutex.withLock { relay.givenUp = true; relay.mutex.broadcast() }
        readers.wait()
        #expect(ended, "the discard was still waiting after 30 s while uses kept overlapping")
        if !ended { discarded.wait() }
        #expect(key.isDiscarded)
        // The reader whose turn it was when the discard began was turned away (the other may see the end first).
        #expect(relay.mutex.withLock { relay.stopped.contains(true) }, "a use begun after the discard must throw")
    }

    @Test("passcodes are read as one line into guarded memory")
    func passcodeFromStream() throws {
        func passcode(from input: String) throws -> Passcode {
            let pipe = Pipe()
            pipe.fileHandleForWriting.write(Data(input.utf8))
            try pipe.fileHandleForWriting.close()
            return try Passcode.read(from: .init(rawValue: pipe.fileHandleForReading.fileDescriptor))
        }
        #expect(try passcode(from: "secret\nignored").matches(try Passcode("secret")))
        #expect(try passcode(from: "secret\r\n").matches(try Passcode("secret")))
        #expect(try passcode(from: "no newline").matches(try Passcode("no newline")))
        expectError(.invalidArgument) { try passcode(from: "\n") }
        expectError(.invalidArgument) { try passcode(from: "") }
        expectError(.invalidArgument) { try passcode(from: String(repeating: "x", count: Passcode.maximumLength + 1)) }
    }
}
