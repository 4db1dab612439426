import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// The reference table (DATA-PROTECTION.md §2) as one table: every class, every state, every operation.
@Suite("classes in force", .ownThread)
struct ProtectionMatrixTests {
    enum Phase: String, CaseIterable, CustomTestStringConvertible {
        case beforeFirstUnlock, unlocked, lockingWithinGrace, locked
        var testDescription: String { rawValue }
    }

    /// What is allowed: open an existing file, read it whole, replace it whole, create a new file,
    /// and use (read and write) a handle opened while unlocked. nil: no such handle can exist in that state.
    struct Allowed {
        var open: Bool, read: Bool, replace: Bool, create: Bool, openHandle: Bool?
        static let all = Allowed(open: true, read: true, replace: true, create: true, openHandle: true)
        static let none = Allowed(open: false, read: false, replace: false, create: false, openHandle: false)
    }

    static func expected(_ protectionClass: ProtectionClass, _ phase: Phase) -> Allowed {
        switch (protectionClass, phase) {
        case (_, .unlocked), (_, .lockingWithinGrace), (.none, .locked),
             (.completeUntilFirstUserAuthentication, .locked):
            return .all
        case (.none, .beforeFirstUnlock):
            return Allowed(open: true, read: true, replace: true, create: true, openHandle: nil)
        case (.complete, .locked):
            return .none
        case (.completeUnlessOpen, .locked):
            return Allowed(open: false, read: false, replace: true, create: true, openHandle: true)
        case (.completeUnlessOpen, .beforeFirstUnlock):
            return Allowed(open: false, read: false, replace: true, create: true, openHandle: nil)
        case (.complete, .beforeFirstUnlock), (.completeUntilFirstUserAuthentication, .beforeFirstUnlock):
            return Allowed(open: false, read: false, replace: false, create: false, openHandle: nil)
        }
    }

    /// Holds a lock in its grace period: its delegate does not return until released.
    final class BlockingDelegate: ProtectedDataDelegate, @unchecked Sendable {
        let release = DispatchSemaphore(value: 0)
        func protectedDataWillBecomeUnavailable(_ device: Device) { release.wait() }
        func protectedDataDidBecomeAvailable(_ device: Device) {}
    }

    @Test("class × state × operation", arguments: ProtectionClass.allCases, Phase.allCases)
    func matrix(protectionClass: ProtectionClass, phase: Phase) async throws {
        let test = try TestDevice()
        var container = try test.makeContainer()
        let original = Data(pattern(10_000, seed: protectionClass.rawValue))
        try container.write(original, toPath: "Documents/existing", options: protectionClass.writingOption)
        let handle = try container.fileHandle(forUpdatingAtPath: "Documents/existing")
        defer { try? handle.close() }

        let blocker = BlockingDelegate()
        var lockTask: Task<Void, Never>?
        switch phase {
        case .unlocked:
            break
        case .lockingWithinGrace:
            test.device.addDelegate(blocker)
            let device = test.device
            lockTask = Task(executorPreference: ThreadPerJobExecutor.shared) { await device.lock(gracePeriod: 600) }
            while test.device.state != .locking { try await Task.sleep(nanoseconds: 1_000_000) }
        case .locked:
            await test.device.lock(gracePeriod: 0)
            #expect(test.device.state == .locked)
        case .beforeFirstUnlock:
            container = try test.reopen().container(bundleIdentifier: TestDevice.bundleIdentifier)
            #expect(container.device.state == .beforeFirstUnlock)
        }

        let allowed = Self.expected(protectionClass, phase)
        let onDisk = try container.storedPath("Documents/existing")
        let before = readRaw(onDisk)
        check(allowed.open, writing: false, "open") { try container.fileHandle(forReadingAtPath: "Documents/existing").close() }
        check(allowed.read, writing: false, "read") {
            let contents = try container.contents(atPath: "Documents/existing")
            #expect(contents == original)
        }
        check(allowed.replace, writing: true, "replace") { try container.write(Data("replaced".utf8), toPath: "Documents/existing") }
        if !allowed.replace { #expect(readRaw(onDisk) == before, "a denied replace leaves the old file") }
        check(allowed.create, writing: true, "create") {
            try container.write(Data("new".utf8), toPath: "Documents/new", options: protectionClass.writingOption)
        }
        if !allowed.create { #expect(!container.fileExists(atPath: "Documents/new"), "a denied create leaves no file") }
        if let handleAllowed = allowed.openHandle {
            check(handleAllowed, writing: false, "handle read") { _ = try handle.read(upToCount: 100, atOffset: 0) }
            check(handleAllowed, writing: true, "handle write") { try handle.write(contentsOf: Data([1, 2, 3]), atOffset: 5) }
        }
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: try container.storedPath("Documents")).filter { $0.hasPrefix(".sandboxctl-tmp") }
        #expect(leftovers.isEmpty, "no temporary file left behind")

        blocker.release.signal()
        await lockTask?.value
    }

    private func check(_ allowed: Bool, writing: Bool, _ label: Comment, _ body: () throws -> Void) {
        if allowed {
            do { try body() } catch { Issue.record("\(label): expected to work, got \(error)") }
        } else {
            expectDenied(writing: writing, body)
        }
    }
}
