import Foundation
import ProtectedStore
@testable import ProtectedStoreDaemon
import Testing
import SuiteThreads

/// The README's library example, kept compiling and true.
@Suite("README", .ownThread)
struct ReadmeExampleTests {
    @Test("the library example runs as written")
    func example() async throws {
        let scratch = TemporaryDirectory()
        let device = try Device.create(root: scratch.file("device"), deviceSecretPath: scratch.file("device.secret"),
                                       passcode: try Passcode("correct horse"), kdf: .fast, notificationCenter: NotificationCenter())
        let app = try device.createContainer(bundleIdentifier: "com.example.notes")

        try app.write(Data("hello".utf8), toPath: "Documents/note.txt", options: .completeFileProtection)
        try app.write(Data("inbox".utf8), toPath: "Documents/later.txt", options: .completeFileProtectionUnlessOpen)
        let attributes = try app.attributesOfItem(atPath: "Documents/note.txt")
        #expect((attributes[.protectionKey] as? FileProtectionType)?.rawValue == FileProtectionType.complete.rawValue)

        let events = device.protectedDataEvents()
        let consumer = Task { () -> [ProtectedDataEvent] in
            var seen: [ProtectedDataEvent] = []
            for await event in events {
                seen.append(event)
                if seen.count == 2 { break }
            }
            return seen
        }

        await device.lock()
        var denied = false
        do {
            _ = try app.contents(atPath: "Documents/note.txt")
        } catch let error as CocoaError where error.code == .fileReadNoPermission {
            denied = (error.underlying as? POSIXError)?.code == .EPERM
        }
        #expect(denied)
        try app.write(Data("arrived".utf8), toPath: "Documents/while-locked.txt", options: .completeFileProtectionUnlessOpen)
        try device.unlock(passcode: try Passcode("correct horse"))

        let handle = try app.fileHandle(forUpdatingAtPath: "Documents/note.txt")
        try handle.write(contentsOf: Data(" world".utf8), atOffset: 5)
        try handle.close()
        #expect(try app.contents(atPath: "Documents/note.txt") == Data("hello world".utf8))
        #expect(await consumer.value == [.willBecomeUnavailable, .didBecomeAvailable])
    }

    @Test("the attach example runs as written, and a lock through the daemon reaches its delegate")
    func attachExample() async throws {
        let test = try TestDevice()
        _ = try test.makeContainer("com.example.notes")
        let daemon = try KeyDaemon.start(root: test.root, deviceSecretPath: test.secretPath)
        defer { daemon.stop() }
        let myStore = EventRecorder()

        let shared = try Device.attach(root: test.root)
        shared.addDelegate(myStore)
        let notes = try shared.container(bundleIdentifier: "com.example.notes")

        try shared.unlock(passcode: try Passcode(TestDevice.passcode))
        try notes.write(Data("n".utf8), toPath: "Documents/n.txt")
        await shared.lock()
        #expect(eventually { myStore.events == [.didBecomeAvailable, .willBecomeUnavailable] })
        #expect(!Device.isDaemonRunning(root: test.path("elsewhere")))
        expectError(.daemonUnavailable) { try Device.attach(root: test.path("elsewhere")) }
    }

    @Test("the Inbox example runs as written: the delivery arrives as an open-URL event, is read, and moved out to edit")
    func inboxExample() async throws {
        let test = try TestDevice()
        let notes = try test.makeContainer("com.example.notes")
        let myStore = AppRecorder()
        let report = sourceFile(test, "report.pdf", "figures")

        notes.addOpenURLDelegate(myStore)
        let events = notes.openURLEvents()
        let reader = Task { () -> Data? in
            for await request in events {
                let data = try notes.contents(atPath: request.path)
                try notes.moveItem(atPath: request.path, toPath: "Documents/\(request.url.lastPathComponent)")
                return data
            }
            return nil
        }
        try notes.deliverToInbox(fileAtPath: report, sourceApplication: "com.example.mail",
                                 annotationJSON: #"{"subject": "Q3"}"#)
        #expect(try await reader.value == Data("figures".utf8))
        #expect(eventually { myStore.opens == ["Documents/Inbox/report.pdf"] })
        #expect(try notes.contents(atPath: "Documents/report.pdf") == Data("figures".utf8))
        #expect(myStore.annotation(of: "Documents/Inbox/report.pdf") == #"{"subject":"Q3"}"#)
        // The receiver records the event as handled just after the observers return; let it, before the device goes.
        #expect(try eventually { try notes.inboxQueue.entries().contains { $0.eventDelivered } })
    }

    @Test("the DocC article Getting started shows the README's library example word for word")
    func gettingStartedArticle() throws {
        let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: repository.appendingPathComponent("README.md"), encoding: .utf8)
        let article = try String(contentsOf: repository.appendingPathComponent("Sources/ProtectedStore/ProtectedStore.docc/GettingStarted.md"), encoding: .utf8)
        let library = try #require(readme.range(of: "## Library\n\n```swift\n"), "the README lost its library example").upperBound
        let example = readme[library..<(try #require(readme.range(of: "\n```\n", range: library..<readme.endIndex))).lowerBound]
        let marker = try #require(article.range(of: "<!-- example: README.md#library -->\n```swift\n"), "the article lost its example marker").upperBound
        let copy = article[marker..<(try #require(article.range(of: "\n```\n", range: marker..<article.endIndex))).lowerBound]
        #expect(copy == example, "copy the README's library example into GettingStarted.md again")
    }
}
