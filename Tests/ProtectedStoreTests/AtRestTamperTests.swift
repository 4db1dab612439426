import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import Testing

/// What someone with the disk (and, where named, the device secret) can change at rest, and that each change is
/// reported as damage or refused, never hidden (docs/SECURITY.md, "At rest").
@Suite("Tampering at rest: reported, never hidden")
struct AtRestTamperTests {
    private func cli(_ test: TestDevice, _ arguments: [String], stdin: String? = nil) throws -> CLI.Result {
        try CLI.run(arguments + ["--root", test.root, "--device-secret", test.secretPath], stdin: stdin)
    }

    @Test("a folder whose name IV was removed or resized, a tampered link target and a damaged description are listed as damage, with exit 65")
    func listingsReportDamage() throws {
        let test = try TestDevice()
        let container = try test.makeContainer(defaultProtection: .none)
        for folder in ["removed", "short", "long"] {
            try container.createDirectory(atPath: "Documents/\(folder)")
            try container.write(Data("inside".utf8), toPath: "Documents/\(folder)/note.txt")
        }
        try container.createSymbolicLink(atPath: "Documents/link", withDestinationPath: "removed/note.txt")
        let iv = { (folder: String) in (try container.storedPath("Documents/\(folder)") as NSString).appendingPathComponent(DirectoryNames.ivName) }
        try FileManager.default.removeItem(atPath: try iv("removed"))
        writeRaw(Array(readRaw(try iv("short")).prefix(15)), try iv("short"))
        writeRaw(readRaw(try iv("long")) + [0], try iv("long"))
        let link = try container.storedPath("Documents/link")
        let stored = try FileManager.default.destinationOfSymbolicLink(atPath: link)
        try FileManager.default.removeItem(atPath: link)
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: String(stored.dropLast()) + (stored.last == "A" ? "B" : "A"))

        // The library lists every entry, the damaged ones with their problem.
        let items = try container.contentsOfDirectory(atPath: "Documents")
        #expect(items.map(\.name) == ["Inbox", "link", "long", "removed", "short"])
        for name in ["link", "long", "removed", "short"] {
            #expect(items.first { $0.name == name }?.problem != nil, "\(name) is marked damaged")
        }
        #expect(items.first { $0.name == "removed" }?.problem?.contains("no name IV") == true)
        #expect(items.first { $0.name == "short" }?.problem?.contains("15 bytes") == true)

        let listed = try cli(test, ["ls", "-l", "\(TestDevice.bundleIdentifier):Documents"])
        #expect(listed.status == 65, "\(listed.stdout) \(listed.stderr)")
        for name in ["removed", "short", "long", "link"] {
            #expect(listed.stdout.contains(name), "ls shows \(name)")
            #expect(listed.stderr.contains("Documents/\(name): damaged"), "ls names \(name) on stderr: \(listed.stderr)")
        }
        let status = try cli(test, ["status"])
        #expect(status.status == 65)
        #expect(status.stdout.contains("4 damaged"), "\(status.stdout)")

        // A damaged description: the container is named as damaged, not left out.
        let description = ((container.dataPath as NSString).deletingLastPathComponent as NSString).appendingPathComponent(Container.metadataName)
        var sealed = readRaw(description)
        sealed[30] ^= 1
        writeRaw(sealed, description)
        let listing = try test.reopen().containerListing()
        #expect(listing.identifiers.isEmpty)
        #expect(listing.damaged.count == 1 && listing.damaged[0].problem.contains("does not open"))
        let afterStatus = try cli(test, ["status", "--json"])
        #expect(afterStatus.status == 65)
        #expect(afterStatus.stdout.contains("damagedContainers") && afterStatus.stderr.contains("containers/"))
    }

    @Test("the mount lists a folder's good entries and then fails the listing with EIO when an entry's name does not decrypt")
    func mountListingReportsDamage() throws {
        let test = try TestDevice()
        let container = try test.makeContainer(defaultProtection: .none)
        try container.write(Data("a".utf8), toPath: "Documents/good.txt")
        let documents = try container.storedPath("Documents")
        // A name made outside ProtectedStore: it decrypts in no directory.
        writeRaw([1, 2, 3], (documents as NSString).appendingPathComponent("planted-by-hand"))
        let view = ContainerFileSystem(container: container)
        let handle = try view.openDirectory("/Documents")
        defer { view.releaseDirectory(handle) }
        let listing = try view.listing(handle, fresh: true)
        #expect(listing.entries.map(\.name).contains("good.txt"))
        #expect(listing.damage?.kind == .integrity)
        #expect(listing.damage?.path?.contains("planted-by-hand") == true)
        #expect(view.errno(for: listing.damage!, doing: "readdir") == .ioError)
        // A folder whose IV is gone does not open through the mount either.
        try container.createDirectory(atPath: "Documents/folder")
        try container.write(Data("b".utf8), toPath: "Documents/folder/b.txt")
        try FileManager.default.removeItem(atPath: (try container.storedPath("Documents/folder") as NSString).appendingPathComponent(DirectoryNames.ivName))
        #expect(throws: ProtectedStoreError.self) { try view.openDirectory("/Documents/folder") }
    }

    @Test("restored Inbox records do not deliver their events again, a removed record or queue state is reported, and `inbox list` exits 65")
    func inboxReplayAndRemoval() throws {
        let test = try TestDevice()
        let container = try test.makeContainer(defaultProtection: .none)
        let queue = container.inboxQueue
        for name in ["a.txt", "b.txt", "c.txt"] {
            let source = test.path(name)
            writeRaw(Array(name.utf8), source)
            try container.deliverToInbox(fileAtPath: source)
        }
        let records = try FileManager.default.contentsOfDirectory(atPath: queue.path).filter { $0.hasPrefix("0") }.sorted()
        #expect(records.count == 3)
        let before = records.map { readRaw((queue.path as NSString).appendingPathComponent($0)) }
        // Handled as a receiver handles them.
        for entry in try queue.entries().prefix(2) {
            try queue.finish(try #require(try queue.claim(entry)))
        }
        #expect(try queue.scan().damage.isEmpty)
        // The replay: both handled records put back as they were before.
        for (name, bytes) in zip(records, before).prefix(2) { writeRaw(bytes, (queue.path as NSString).appendingPathComponent(name)) }
        let replayed = try queue.scan()
        #expect(replayed.entries.prefix(2).allSatisfy { $0.eventDelivered }, "replayed records count as handled")
        #expect(replayed.damage.count == 2 && replayed.damage.allSatisfy { $0.problem.contains("replay") })
        for entry in try queue.entries() where entry.sequence <= 2 { #expect(try queue.claim(entry) == nil) }
        // The pending third record removed: its event is lost, and that is said.
        try FileManager.default.removeItem(atPath: (queue.path as NSString).appendingPathComponent(records[2]))
        let removed = try queue.scan()
        #expect(removed.damage.contains { $0.problem.contains("missing") && $0.file == records[2] })
        let listed = try cli(test, ["inbox", "list", TestDevice.bundleIdentifier])
        #expect(listed.status == 65)
        #expect(listed.stderr.contains("replay") && listed.stderr.contains("missing"), "\(listed.stderr)")
        // Removing the state to clear the watermark: reported, and no pending event goes out.
        for (name, bytes) in zip(records, before) { writeRaw(bytes, (queue.path as NSString).appendingPathComponent(name)) }
        try FileManager.default.removeItem(atPath: (queue.path as NSString).appendingPathComponent(InboxQueue.stateName))
        let stateless = try queue.scan()
        #expect(stateless.damage.contains { $0.file == InboxQueue.stateName })
        #expect(stateless.entries.allSatisfy { $0.eventDelivered })
        for entry in try queue.entries() { #expect(try queue.claim(entry) == nil) }
    }

    @Test("a keybag restored from before a passcode change no longer opens, with either passcode")
    func keybagRollback() throws {
        let test = try TestDevice()
        let old = readRaw(test.device.keybagPath)
        try test.device.changePasscode(from: try Passcode(TestDevice.passcode), to: try Passcode("new-passcode"))
        #expect(try PasscodeBinding.load(at: PasscodeBinding.path(forSecretAt: test.secretPath), deviceSecret: try DeviceSecret.load(at: test.secretPath))?.entries.count == 1)
        writeRaw(old, test.device.keybagPath)
        let refused = expectError(.integrity) { try test.reopen() }
        #expect(refused?.problem.contains("rollback") == true, "\(String(describing: refused))")
        // The daemon's and every holder's unlock re-reads the keybag: the restored one is refused there too.
        expectError(.integrity) { try test.device.unlock(passcode: try Passcode(TestDevice.passcode)) }
        let statusCommand = try cli(test, ["status"])
        #expect(statusCommand.status == 65 && statusCommand.stderr.contains("rollback"))
    }

    @Test("a class B public key replaced by a device-secret holder is refused at unlock as keybag damage")
    func classBPublicKeySubstitution() throws {
        let test = try TestDevice()
        let secret = try DeviceSecret.load(at: test.secretPath)
        let keybagPath = test.device.keybagPath
        let original = try Keybag.parse(readRaw(keybagPath), path: keybagPath, deviceSecret: secret)
        let attacker = X25519.generateKeyPair()
        let forged = Keybag(keybagID: original.keybagID, isBound: original.isBound, kdf: original.kdf, classBPublicKey: attacker.publicKey, entries: original.entries)
        let bytes = try forged.serialized(deviceSecret: secret)
        writeRaw(bytes, keybagPath)
        // The holder can rewrite the binding too: it is only a MAC under the same secret.
        let bindingPath = PasscodeBinding.path(forSecretAt: test.secretPath)
        let value = try #require(try PasscodeBinding.load(at: bindingPath, deviceSecret: secret)).entries[0].value
        try PasscodeBinding(keybagID: original.keybagID, entries: [.init(value: value, keybag: bytes)]).store(at: bindingPath, deviceSecret: secret)
        let device = try test.reopen()
        let refused = expectError(.integrity) { try device.unlock(passcode: try Passcode(TestDevice.passcode)) }
        #expect(refused?.problem.contains("class B public key") == true)
        #expect(device.state == .beforeFirstUnlock)
    }

    @Test("`cat` of a 1 TiB sparse file into a reader of 1 MiB ends with a peak resident size under 64 MiB")
    func catStreamsInBoundedMemory() throws {
        let test = try TestDevice()
        let container = try test.makeContainer(defaultProtection: .none)
        let handle = try container.createFile(atPath: "Documents/huge")
        try handle.write(contentsOf: Data("start".utf8), atOffset: 0)
        try handle.truncate(atOffset: 1 << 40)
        try handle.close()
        let script = """
            import os, subprocess, sys
            child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
            data = b""
            while len(data) < 1 << 20:
                chunk = child.stdout.read((1 << 20) - len(data))
                if not chunk: break
                data += chunk
            child.stdout.close()
            _, status, usage = os.wait4(child.pid, 0)
            print(len(data), data[:5].decode(), usage.ru_maxrss)
            """
        let result = try CLI.run(executable: URL(fileURLWithPath: "/usr/bin/python3"),
                                 ["-c", script, SpawnedProcess.builtExecutable("sandboxctl").path, "cat", "\(TestDevice.bundleIdentifier):Documents/huge",
                                  "--root", test.root, "--device-secret", test.secretPath])
        let fields = result.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        try #require(fields.count == 3, "\(result.stdout) \(result.stderr)")
        #expect(fields[0] == "1048576" && fields[1] == "start")
        let peakKiB = try #require(Int(fields[2]))
        print("cat of a 1 TiB sparse file into head -c 1M: peak resident \(peakKiB / 1024) MiB")
        #expect(peakKiB < (runsUnderSanitizer ? 256 : 64) * 1024, "peak resident \(peakKiB) KiB")
    }

    @Test("`put` streams a sparse local file and keeps it sparse; `put -` streams a pipe")
    func putStreams() throws {
        let test = try TestDevice()
        let container = try test.makeContainer(defaultProtection: .none)
        let source = test.path("sparse")
        #expect(FileManager.default.createFile(atPath: source, contents: nil))
        let file = try #require(FileHandle(forWritingAtPath: source))
        try file.truncate(atOffset: 64 << 30)
        try file.seek(toOffset: 32 << 30)
        try file.write(contentsOf: Data("middle".utf8))
        try file.close()
        let put = try cli(test, ["put", source, "\(TestDevice.bundleIdentifier):Documents/sparse"])
        #expect(put.status == 0, "\(put.stderr)")
        let stored = try container.storedPath("Documents/sparse")
        var info = stat()
        #expect(stat(stored, &info) == 0 && info.st_blocks * 512 < 1 << 20, "the holes stay holes at rest")
        let handle = try container.fileHandle(forReadingAtPath: "Documents/sparse")
        #expect(handle.size == 64 << 30)
        #expect(try handle.read(upToCount: 6, atOffset: 32 << 30) == Data("middle".utf8))
        try handle.close()
        let piped = try cli(test, ["put", "-", "\(TestDevice.bundleIdentifier):Documents/piped"], stdin: "from a pipe\n")
        #expect(piped.status == 0, "\(piped.stderr)")
        #expect(try container.contents(atPath: "Documents/piped") == Data("from a pipe\n".utf8))
    }

    @Test("padded at rest: link targets by 16 bytes, container descriptions to one size, Inbox records by 1 KiB whatever the name or event state")
    func paddedSizes() throws {
        let test = try TestDevice()
        let short = try test.makeContainer("com.example.a", defaultProtection: .none)
        let long = try test.makeContainer("com.example." + String(repeating: "long-", count: 28), defaultProtection: .completeUntilFirstUserAuthentication)
        func descriptionSize(_ container: Container) throws -> UInt64 {
            let path = ((container.dataPath as NSString).deletingLastPathComponent as NSString).appendingPathComponent(Container.metadataName)
            return try #require(try FileManager.default.attributesOfItem(atPath: path)[.size] as? UInt64)
        }
        #expect(try descriptionSize(short) == descriptionSize(long))
        try short.createSymbolicLink(atPath: "Documents/one", withDestinationPath: "a")
        try short.createSymbolicLink(atPath: "Documents/fifteen", withDestinationPath: String(repeating: "b", count: 15))
        try short.createSymbolicLink(atPath: "Documents/sixteen", withDestinationPath: String(repeating: "c", count: 16))
        let lengths = try ["one", "fifteen", "sixteen"].map { try FileManager.default.destinationOfSymbolicLink(atPath: try short.storedPath("Documents/\($0)")).count }
        #expect(lengths[0] == lengths[1] && lengths[1] == lengths[2])
        #expect(try short.itemInfo(atPath: "Documents/fifteen").symbolicLinkTarget == String(repeating: "b", count: 15))
        for name in ["x", String(repeating: "y", count: 200)] {
            let source = test.path(name)
            writeRaw([1], source)
            try short.deliverToInbox(fileAtPath: source)
        }
        let queue = short.inboxQueue
        func recordSizes() throws -> [UInt64] {
            try FileManager.default.contentsOfDirectory(atPath: queue.path).filter { $0.hasPrefix("0") }.sorted().map {
                try #require(try FileManager.default.attributesOfItem(atPath: (queue.path as NSString).appendingPathComponent($0))[.size] as? UInt64)
            }
        }
        let pending = try recordSizes()
        #expect(pending.count == 2 && pending[0] == pending[1])
        try queue.finish(try #require(try queue.claim(try queue.entries()[0])))
        #expect(try recordSizes() == pending, "handling an event does not change its record's size")
    }

    @Test("error messages name the cause: a 256-byte name, an unsupported cipher byte, a header rule broken under a valid wrap")
    func rightCauses() throws {
        let cipher = try NameCipher(nameKey: SecureBytes.random(count: 32))
        let iv = Random.bytes(NameCipher.directoryIVBytes)
        guard case .long(_, let encrypted) = try cipher.storedName(for: String(repeating: "n", count: 256), directoryIV: iv) else {
            Issue.record("a 256-byte name is stored as a long name")
            return
        }
        #expect(cipher.name(fromEncrypted: encrypted, directoryIV: iv) == nil, "a name over 255 bytes is refused, even sealed validly")

        let test = try TestDevice()
        let path = test.path("file")
        let file = try EncryptedFile.create(at: path, protectionClass: .none, keys: test.device)
        try file.write(pattern(100), at: 0)
        try file.close()
        let original = readRaw(path)
        func opening(_ change: (inout [UInt8]) -> Void) -> ProtectedStoreError? {
            var bytes = original
            change(&bytes)
            writeRaw(bytes, path)
            do {
                _ = try EncryptedFile.open(at: FileLocation(path: path), keys: test.device, writable: false)
                return nil
            } catch {
                return error as? ProtectedStoreError
            }
        }
        if !FileHeader.Cipher.aegis256.isAvailable {
            let unsupported = opening { $0[8] = FileHeader.Cipher.aegis256.rawValue }
            #expect(unsupported?.kind == .unsupportedFormat && unsupported?.problem.contains("AEGIS-256") == true, "\(String(describing: unsupported))")
            #expect(unsupported?.problem.contains("compiled against") == true)
        }
        #expect(opening { $0[7] = 0x04 }?.problem.contains("flags byte") == true)
        #expect(opening { $0[12] = 0x00; $0[13] = 0x30 }?.problem.contains("block size") == true)
        #expect(opening { $0[6] = 9 }?.problem.contains("class byte") == true)
    }
}

/// The same tampers seen by an unmodified program through the kernel.
@Suite("Tampering at rest, through the mount", .ownThread, .serialized, .enabled(if: FUSEAvailability.isAvailable, "needs /dev/fuse and fusermount3"))
struct AtRestTamperMountTests {
    @Test("ls(1) on the mount lists the readable entries, then reports the damaged one as an I/O error; a folder without its IV does not open",
          .timeLimit(.minutes(10)))
    func lsThroughTheMount() throws {
        let mounted = try MountedDevice(defaultProtection: .none)
        try mounted.container.write(Data("a".utf8), toPath: "Documents/good.txt")
        try mounted.container.createDirectory(atPath: "Documents/folder")
        try mounted.container.write(Data("b".utf8), toPath: "Documents/folder/b.txt")
        let documents = try mounted.container.storedPath("Documents")
        writeRaw([1, 2, 3], (documents as NSString).appendingPathComponent("planted-by-hand"))
        try FileManager.default.removeItem(atPath: (try mounted.container.storedPath("Documents/folder") as NSString).appendingPathComponent(DirectoryNames.ivName))

        let listed = try CLI.run(executable: URL(fileURLWithPath: "/bin/ls"), [mounted.path("Documents")])
        #expect(listed.status != 0, "ls fails: \(listed.stdout) \(listed.stderr)")
        #expect(listed.stdout.contains("good.txt") && listed.stdout.contains("folder"), "\(listed.stdout)")
        #expect(listed.stderr.contains("Input/output error"), "\(listed.stderr)")
        let inside = try CLI.run(executable: URL(fileURLWithPath: "/bin/ls"), [mounted.path("Documents/folder")])
        #expect(inside.status != 0 && inside.stderr.contains("Input/output error"), "\(inside.stderr)")
        #expect(eventually { mounted.log.contains("planted-by-hand") }, "the mount's log names the damaged entry")
    }
}
