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
    private let staged: FileLocation
    private let file: EncryptedFile
    private let handle: ProtectedFileHandle
    private let lock = NSLock()
    private enum State { case writing, delivering, delivered, discarded }
    private var state = State.writing
    private var whyDiscarded: String?

    fileprivate init(container: Container) throws {
        self.container = container
        inbox = try container.directory.openDirectory(container.inboxPath)
        let displayPath = container.directory.displayPath(container.inboxPath)
        staged = FileLocation(directory: inbox.descriptor, name: "\(Self.stagingPrefix)\(getpid())-\(Random.bytes(8).hex)", displayPath: displayPath)
        file = try EncryptedFile.create(at: staged, protectionClass: .completeUnlessOpen, flags: .awaitsDefaultClass, keys: container.device)
        do {
            handle = try ProtectedFileHandle(file: file, path: displayPath, container: container)
        } catch {
            try? file.close()
            staged.unlink()
            throw error
        }
    }

    deinit { discard() }

    /// Bytes written so far (the highest offset reached).
    package var size: Int64 { file.size }

    /// Writes `bytes` at `offset` (a gap before it reads as zeros).
    package func write(from bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        try foundationErrors(writing: true) { try file.write(from: bytes, at: offset) }
    }

    /// Cuts or extends the file to `size` bytes.
    package func truncate(to size: Int64) throws {
        try foundationErrors(writing: true) { try file.truncate(to: size) }
    }

    /// Makes what was written so far durable (the writer's fsync); it is still not delivered.
    package func synchronize() throws {
        try foundationErrors(writing: true) { try file.synchronize() }
    }

    /// Delivers the file into the Inbox under `name` (or a free variant of it), with an open-URL event carrying
    /// `sourceApplication` and `annotationJSON`, checked as `deliverToInbox` checks them. If it throws, `isDeliverable`
    /// says whether the drop is as it was, nothing delivered (its class may be the Inbox's now): write on, or deliver
    /// again; else `isDelivered` says whether it was delivered (only the Inbox's sync failed) or, with
    /// `discardReason`, why it was discarded.
    @discardableResult
    package func deliver(named name: String, sourceApplication: String?, annotationJSON: String?) throws -> InboxItem {
        try foundationErrors(writing: true) {
            let started = lock.withLock {
                guard state == .writing else { return false }
                state = .delivering
                return true
            }
            guard started else {
                throw ProtectedStoreError(.invalidArgument, path: staged.displayPath, problem: "this drop was already delivered or discarded",
                                          remedy: "Start a new drop")
            }
            let itemName: String, annotation: String?, target: ProtectionClass
            do {
                itemName = try Container.checkedInboxName(name, source: container.directory.displayPath(container.inboxPath.appending(name)))
                if let sourceApplication { try Container.checkSourceApplication(sourceApplication) }
                annotation = try annotationJSON.map(Container.checkedAnnotation)
                target = try container.inheritedClass(in: inbox)
            } catch {
                lock.withLock { state = .writing }
                throw error
            }
            // After a failed sync Linux may have dropped the pages it could not write and marked them clean: a second
            // sync would succeed over missing blocks, so such a file can't be trusted to be whole.
            let lostBytes = "so its bytes may not all be on disk"
            let sealedClass: (protection: ProtectionClass, awaitsDefaultClass: Bool)
            do {
                sealedClass = try takeInboxClass(target)
            } catch {
                // Still awaiting its class: the new header was never written (sealing it failed), so nothing changed.
                if file.awaitsDefaultClass {
                    lock.withLock { state = .writing }
                } else {
                    discardAfterFailure("the sync of its new header failed, \(lostBytes)")
                }
                throw error
            }
            do {
                try file.synchronize()
            } catch {
                discardAfterFailure("a sync of it failed, \(lostBytes)")
                throw error
            }
            do {
                // Stored now, so nothing is written to the item once it is delivered (close would).
                try file.storeSynchronizedRecord()
            } catch {
                discardAfterFailure("its length record could not be stored")
                throw error
            }
            let committed: (entry: InboxQueue.Entry, unsynced: (any Error)?)
            do {
                // Renamed while still open: a failure leaves the drop whole, open and writable.
                committed = try container.commit(staged, named: itemName, in: inbox, size: UInt64(file.size), sourceApplication: sourceApplication,
                                                 annotation: annotation)
            } catch {
                // Unless it is known to be gone (commit removed it with a record it could not remove), it is kept.
                if (try? staged.status() == nil) == true {
                    discardAfterFailure("its delivery record could not be undone, so it went with it")
                } else {
                    lock.withLock { state = .writing }
                }
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

    /// Why a failed delivery discarded the drop, if it did.
    package var discardReason: String? { lock.withLock { whyDiscarded } }

    /// Re-wraps the file for the Inbox's class `target` if the device lets it now (unlocked, or the class is B);
    /// else it stays sealed for class B, awaiting the class, as a locked device delivers.
    private func takeInboxClass(_ target: ProtectionClass) throws -> (protection: ProtectionClass, awaitsDefaultClass: Bool) {
        guard file.awaitsDefaultClass else { return (file.protectionClass, false) }
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

    private func discardAfterFailure(_ reason: String) {
        lock.withLock {
            state = .discarded
            whyDiscarded = reason
        }
        removeStaged()
    }

    private func removeStaged() {
        closeFile()
        staged.unlink()
    }

    private func closeFile() {
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
        removeStaged()
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
