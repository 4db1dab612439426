import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing

// The code under test: an app's reading list, one class A file. Links added while the device is locked can't go
// into it, so they wait in class B files (which can be created while locked) and are merged when protected data
// is back. Links also arrive as files in the Inbox.
final class ReadingList: ProtectedDataDelegate, OpenURLDelegate, @unchecked Sendable {
    let container: Container
    private let mutex = NSLock()
    private var listPath: String { "\(container.applicationSupportPath)/ReadingList.txt" }
    private var waitingFolder: String { "\(container.applicationSupportPath)/Waiting" }

    init(container: Container) throws {
        self.container = container
        try container.createDirectory(atPath: waitingFolder, withIntermediateDirectories: true,
                                      attributes: [.protectionKey: FileProtectionType.completeUnlessOpen])
        container.device.addDelegate(self)
        container.addOpenURLDelegate(self)
        if container.device.isProtectedDataAvailable { try mutex.withLock { try mergeWaiting() } }
    }

    /// Adds a link (once); it survives a lock, and a reboot before the next unlock.
    func add(_ link: String) throws {
        try mutex.withLock {
            do {
                let links = try load()
                if !links.contains(link) { try save(links + [link]) }
            } catch let error as CocoaError where error.isProtectedDataUnavailable {
                let name = String(format: "%.6f-%@.txt", Date().timeIntervalSinceReferenceDate, UUID().uuidString)
                try container.write(Data(link.utf8), toPath: "\(waitingFolder)/\(name)", options: .completeFileProtectionUnlessOpen)
            }
        }
    }

    func links() throws -> [String] { try mutex.withLock { try load() } }

    func protectedDataWillBecomeUnavailable(_ device: Device) {}

    func protectedDataDidBecomeAvailable(_ device: Device) {
        mutex.withLock { try? mergeWaiting() }
    }

    func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {
        let path = "Documents/Inbox/\(url.lastPathComponent)"
        guard let text = try? container.contents(atPath: path) else { return }
        try? add(String(decoding: text, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        try? container.removeItem(atPath: path)
    }

    // Adding is idempotent, so a crash between saving the list and removing a waiting file replays harmlessly.
    private func mergeWaiting() throws {
        for item in try container.contentsOfDirectory(atPath: waitingFolder) {
            let path = "\(waitingFolder)/\(item.name)"
            let link = String(decoding: try container.contents(atPath: path), as: UTF8.self)
            let links = try load()
            if !links.contains(link) { try save(links + [link]) }
            try container.removeItem(atPath: path)
        }
    }

    private func load() throws -> [String] {
        do {
            return String(decoding: try container.contents(atPath: listPath), as: UTF8.self).split(separator: "\n").map(String.init)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            return []
        }
    }

    private func save(_ links: [String]) throws {
        try container.write(Data(links.joined(separator: "\n").utf8), toPath: listPath, options: .completeFileProtection)
    }
}

// Its tests, with ProtectedStoreTesting.
@Suite("Testing guide example")
struct ReadingListTests {
    @Test("links added while locked are kept, and merged after the unlock", arguments: [TestDevice.KeyHolder.inProcess, .daemon])
    func addWhileLocked(keyHolder: TestDevice.KeyHolder) async throws {
        let device = try TestDevice(keyHolder: keyHolder)
        let list = try ReadingList(container: device.container)
        try list.add("https://swift.org")
        try await device.whileLocked {
            try list.add("https://example.com/read-later")
            // The list itself is class A: reading it now fails as it does on a locked iPhone.
            let error = #expect(throws: CocoaError.self) { try list.links() }
            #expect(error?.code == .fileReadNoPermission)
        }
        #expect(try list.links() == ["https://swift.org", "https://example.com/read-later"])
    }

    @Test("an app launched before first unlock loses nothing")
    func rebootBeforeFirstUnlock() async throws {
        let device = try TestDevice()
        try ReadingList(container: device.container).add("https://swift.org")
        await device.lock()
        try ReadingList(container: device.container).add("https://example.com/locked")
        try device.reboot()
        let relaunched = try ReadingList(container: device.container)
        try relaunched.add("https://example.com/before-first-unlock")
        try await device.unlock()
        #expect(try relaunched.links() == ["https://swift.org", "https://example.com/locked", "https://example.com/before-first-unlock"])
    }

    @Test("a link delivered to the Inbox while locked is opened after did-become-available")
    func inboxWhileLocked() async throws {
        let device = try TestDevice()
        let events = device.recordEvents()
        let list = try ReadingList(container: device.container)
        await device.lock()
        try await device.deliverToInbox(Data("https://example.com/shared\n".utf8), name: "link.txt", sourceApplication: "com.example.browser")
        try events.expectEvents([.willBecomeUnavailable])
        try await device.unlock()
        try events.expectEvents([.willBecomeUnavailable, .didBecomeAvailable, .openURL("Documents/Inbox/link.txt")])
        #expect(try list.links() == ["https://example.com/shared"])
        #expect(try device.container.contentsOfDirectory(atPath: "Documents/Inbox").isEmpty)
    }
}
