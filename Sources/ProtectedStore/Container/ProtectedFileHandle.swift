import Foundation
import ProtectedStoreCore

/// A random-access handle on one file of a container, like `FileHandle` with explicit offsets.
///
/// A class A handle stops working when the device locks (its key is discarded); a class B handle opened before the
/// lock keeps working until closed. Errors are `CocoaError`s, as Foundation's.
public final class ProtectedFileHandle: @unchecked Sendable {
    /// The file, as "bundle-id:path".
    public let path: String
    let file: EncryptedFile
    private let device: Device

    /// Wraps a file just opened or created and registers it with the device's lock.
    init(file: EncryptedFile, path: String, container: Container) throws {
        self.file = file
        self.path = path
        self.device = container.device
        do {
            try device.track(file)
        } catch {
            try? file.close()
            throw error
        }
    }

    /// Opens an existing file; one delivered to the Inbox while locked first takes its directory's class if the device is unlocked.
    convenience init(opening item: ResolvedItem, writable: Bool, container: Container) throws {
        var file = try container.openStoredFile(item, writable: writable)
        if file.awaitsDefaultClass, container.device.state == .unlocked {
            try? file.close()
            // Adopting can fail (a lock meanwhile, a read-only file system); the file then opens as it is, class B.
            try? container.adoptDefaultClass(item)
            file = try container.openStoredFile(item, writable: writable)
        }
        try self.init(file: file, path: item.displayPath, container: container)
    }

    deinit { device.forget(file) }

    /// Stops tracking the file for the lock (it is being closed by its owner).
    func forget() { device.forget(file) }

    /// The file's class.
    public var protection: FileProtectionType { file.protectionClass.fileProtectionType }

    /// Plaintext bytes per encrypted block: a write covering only part of a block reads the rest of it first.
    public var blockSize: Int { file.blockSize }

    /// Plaintext size in bytes.
    public var size: UInt64 { UInt64(file.size) }

    /// Reads up to `count` bytes at `offset`; fewer at the end of the file.
    public func read(upToCount count: Int, atOffset offset: UInt64) throws -> Data {
        try foundationErrors(writing: false) {
            guard count >= 0 else { throw invalid("a negative byte count (\(count))") }
            return Data(try file.read(at: try checked(offset), count: count))
        }
    }

    /// Writes `data` at `offset`, extending the file (with zeros in any gap, which take no space) if needed. A full
    /// disk fails it with `.fileWriteOutOfSpace` before anything changed.
    public func write(contentsOf data: Data, atOffset offset: UInt64) throws {
        try foundationErrors(writing: true) {
            let start = try checked(offset)
            try data.withUnsafeBytes { try file.write(from: $0, at: start) }
        }
    }

    /// Cuts or extends the file to `offset` bytes; extending stores nothing for the gap. A call that fails changes nothing.
    public func truncate(atOffset offset: UInt64) throws {
        try foundationErrors(writing: true) { try file.truncate(to: try checked(offset)) }
    }

    /// Makes everything written so far durable (fsync).
    public func synchronize() throws {
        try foundationErrors(writing: true) { try file.synchronize() }
    }

    /// Closes the file and zeroes its key. Further calls fail.
    public func close() throws {
        device.forget(file)
        try foundationErrors(writing: false) { try file.close() }
    }

    private func checked(_ offset: UInt64) throws -> Int64 {
        guard offset <= UInt64(Int64.max) else { throw invalid("offset \(offset) is too large") }
        return Int64(offset)
    }

    private func invalid(_ problem: String) -> ProtectedStoreError {
        ProtectedStoreError(.invalidArgument, path: path, problem: problem, remedy: "Pass a valid offset and count")
    }
}
