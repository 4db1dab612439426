import Foundation
import ProtectedStoreCore
import SystemPackage

/// The durable record of a container's Inbox deliveries and their open-URL events (docs/FORMAT.md §6).
///
/// One small sealed JSON record per delivered item, `<container>/inbox-queue/<sequence>.sealed`, outside the container's data
/// and encrypted under its name key, as the names in it are:
/// the sequence number fixes delivery order, the file survives crashes, daemon restarts and reboots, and a flock on
/// it makes exactly one program deliver its event. Deliveries allocate numbers and names under `queue.lock`.
package struct InboxQueue: Sendable {
    /// One delivered item.
    package struct Entry: Codable, Sendable, Equatable {
        package var sequence: UInt64
        /// The item's name in Documents/Inbox.
        package var name: String
        /// The hidden name it was written under, so a delivery interrupted between recording and renaming can be finished.
        package var stagingName: String
        package var sourceApplication: String?
        /// A JSON value that fits a property list, as the sender gave it.
        package var annotation: String?
        /// Plaintext bytes.
        package var size: UInt64
        package var deliveredAt: Date
        /// Whether its open-URL event has been handled by the container's observers.
        package var eventDelivered: Bool
    }

    /// An entry whose event this program is delivering: the flock keeps every other program off it until `finish`.
    final class Claim {
        fileprivate let descriptor: FileDescriptor
        let entry: Entry

        fileprivate init(descriptor: FileDescriptor, entry: Entry) {
            self.descriptor = descriptor
            self.entry = entry
        }

        deinit { try? descriptor.close() }
    }

    static let directoryName = "inbox-queue"
    static let lockName = "queue.lock"

    /// The queue directory.
    let path: String
    /// Names the container in errors.
    let bundleIdentifier: String
    /// Seals the records: they hold names, which are never stored in clear.
    let cipher: NameCipher

    init(containerPath: String, bundleIdentifier: String, cipher: NameCipher) {
        path = (containerPath as NSString).appendingPathComponent(Self.directoryName)
        self.bundleIdentifier = bundleIdentifier
        self.cipher = cipher
    }

    private func location(_ name: String) -> FileLocation {
        FileLocation(path: (path as NSString).appendingPathComponent(name))
    }

    private static let recordSuffix = ".sealed"

    private static func fileName(_ sequence: UInt64) -> String { String(format: "%020llu", sequence) + recordSuffix }

    /// What a record's sealing binds it to: its sequence number, so records can't be swapped between files.
    private static func context(_ sequence: UInt64) -> [UInt8] { Array("inbox-queue".utf8) + withUnsafeBytes(of: sequence.littleEndian, Array.init) }

    /// Creates the directory if this container has had no delivery yet.
    func prepare() throws {
        guard try !FileSystem.exists(path) else { return }
        try FileSystem.createDirectories(path)
    }

    /// Runs `body` holding the queue's lock, which serialises deliveries and repairs against each other.
    func withLock<R>(_ body: () throws -> R) throws -> R {
        try prepare()
        // Read-only once it exists: closing it then raises no inotify write event to wake the receivers.
        let lockLocation = location(Self.lockName)
        if try lockLocation.status() == nil {
            try? lockLocation.open(.writeOnly, options: [.create], permissions: [.ownerReadWrite], doing: "create the Inbox queue lock").close()
        }
        let lock = try lockLocation.open(.readOnly, doing: "open the Inbox queue lock")
        return try lock.closeAfter {
            while flock(lock.rawValue, LOCK_EX) != 0 {
                guard Foundation.errno == EINTR else {
                    throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "lock the Inbox queue")
                }
            }
            return try body()
        }
    }

    /// Every entry, in delivery order. One that does not decode, or names its item in a way no delivery writes, is
    /// skipped: it names nothing deliverable. Failures to read are errors, so no entry is mistaken for absent.
    package func entries() throws -> [Entry] {
        guard try FileSystem.exists(path) else { return [] }
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: path)
        } catch {
            throw ProtectedStoreError(.io, path: path, problem: "cannot list the Inbox queue (\(error.localizedDescription))", remedy: "Check the permissions of the device root")
        }
        return try names.filter { $0.hasSuffix(Self.recordSuffix) && !$0.hasPrefix(".") }
            .compactMap { name in
                do {
                    return try read(location(name))
                } catch let error as ProtectedStoreError where error.kind == .notFound {
                    return nil  // removed since the listing
                }
            }
            .sorted { $0.sequence < $1.sequence }
    }

    /// The number for the next delivery: above every number ever given, also those of records since pruned. Caller holds the lock.
    func allocateSequence(above recorded: [Entry]) throws -> UInt64 {
        let counter = location(Self.counterName)
        let stored = try counter.status() == nil ? 0 : UInt64(String(decoding: try counter.readPrefix(count: 32, what: "Inbox sequence counter"), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        let next = max(stored, recorded.last?.sequence ?? 0) + 1
        try FileSystem.writeAtomically(Array("\(next)\n".utf8), to: counter, replacing: true)
        return next
    }

    static let counterName = "sequence"

    /// Records a new entry durably; an existing record of that number is never overwritten.
    func record(_ entry: Entry) throws { try write(entry, replacing: false) }

    private func write(_ entry: Entry, replacing: Bool) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = .sortedKeys
        var json = Array(try encoder.encode(entry))
        defer { zeroize(&json) }
        try FileSystem.writeAtomically(try cipher.sealedRecord(json, context: Self.context(entry.sequence)),
                                       to: location(Self.fileName(entry.sequence)), replacing: replacing)
    }

    private func read(_ entryLocation: FileLocation) throws -> Entry? {
        let fileName = (entryLocation.name as NSString).lastPathComponent
        guard let sequence = UInt64(fileName.dropLast(Self.recordSuffix.count)) else { return nil }
        let sealed = try entryLocation.readPrefix(count: 64 << 10, what: "Inbox queue entry")
        // One that does not open (modified, or from another container) names nothing deliverable.
        guard let json = cipher.record(fromSealed: sealed, context: Self.context(sequence)) else { return nil }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        guard let entry = try? decoder.decode(Entry.self, from: Data(json)), entry.sequence == sequence else { return nil }
        // Checked again before any file operation uses them, as any input is.
        guard ContainerPath.isPlainName(entry.name), entry.stagingName.hasPrefix(FileSystem.temporaryPrefix),
              !entry.stagingName.containsSlash, !entry.stagingName.utf8.contains(0) else { return nil }
        return entry
    }

    /// Forgets an entry durably.
    func remove(_ entry: Entry) throws {
        let entryLocation = location(Self.fileName(entry.sequence))
        guard unlink(entryLocation.name) == 0 || Foundation.errno == ENOENT else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: entryLocation.displayPath, doing: "remove the Inbox queue entry")
        }
        try entryLocation.synchronizeDirectory()
    }

    /// Takes `entry` for delivery if its event is still pending and no other program has it; nil otherwise.
    func claim(_ entry: Entry) throws -> Claim? {
        let entryLocation = location(Self.fileName(entry.sequence))
        let descriptor: FileDescriptor
        do {
            descriptor = try entryLocation.open(.readOnly, doing: "open the Inbox queue entry")
        } catch let error as ProtectedStoreError where error.kind == .notFound {
            return nil
        }
        var keep = false
        defer { if !keep { try? descriptor.close() } }
        guard flock(descriptor.rawValue, LOCK_EX | LOCK_NB) == 0 else { return nil }
        // Marking an entry delivered replaces its file: a lock won on the replaced one guards nothing.
        var opened = stat(), current = stat()
        guard fstat(descriptor.rawValue, &opened) == 0, stat(entryLocation.name, &current) == 0,
              opened.st_ino == current.st_ino, opened.st_dev == current.st_dev else { return nil }
        guard let fresh = try read(entryLocation), !fresh.eventDelivered else { return nil }
        keep = true
        return Claim(descriptor: descriptor, entry: fresh)
    }

    /// Whether the claimed entry is still recorded (a failed delivery or a repair may have removed it meanwhile).
    func isStillRecorded(_ claim: Claim) -> Bool {
        var info = stat()
        return fstat(claim.descriptor.rawValue, &info) == 0 && info.st_nlink > 0
    }

    /// Records that the claimed entry's event was handled; a record removed meanwhile stays removed.
    func finish(_ claim: Claim) throws {
        var delivered = claim.entry
        delivered.eventDelivered = true
        try withLock {
            guard isStillRecorded(claim) else { return }
            try write(delivered, replacing: true)
        }
    }
}
