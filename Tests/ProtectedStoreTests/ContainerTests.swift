import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import Testing
import SuiteThreads

@Suite("containers", .ownThread)
struct ContainerTests {
    @Test("a new container has the iOS layout and its default class; reopening finds it")
    func layout() throws {
        let test = try TestDevice()
        let container = try test.makeContainer(defaultProtection: .completeUntilFirstUserAuthentication)
        for folder in Container.layout(bundleIdentifier: TestDevice.bundleIdentifier) {
            #expect(try container.itemInfo(atPath: folder).type == .typeDirectory, "\(folder)")
        }
        #expect(container.applicationSupportPath == "Library/Application Support/com.example.test")
        #expect(try container.contentsOfDirectory(atPath: "").map(\.name) == ["Documents", "Library", "tmp"])
        let reopened = try test.reopen().container(bundleIdentifier: TestDevice.bundleIdentifier)
        #expect(reopened.defaultProtection == FileProtectionType.completeUntilFirstUserAuthentication)
        #expect(try test.device.containerIdentifiers() == [TestDevice.bundleIdentifier])
        expectError(.alreadyExists) { try test.makeContainer() }
        writeRaw([1], test.root + "/containers/README")
        try FileManager.default.createDirectory(atPath: test.root + "/containers/.sandboxctl-new-0123", withIntermediateDirectories: false)
        #expect(try test.device.containerIdentifiers() == [TestDevice.bundleIdentifier], "stray entries are not containers")
        expectError(.notFound) { try test.device.container(bundleIdentifier: "com.example.missing") }
    }

    @Test("class precedence: writing option, then the replaced file's class, then the directory's, then the container default")
    func classPrecedence() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data("a".utf8), toPath: "Documents/default")
        #expect(try container.itemInfo(atPath: "Documents/default").protectionClass == .complete)
        try container.write(Data("b".utf8), toPath: "Documents/chosen", options: [.atomic, .completeFileProtectionUnlessOpen])
        #expect(try container.itemInfo(atPath: "Documents/chosen").protectionClass == .completeUnlessOpen)
        try container.write(Data("b2".utf8), toPath: "Documents/chosen")
        #expect(try container.itemInfo(atPath: "Documents/chosen").protectionClass == .completeUnlessOpen, "a replaced file keeps its class")
        try container.createDirectory(atPath: "Library/Caches/open", attributes: [.protectionKey: FileProtectionType.none])
        try container.write(Data("c".utf8), toPath: "Library/Caches/open/item")
        #expect(try container.itemInfo(atPath: "Library/Caches/open/item").protectionClass == ProtectionClass.none)
        try container.createDirectory(atPath: "Library/Caches/open/deeper/still", withIntermediateDirectories: true)
        #expect(try container.itemInfo(atPath: "Library/Caches/open/deeper/still").protectionClass == ProtectionClass.none, "subdirectories inherit")
        let handle = try container.createFile(atPath: "Library/Caches/open/deeper/still/new")
        #expect(handle.protection.rawValue == FileProtectionType.none.rawValue)
        try handle.close()
        try container.setProtection(.completeUntilFirstUserAuthentication, ofItemAtPath: "Library/Caches/open")
        try container.write(Data("d".utf8), toPath: "Library/Caches/open/later")
        #expect(try container.itemInfo(atPath: "Library/Caches/open/later").protectionClass == .completeUntilFirstUserAuthentication)
        #expect(try container.itemInfo(atPath: "Library/Caches/open/item").protectionClass == ProtectionClass.none, "existing files keep theirs")
        #expect(try container.itemInfo(atPath: "Documents").protection == nil, "no class set: the container default applies")
    }

    @Test("Foundation-shaped API: attributes, protectionKey, CocoaError codes with the path and a POSIX error")
    func foundationShapes() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data(pattern(12_345)), toPath: "Documents/report.pdf")
        let attributes = try container.attributesOfItem(atPath: "Documents/report.pdf")
        #expect((attributes[.protectionKey] as? FileProtectionType)?.rawValue == FileProtectionType.complete.rawValue)
        #expect((attributes[.size] as? NSNumber)?.intValue == 12_345, "plaintext size, not the encrypted length")
        #expect(attributes[.type] as? FileAttributeType == .typeRegular)
        try container.setAttributes([.protectionKey: FileProtectionType.completeUnlessOpen], ofItemAtPath: "Documents/report.pdf")
        #expect((try container.attributesOfItem(atPath: "Documents/report.pdf")[.protectionKey] as? FileProtectionType)?.rawValue == FileProtectionType.completeUnlessOpen.rawValue)
        #expect(try container.contents(atPath: "Documents/report.pdf") == Data(pattern(12_345)), "a class change keeps the contents")
        expectCocoaError(.invalidArgument) { try container.setAttributes([.posixPermissions: 0o777], ofItemAtPath: "Documents/report.pdf") }

        let missing = expectCocoaError(.notFound) { try container.contents(atPath: "Documents/missing") }
        #expect(missing?.code == .fileReadNoSuchFile)
        #expect(missing?.filePath == "com.example.test:Documents/missing")
        #expect((missing?.underlying as? POSIXError)?.code == .ENOENT)
        #expect(missing?.localizedDescription.contains("Documents/missing") == true, "the message names the file")
        let exists = expectCocoaError(.alreadyExists) { try container.write(Data(), toPath: "Documents/report.pdf", options: .withoutOverwriting) }
        #expect(exists?.code == .fileWriteFileExists)
        let directory = expectCocoaError(.invalidArgument) { try container.contents(atPath: "Documents") }
        #expect(directory?.localizedDescription.contains("directory") == true)
        expectCocoaError(.invalidArgument) { try container.write(Data(), toPath: "Documents") }
        expectCocoaError(.alreadyExists) { try container.createFile(atPath: "Documents/report.pdf") }
        expectCocoaError(.invalidArgument) { try container.contents(atPath: "Documents/report.pdf/") }
        expectCocoaError(.invalidArgument) { try container.write(Data(), toPath: "Documents/new/") }
        let root = try container.itemInfo(atPath: "")
        #expect(root.type == .typeDirectory && root.protection == nil)
    }

    @Test("a file of another format or another device gets a clear integrity error and stays untouched")
    func foreignFiles() throws {
        let test = try TestDevice()
        let other = try TestDevice()
        let container = try test.makeContainer()
        let foreign = try other.makeContainer()
        try foreign.write(Data("theirs".utf8), toPath: "Documents/x", options: .noFileProtection)
        let stolen = readRaw(try foreign.storedPath("Documents/x"))
        writeRaw(stolen, try container.storedPath("Documents/stolen"))
        writeRaw(Array("plain text, not ours".utf8), try container.storedPath("Documents/plain.txt"))
        let error = expectCocoaError(.integrity) { try container.contents(atPath: "Documents/stolen") }
        #expect(error?.code == .fileReadCorruptFile)
        #expect(error?.protectedStoreError?.problem.contains("another device") == true)
        expectCocoaError(.integrity) { try container.contents(atPath: "Documents/plain.txt") }
        let listed = try container.contentsOfDirectory(atPath: "Documents").first { $0.name == "plain.txt" }
        #expect(listed?.protectionClass == nil && listed?.problem != nil, "listing shows the problem instead of failing")
        #expect(readRaw(try container.storedPath("Documents/plain.txt")) == Array("plain text, not ours".utf8))
    }

    @Test("a file a power cut left with no bytes (created, never synced) reads as empty, lists with its folder's class and takes writes, as on ext4")
    func emptyAfterPowerCut() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.createDirectory(atPath: "Documents/open", attributes: [.protectionKey: FileProtectionType.none])
        func emptied(_ path: String, data: String = "lost in the cut") throws {
            try container.write(Data(data.utf8), toPath: path, options: .completeFileProtectionUnlessOpen)
            #expect(truncate(try container.storedPath(path), 0) == 0)
        }
        try emptied("Documents/notes.txt")
        let listed = try container.itemInfo(atPath: "Documents/notes.txt")
        #expect(listed.problem == nil && listed.size == 0)
        #expect(listed.protectionClass == .complete, "the class a new file there takes (the container's default)")
        #expect(try container.contents(atPath: "Documents/notes.txt") == Data())
        #expect(try container.itemInfo(atPath: "Documents/notes.txt").protectionClass == .complete, "opening gave it that class")
        try emptied("Documents/open/log")
        let handle = try container.fileHandle(forUpdatingAtPath: "Documents/open/log")
        try handle.write(contentsOf: Data("after".utf8), atOffset: 0)
        try handle.close()
        #expect(try container.contents(atPath: "Documents/open/log") == Data("after".utf8))
        #expect(try container.itemInfo(atPath: "Documents/open/log").protectionClass == ProtectionClass.none, "its folder's class")
        // Through the mount's view: size 0, reads nothing, takes writes.
        let view = ContainerFileSystem(container: container)
        try emptied("Documents/viewed.txt")
        #expect(try view.attributes(of: "/Documents/viewed.txt").st_size == 0)
        let number = try view.open("/Documents/viewed.txt", flags: O_RDWR)
        var buffer = [UInt8](repeating: 0, count: 16)
        #expect(try buffer.withUnsafeMutableBytes { try view.read(number, into: $0, at: 0) } == 0)
        #expect(try Array("mounted".utf8).withUnsafeBytes { try view.write(number, from: $0, at: 0) } == 7)
        try view.synchronize(number)
        view.release(number)
        #expect(try container.contents(atPath: "Documents/viewed.txt") == Data("mounted".utf8))

        // Locked, a class A folder's empty file can't be given its header: denied as any class A file is, and untouched.
        // Class B's header could be made locked (public key), but not opened: left empty too (a creator may be writing).
        try emptied("Documents/locked.txt")
        try container.createDirectory(atPath: "Documents/sealed", attributes: [.protectionKey: FileProtectionType.completeUnlessOpen])
        try emptied("Documents/sealed/locked.txt")
        await test.device.lock()
        for path in ["Documents/locked.txt", "Documents/sealed/locked.txt"] {
            expectDenied(writing: false) { try container.contents(atPath: path) }
            #expect(readRaw(try container.storedPath(path)).isEmpty)
        }
        try test.device.unlock(passcode: try Passcode(TestDevice.passcode))
        #expect(try container.contents(atPath: "Documents/locked.txt") == Data())
        #expect(try container.contents(atPath: "Documents/sealed/locked.txt") == Data())
        #expect(try container.itemInfo(atPath: "Documents/sealed/locked.txt").protectionClass == .completeUnlessOpen)

        // One that can't be written can't be given a header: a clear error, and it stays as it was.
        try emptied("Documents/readonly.txt")
        #expect(chmod(try container.storedPath("Documents/readonly.txt"), 0o400) == 0)
        if geteuid() != 0 {
            let refused = expectCocoaError(.io) { try container.contents(atPath: "Documents/readonly.txt") }
            #expect(refused?.protectedStoreError?.problem.contains("give the empty file a header") == true, "\(String(describing: refused))")
            #expect(readRaw(try container.storedPath("Documents/readonly.txt")).isEmpty)
        }

        // The Inbox's items are synced before they are named: an empty one is damage there, listed as such.
        let source = test.path("delivered.txt")
        writeRaw(Array("delivered".utf8), source)
        let delivered = try container.deliverToInbox(fileAtPath: source)
        #expect(truncate(try container.storedPath(delivered.path), 0) == 0)
        expectCocoaError(.integrity) { try container.contents(atPath: delivered.path) }
        #expect(try container.itemInfo(atPath: delivered.path).problem != nil)
        #expect(readRaw(try container.storedPath(delivered.path)).isEmpty)

        // A file with a few bytes that are not a header is damage, not a lost create.
        writeRaw([1, 2, 3], try container.storedPath("Documents/short.txt"))
        expectCocoaError(.integrity) { try container.contents(atPath: "Documents/short.txt") }
        #expect(readRaw(try container.storedPath("Documents/short.txt")) == [1, 2, 3])
    }

    @Test("random-access handles: read and write at offsets, truncate, synchronize, close")
    func handles() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let handle = try container.createFile(atPath: "Library/Application Support/com.example.test/db", attributes: [.protectionKey: FileProtectionType.completeUnlessOpen])
        try handle.write(contentsOf: Data(pattern(10_000)), atOffset: 0)
        try handle.write(contentsOf: Data([1, 2, 3]), atOffset: 20_000)
        #expect(handle.size == 20_003)
        #expect(try handle.read(upToCount: 4, atOffset: 19_999) == Data([0, 1, 2, 3]))
        try handle.truncate(atOffset: 5000)
        try handle.synchronize()
        try handle.close()
        expectCocoaError(.invalidArgument) { try handle.read(upToCount: 1, atOffset: 0) }
        #expect(try container.contents(atPath: "Library/Application Support/com.example.test/db") == Data(pattern(5000)))
        let reader = try container.fileHandle(forReadingAtPath: "Library/Application Support/com.example.test/db")
        expectCocoaError(.invalidArgument) { try reader.write(contentsOf: Data([1]), atOffset: 0) }
        #expect(try reader.read(upToCount: 10, atOffset: 4995) == Data(pattern(5000)[4995...]))
        try reader.close()
    }

    @Test("move, remove and mkdir; the container's own folders can't be removed or moved")
    func moveAndRemove() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data("n".utf8), toPath: "Documents/note", options: .completeFileProtectionUnlessOpen)
        try container.createDirectory(atPath: "Documents/archive/2026", withIntermediateDirectories: true)
        try container.moveItem(atPath: "Documents/note", toPath: "Documents/archive/2026/note")
        #expect(try container.itemInfo(atPath: "Documents/archive/2026/note").protectionClass == .completeUnlessOpen, "files keep their class")
        #expect(!container.fileExists(atPath: "Documents/note"))
        try container.write(Data("m".utf8), toPath: "Documents/other")
        expectCocoaError(.alreadyExists) { try container.moveItem(atPath: "Documents/other", toPath: "Documents/archive/2026/note") }
        expectCocoaError(.invalidArgument) { try container.moveItem(atPath: "Documents/archive", toPath: "Documents/archive/2026/inside") }
        expectCocoaError(.alreadyExists) { try container.createDirectory(atPath: "Documents/archive") }
        expectCocoaError(.notFound) { try container.createDirectory(atPath: "Documents/none/child") }
        try container.createDirectory(atPath: "Documents/archive", withIntermediateDirectories: true)
        for folder in Container.layout(bundleIdentifier: TestDevice.bundleIdentifier) {
            expectCocoaError(.invalidArgument) { try container.removeItem(atPath: folder) }
            expectCocoaError(.invalidArgument) { try container.moveItem(atPath: folder, toPath: "Documents/x") }
        }
        try container.removeItem(atPath: "Documents/archive")
        #expect(!container.fileExists(atPath: "Documents/archive"))
        expectCocoaError(.notFound) { try container.removeItem(atPath: "Documents/archive") }
        #expect(try container.contentsOfDirectory(atPath: "Documents").map(\.name) == ["Inbox", "other"])
    }

    @Test("erase destroys the keys and removes the containers")
    func erase() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.write(Data("gone".utf8), toPath: "Documents/x", options: .noFileProtection)
        try test.device.erase()
        #expect(!FileManager.default.fileExists(atPath: test.secretPath))
        #expect(try FileManager.default.contentsOfDirectory(atPath: test.root).isEmpty)
        expectError(.notFound) { try test.reopen() }
        _ = try Device.create(root: test.root, deviceSecretPath: test.secretPath, passcode: try Passcode("again"), kdf: .fast)
    }
}
