import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import Logging
import Testing
import SuiteThreads

/// Records protection and open-URL events in one ordered log, as an app delegate implementing both would see them.
final class AppRecorder: ProtectedDataDelegate, OpenURLDelegate, @unchecked Sendable {
    enum Entry: Equatable, CustomStringConvertible {
        case did, will
        case open(path: String, source: String?)

        var description: String {
            switch self {
            case .did: "did"
            case .will: "will"
            case .open(let path, let source): "open \(path) from \(source ?? "-")"
            }
        }
    }

    private let mutex = NSLock()
    private var recorded: [Entry] = []
    private var annotations: [String: String] = [:]
    var log: [Entry] { mutex.withLock { recorded } }
    var opens: [String] { log.compactMap { if case .open(let path, _) = $0 { path } else { nil } } }
    func annotation(of path: String) -> String? { mutex.withLock { annotations[path] } }

    func protectedDataWillBecomeUnavailable(_ device: Device) { mutex.withLock { recorded.append(.will) } }
    func protectedDataDidBecomeAvailable(_ device: Device) { mutex.withLock { recorded.append(.did) } }

    func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {
        let path = String(url.path.dropFirst(container.dataPath.count + 1))
        let annotationText = annotation.flatMap { try? JSONSerialization.data(withJSONObject: $0, options: [.fragmentsAllowed, .sortedKeys]) }
            .map { String(decoding: $0, as: UTF8.self) }
        mutex.withLock {
            recorded.append(.open(path: path, source: sourceApplication))
            annotations[path] = annotationText
        }
    }

    /// Registers for both kinds of event, as an app does at launch.
    func launch(_ container: Container) {
        container.device.addDelegate(self)
        container.addOpenURLDelegate(self)
    }
}

/// A local file to deliver, in a test's directory.
func sourceFile(_ test: TestDevice, _ name: String, _ contents: String) -> String {
    let path = test.path("outbox-\(UUID().uuidString.prefix(8))")
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    let file = (path as NSString).appendingPathComponent(name)
    writeRaw(Array(contents.utf8), file)
    return file
}

/// Asserts the Inbox rule's error: `CocoaError(.fileWriteNoPermission)` over `POSIXError(.EACCES)`, with a remedy.
func expectInboxDenied<R>(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> R) {
    expectDenied(writing: true, posix: .EACCES, kind: .permissionDenied, sourceLocation: sourceLocation) {
        do {
            return try body()
        } catch let error as CocoaError {
            #expect(error.protectedStoreError?.remedy.contains("Move the item out") == true, sourceLocation: sourceLocation)
            throw error
        }
    }
}

@Suite("Inbox", .ownThread)
struct InboxTests {
    @Test("a delivery while unlocked: one event in each of the three forms, the file readable under the default class")
    func deliverWhileUnlocked() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let recorder = AppRecorder()
        container.addOpenURLDelegate(recorder)
        let events = container.openURLEvents()
        let received = NSLock()
        nonisolated(unsafe) var requests: [OpenURLRequest] = []
        let consumer = Task(executorPreference: ThreadPerJobExecutor.shared) { for await request in events { received.withLock { requests.append(request) } } }
        defer { consumer.cancel() }
        let posted = NSLock()
        nonisolated(unsafe) var notifications: [[AnyHashable: Any]] = []
        let observer = test.device.notificationCenter.addObserver(forName: Container.openURLNotification, object: container, queue: nil) { note in
            posted.withLock { notifications.append(note.userInfo ?? [:]) }
        }
        defer { test.device.notificationCenter.removeObserver(observer) }
        container.postOpenURLNotifications()

        let item = try container.deliverToInbox(fileAtPath: sourceFile(test, "report.pdf", "quarterly figures"), sourceApplication: "com.example.mail",
                                                annotationJSON: #"{"subject": "Q3", "pages": 12, "final": true, "tags": ["a", "b"]}"#)
        #expect(item.path == "Documents/Inbox/report.pdf")
        #expect(item.protectionClass == .complete && !item.awaitsDefaultClass)

        // Waiting without blocking a thread: the consumer task needs one of the pool's few.
        for _ in 0..<1000 where received.withLock({ requests.count }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        let request = received.withLock { requests.first }
        #expect(request?.path == "Documents/Inbox/report.pdf")
        #expect(request?.sourceApplication == "com.example.mail")
        #expect(request?.annotationJSON == #"{"final":true,"pages":12,"subject":"Q3","tags":["a","b"]}"#)
        #expect((request?.annotation as? [String: Any])?["pages"] as? Int == 12)
        #expect(eventually { recorder.opens == ["Documents/Inbox/report.pdf"] && posted.withLock { notifications.count } == 1 })
        let userInfo = posted.withLock { notifications.first } ?? [:]
        #expect(userInfo[Container.openURLSourceApplicationKey] as? String == "com.example.mail")
        #expect((userInfo[Container.openURLRequestKey] as? OpenURLRequest)?.sequenceNumber == 1)
        #expect(recorder.annotation(of: "Documents/Inbox/report.pdf") == #"{"final":true,"pages":12,"subject":"Q3","tags":["a","b"]}"#)
        #expect(try eventually { try container.inboxItems().first?.state == .delivered })

        #expect(String(decoding: try container.contents(atPath: item.path), as: UTF8.self) == "quarterly figures")
        usleep(200_000)
        #expect(recorder.opens.count == 1, "one event only: \(recorder.log)")
        #expect(received.withLock { requests.count } == 1)
        #expect(posted.withLock { notifications.count } == 1)
    }

    @Test("three deliveries while locked: sealed for class B, then after unlock three events in order, once, after did; each file takes the default class when opened")
    func deliverWhileLocked() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let recorder = AppRecorder()
        recorder.launch(container)
        await test.device.lock(gracePeriod: 0)
        var paths: [String] = []
        try container.createDirectory(atPath: "Documents/plain", attributes: [.protectionKey: FileProtectionType.none])
        for (index, contents) in ["first", "second", "third"].enumerated() {
            let item = try container.deliverToInbox(fileAtPath: sourceFile(test, "scan.pdf", contents), sourceApplication: "com.example.scanner")
            #expect(item.protectionClass == .completeUnlessOpen && item.awaitsDefaultClass)
            #expect(item.sequenceNumber == UInt64(index + 1))
            paths.append(item.path)
        }
        #expect(paths == ["Documents/Inbox/scan.pdf", "Documents/Inbox/scan-1.pdf", "Documents/Inbox/scan-2.pdf"])
        usleep(300_000)
        #expect(recorder.log == [.will], "no open-URL event while locked: \(recorder.log)")
        expectDenied(writing: false) { try container.contents(atPath: paths[0]) }
        #expect(try container.inboxItems().map(\.state) == [.pendingEvent, .pendingEvent, .pendingEvent])

        try test.device.unlock(passcode: Passcode(TestDevice.passcode))
        let expected: [AppRecorder.Entry] = [.will, .did] + paths.map { .open(path: $0, source: "com.example.scanner") }
        #expect(eventually { recorder.log == expected }, "\(recorder.log)")
        usleep(300_000)
        #expect(recorder.log == expected, "no duplicates: \(recorder.log)")
        #expect(try container.inboxItems().map(\.state) == [.delivered, .delivered, .delivered])

        for (path, contents) in zip(paths, ["first", "second", "third"]) {
            #expect(String(decoding: try container.contents(atPath: path), as: UTF8.self) == contents)
            #expect(try container.itemInfo(atPath: path).protectionClass == .complete)
        }
        #expect(try container.inboxItems().allSatisfy { !$0.awaitsDefaultClass })
        // Moved out before its first unlocked open, an item still takes the class it would have had in the Inbox.
        let late = try container.deliverToInbox(fileAtPath: sourceFile(test, "late.txt", "late"))
        #expect(!late.awaitsDefaultClass, "unlocked: sealed under the default class at once")
        await test.device.lock(gracePeriod: 0)
        let sealed = try container.deliverToInbox(fileAtPath: sourceFile(test, "sealed.txt", "sealed"))
        try container.moveItem(atPath: sealed.path, toPath: "Documents/plain/sealed.txt")
        try test.device.unlock(passcode: Passcode(TestDevice.passcode))
        #expect(try container.contents(atPath: "Documents/plain/sealed.txt") == Data("sealed".utf8))
        #expect(try container.itemInfo(atPath: "Documents/plain/sealed.txt").protectionClass == .complete)
        // Now class A: a lock takes it away again.
        await test.device.lock(gracePeriod: 0)
        expectDenied(writing: false) { try container.contents(atPath: paths[1]) }
    }

    @Test("launch with pending items: a program opening the container later gets them first, once data is available; the next launch gets none")
    func launchWithPendingItems() async throws {
        let test = try TestDevice()
        _ = try test.makeContainer(defaultProtection: .completeUntilFirstUserAuthentication)
        // Delivered by another program before first unlock, while no one listens.
        let sender = try test.reopen().container(bundleIdentifier: TestDevice.bundleIdentifier)
        for name in ["a.txt", "b.txt"] {
            try sender.deliverToInbox(fileAtPath: sourceFile(test, name, name), annotationJSON: "\"\(name)\"")
        }

        let app = try test.reopen()
        let container = try app.container(bundleIdentifier: TestDevice.bundleIdentifier)
        let recorder = AppRecorder()
        recorder.launch(container)
        usleep(300_000)
        #expect(recorder.log.isEmpty, "before first unlock nothing is delivered: \(recorder.log)")
        try app.unlock(passcode: Passcode(TestDevice.passcode))
        #expect(eventually { recorder.log == [.did, .open(path: "Documents/Inbox/a.txt", source: nil), .open(path: "Documents/Inbox/b.txt", source: nil)] },
                "\(recorder.log)")
        #expect(recorder.annotation(of: "Documents/Inbox/b.txt") == "\"b.txt\"")
        #expect(try container.contents(atPath: "Documents/Inbox/a.txt") == Data("a.txt".utf8))
        #expect(try container.itemInfo(atPath: "Documents/Inbox/a.txt").protectionClass == .completeUntilFirstUserAuthentication)

        let relaunched = try test.reopen()
        try relaunched.unlock(passcode: Passcode(TestDevice.passcode))
        let second = AppRecorder()
        second.launch(try relaunched.container(bundleIdentifier: TestDevice.bundleIdentifier))
        usleep(400_000)
        #expect(second.opens.isEmpty, "each event is delivered once: \(second.log)")
    }

    @Test("an event buffered in a sequence that ends before taking it stays pending for the next receiver")
    func abandonedSequence() throws {
        let test = try TestDevice()
        let first = try test.makeContainer()
        var events: OpenURLEvents? = first.openURLEvents()
        try first.deliverToInbox(fileAtPath: sourceFile(test, "report.pdf", "r"))
        usleep(300_000)
        #expect(try first.inboxItems().first?.state == .pendingEvent, "buffered, not taken")
        events = nil
        #expect(events == nil)
        let recorder = AppRecorder()
        let second = try test.device.container(bundleIdentifier: TestDevice.bundleIdentifier)
        second.addOpenURLDelegate(recorder)
        #expect(eventually { recorder.opens == ["Documents/Inbox/report.pdf"] }, "\(recorder.log)")
        withExtendedLifetime(second) {}
    }

    @Test("two receivers of one container share its events: each delivered exactly once overall")
    func twoReceivers() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let first = AppRecorder(), second = AppRecorder()
        let containerA = try test.device.container(bundleIdentifier: TestDevice.bundleIdentifier)
        let containerB = try test.device.container(bundleIdentifier: TestDevice.bundleIdentifier)
        containerA.addOpenURLDelegate(first)
        containerB.addOpenURLDelegate(second)
        for index in 0..<20 {
            try containerA.deliverToInbox(fileAtPath: sourceFile(test, "n\(index).txt", "\(index)"))
        }
        #expect(eventually { first.opens.count + second.opens.count == 20 })
        usleep(300_000)
        let all = first.opens + second.opens
        #expect(all.count == 20 && Set(all).count == 20, "\(first.opens) \(second.opens)")
        #expect(first.opens == first.opens.sorted { $0.localizedStandardCompare($1) == .orderedAscending }, "each receiver in delivery order")
    }

    @Test("every write-like operation in Documents/Inbox is refused with EACCES; reading, listing, deleting and moving out work")
    func readAndDeleteOnly() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        try container.deliverToInbox(fileAtPath: sourceFile(test, "report.pdf", "v1"))
        try container.deliverToInbox(fileAtPath: sourceFile(test, "other.txt", "other"))
        let inboxItem = "Documents/Inbox/report.pdf"
        try container.write(Data("draft".utf8), toPath: "Documents/draft.txt")

        expectInboxDenied { try container.write(Data("v2".utf8), toPath: inboxItem) }
        expectInboxDenied { try container.write(Data("new".utf8), toPath: "Documents/Inbox/new.txt") }
        expectInboxDenied { try container.createFile(atPath: "Documents/Inbox/new.txt") }
        expectInboxDenied { try container.fileHandle(forUpdatingAtPath: inboxItem) }
        expectInboxDenied { try container.createDirectory(atPath: "Documents/Inbox/folder") }
        expectInboxDenied { try container.moveItem(atPath: "Documents/draft.txt", toPath: "Documents/Inbox/draft.txt") }
        expectInboxDenied { try container.moveItem(atPath: inboxItem, toPath: "Documents/Inbox/renamed.pdf") }
        expectInboxDenied { try container.setProtection(.none, ofItemAtPath: inboxItem) }
        expectInboxDenied { try container.setAttributes([.protectionKey: FileProtectionType.completeUnlessOpen], ofItemAtPath: inboxItem) }
        expectInboxDenied { try container.setProtection(.none, ofItemAtPath: "Documents/Inbox") }
        // A symbolic link elsewhere leading into the Inbox is no way around the rule.
        try container.createSymbolicLink(atPath: "Documents/in", withDestinationPath: "Inbox")
        expectInboxDenied { try container.write(Data("x".utf8), toPath: "Documents/in/sneaky.txt") }
        expectInboxDenied { try container.write(Data("x".utf8), toPath: "Documents/in/report.pdf") }

        #expect(try container.contents(atPath: inboxItem) == Data("v1".utf8), "unchanged")
        #expect(try container.contentsOfDirectory(atPath: "Documents/Inbox").map(\.name) == ["other.txt", "report.pdf"])
        let handle = try container.fileHandle(forReadingAtPath: inboxItem)
        #expect(try handle.read(upToCount: 10, atOffset: 0) == Data("v1".utf8))
        try handle.close()
        try container.removeItem(atPath: "Documents/Inbox/other.txt")

        // The documented way to edit: move it out, then change it.
        try container.moveItem(atPath: inboxItem, toPath: "Documents/report.pdf")
        #expect(try container.itemInfo(atPath: "Documents/report.pdf").protectionClass == .complete, "still protected")
        try container.write(Data("v2, edited".utf8), toPath: "Documents/report.pdf")
        #expect(try container.contents(atPath: "Documents/report.pdf") == Data("v2, edited".utf8))
        #expect(try container.contentsOfDirectory(atPath: "Documents/Inbox").isEmpty)
    }

    @Test("hostile names, bad annotations and bad sources are refused before anything is written; collisions get numbered names")
    func badInputAndCollisions() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let source = sourceFile(test, "report.pdf", "data")
        for name in ["", ".", "..", "a/b", "../escape", "a\u{0}b", String(repeating: "n", count: 256), ".sandboxctl-class",
                     "red\u{1B}[31m.txt", "two\nlines.txt", "\u{202E}fdp.exe", "bell\u{7}"] {
            let error = expectCocoaError(.invalidArgument) { try container.deliverToInbox(fileAtPath: source, name: name) }
            #expect(error?.protectedStoreError?.path == source, "the error names the file delivered")
        }
        for annotation in ["{", "null", #"{"a": [1, null]}"#, "", String(repeating: "1", count: 20_000)] {
            let error = expectCocoaError(.invalidArgument) { try container.deliverToInbox(fileAtPath: source, annotationJSON: annotation) }
            #expect(error?.protectedStoreError?.problem.hasPrefix("the annotation") == true)
        }
        #expect(expectCocoaError(.invalidArgument) { try container.deliverToInbox(fileAtPath: source, annotationJSON: #"{"a": {"b": null}}"#) }?
            .protectedStoreError?.problem.contains(".a.b") == true)
        expectCocoaError(.invalidArgument) { try container.deliverToInbox(fileAtPath: source, sourceApplication: "not a bundle id") }
        expectCocoaError(.notFound) { try container.deliverToInbox(fileAtPath: test.path("missing.pdf")) }
        expectCocoaError(.invalidArgument) { try container.deliverToInbox(fileAtPath: test.directory.path) }
        let fifo = test.path("fifo")
        #expect(mkfifo(fifo, 0o600) == 0)
        expectCocoaError(.invalidArgument) { try container.deliverToInbox(fileAtPath: fifo) }
        #expect(try container.inboxItems().isEmpty)
        #expect(try container.inboxQueue.entries().isEmpty, "the queue is untouched")
        #expect(try FileManager.default.contentsOfDirectory(atPath: try container.storedPath("Documents/Inbox")) == [DirectoryNames.ivName], "no staged file left")

        let names = try (0..<3).map { _ in try container.deliverToInbox(fileAtPath: source).name }
        #expect(names == ["report.pdf", "report-1.pdf", "report-2.pdf"])
        #expect(try container.deliverToInbox(fileAtPath: source, name: "notes").name == "notes")
        #expect(try container.deliverToInbox(fileAtPath: source, name: "notes").name == "notes-1")
        #expect(try container.deliverToInbox(fileAtPath: source, name: ".profile").name == ".profile")
        #expect(try container.deliverToInbox(fileAtPath: source, name: ".profile").name == ".profile-1")
        #expect(try container.deliverToInbox(fileAtPath: source, name: "résumé 📄.pdf").name == "résumé 📄.pdf")
        let long = String(repeating: "é", count: 125) + ".pdf"
        #expect(try container.deliverToInbox(fileAtPath: source, name: long).name == long)
        let shortened = try container.deliverToInbox(fileAtPath: source, name: long).name
        #expect(shortened.utf8.count <= 255 && shortened.hasSuffix("-1.pdf") && shortened != long)
        #expect(try container.inboxItems().map(\.sequenceNumber) == (1...10).map { UInt64($0) })

        // A name is free again once its item is gone; numbers are never reused, even after records are pruned.
        try container.removeItem(atPath: "Documents/Inbox/notes")
        try container.removeItem(atPath: "Documents/Inbox/\(shortened)")
        let again = try container.deliverToInbox(fileAtPath: source, name: "notes")
        #expect(again.name == "notes" && again.sequenceNumber == 11)
        #expect(try container.inboxQueue.entries().count == 9, "the two records whose items were removed are pruned")
    }

    @Test("a delivery interrupted between its record and its rename is finished by the receiver; a record whose item is gone is dropped")
    func interruptedDelivery() throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let kept = try container.deliverToInbox(fileAtPath: sourceFile(test, "kept.txt", "kept"))
        let removed = try container.deliverToInbox(fileAtPath: sourceFile(test, "removed.txt", "gone"))
        // As if the sender died after recording: the item is still under its staging name, the event pending.
        var entry = try #require(try container.inboxQueue.entries().first)
        let inbox = try container.storedPath("Documents/Inbox")
        entry.stagingName = FileSystem.temporaryPrefix + "0123456789abcdef"
        #expect(rename(try container.storedPath(kept.path), inbox + "/" + entry.stagingName) == 0)
        // The record rewritten in place, as the sender wrote it (a removal through the queue would withdraw it).
        try FileManager.default.removeItem(atPath: (container.inboxQueue.path as NSString).appendingPathComponent(String(format: "%020llu.sealed", entry.sequence)))
        try container.inboxQueue.record(entry)
        try container.removeItem(atPath: removed.path)
        #expect(try container.inboxItems().map(\.name) == [], "the staged file is hidden until finished")

        let recorder = AppRecorder()
        container.addOpenURLDelegate(recorder)
        #expect(eventually { recorder.opens == ["Documents/Inbox/kept.txt"] }, "\(recorder.log)")
        #expect(try container.contents(atPath: "Documents/Inbox/kept.txt") == Data("kept".utf8))
        #expect(try eventually { try container.inboxQueue.entries().map(\.name) == ["kept.txt"] }, "the dangling record was dropped")
    }

    @Test("a drop whose delivery fails stays in the drop folder, tried again until it is delivered; one whose sync fails is discarded, said why")
    func failedDropDeliveryIsKept() async throws {
        let test = try TestDevice()
        let container = try test.makeContainer()
        let log = RecordedLog()
        let drops = InboxDropFileSystem(container: container, sourceApplication: "com.example.scanner", annotation: nil, settleTime: 0.05,
                                        logger: Logger(label: "drop-test") { _ in log })
        defer { drops.stop() }
        // A full disk under the Inbox queue: every delivery fails as it is recorded, until the rule goes.
        let full = FaultInjection.install(FaultInjection.Rule(.write(allowedBytes: 0), folder: container.inboxQueue.path, errno: .noSpace))
        var fullRemoved = false
        defer { if !fullRemoved { FaultInjection.remove(full) } }
        let contents = pattern(100_000, seed: 3)
        func drop(_ name: String) throws {
            let handle = try drops.create("/\(name)", writer: getpid())
            #expect(try contents.withUnsafeBytes { try drops.write(handle, from: $0, at: 0) } == contents.count)
            drops.flush(handle, by: getpid())
            drops.release(handle)
        }
        // Closed under a final name: delivered after the settle time.
        try drop("scan.pdf")
        // Written under a temporary name: the rename delivers it, and takes effect though the delivery fails.
        try drop("photo.jpg.part")
        try drops.rename("/photo.jpg.part", to: "/photo.jpg", flags: 0)
        // Each fails twice (so it was put back once and tried again), and is in the folder between tries.
        func failures(_ name: String) -> [String] { log.messages.filter { $0.hasPrefix("could not deliver \(name):") } }
        #expect(eventually { failures("scan.pdf").count >= 2 && failures("photo.jpg").count >= 2 }, "\(log.messages)")
        #expect(eventually { drops.names() == ["photo.jpg", "scan.pdf"] }, "failed deliveries stay in the folder")
        #expect(try container.inboxItems().isEmpty)
        #expect(try container.inboxQueue.entries().isEmpty, "nothing recorded")
        #expect(failures("scan.pdf").allSatisfy { $0.contains("Free some disk space") && $0.contains("tried again in") }, "\(log.messages)")
        FaultInjection.remove(full)
        fullRemoved = true
        // The next try comes within the doubling wait reached so far (up to a minute).
        #expect(try eventually(timeout: 70) { try container.inboxItems().count == 2 })
        let items = try container.inboxItems()
        #expect(Set(items.map(\.name)) == ["photo.jpg", "scan.pdf"])
        for item in items {
            #expect(try container.contents(atPath: item.path) == Data(contents))
            #expect(item.sourceApplication == "com.example.scanner")
        }
        #expect(drops.names().isEmpty)
        #expect(try container.inboxQueue.entries().count == 2, "each delivered once")

        // A failed fsync of the staged file: Linux may have dropped what it could not write, so it is not delivered.
        let failingSync = FaultInjection.install(FaultInjection.Rule(.synchronize, folder: try container.storedPath("Documents/Inbox"),
                                                                     pattern: "\(InboxDrop.stagingPrefix)*", errno: .ioError))
        defer { FaultInjection.remove(failingSync) }
        try drop("notes.txt")
        #expect(eventually { !failures("notes.txt").isEmpty && drops.names().isEmpty }, "\(log.messages)")
        #expect(failures("notes.txt").first.map { $0.contains("it was discarded: ") && $0.contains("so its bytes may not all be on disk") } == true,
                "\(log.messages)")
        #expect(try container.inboxItems().count == 2)
        drops.stop()
        #expect(try FileManager.default.contentsOfDirectory(atPath: container.storedPath("Documents/Inbox")).filter { $0.hasPrefix(InboxDrop.stagingPrefix) }.isEmpty,
                "no staged file left behind")
    }
}

/// Messages logged, for a test to read.
final class RecordedLog: LogHandler, @unchecked Sendable {
    private let mutex = NSLock()
    private var recorded: [String] = []
    var messages: [String] { mutex.withLock { recorded } }
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) { mutex.withLock { recorded.append("\(event.message)") } }
}
