import CSQLite
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import SystemPackage
import Testing
import SuiteThreads

/// After a lock, no copy of the class A key or of a closed file's key may be left anywhere in memory: not in a stray
/// buffer, a stack, or a freed heap block. The scan reads every readable mapping through /proc/PID/mem.
@Suite(.ownThread) struct MemoryHygieneTests {
    @Test func afterALockNoClassAKeyAndNoClosedFilesKeyIsLeftInThisProcess() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        var secrets = [try MaskedSecret("the class A key", test.device.classKey(for: .complete))]
        let files: [(String, Data.WritingOptions)] = [("a.bin", .completeFileProtection), ("b.bin", .completeFileProtectionUnlessOpen),
                                                      ("c.bin", .completeFileProtectionUntilFirstUserAuthentication), ("d.bin", .noFileProtection)]
        for (name, option) in files {
            let path = "Documents/\(name)"
            // Every way a file key is used: whole-file write and read, a handle's read, write past the end, and close.
            try container.write(Data(repeating: 7, count: 300_000), toPath: path, options: option)
            #expect(try container.contents(atPath: path).count == 300_000)
            let handle = try container.fileHandle(forUpdatingAtPath: path)
            _ = try handle.read(upToCount: 5000, atOffset: 4000)
            try handle.write(contentsOf: Data(repeating: 9, count: 10_000), atOffset: 299_000)
            try handle.close()
            let header = try EncryptedFile.header(at: FileLocation(path: try container.storedPath(path)))
            secrets.append(try MaskedSecret("the key of closed file \(name)", header.unwrapFileKey(keys: test.device, path: path)))
        }

        // A "when unlocked" keychain item added and read: its key is unwrapped for each call and zeroed after it.
        let keychain = try Keychain(device: test.device, accessGroups: .only(["com.example.app"]))
        try keychain.add(.genericPassword(service: "memory", account: "a", secret: Data(repeating: 3, count: 64)))
        #expect(try keychain.secret(matching: .genericPassword(service: "memory")).count == 64)
        secrets.append(try MaskedSecret("the key of keychain item memory/a", Self.keychainItemKey(root: test.root, device: test.device)))

        // A file still open keeps its key (class D: a lock leaves it), and the scan must see that one too.
        try container.write(Data(repeating: 1, count: 100), toPath: "Documents/open.bin", options: .noFileProtection)
        let open = try container.fileHandle(forReadingAtPath: "Documents/open.bin")
        defer { try? open.close() }
        let openKey = try MaskedSecret("the key of open file open.bin", EncryptedFile.header(at: FileLocation(path: try container.storedPath("Documents/open.bin")))
            .unwrapFileKey(keys: test.device, path: "open.bin"))

        let unlocked = try MemoryScan(pid: getpid(), secrets: secrets + [openKey])
        // The scan must find what is there, or finding nothing later would prove nothing.
        #expect(unlocked.found.contains { $0.hasPrefix("the class A key") }, "the unlocked class A key was not found: the scan is blind")
        #expect(unlocked.found.contains { $0.hasPrefix("the key of open file") }, "the open file's key was not found: the scan is blind")
        #expect(!unlocked.found.contains { $0.contains("closed file") }, "closed files' keys while unlocked: \(unlocked.found)")

        await test.device.lock(gracePeriod: 0)
        let locked = try MemoryScan(pid: getpid(), secrets: secrets)
        #expect(locked.found.isEmpty, "left in memory after the lock: \(locked.found)")
        #expect(locked.scannedBytes > 10 << 20)
        print("memory hygiene: scanned \(locked.scannedBytes >> 20) MiB of this process in \(locked.regions) mappings after the lock; found \(locked.found.count) of \(secrets.count) keys")
    }

    @Test func theDaemonCannotBeDumpedKeepsItsKeysLockedAndForgetsClassAOnLock() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        // The same keys, unwrapped here from the same keybag, to know what to look for.
        let secret = try MaskedSecret("the class A key", test.device.classKey(for: .complete))
        let daemon = try DaemonProcess(test, grace: 0, executable: DaemonProcess.releaseExecutable ?? SpawnedProcess.builtExecutable("sandboxctl"))
        let unlocked = try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode + "\n")
        #expect(unlocked.status == 0, "\(unlocked.stderr)")
        let client = try Device.attach(root: test.root, notificationCenter: NotificationCenter())
        defer { client.powerOff() }
        let status = try #require(try client.daemonStatus())
        #expect(status.coreDumpsDisabled, "the daemon can be dumped or traced")
        // The sanitizers turn mlock into a no-op, so `make verify`'s sanitized runs have nothing locked to report.
        #expect((status.lockedMemoryKiB ?? 0) > 0 || runsUnderSanitizer, "the daemon has no mlocked memory: \(String(describing: status.lockedMemoryKiB))")

        guard geteuid() == 0 else {
            // A non-dumpable process's memory is closed to its own user: that is the hardening, and only root can scan it.
            #expect(FileManager.default.isReadableFile(atPath: "/proc/\(daemon.pid)/mem") == false)
            print("memory hygiene: skipping the scan of the daemon's memory: it needs root (the daemon is not dumpable)")
            return
        }
        #expect(try MemoryScan(pid: daemon.pid, secrets: [secret]).found.count == 1, "the daemon's unlocked class A key was not found: the scan is blind")
        // A "when unlocked" keychain item added and read through the daemon, which unwraps its key for each call.
        let added = try sandboxctl(test, ["keychain", "add", "com.example.app", "--service", "memory", "--account", "a"], stdin: "a keychain secret")
        #expect(added.status == 0, "\(added.stderr)")
        #expect(try sandboxctl(test, ["keychain", "find", "com.example.app", "--service", "memory"]).stdout == "a keychain secret")
        let itemKey = try MaskedSecret("the key of keychain item memory/a", Self.keychainItemKey(root: test.root, device: client))
        let locked = try sandboxctl(test, ["lock"])
        #expect(locked.status == 0, "\(locked.stderr)")
        let scan = try MemoryScan(pid: daemon.pid, secrets: [secret, itemKey])
        #expect(scan.found.isEmpty, "left in the daemon after the lock: \(scan.found)")
        print("memory hygiene: scanned \(scan.scannedBytes >> 20) MiB of the daemon after the lock; core dumps disabled, \(status.lockedMemoryKiB ?? 0) KiB locked")
    }
    /// The item key of the one row of a device's keychain, unwrapped here from the row as stored.
    static func keychainItemKey(root: String, device: Device) throws -> SecureBytes {
        var connection: OpaquePointer?
        let path = (Keychain.folder(root: root) as NSString).appendingPathComponent("keychain.sqlite")
        try #require(sqlite3_open_v2(path, &connection, SQLITE_OPEN_READONLY, nil) == SQLITE_OK)
        defer { sqlite3_close(connection) }
        var statement: OpaquePointer?
        try #require(sqlite3_prepare_v2(connection, "SELECT ref, kind, accessible, wrapped_key FROM items", -1, &statement, nil) == SQLITE_OK)
        defer { sqlite3_finalize(statement) }
        try #require(sqlite3_step(statement) == SQLITE_ROW)
        func blob(_ column: Int32) -> [UInt8] {
            Array(UnsafeRawBufferPointer(start: sqlite3_column_blob(statement, column), count: Int(sqlite3_column_bytes(statement, column))))
        }
        let (reference, kind, accessible) = (blob(0), UInt8(sqlite3_column_int(statement, 1)), UInt8(sqlite3_column_int(statement, 2)))
        let wrapped = WrappedFileKey(protectionClass: KeychainAccessibility(rawValue: accessible)!.protectionClass,
                                     associatedData: ItemSeal.keyAssociatedData(keybagID: device.keybagID, reference: reference, kind: kind, accessible: accessible),
                                     ephemeralPublicKey: ItemSeal.noEphemeralKey, sealed: blob(3))
        return try #require(try device.unwrapFileKey(wrapped))
    }

    /// What an outside reader of the daemon's memory would look for, computed as docs/FORMAT.md §2 says from the keybag
    /// on disk, the device secret and a passcode: T (Argon2id's output), K_pass, and, when the passcode is right, the
    /// class A key and the class B secret key.
    static func passcodeSecrets(_ test: TestDevice, passcode: String, label: String) throws -> [MaskedSecret] {
        let keybagPath = (test.root as NSString).appendingPathComponent("keybag")
        let deviceSecret = try DeviceSecret.load(at: test.secretPath)
        let keybag = try Keybag.parse(readRaw(keybagPath), path: keybagPath, deviceSecret: deviceSecret)
        let stretched = try keybag.kdf.derive(from: Passcode(passcode))
        let value = try #require(try PasscodeBinding.load(at: PasscodeBinding.path(forSecretAt: test.secretPath), deviceSecret: deviceSecret))
            .entry(forKeybag: readRaw(keybagPath), keybagPath: keybagPath).value
        let binding = SecureBytes(count: value.count) { $0.copyBytes(from: value) }
        let passcodeKey = try deviceSecret.derive(Keybag.passcodeKeyLabel, keybagID: keybag.keybagID, secretInputs: [stretched, binding])
        var secrets = [try MaskedSecret("T of the \(label) passcode", stretched), try MaskedSecret("K_pass of the \(label) passcode", passcodeKey)]
        if let keys = try? keybag.unwrapPasscodeClassKeys(passcode: Passcode(passcode), binding: value, deviceSecret: deviceSecret, path: keybagPath) {
            secrets += [try MaskedSecret("the class A key", keys[.complete]!), try MaskedSecret("the class B secret key", keys[.completeUnlessOpen]!)]
        }
        return secrets
    }

    /// After every lock (several cycles, after a passcode change, after a wrong passcode) nothing derived from a
    /// passcode is left in the daemon: whoever reads its memory then (root, a swap page, a hibernation image) still
    /// needs the passcode (docs/SECURITY.md).
    @Test func afterEveryLockTheDaemonHoldsNothingDerivedFromThePasscode() throws {
        guard geteuid() == 0 else {
            print("memory hygiene: skipping the passcode-derived scan of the daemon: it needs root (the daemon is not dumpable)")
            return
        }
        let test = try TestDevice()
        _ = try test.makeContainer()
        let daemon = try DaemonProcess(test, grace: 0, executable: DaemonProcess.releaseExecutable ?? SpawnedProcess.builtExecutable("sandboxctl"))
        let build = DaemonProcess.releaseExecutable == nil ? "debug (set PROTECTEDSTORE_RELEASE_BIN, as make test does, to scan a release build)" : "release"
        var secrets = try Self.passcodeSecrets(test, passcode: TestDevice.passcode, label: "first")
        func expectNothingAfterLock(_ moment: String) throws {
            let locked = try sandboxctl(test, ["lock"])
            #expect(locked.status == 0, "\(locked.stderr)")
            let scan = try MemoryScan(pid: daemon.pid, secrets: secrets)
            #expect(scan.found.isEmpty, "left in the daemon after \(moment): \(scan.found)")
        }
        func unlock(_ passcode: String) throws -> CLI.Result { try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: passcode + "\n") }

        for cycle in 1...6 {
            #expect(try unlock(TestDevice.passcode).status == 0)
            if cycle == 1 {
                // The scan must see what is there: the class A key is in the daemon while unlocked.
                let unlocked = try MemoryScan(pid: daemon.pid, secrets: secrets)
                #expect(unlocked.found.contains { $0.hasPrefix("the class A key") }, "the unlocked class A key was not found: the scan is blind")
                #expect(!unlocked.found.contains { $0.hasPrefix("T ") || $0.hasPrefix("K_pass") }, "passcode-derived bytes while unlocked: \(unlocked.found)")
            }
            try expectNothingAfterLock("lock \(cycle) of 6")
        }

        #expect(try unlock(TestDevice.passcode).status == 0)
        let changed = try sandboxctl(test, ["passwd", "--passcode-stdin"], stdin: "\(TestDevice.passcode)\nsecond-passcode\n")
        #expect(changed.status == 0, "\(changed.stderr)")
        secrets += try Self.passcodeSecrets(test, passcode: "second-passcode", label: "second")
        try expectNothingAfterLock("a passcode change and a lock")

        #expect(try unlock("wrong-passcode").status != 0)
        secrets += try Self.passcodeSecrets(test, passcode: "wrong-passcode", label: "wrong").filter { $0.label.hasPrefix("T ") || $0.label.hasPrefix("K_pass") }
        try expectNothingAfterLock("a wrong passcode and a lock")
        print("memory hygiene: scanned a \(build) daemon after 8 locks (6 cycles, a passcode change, a wrong passcode) for \(secrets.count) secrets: T, K_pass, class A and B keys")
    }
}

/// Whether this test binary, and so the programs built beside it, runs under AddressSanitizer or ThreadSanitizer
/// (`make verify`): both turn `mlock` into a no-op and inflate resident memory.
let runsUnderSanitizer = dlsym(nil, "__asan_init") != nil || dlsym(nil, "__tsan_init") != nil

/// A secret kept only XOR-masked, so the test's own copy never matches the search.
struct MaskedSecret {
    static let mask: UInt8 = 0x5C
    let label: String
    let masked: [UInt8]

    init(_ label: String, _ secret: SecureBytes) throws {
        self.label = label
        masked = try secret.withUnsafeBytes { $0.map { $0 ^ Self.mask } }
    }

    /// Whether `bytes` starts with the secret, unmasking one byte at a time.
    func matches(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard bytes.count >= masked.count else { return false }
        for index in masked.indices where bytes[index] != masked[index] ^ Self.mask { return false }
        return true
    }
}

/// Every readable mapping of a process, read through /proc/PID/mem and searched for secrets.
struct MemoryScan {
    /// "label at 0x… (mapping)" for every secret found.
    private(set) var found: [String] = []
    private(set) var scannedBytes = 0
    private(set) var regions = 0

    init(pid: Int32, secrets: [MaskedSecret]) throws {
        var labels: Set<String> = []
        (scannedBytes, regions) = try Self.readEveryMapping(of: pid) { buffer, read, position, name in
            for secret in secrets {
                let first = secret.masked[0] ^ MaskedSecret.mask
                var offset = 0
                while offset < read, let hit = memchr(buffer.baseAddress! + offset, Int32(first), read - offset) {
                    let index = buffer.baseAddress!.distance(to: hit)
                    if secret.matches(UnsafeRawBufferPointer(rebasing: buffer[index..<read])) && labels.insert(secret.label).inserted {
                        found.append("\(secret.label) at 0x\(String(position + UInt64(index), radix: 16)) (\(name))")
                    }
                    offset = index + 1
                }
            }
        }
    }

    /// Calls `body` with each chunk of every readable mapping of `pid` (its bytes, their count, their address, the
    /// mapping's name); chunks overlap by 64 bytes. Returns the bytes read and the mappings.
    static func readEveryMapping(of pid: Int32, _ body: (UnsafeMutableRawBufferPointer, Int, UInt64, String) -> Void) throws -> (bytes: Int, regions: Int) {
        var scannedBytes = 0, regions = 0
        // Read to the end by hand: /proc files report size 0, and a one-shot read stops at the first page.
        guard let mapsFile = FileHandle(forReadingAtPath: "/proc/\(pid)/maps"), let mapsData = try mapsFile.readToEnd() else {
            throw POSIXError(.ENOENT)
        }
        let maps = String(decoding: mapsData, as: UTF8.self)
        let memory = try FileDescriptor.open("/proc/\(pid)/mem", .readOnly)
        defer { try? memory.close() }
        let chunk = 1 << 20, overlap = 64
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 16)
        defer { buffer.deallocate() }
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 5, fields[1].hasPrefix("r") else { continue }
            let name = fields.count > 5 ? String(fields[5]) : "anonymous"
            if name == "[vvar]" || name == "[vsyscall]" || name == "[vvar_vclock]" { continue }
            let bounds = fields[0].split(separator: "-").compactMap { UInt64($0, radix: 16) }
            // Sanitizer shadow memory is reserved by the terabyte and holds no program data: leave mappings over 4 GiB.
            guard bounds.count == 2, bounds[1] - bounds[0] <= 4 << 30 else { continue }
            regions += 1
            var position = bounds[0]
            while position < bounds[1] {
                let wanted = Int(min(UInt64(chunk), bounds[1] - position))
                // A mapping can vanish or be unreadable (a device, a guard page): skip it, it holds nothing to find.
                guard let read = try? memory.read(fromAbsoluteOffset: Int64(bitPattern: position),
                                                  into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<wanted])), read > 0 else { break }
                scannedBytes += read
                body(buffer, read, position, name)
                // Step back a little so a secret straddling two chunks is seen whole.
                position += UInt64(read == wanted && position + UInt64(read) < bounds[1] ? read - overlap : read)
            }
        }
        return (scannedBytes, regions)
    }
}

/// How much of some plaintexts a process's memory holds: every 8-byte-aligned word of them is looked for at every
/// 8-byte-aligned address (heap blocks, libfuse's buffers and the kernel's copies into them are aligned alike).
/// The plaintexts are random, so a word found is a copy, not a coincidence.
struct PlaintextScan {
    /// Bytes of the plaintexts found (8 per word), by mapping name.
    private(set) var found: [String: Int] = [:]
    private(set) var scannedBytes = 0
    /// Where the first few words were found, to look them up in /proc/PID/maps.
    private(set) var addresses: [String] = []
    var foundBytes: Int { found.values.reduce(0, +) }

    init(pid: Int32, plaintexts: [Data]) throws {
        var words = Set<UInt64>()
        // A bit per value of a word's low 24 bits (2 MiB): with a few hundred thousand words most of it stays clear,
        // so nearly every word of memory fails it without a hash lookup, which a debug build makes slow.
        var filter = [UInt64](repeating: 0, count: 1 << 18)
        for plaintext in plaintexts {
            plaintext.withUnsafeBytes { bytes in
                for offset in stride(from: 0, to: bytes.count - 7, by: 8) {
                    let word = bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
                    words.insert(word)
                    filter[Int(word & 0xFF_FFFF) >> 6] |= 1 << (word & 63)
                }
            }
        }
        var found: [String: Int] = [:]
        var addresses: [String] = []
        (scannedBytes, _) = try MemoryScan.readEveryMapping(of: pid) { buffer, read, position, name in
            let count = read / 8
            let memory = buffer.baseAddress!.bindMemory(to: UInt64.self, capacity: count)
            var matched = 0
            for index in 0..<count {
                let word = memory[index]
                guard filter[Int(word & 0xFF_FFFF) >> 6] & (1 << (word & 63)) != 0, words.contains(word) else { continue }
                matched += 1
                if addresses.count < 8 { addresses.append("0x" + String(position + UInt64(index * 8), radix: 16)) }
            }
            if matched > 0 { found[name, default: 0] += matched * 8 }
        }
        self.found = found
        self.addresses = addresses
    }
}
