import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing

/// A temporary directory removed when the value is released, even when a test fails.
final class TemporaryDirectory: @unchecked Sendable {
    let path: String

    init() {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("ps-test-\(UUID().uuidString)").path
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    func file(_ name: String) -> String { (path as NSString).appendingPathComponent(name) }
}

/// Whether tests that need something this machine may lack can run: yes without a problem, else no, with the reason
/// printed (the `.enabled(if:)` comment is fixed text; this names what is missing here).
func canRun(_ tests: String, unless problem: String?) -> Bool {
    if let problem { print("Skipping \(tests): \(problem)") }
    return problem == nil
}

/// A small tmpfs of its own, to fill up: unmounted (lazily) when released. Nil, with the reason printed, where this
/// process may not mount (it needs root or CAP_SYS_ADMIN).
final class SmallDisk: @unchecked Sendable {
    let directory = TemporaryDirectory()
    var path: String { directory.path }

    init?(megabytes: Int, purpose: String) {
        let mounting = try? CLI.run(executable: URL(fileURLWithPath: "/bin/mount"), ["-t", "tmpfs", "-o", "size=\(megabytes)m,mode=0700", "tmpfs", directory.path])
        guard let mounting, mounting.status == 0 else {
            print("Skipping \(purpose): cannot mount a \(megabytes) MiB tmpfs (\(mounting?.stderr.trimmingCharacters(in: .whitespacesAndNewlines) ?? "no /bin/mount")); it needs root or CAP_SYS_ADMIN")
            return nil
        }
    }

    deinit { _ = try? CLI.run(executable: URL(fileURLWithPath: "/bin/umount"), ["-l", directory.path]) }
}

/// A device with the fast KDF in a temporary directory, its secret beside (not inside) the root.
struct TestDevice {
    static let passcode = "1234-test"
    let directory: TemporaryDirectory
    let device: Device
    var root: String { directory.file("root") }
    var secretPath: String { directory.file("device.secret") }

    init(passcode: String = TestDevice.passcode, policy: PasscodePolicy = .default, in directory: TemporaryDirectory = TemporaryDirectory()) throws {
        self.directory = directory
        device = try Device.create(root: directory.file("root"), deviceSecretPath: directory.file("device.secret"),
                                   passcode: try Passcode(passcode), kdf: .fast, passcodePolicy: policy, notificationCenter: NotificationCenter())
    }

    /// The same device opened again, as after a reboot: before first unlock.
    func reopen() throws -> Device { try Device.open(root: root, deviceSecretPath: secretPath, notificationCenter: NotificationCenter()) }

    func makeContainer(_ bundleIdentifier: String = TestDevice.bundleIdentifier, defaultProtection: FileProtectionType = .complete) throws -> Container {
        try device.createContainer(bundleIdentifier: bundleIdentifier, defaultProtection: defaultProtection)
    }

    static let bundleIdentifier = "com.example.test"

    func path(_ name: String) -> String { directory.file(name) }
}

/// The error of type `E` that `body` throws; records an issue (naming `expected`) if it succeeds or throws another type.
func caught<E: Error, R>(_ type: E.Type, expected: String, sourceLocation: SourceLocation, _ body: () throws -> R) -> E? {
    do {
        _ = try body()
        Issue.record("expected \(expected), but the call succeeded", sourceLocation: sourceLocation)
    } catch let error as E {
        return error
    } catch {
        Issue.record("expected \(expected), got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

/// Asserts that `body` throws the `CocoaError` Foundation would for a denial: `.fileReadNoPermission` or
/// `.fileWriteNoPermission` over `POSIXError(posix)`, with the library's `kind` inside. By default a data-protection
/// denial (EPERM); the Inbox's read-and-delete rule is EACCES, `.permissionDenied`.
func expectDenied<R>(writing: Bool, posix: POSIXErrorCode = .EPERM, kind: ProtectedStoreError.Kind = .protectedDataUnavailable,
                     sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> R) {
    guard let error = caught(CocoaError.self, expected: "a \(kind) denial", sourceLocation: sourceLocation, body) else { return }
    #expect(error.code == (writing ? .fileWriteNoPermission : .fileReadNoPermission), "got \(error)", sourceLocation: sourceLocation)
    #expect((error.underlying as? POSIXError)?.code == posix, "underlying \(String(describing: error.underlying))", sourceLocation: sourceLocation)
    #expect(error.protectedStoreError?.kind == kind, sourceLocation: sourceLocation)
}

/// Asserts that a container call throws a `CocoaError` carrying a library error of `kind`.
@discardableResult
func expectCocoaError<R>(_ kind: ProtectedStoreError.Kind, sourceLocation: SourceLocation = #_sourceLocation,
                         _ body: () throws -> R) -> CocoaError? {
    let error = caught(CocoaError.self, expected: "CocoaError(\(kind))", sourceLocation: sourceLocation, body)
    if let error {
        #expect(error.protectedStoreError?.kind == kind, "got \(error.protectedStoreError.map(String.init(describing:)) ?? String(describing: error))", sourceLocation: sourceLocation)
    }
    return error
}

/// Asserts that `body` throws a `ProtectedStoreError` of `kind` and returns it.
@discardableResult
func expectError<R>(_ kind: ProtectedStoreError.Kind, sourceLocation: SourceLocation = #_sourceLocation,
                    _ body: () throws -> R) -> ProtectedStoreError? {
    let error = caught(ProtectedStoreError.self, expected: "ProtectedStoreError(\(kind))", sourceLocation: sourceLocation, body)
    if let error { #expect(error.kind == kind, "got \(error)", sourceLocation: sourceLocation) }
    return error
}

func readRaw(_ path: String) -> [UInt8] { Array(FileManager.default.contents(atPath: path)!) }
func writeRaw(_ bytes: [UInt8], _ path: String) { precondition(FileManager.default.createFile(atPath: path, contents: Data(bytes))) }

/// A deterministic byte pattern that never repeats within a block; filled in place because a
/// closure per byte dominated the large-file tests under the sanitizers.
func pattern(_ count: Int, seed: UInt8 = 0) -> [UInt8] {
    [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        for index in 0..<count {
            buffer[index] = UInt8(truncatingIfNeeded: index &* 31 &+ Int(seed) &+ index >> 8)
        }
        initialized = count
    }
}

extension Array where Element == UInt8 {
    func contains(subsequence needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, needle.count <= count else { return needle.isEmpty }
        return (0...(count - needle.count)).contains { start in self[start..<start + needle.count].elementsEqual(needle) }
    }
}

extension Device {
    /// Writes a standalone encrypted file at an absolute path (file-format tests; apps use containers).
    func writeFile(_ contents: [UInt8], to path: String, protection protectionClass: ProtectionClass = .complete) throws {
        unlink(path)
        let file = try EncryptedFile.create(at: path, protectionClass: protectionClass, keys: self)
        defer { try? file.close() }
        try file.write(contents, at: 0)
        try file.synchronize()
    }

    /// Reads a standalone encrypted file.
    func readFile(at path: String) throws -> [UInt8] {
        let file = try EncryptedFile.open(at: path, keys: self, writable: false)
        defer { try? file.close() }
        return try file.readAll()
    }
}
