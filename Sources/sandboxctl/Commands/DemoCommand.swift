import ArgumentParser
import Foundation
import ProtectedStore

struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Tell the whole lock/unlock story in a throwaway device (what `make demo` runs).",
        discussion: "Creates a device and an app container in a temporary directory, writes one file per protection class, observes the events in all three forms, keeps two keychain items (class A and class C), locks, shows per class what works and what is denied (the keychain's too), creates a class B file and receives an Inbox delivery while locked, unlocks (the delivery's open-URL event follows), reboots, and removes everything it made."
    )

    func run() async throws {
        try await reportingErrors {
            let style = Style.standardOutput
            let workspace = FileManager.default.temporaryDirectory.appendingPathComponent("sandboxctl-demo-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: workspace) }
            let root = (workspace as NSString).appendingPathComponent("device")
            let secret = (workspace as NSString).appendingPathComponent("device.secret")
            let passcode = try Passcode("correct horse battery staple")
            var problems: [String] = []

            print(style.heading("1. A device and an app container"))
            let device = try Device.create(root: root, deviceSecretPath: secret, passcode: passcode)
            let container = try device.createContainer(bundleIdentifier: "com.example.diary")
            print("   device \(root) (device secret kept outside it), unlocked after creation")
            print("   container com.example.diary, default class complete: \(Container.layout(bundleIdentifier: container.bundleIdentifier).joined(separator: ", "))")

            print(style.heading("2. Observers: a delegate, NotificationCenter, an AsyncSequence"))
            let log = EventLog()
            let delegate = DemoDelegate(log: log)
            device.addDelegate(delegate)
            container.addOpenURLDelegate(delegate)
            let center = device.notificationCenter
            let observers = [Device.protectedDataWillBecomeUnavailableNotification, Device.protectedDataDidBecomeAvailableNotification].map { name in
                center.addObserver(forName: name, object: device, queue: nil) { note in log.record("notification  \(note.name.rawValue)") }
            }
            defer { observers.forEach(center.removeObserver) }
            let events = device.protectedDataEvents()
            let consumer = Task {
                for await event in events { log.record("async stream  \(event)") }
            }
            defer { consumer.cancel() }
            print("   each gets every transition; the lock waits until all are done (or the 10 s grace period ends)")

            print(style.heading("3. One file per class, and two files kept open"))
            let secretText = "Dear diary, the vault code is 4-8-15-16-23-42."
            let options = ProtectionClass.allCases.map { ($0, $0.writingOption) }
            for (protectionClass, option) in options {
                try container.write(Data("\(secretText) (\(protectionClass.name))".utf8), toPath: Self.path(protectionClass), options: option)
                print("   wrote \(Self.path(protectionClass))  class \(protectionClass.letter)")
            }
            let openA = try container.fileHandle(forReadingAtPath: Self.path(.complete))
            let openB = try container.fileHandle(forReadingAtPath: Self.path(.completeUnlessOpen))
            print("   holding open handles on the class A and class B files")
            let keychain = try Keychain(device: device, accessGroups: .only([container.bundleIdentifier]))
            let token = KeychainQuery.genericPassword(service: "api.example.com", account: "session")
            let refresh = KeychainQuery.genericPassword(service: "api.example.com", account: "refresh")
            try keychain.add(.genericPassword(service: "api.example.com", account: "session", secret: Data("token-1".utf8)))
            try keychain.add(.genericPassword(service: "api.example.com", account: "refresh", secret: Data("refresh-1".utf8), accessible: .afterFirstUnlock))
            print("   keychain: a session token (when-unlocked, class A) and a refresh token (after-first-unlock, class C)")

            print(style.heading("4. No plaintext on disk"))
            var leaked = false
            for (protectionClass, _) in options {
                let raw = try Data(contentsOf: URL(fileURLWithPath: try container.storedPath(Self.path(protectionClass))))
                leaked = leaked || raw.range(of: Data("vault code".utf8)) != nil
            }
            let keychainDatabase = (Keychain.folder(root: root) as NSString).appendingPathComponent("keychain.sqlite")
            let keychainBytes = try Data(contentsOf: URL(fileURLWithPath: keychainDatabase))
            leaked = leaked || ["token-1", "refresh-1", "api.example.com", "session"].contains { keychainBytes.range(of: Data($0.utf8)) != nil }
            print("   plaintext present on disk (files, keychain secrets and attributes): " + (leaked ? style.bad("YES") : style.good("no")))
            if leaked { problems.append("plaintext found on disk") }
            let storedPaths = FileManager.default.subpaths(atPath: container.dataPath) ?? []
            let namesLeaked = storedPaths.contains { $0.contains("Documents") || $0.contains("class-") }
            print("   \(storedPaths.count) stored names, e.g. \(storedPaths.first(where: { !$0.contains(".sandboxctl") }) ?? "-")")
            print("   plaintext names on disk: " + (namesLeaked ? style.bad("YES") : style.good("no")))
            if namesLeaked { problems.append("plaintext names found on disk") }

            print(style.heading("5. Lock"))
            let lockStarted = Date()
            await device.lock()
            let waited = Date().timeIntervalSince(lockStarted)
            print("   keys discarded after \(Int(waited * 1000)) ms" + (waited < device.gracePeriod
                ? ": every observer was done before the \(Int(device.gracePeriod)) s grace period ended"
                : ": the grace period ended before every observer was done"))
            print("   state \(device.state.rawValue), isProtectedDataAvailable = \(device.isProtectedDataAvailable)")
            let expectations: [ProtectionClass: (read: Bool, create: Bool, handle: Bool)] = [
                .complete: (false, false, false), .completeUnlessOpen: (false, true, true),
                .completeUntilFirstUserAuthentication: (true, true, true), .none: (true, true, true),
            ]
            for (protectionClass, option) in options {
                let expected = expectations[protectionClass]!
                print("   class \(protectionClass.letter) \(protectionClass.name)")
                problems += check("read:", expect: expected.read, style: style) { _ = try container.contents(atPath: Self.path(protectionClass)) }
                problems += check("create:", expect: expected.create, style: style) {
                    try container.write(Data("written while locked".utf8), toPath: "Documents/new-\(protectionClass.letter).txt", options: option)
                }
                if protectionClass == .complete {
                    problems += check("handle opened before the lock:", expect: false, style: style) { _ = try openA.read(upToCount: 10, atOffset: 0) }
                } else if protectionClass == .completeUnlessOpen {
                    problems += check("handle opened before the lock:", expect: true, style: style) { _ = try openB.read(upToCount: 10, atOffset: 0) }
                }
            }

            print("   keychain")
            problems += check("read the session token:", expect: false, style: style) { _ = try keychain.secret(matching: token) }
            problems += check("read the refresh token:", expect: true, style: style) { _ = try keychain.secret(matching: refresh) }

            print(style.heading("6. While locked: a class B file, and a delivery to the Inbox"))
            try container.write(Data("Package delivered at the door.".utf8), toPath: "Documents/arrived-while-locked.txt", options: .completeFileProtectionUnlessOpen)
            print("   created Documents/arrived-while-locked.txt with class B's public key")
            problems += check("read it back while still locked:", expect: false, style: style) { _ = try container.contents(atPath: "Documents/arrived-while-locked.txt") }
            let postcard = (workspace as NSString).appendingPathComponent("postcard.txt")
            try Data("Greetings from the seaside.".utf8).write(to: URL(fileURLWithPath: postcard))
            let delivered = try container.deliverToInbox(fileAtPath: postcard, sourceApplication: "com.example.mail")
            print("   another app delivered \(delivered.path) (sealed for class B); its open-URL event waits for the unlock")

            print(style.heading("7. Unlock"))
            do {
                try device.unlock(passcode: try Passcode("wrong guess"))
                problems.append("a wrong passcode unlocked the device")
            } catch let error as ProtectedStoreError {
                print("   wrong passcode: " + style.good("rejected") + " — \(error.problem)")
            }
            try device.unlock(passcode: passcode)
            print("   state \(device.state.rawValue), isProtectedDataAvailable = \(device.isProtectedDataAvailable)")
            for path in options.map({ Self.path($0.0) }) + ["Documents/arrived-while-locked.txt"] {
                problems += check("read \(path):", expect: true, style: style) { _ = try container.contents(atPath: path) }
            }
            problems += check("read the session token:", expect: true, style: style) { _ = try keychain.secret(matching: token) }
            try? openA.close()
            try? openB.close()
            for _ in 0..<200 where !log.lines.contains(where: { $0.contains("open URL") }) { try await Task.sleep(nanoseconds: 10_000_000) }
            problems += check("its open-URL event arrived after did:", expect: true, style: style) {
                guard log.lines.contains(where: { $0.contains("open URL") }) else { throw ProtectedStoreError(.notFound, problem: "no open-URL event arrived", remedy: "") }
            }
            problems += check("read \(delivered.path):", expect: true, style: style) { _ = try container.contents(atPath: delivered.path) }
            problems += check("write \(delivered.path):", expect: false, style: style) { try container.write(Data("scribbled".utf8), toPath: delivered.path) }
            problems += check("move it to Documents/ and edit it there:", expect: true, style: style) {
                try container.moveItem(atPath: delivered.path, toPath: "Documents/postcard.txt")
                try container.write(Data("Greetings from the seaside. (Kept.)".utf8), toPath: "Documents/postcard.txt")
            }

            print(style.heading("8. Events, in the order observers received them"))
            try await Task.sleep(nanoseconds: 100_000_000)
            for (index, line) in log.lines.enumerated() { print("   \(index + 1). \(line)") }

            print(style.heading("9. Reboot: before first unlock"))
            let rebooted = try Device.open(root: root, deviceSecretPath: secret)
            let afterBoot = try rebooted.container(bundleIdentifier: container.bundleIdentifier)
            print("   state \(rebooted.state.rawValue)")
            for (protectionClass, _) in options {
                problems += check("class \(protectionClass.letter) read:", expect: protectionClass == .none, style: style) {
                    _ = try afterBoot.contents(atPath: Self.path(protectionClass))
                }
            }

            let keychainAfterBoot = try Keychain(device: rebooted, accessGroups: .only([container.bundleIdentifier]))
            problems += check("keychain, refresh token:", expect: false, style: style) { _ = try keychainAfterBoot.secret(matching: refresh) }

            print(style.heading("10. Clean up"))
            print("   removed \(workspace)")
            if !problems.isEmpty {
                printError("the demo saw behaviour that contradicts the protection rules: \(problems.joined(separator: "; "))")
                throw ExitCode(ExitStatus.failure)
            }
        }
    }

    private static func path(_ protectionClass: ProtectionClass) -> String { "Documents/class-\(protectionClass.letter).txt" }

    /// Runs one operation, prints whether it worked or was denied (with the error), and returns a problem if that was not expected.
    private func check(_ label: String, expect allowed: Bool, style: Style, _ operation: () throws -> Void) -> [String] {
        let padded = "     " + label.padding(toLength: 44, withPad: " ", startingAt: 0)
        do {
            try operation()
            print(padded + (allowed ? style.good("ok") : style.bad("ALLOWED (expected denied)")))
            return allowed ? [] : ["\(label) allowed"]
        } catch let error as CocoaError where error.isProtectedDataUnavailable || error.protectedStoreError?.kind == .permissionDenied {
            let posix = error.isProtectedDataUnavailable ? "EPERM" : "EACCES"
            let reason = "\(error.code == .fileReadNoPermission ? "CocoaError.fileReadNoPermission" : "CocoaError.fileWriteNoPermission"), \(posix): \(error.protectedStoreError!.problem)"
            print(padded + (allowed ? style.bad("DENIED (expected ok)") : style.good("denied")) + style.dim(" — \(reason)"))
            return allowed ? ["\(label) denied"] : []
        } catch let error as KeychainError where error.code == .interactionNotAllowed {
            print(padded + (allowed ? style.bad("DENIED (expected ok)") : style.good("denied")) + style.dim(" — \(error.statusName)"))
            return allowed ? ["\(label) denied"] : []
        } catch {
            print(padded + style.bad("failed: \(error)"))
            return ["\(label) failed: \(error)"]
        }
    }
}

/// Collects event lines from the observers' threads, in arrival order.
private final class EventLog: @unchecked Sendable {
    private let mutex = NSLock()
    private var recorded: [String] = []
    func record(_ line: String) { mutex.withLock { recorded.append(line) } }
    var lines: [String] { mutex.withLock { recorded } }
}

private final class DemoDelegate: ProtectedDataDelegate, OpenURLDelegate {
    let log: EventLog
    init(log: EventLog) { self.log = log }
    func protectedDataWillBecomeUnavailable(_ device: Device) { log.record("delegate      protectedDataWillBecomeUnavailable") }
    func protectedDataDidBecomeAvailable(_ device: Device) { log.record("delegate      protectedDataDidBecomeAvailable") }
    func container(_ container: Container, open url: URL, sourceApplication: String?, annotation: Any?) {
        log.record("delegate      open URL \(url.lastPathComponent) from \(sourceApplication ?? "-")")
    }
}
