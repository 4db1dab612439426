import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// `sandboxctl migrate` on a device written by format version 1's own sandboxctl (Tests/Fixtures/v1-device.tar.gz,
/// made by scripts/make-v1-fixture.sh): everything carried over, nothing in clear, every other command refused with
/// the version and the command named, and a power cut at any instant of it survived.
@Suite("version 1 devices and sandboxctl migrate", .ownThread, .serialized)
struct MigrationTests {
    static let passcode = "123456"
    static let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/v1-device.tar.gz").path

    /// A fresh copy of the fixture: `root` and `secret` inside a temporary folder.
    struct Copy {
        let directory = TemporaryDirectory()
        var root: String { directory.file("v1-device/root") }
        var secret: String { directory.file("v1-device/device.secret") }

        init() throws {
            let tar = Process()
            tar.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            tar.arguments = ["tar", "-xzf", MigrationTests.fixture, "-C", directory.path]
            try tar.run()
            tar.waitUntilExit()
            guard tar.terminationStatus == 0 else {
                throw ProtectedStoreError(.io, path: MigrationTests.fixture, problem: "tar could not unpack the fixture", remedy: "Check that tar is installed")
            }
        }

        /// The version 1 file's modification time, to compare after the migration.
        func version1ModificationTime(_ bundle: String, _ path: String) -> Date? {
            (try? FileManager.default.attributesOfItem(atPath: "\(root)/containers/\(bundle)/Data/\(path)"))?[.modificationDate] as? Date
        }

        func migrate(passcode: String = MigrationTests.passcode) throws -> DeviceFormat.MigrationSummary {
            try DeviceFormat.migrate(root: root, deviceSecretPath: secret) { try Passcode(passcode) }
        }
    }

    /// scripts/make-v1-fixture.sh's bytes: `size` bytes that differ by position and seed.
    static func content(_ size: Int, _ seed: Int) -> Data { Data((0..<size).map { UInt8(($0 * 31 + seed) % 251) }) }

    static let longName = String(repeating: "long-name-", count: 18) + "end.txt"

    /// Every file of the fixture: container, path, content, and the class it has after the migration.
    static let files: [(bundle: String, path: String, content: Data, protection: FileProtectionType)] = [
        ("com.example.notes", "Documents/a.txt", content(5, 1), .complete),
        ("com.example.notes", "Documents/b.bin", content(4096, 2), .completeUnlessOpen),
        ("com.example.notes", "Documents/c.bin", content(4097, 3), .completeUntilFirstUserAuthentication),
        ("com.example.notes", "Documents/d.bin", content(10000, 4), .none),
        ("com.example.notes", "Documents/empty", content(0, 5), .complete),
        ("com.example.notes", "Documents/Public/Nested/n.txt", content(100, 6), .none),
        ("com.example.notes", "Library/Caches/thumbs/t1", content(8192, 7), .complete),
        ("com.example.notes", "Documents/\(longName)", content(33, 8), .complete),
        ("com.example.notes", "Documents/Résumé – 履歴書.txt", content(64, 9), .complete),
        ("com.example.notes", "Library/Application Support/com.example.notes/db/notes.sqlite", content(12288, 10),
         .completeUntilFirstUserAuthentication),
        ("com.example.notes", "Documents/Inbox/report.pdf", content(300, 11), .complete),
        // Delivered before first unlock, sealed for class B: it takes its folder's class, as its first unlocked open would.
        ("com.example.notes", "Documents/Inbox/photo.jpg", content(5000, 12), .complete),
        ("com.example.mail", "Documents/mail.eml", content(2000, 13), .completeUnlessOpen),
    ]

    /// Folders with a class marker, and the class.
    static let folderClasses: [(bundle: String, path: String, protection: FileProtectionType)] = [
        ("com.example.notes", "Documents/Public", .none),
        ("com.example.notes", "Documents/Public/Nested", .none),
        ("com.example.notes", "Library/Application Support/com.example.notes/db", .completeUntilFirstUserAuthentication),
    ]

    /// What differs between the version 2 device in `root` and the fixture's content; empty when everything is there.
    static func problems(root: String, secret: String, expecting expected: [(bundle: String, path: String, content: Data, protection: FileProtectionType)] = files) -> [String] {
        do {
            guard try DeviceFormat.state(root: root) == .current else { return ["the device is not in format version 2"] }
            let device = try Device.open(root: root, deviceSecretPath: secret, notificationCenter: NotificationCenter())
            try device.unlock(passcode: try Passcode(passcode))
            var problems: [String] = []
            let bundles = Set(expected.map(\.bundle)).sorted()
            if try device.containerIdentifiers() != bundles { problems.append("containers: \(try device.containerIdentifiers())") }
            let notes = try device.container(bundleIdentifier: "com.example.notes")
            let mail = bundles.contains("com.example.mail") ? try device.container(bundleIdentifier: "com.example.mail") : nil
            if let mail, mail.defaultProtection != .completeUnlessOpen { problems.append("mail's default class is \(mail.defaultProtection.rawValue)") }
            for file in expected {
                let container = file.bundle == "com.example.mail" ? mail! : notes
                let read = try? container.contents(atPath: file.path)
                if read != file.content { problems.append("\(file.bundle):\(file.path): \(read.map { "\($0.count) bytes, not as written" } ?? "missing")") }
                let protection = try? container.attributesOfItem(atPath: file.path)[.protectionKey] as? FileProtectionType
                if protection?.rawValue != file.protection.rawValue {
                    problems.append("\(file.bundle):\(file.path): class \(protection?.rawValue ?? "none found"), not \(file.protection.rawValue)")
                }
            }
            for folder in folderClasses {
                let protection = try? notes.attributesOfItem(atPath: folder.path)[.protectionKey] as? FileProtectionType
                if protection?.rawValue != folder.protection.rawValue { problems.append("\(folder.path): folder class \(protection?.rawValue ?? "none")") }
            }
            let documents = Set(try notes.contentsOfDirectory(atPath: "Documents").map(\.name))
            let listed = Set(["Inbox", "Public"] + expected.filter { $0.bundle == "com.example.notes" && $0.path.hasPrefix("Documents/") }
                .map { $0.path.split(separator: "/")[1] }.map(String.init))
            if documents != listed { problems.append("Documents lists \(documents.sorted())") }
            let records = try notes.inboxQueue.entries()
            if records.map(\.sequence) != [1, 2] || records.map(\.name) != ["report.pdf", "photo.jpg"]
                || records.map(\.sourceApplication) != ["com.example.mail", "com.example.camera"]
                || records.first?.annotation != #"{"subject":"Q3"}"# || records.contains(where: \.eventDelivered) {
                problems.append("Inbox records: \(records)")
            }
            device.shutDown()
            return problems
        } catch {
            return ["\(error)"]
        }
    }

    /// A digest of every name and every file's bytes under `root`.
    static func digest(of root: String) -> [UInt8] {
        var summary: [UInt8] = []
        for path in (FileManager.default.enumerator(atPath: root)?.compactMap { $0 as? String } ?? []).sorted() {
            summary += Array(path.utf8) + [0]
            summary += Blake2b.hash(Array(FileManager.default.contents(atPath: "\(root)/\(path)") ?? Data()))
        }
        return Blake2b.hash(summary)
    }

    @Test("migrate carries every file, class, folder class, long and non-ASCII name, modification time and Inbox record over")
    func migratesEverything() throws {
        let copy = try Copy()
        #expect(try DeviceFormat.state(root: copy.root) == .version1)
        let modified = copy.version1ModificationTime("com.example.notes", "Documents/d.bin")
        let summary = try copy.migrate()
        #expect(summary.containers == 2)
        #expect(summary.files == Self.files.count)
        #expect(summary.bytes == Int64(Self.files.map(\.content.count).reduce(0, +)))
        #expect(summary.inboxRecords == 2)
        #expect(summary.skipped.isEmpty)
        #expect(Self.problems(root: copy.root, secret: copy.secret) == [])
        let device = try Device.open(root: copy.root, deviceSecretPath: copy.secret)
        let date = try device.container(bundleIdentifier: "com.example.notes").attributesOfItem(atPath: "Documents/d.bin")[.modificationDate] as? Date
        #expect(modified != nil && date == modified)
        // Done once: a second run has nothing to do and changes nothing.
        #expect(try copy.migrate().outcome == .alreadyCurrent)
        #expect(!FileManager.default.fileExists(atPath: "\(copy.root)/\(DeviceFormat.migrationFolderName)"))
    }

    @Test("after migrate no name, bundle id, annotation or content is stored in clear under the root")
    func nothingInClear() throws {
        let copy = try Copy()
        let clear = ["com.example", "a.txt", "Public", "Nested", "report.pdf", "photo.jpg", "subject", "Résumé", "long-name", "container.json"]
        func found() -> [String] {
            let files = FileManager.default.enumerator(atPath: copy.root)?.compactMap { $0 as? String } ?? []
            return clear.filter { word in
                files.contains { $0.contains(word) || (FileManager.default.contents(atPath: "\(copy.root)/\($0)")?.range(of: Data(word.utf8)) != nil) }
            }
        }
        #expect(found().count == clear.count, "the fixture must hold each of them in clear before")
        _ = try copy.migrate()
        #expect(found() == [])
    }

    @Test("a wrong passcode changes nothing and counts as a failed attempt")
    func wrongPasscode() throws {
        let copy = try Copy()
        #expect(throws: ProtectedStoreError.self) { try copy.migrate(passcode: "000000") }
        #expect(try DeviceFormat.state(root: copy.root) == .version1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: copy.root).contains { $0.hasPrefix(".sandboxctl") } == false)
        #expect((try PasscodeAttempts.load(from: "\(copy.root)/passcode-attempts.json")).failedAttempts == 1)
        _ = try copy.migrate()
        #expect(Self.problems(root: copy.root, secret: copy.secret) == [])
    }

    @Test("migrate is refused while a daemon holds the device (its lock taken), and changes nothing")
    func refusedWhileADaemonRuns() throws {
        let copy = try Copy()
        let held = try DaemonInfo.takeLock(root: copy.root, remedy: "")
        defer { close(held) }
        let error = #expect(throws: ProtectedStoreError.self) { try copy.migrate() }
        #expect(error?.kind == .alreadyExists && error?.problem.contains("a key daemon already serves this device") == true)
        #expect(try DeviceFormat.state(root: copy.root) == .version1)
    }

    @Test("every other command on a version 1 device fails with 65, naming the version, the command and migrate")
    func otherCommandsRefused() throws {
        let copy = try Copy()
        let options = ["--root", copy.root, "--device-secret", copy.secret]
        for arguments in [["ls", "com.example.notes:Documents"], ["status"], ["inbox", "list", "com.example.notes"], ["daemon"]] {
            let result = try CLI.run(arguments + options)
            #expect(result.status == 65, "\(arguments): \(result.stderr)")
            #expect(result.stderr.contains("`sandboxctl \(arguments.prefix(arguments[0] == "inbox" ? 2 : 1).joined(separator: " "))` cannot run"), "\(result.stderr)")
            #expect(result.stderr.contains("format version 1") && result.stderr.contains("sandboxctl migrate --root \(copy.root)"), "\(result.stderr)")
        }
        let migrated = try CLI.run(["migrate", "--passcode-stdin"] + options, stdin: Self.passcode + "\n")
        #expect(migrated.status == 0, "\(migrated.stderr)")
        #expect(migrated.stdout.contains("Migrated \(copy.root) to format version 2: 2 container(s)"), "\(migrated.stdout)")
        let listed = try CLI.run(["ls", "com.example.notes:Documents"] + options)
        #expect(listed.status == 0 && listed.stdout.contains("Résumé – 履歴書.txt"), "\(listed.stdout)\(listed.stderr)")
        let again = try CLI.run(["migrate", "--json"] + options)
        #expect(again.status == 0 && again.stdout.contains(#""result" : "already-current""#), "\(again.stdout)\(again.stderr)")
    }

    @Test("a power cut at any instant of migrate leaves a device that is version 1 or 2, and migrate again finishes with nothing lost")
    func survivesPowerCuts() throws {
        let copy = try Copy()
        // Fewer files than the whole fixture, one of each kind that matters (class B, a long name, nested folders with
        // classes, both Inbox items), so the suite stays quick: every state runs a migration of its own.
        let removed = ["com.example.notes/Data/Documents/c.bin", "com.example.notes/Data/Documents/d.bin", "com.example.notes/Data/Documents/empty",
                       "com.example.notes/Data/Documents/Résumé – 履歴書.txt", "com.example.notes/Data/Library/Caches/thumbs/t1",
                       "com.example.notes/Data/Library/Application Support/com.example.notes/db/notes.sqlite", "com.example.mail"]
        for path in removed { try FileManager.default.removeItem(atPath: "\(copy.root)/containers/\(path)") }
        let kept = Self.files.filter { file in !removed.contains { "\(file.bundle)/Data/\(file.path)".hasPrefix($0) } }
        let recording = try PowerCutRecording.start(root: copy.root)
        let migrated = 1
        do {
            _ = try copy.migrate()
            recording.mark(migrated)
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        let scratch = TemporaryDirectory()
        // Many cuts leave the same files (everything pending lost, say): each distinct state is migrated once, since a
        // migration is many fsyncs and the suite's other tests share the disk.
        var seen: Set<[UInt8]> = []
        var distinct = 0
        let report = try recording.check(workload: "migrate", statesPerCut: 1, seed: 5, scratch: scratch.path) { state in
            guard seen.insert(Self.digest(of: state.path)).inserted else { return [] }
            distinct += 1
            let format = try DeviceFormat.state(root: state.path)
            if state.marks.contains(migrated) && format != .current { return ["migrate had returned, but the device reads as \(format)"] }
            if format != .current {
                do {
                    _ = try DeviceFormat.migrate(root: state.path, deviceSecretPath: copy.secret) { try Passcode(Self.passcode) }
                } catch {
                    return ["migrate again failed: \(error)"]
                }
            }
            return Self.problems(root: state.path, secret: copy.secret, expecting: kept)
        }
        print("power-cut: \(report.description); \(distinct) distinct states migrated")
        #expect(distinct > 100)
        #expect(report.violations == [])
    }
}
