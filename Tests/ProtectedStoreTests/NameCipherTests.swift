import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import ProtectedStoreTesting
import Testing
import SuiteThreads

@Suite("Encrypted names", .ownThread)
struct NameCipherTests {
    let cipher = try! NameCipher(nameKey: .random(count: 32))
    let documents = Random.bytes(NameCipher.directoryIVBytes)
    let caches = Random.bytes(NameCipher.directoryIVBytes)

    func encrypted(_ stored: NameCipher.StoredName) -> String {
        switch stored {
        case .short(let name): name
        case .long(_, let encryptedName): encryptedName
        }
    }

    @Test("every length from 1 to 255 bytes round-trips; up to 144 bytes the entry is the encrypted name")
    func roundTrip() throws {
        for length in 1...255 {
            // Multi-byte characters too: "é" is two bytes, so odd lengths end with one ASCII byte.
            let name = String(repeating: "é", count: length / 2) + String(repeating: "n", count: length % 2)
            #expect(name.utf8.count == length)
            let stored = try cipher.storedName(for: name, directoryIV: documents)
            #expect(stored.entry.utf8.count <= NameCipher.maximumEntryBytes)
            #expect(cipher.name(fromEncrypted: encrypted(stored), directoryIV: documents) == name)
            switch stored {
            case .short(let entry):
                #expect(length <= 144, "\(length) bytes")
                #expect(!NameCipher.isLongEntry(entry))
            case .long(let entry, let encryptedName):
                #expect(length > 144, "\(length) bytes")
                #expect(NameCipher.isLongEntry(entry) && entry == NameCipher.longEntry(for: encryptedName))
            }
        }
    }

    @Test("a name encrypts the same way twice in one directory, differently in another, and its length shows only to 16 bytes")
    func determinism() throws {
        let once = try cipher.storedName(for: "notes.sqlite", directoryIV: documents)
        #expect(try cipher.storedName(for: "notes.sqlite", directoryIV: documents) == once)
        #expect(try cipher.storedName(for: "notes.sqlite", directoryIV: caches) != once)
        #expect(try cipher.storedName(for: "notes.sqlitf", directoryIV: documents) != once)
        let other = try NameCipher(nameKey: .random(count: 32))
        #expect(try other.storedName(for: "notes.sqlite", directoryIV: documents) != once, "another container's key")
        #expect(try cipher.storedName(for: "a", directoryIV: documents).entry.count == once.entry.count)
        #expect(try cipher.storedName(for: String(repeating: "a", count: 17), directoryIV: documents).entry.count > once.entry.count)
        #expect(!once.entry.contains("notes") && !once.entry.hasPrefix(".") && !once.entry.contains("/"))
    }

    @Test("a name moved to another directory, edited, or sealed as a link target is not a name")
    func tampering() throws {
        let stored = try cipher.storedName(for: "Report.pdf", directoryIV: documents).entry
        #expect(cipher.name(fromEncrypted: stored, directoryIV: caches) == nil)
        var bytes = try #require(Base64URL.decode(stored))
        for index in [0, 23, 24, bytes.count - 1] {
            bytes[index] ^= 1
            #expect(cipher.name(fromEncrypted: Base64URL.encode(bytes), directoryIV: documents) == nil, "byte \(index) flipped")
            bytes[index] ^= 1
        }
        #expect(cipher.name(fromEncrypted: stored + "A", directoryIV: documents) == nil)
        #expect(cipher.name(fromEncrypted: String(stored.dropLast()), directoryIV: documents) == nil)
        // The same padded bytes sealed as a link target (another domain in the associated data) are not a name.
        let linkTarget = try cipher.directoryBoundLinkTarget("Report.pdf" + String(repeating: "\0", count: 6), directoryIV: documents)
        #expect(cipher.name(fromEncrypted: linkTarget, directoryIV: documents) == nil, "a link target is not a name")
        #expect(cipher.name(fromEncrypted: try cipher.sealedLinkTarget("Report.pdf"), directoryIV: documents) == nil)
    }

    @Test("garbage is refused, never a crash", arguments: ["", "~", ".", "..", "a", "A===", "AAAA", "-_-_", "é", String(repeating: "A", count: 400), "~" + String(repeating: "x", count: 43)])
    func garbage(text: String) {
        #expect(cipher.name(fromEncrypted: text, directoryIV: documents) == nil)
        #expect(cipher.linkTarget(fromSealed: text, directoryIV: documents) == nil)
    }

    @Test("base64url is canonical: one text per byte string")
    func base64URL() {
        for count in 0..<40 {
            let bytes = Random.bytes(count)
            let text = Base64URL.encode(bytes)
            #expect(Base64URL.decode(text) == bytes)
            #expect(!text.contains("=") && !text.contains("/") && !text.contains("+") && !text.hasPrefix("."))
        }
        #expect(Base64URL.decode("AB") == nil, "non-zero unused bits")
        #expect(Base64URL.decode("AA") == [0])
        #expect(Base64URL.decode("AA==") == nil)
    }

    @Test("link targets round-trip with a random nonce and read in any directory; those of the first form only in their own")
    func linkTargets() throws {
        let target = "../Library/Caches/" + String(repeating: "deep/", count: 100) + "file"
        let first = try cipher.sealedLinkTarget(target)
        let second = try cipher.sealedLinkTarget(target)
        #expect(first != second)
        #expect(first.hasPrefix(NameCipher.linkTargetPrefix) && !NameCipher.isBoundToDirectory(linkTarget: first))
        #expect(cipher.linkTarget(fromSealed: first, directoryIV: documents) == target)
        #expect(cipher.linkTarget(fromSealed: second, directoryIV: caches) == target, "a moved link reads in its new directory")
        #expect(!first.contains("Library"))
        var bytes = try #require(Base64URL.decode(String(first.dropFirst())))
        bytes[bytes.count - 1] ^= 1
        #expect(cipher.linkTarget(fromSealed: "~" + Base64URL.encode(bytes), directoryIV: documents) == nil, "a flipped bit")
        let bound = try cipher.directoryBoundLinkTarget(target, directoryIV: documents)
        #expect(NameCipher.isBoundToDirectory(linkTarget: bound))
        #expect(cipher.linkTarget(fromSealed: bound, directoryIV: documents) == target)
        #expect(cipher.linkTarget(fromSealed: bound, directoryIV: caches) == nil)
        #expect(cipher.linkTarget(fromSealed: "~" + bound, directoryIV: documents) == nil, "the first form is not the current one")
        let name = try cipher.storedName(for: "file", directoryIV: documents).entry
        #expect(cipher.linkTarget(fromSealed: name, directoryIV: documents) == nil, "a name is not a link target")
    }
}

@Suite("Names at rest", .ownThread)
struct NamesAtRestTests {
    /// Every path below `folder`, as stored.
    func storedPaths(_ folder: String) throws -> [String] { try FileManager.default.subpathsOfDirectory(atPath: folder) }

    @Test("a container stores no name in clear: folders, files, long names and link targets; all list and open again after a reboot, before the first unlock")
    func noNameInClear() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let long = String(repeating: "Ж", count: 120) + ".txt"  // 244 bytes: stored as a long name
        try container.createDirectory(atPath: "Documents/Projects/Secret plans", withIntermediateDirectories: true)
        try container.write(Data("long".utf8), toPath: "Documents/Projects/Secret plans/" + long, options: .noFileProtection)
        try container.write(Data("short".utf8), toPath: "Documents/Projects/short.txt", options: .noFileProtection)
        try container.createSymbolicLink(atPath: "Documents/shortcut", withDestinationPath: "Projects/short.txt")
        #expect(try container.contents(atPath: "Documents/shortcut") == Data("short".utf8))

        let stored = try storedPaths(container.dataPath)
        for clear in ["Documents", "Projects", "Secret", "short", "Ж", "Library", "Caches", "Inbox", "shortcut", "com.example"] {
            #expect(!stored.contains { $0.contains(clear) }, "\(clear) is stored in clear: \(stored)")
        }
        let link = try FileManager.default.destinationOfSymbolicLink(atPath: try container.storedPath("Documents/shortcut"))
        #expect(!link.contains("Projects") && !link.contains("short"), "\(link)")
        #expect(stored.contains { $0.hasSuffix("/" + DirectoryNames.ivName) })

        let reopened = try test.reopen()
        #expect(reopened.state == .beforeFirstUnlock)
        let again = try reopened.container(bundleIdentifier: TestDevice.bundleIdentifier)
        #expect(try again.contentsOfDirectory(atPath: "").map(\.name) == ["Documents", "Library", "tmp"])
        #expect(try again.contentsOfDirectory(atPath: "Documents").map(\.name) == ["Inbox", "Projects", "shortcut"])
        #expect(try again.contentsOfDirectory(atPath: "Documents/Projects/Secret plans").map(\.name) == [long])
        #expect(try again.itemInfo(atPath: "Documents/shortcut").symbolicLinkTarget == "Projects/short.txt")
        #expect(try again.contents(atPath: "Documents/Projects/Secret plans/" + long) == Data("long".utf8), "class D opens before the first unlock")
    }

    @Test("a long name moves, is listed where it went, and leaves no stored name behind when removed")
    func longNames() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let long = String(repeating: "n", count: 255)
        try container.write(Data("x".utf8), toPath: "Documents/" + long, options: .noFileProtection)
        try container.createDirectory(atPath: "Documents/" + String(repeating: "d", count: 200))
        #expect(try container.contentsOfDirectory(atPath: "Documents").map(\.name) == ["Inbox", String(repeating: "d", count: 200), long])
        try container.moveItem(atPath: "Documents/" + long, toPath: "tmp/" + long)
        #expect(try container.contentsOfDirectory(atPath: "tmp").map(\.name) == [long])
        #expect(try container.contents(atPath: "tmp/" + long) == Data("x".utf8))
        try container.removeItem(atPath: "tmp/" + long)
        try container.removeItem(atPath: "Documents/" + String(repeating: "d", count: 200))
        #expect(try FileManager.default.contentsOfDirectory(atPath: try container.storedPath("tmp")) == [DirectoryNames.ivName])
        #expect(try FileManager.default.contentsOfDirectory(atPath: try container.storedPath("Documents")).count == 2, "the IV and the Inbox")
    }

    @Test("a stored name that is not ours, moved from another directory or cut short is an integrity error naming it")
    func corruptNames() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data("x".utf8), toPath: "Documents/a.txt", options: .noFileProtection)
        try container.write(Data("y".utf8), toPath: "tmp/" + String(repeating: "L", count: 200), options: .noFileProtection)
        let documents = try container.storedPath("Documents")
        writeRaw([1], documents + "/planted.txt")
        var error = expectCocoaError(.integrity) { try container.contentsOfDirectory(atPath: "Documents") }
        #expect(error?.protectedStoreError?.path?.hasSuffix("Documents/planted.txt") == true, "\(String(describing: error))")
        #expect(unlink(documents + "/planted.txt") == 0)
        // An entry moved in from another directory does not decrypt under this directory's IV.
        let moved = try container.storedPath("Documents/a.txt")
        #expect(rename(moved, try container.storedPath("Library") + "/" + (moved as NSString).lastPathComponent) == 0)
        error = expectCocoaError(.integrity) { try container.contentsOfDirectory(atPath: "Library") }
        #expect(error?.protectedStoreError?.problem.contains("not a name encrypted for this directory") == true)
        // A long name whose stored name is gone.
        let tmp = try container.storedPath("tmp")
        let longNameFile = try #require(try FileManager.default.contentsOfDirectory(atPath: tmp).first { $0.hasPrefix(".sandboxctl-name-") })
        #expect(unlink(tmp + "/" + longNameFile) == 0)
        error = expectCocoaError(.integrity) { try container.contentsOfDirectory(atPath: "tmp") }
        #expect(error?.protectedStoreError?.problem.contains("long name") == true)
        // The files themselves are still reached by name.
        #expect(try container.contents(atPath: "tmp/" + String(repeating: "L", count: 200)) == Data("y".utf8))
    }

    @Test("a device attached to a key daemon gets the name key over the socket and sees the same names")
    func throughTheDaemon() async throws {
        let test = try ProtectedStoreTesting.TestDevice(keyHolder: .daemon)
        try test.container.write(Data("x".utf8), toPath: "Documents/through the daemon.txt")
        #expect(try test.container.contentsOfDirectory(atPath: "Documents").map(\.name) == ["Inbox", "through the daemon.txt"])
        let stored = try FileManager.default.subpathsOfDirectory(atPath: test.container.dataPath)
        #expect(!stored.contains { $0.contains("daemon") })
        await test.lock(gracePeriod: 0)
        #expect(try test.container.contentsOfDirectory(atPath: "Documents").map(\.name) == ["Inbox", "through the daemon.txt"], "listed while locked")
    }
}

@Suite("Paths split at bytes", .ownThread)
struct SlashTests {
    /// U+07F2 is a combining mark: "/" followed by it is one Swift Character, so a Character-based split missed the
    /// slash (found by the names fuzzer as a crash; through the mount, a file whose name starts with one).
    @Test("a name starting with a combining mark is its own component, in paths and in link targets")
    func combiningMarkAfterSlash() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let name = "\u{07F2}notes.txt"
        try container.write(Data("x".utf8), toPath: "Documents/" + name, options: .noFileProtection)
        #expect(try container.contentsOfDirectory(atPath: "Documents").map(\.name) == ["Inbox", name])
        #expect(try ContainerPath("Documents/" + name, container: "t").components == ["Documents", name])
        try container.createSymbolicLink(atPath: "Documents/absolute", withDestinationPath: "/\u{07F2}etc")
        expectCocoaError(.invalidArgument) { try container.contents(atPath: "Documents/absolute/passwd") }
        try container.createSymbolicLink(atPath: "Documents/relative", withDestinationPath: "./" + name)
        #expect(try container.contents(atPath: "Documents/relative") == Data("x".utf8))
        #expect("a/\u{07F2}b".splitAtSlashes() == ["a", "\u{07F2}b"])
        // The String version (the mount's) splits as the generic one does, empty parts and all.
        for path in ["", "/", "//a", "a//b/", "/x/\u{07F2}/é", "no slash"] {
            for omitting in [false, true] {
                #expect(path.splitAtSlashes(omittingEmpty: omitting) == path[...].splitAtSlashes(omittingEmpty: omitting), "\(path) \(omitting)")
            }
        }
        #expect("/\u{07F2}".startsWithSlash && "x/\u{07F2}".containsSlash && !"x".containsSlash)
    }
}
