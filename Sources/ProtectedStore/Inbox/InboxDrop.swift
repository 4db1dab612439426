import Foundation
import ProtectedStoreCore
import SystemPackage

/// A file written into an app's Inbox piece by piece, by a program that knows nothing of ProtectedStore (the drop
/// folder of `sandboxctl inbox mount`): staged as a hidden file in `Documents/Inbox/`, encrypted as it is written (at
/// any offsets, in constant memory), and delivered whole by `deliver(named:sourceApplication:annotationJSON:)`, exactly
/// as `deliverToInbox` delivers a local file. It is sealed for class B while written, so drops work locked and before
/// first unlock; unlocked at delivery, it takes the Inbox's class then (one header rewrite).
package final class InboxDrop: @unchecked Sendable {
    /// Staging names of drops start with this and the writing process's id, so a later drop mount sweeps only the
    /// leftovers of processes that are gone (`Container.recoverAbandonedInboxDrops()`).
    static let stagingPrefix = "\(FileSystem.temporaryPrefix)drop-"

    private let container: Container
    private let inbox: OpenDirectory
    private let displayPath: String
    /// The staged file, the open file and its registration with the lock. Replaced only by a fresh copy after a
    /// failed sync (`deliver`), while no program has the file open, but read by `size` at any time: under `lock`.
    private var staged: FileLocation
    private var file: EncryptedFile
    private var handle: ProtectedFileHandle
    private let lock = NSLock()
    private enum State { case writing, delivering, delivered, discarded }
    private var state = State.writing
    /// A sync of the file failed in an earlier delivery: Linux may have dropped the pages it could not write and
    /// marked them clean, so a later sync would succeed over missing blocks. The next delivery copies the file first.
    private var needsFreshCopy = false

    fileprivate init(container: Container) throws {
        self.container = container
        inbox = try container.directory.openDirectory(container.inboxPath)
        displayPath = container.directory.displayPath(container.inboxPath)
        (staged, file, handle) = try Self.stage(in: inbox, displayPath: displayPath, container: container,
                                               protectionClass: .completeUnlessOpen, flags: .awaitsDefaultClass)
    }

    /// A new, empty staged file, open and registered with the lock.
    private static func stage(in inbox: OpenDirectory, displayPath: String, container: Container, protectionClass: ProtectionClass,
                              flags: FileHeader.Flags) throws -> (FileLocation, EncryptedFile, ProtectedFileHandle) {
        let staged = FileLocation(directory: inbox.descriptor, name: "\(Self.stagingPrefix)\(getpid())-\(Random.bytes(8).hex)", displayPath: displayPath)
        let file = try EncryptedFile.create(at: staged, protectionClass: protectionClass, flags: flags, keys: container.device)
        do {
            return (staged, file, try ProtectedFileHandle(file: file, path: displayPath, container: container))
        } catch {
            try? file.close()
            staged.unlink()
            throw error
        }
    }

    deinit { discard() }

    private var current: (staged: FileLocation, file: EncryptedFile, handle: ProtectedFileHandle) { lock.withLock { (staged, file, handle) } }

    /// Bytes written so far (the highest offset reached).
    package var size: Int64 { current.file.size }

    /// Writes `bytes` at `offset` (a gap before it reads as zeros).
    package func write(from bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        try foundationErrors(writing: true) { try current.file.write(from: bytes, at: offset) }
    }

    /// Cuts or extends the file to `size` bytes.
    package func truncate(to size: Int64) throws {
        try foundationErrors(writing: true) { try current.file.truncate(to: size) }
    }

    /// Makes what was written so far durable (the writer's fsync); it is still not delivered.
    package func synchronize() throws {
        try foundationErrors(writing: true) { try current.file.synchronize() }
    }

    /// Delivers the file into the Inbox under `name` (or a free variant of it), with an open-URL event carrying
    /// `sourceApplication` and `annotationJSON`, checked as `deliverToInbox` checks them. If it throws, `isDeliverable`
    /// says whether the drop is as it was, nothing delivered (its class may be the Inbox's now): write on, or deliver
    /// again; else `isDelivered` whether it was delivered (only the Inbox's sync failed) or lost (see `commit`).
    @discardableResult
    package func deliver(named name: String, sourceApplication: String?, annotationJSON: String?) throws -> InboxItem {
        try foundationErrors(writing: true) {
            let started = lock.withLock {
                guard state == .writing else { return false }
                state = .delivering
                return true
            }
            guard started else {
                throw ProtectedStoreError(.invalidArgument, path: displayPath, problem: "this drop was already delivered or discarded",
                                          remedy: "Start a new drop")
            }
            let committed: (entry: InboxQueue.Entry, unsynced: (any Error)?)
            let sealedClass: (protection: ProtectionClass, awaitsDefaultClass: Bool)
            let annotation: String?
            do {
                let itemName = try Container.checkedInboxName(name, source: container.directory.displayPath(container.inboxPath.appending(name)))
                if let sourceApplication { try Container.checkSourceApplication(sourceApplication) }
                annotation = try annotationJSON.map(Container.checkedAnnotation)
                if lock.withLock({ needsFreshCopy }) { try replaceWithFreshCopy() }
                let (staged, file, _) = current
                lock.withLock { needsFreshCopy = true }
                sealedClass = try takeInboxClass(of: file)
                let size = UInt64(file.size)
                try file.synchronize()
                // Stored now, so nothing is written to the item once it is delivered (close would).
                try file.storeSynchronizedRecord()
                lock.withLock { needsFreshCopy = false }
                // Renamed while still open: a failure leaves the drop whole, open and writable.
                committed = try container.commit(staged, named: itemName, in: inbox, size: size, sourceApplication: sourceApplication, annotation: annotation)
            } catch {
                // Unless it is known to be gone (commit removed it with a record it could not remove), it is kept.
                let kept = (try? current.staged.status() == nil) != true
                lock.withLock { state = kept ? .writing : .discarded }
                if !kept { closeFile() }
                throw error
            }
            lock.withLock { state = .delivered }
            closeFile()
            if let unsynced = committed.unsynced { throw unsynced }
            let entry = committed.entry
            return InboxItem(name: entry.name, path: "\(Container.documentsInbox)/\(entry.name)", state: .pendingEvent, sourceApplication: sourceApplication,
                             annotationJSON: annotation, size: entry.size, protection: sealedClass.protection.fileProtectionType,
                             awaitsDefaultClass: sealedClass.awaitsDefaultClass, sequenceNumber: entry.sequence, deliveryDate: entry.deliveredAt, problem: nil)
        }
    }

    /// Whether the drop can still be written and delivered (not delivered, not discarded).
    package var isDeliverable: Bool { lock.withLock { state == .writing } }

    /// Whether the drop was delivered.
    package var isDelivered: Bool { lock.withLock { state == .delivered } }

    /// Re-wraps the file for the Inbox's class if the device lets it now (unlocked, or the class is B); else it stays
    /// sealed for class B, awaiting the class, as a locked device delivers.
    private func takeInboxClass(of file: EncryptedFile) throws -> (protection: ProtectionClass, awaitsDefaultClass: Bool) {
        guard file.awaitsDefaultClass else { return (file.protectionClass, false) }
        let target = try container.inheritedClass(in: inbox)
        guard container.device.state == .unlocked || target == .completeUnlessOpen else { return (.completeUnlessOpen, true) }
        do {
            // Through the container, so a class A key is registered with the lock before it is one.
            try container.changeClass(of: file, to: target)
            return (target, false)
        } catch let error as ProtectedStoreError where error.kind == .protectedDataUnavailable {
            // Locked meanwhile: delivered sealed for class B, as a locked device delivers.
            return (.completeUnlessOpen, true)
        }
    }

    /// Copies the file into a new staged file and drops the old one, after a sync of it failed. Its blocks are read
    /// and authenticated, so a block the failed sync lost fails the copy (the drop is then kept as it is) rather than
    /// reaching the Inbox.
    private func replaceWithFreshCopy() throws {
        let old = current
        let copy = try Self.stage(in: inbox, displayPath: displayPath, container: container, protectionClass: old.file.protectionClass,
                                  flags: old.file.awaitsDefaultClass ? .awaitsDefaultClass : [])
        do {
            var buffer = [UInt8](repeating: 0, count: Container.deliveryChunkBytes)
            defer { zeroize(&buffer) }
            var offset: Int64 = 0
            let size = old.file.size
            while offset < size {
                let count = try buffer.withUnsafeMutableBytes { try old.file.read(into: UnsafeMutableRawBufferPointer(rebasing: $0[0..<Int(min(Int64($0.count), size - offset))]), at: offset) }
                guard count > 0 else { break }
                try buffer.withUnsafeBytes { try copy.1.write(from: UnsafeRawBufferPointer(rebasing: $0[0..<count]), at: offset) }
                offset += Int64(count)
            }
            if copy.1.size < size { try copy.1.truncate(to: size) }
        } catch {
            copy.2.forget()
            try? copy.1.close()
            copy.0.unlink()
            throw error
        }
        lock.withLock { (staged, file, handle) = copy }
        old.handle.forget()
        try? old.file.close()
        old.staged.unlink()
    }

    private func closeFile() {
        let (_, file, handle) = current
        handle.forget()
        try? file.close()
    }

    /// Throws away what was written: nothing is delivered. Does nothing once delivering, delivered or discarded.
    package func discard() {
        let wasWriting = lock.withLock {
            guard state == .writing else { return false }
            state = .discarded
            return true
        }
        guard wasWriting else { return }
        closeFile()
        current.staged.unlink()
    }
}

extension Container {
    /// Starts a file that a program writes into the Inbox piece by piece (see `InboxDrop`).
    package func beginInboxDrop() throws -> InboxDrop {
        try foundationErrors(writing: true) { try InboxDrop(container: self) }
    }

    /// Cleans up after drop folders that were killed: a drop whose delivery record was written finishes its delivery
    /// (the rename the crash interrupted), and a staged drop that no record names is removed, once its writing process
    /// is gone. Returns how many of each.
    @discardableResult
    package func recoverAbandonedInboxDrops() throws -> (finished: Int, removed: Int) {
        try foundationErrors(writing: true) {
            let inbox = try directory.openDirectory(inboxPath)
            let displayPath = directory.displayPath(inboxPath)
            return try inboxQueue.withLock {
                func isAbandoned(_ staging: String) -> Bool {
                    guard staging.hasPrefix(InboxDrop.stagingPrefix) else { return false }
                    let owner = staging.dropFirst(InboxDrop.stagingPrefix.count).split(separator: "-").first.flatMap { pid_t($0) }
                    // A live owner is a drop folder still writing or delivering it.
                    guard let owner, owner != getpid() else { return false }
                    return kill(owner, 0) != 0 && Foundation.errno == ESRCH
                }
                var finished = 0, removed = 0
                let entries = try inboxQueue.entries()
                for entry in entries where isAbandoned(entry.stagingName) {
                    let item = try inbox.location(entry.name, displayPath: directory.displayPath(inboxPath.appending(entry.name)))
                    let staged = try inbox.location(entry.stagingName, displayPath: item.displayPath)
                    guard try item.status() == nil, try staged.status() != nil else { continue }
                    // One that can't be finished now is left for the receiver, which finishes interrupted deliveries too.
                    do {
                        try inbox.names.recordLongName(of: entry.name, in: inbox.descriptor, displayPath: item.displayPath)
                        try staged.rename(to: item, replacing: false)
                        try item.synchronizeDirectory()
                        finished += 1
                    } catch {
                        continue
                    }
                }
                let recorded = Set(entries.map(\.stagingName))
                for name in try DirectoryNames.entries(in: try inbox.reopened(), displayPath: displayPath) where isAbandoned(name) && !recorded.contains(name) {
                    FileLocation(directory: inbox.descriptor, name: name, displayPath: displayPath).unlink()
                    removed += 1
                }
                if removed > 0 { try FileLocation(directory: inbox.descriptor, name: ".", displayPath: displayPath).synchronizeDirectory() }
                return (finished, removed)
            }
        }
    }
}
