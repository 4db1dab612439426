import Foundation
import ProtectedStoreCore
import SystemPackage

/// One file in a container's Documents/Inbox, with what its delivery recorded.
public struct InboxItem: Sendable {
    /// Where its open-URL event stands.
    public enum State: String, Sendable, Codable {
        /// Delivered; its event waits for protected data and a program receiving the container's events.
        case pendingEvent = "pending-event"
        /// Its event was handled by the container's observers.
        case delivered
        /// No delivery record (it was recorded by nothing, or the record was lost).
        case unrecorded
    }

    /// The item's name in the Inbox.
    public let name: String
    /// Its path relative to the container.
    public let path: String
    /// Whether the app has been told about the item yet.
    public let state: State
    /// The sending app's bundle identifier, if given.
    public let sourceApplication: String?
    /// The sender's annotation as JSON text, if given.
    public let annotationJSON: String?
    /// Plaintext size in bytes.
    public let size: UInt64
    /// The item's class now.
    public let protection: FileProtectionType?
    /// Sealed for class B because it was delivered while locked; takes the container's default class at its first unlocked open.
    public let awaitsDefaultClass: Bool
    /// Its place in delivery order, if recorded.
    public let sequenceNumber: UInt64?
    /// When it was delivered, if recorded.
    public let deliveryDate: Date?
    /// Why its class or size could not be read, if so.
    public let problem: String?

    /// `protection` as the library's class enum.
    public var protectionClass: ProtectionClass? { protection.flatMap(ProtectionClass.init) }
}

extension Container {
    // MARK: Delivering

    /// Hands a local file to the app, as AirDrop or a document interaction does: it is streamed in constant memory into
    /// `Documents/Inbox/` under a free name (`report-1.pdf` when `report.pdf` is taken; `name` defaults to the source's),
    /// encrypted, and renamed into place whole, so no reader sees part of it. Then an open-URL event is recorded for the
    /// container's receiver (see `addOpenURLDelegate`). Unlocked, the item takes the Inbox's class (the container default);
    /// locked or before first unlock it is sealed for class B and takes that class at its first unlocked open.
    /// `annotationJSON` is any JSON value that fits a property list. `progress` is called with the bytes written so far.
    @discardableResult
    public func deliverToInbox(fileAtPath sourcePath: String, name: String? = nil, sourceApplication: String? = nil, annotationJSON: String? = nil,
                               progress: ((_ bytesWritten: UInt64, _ totalBytes: UInt64) -> Void)? = nil) throws -> InboxItem {
        try foundationErrors(writing: true) {
            let (itemName, annotation) = try Self.checkedDelivery(name: name, sourcePath: sourcePath, sourceApplication: sourceApplication, annotationJSON: annotationJSON)
            let source = try InboxSource(path: sourcePath)
            defer { source.close() }
            let inbox = try directory.openDirectory(inboxPath)
            let (staged, size, sealedClass) = try stage(source, named: itemName, in: inbox, progress: progress)
            do {
                let (entry, unsynced) = try commit(staged, named: itemName, in: inbox, size: size, sourceApplication: sourceApplication, annotation: annotation)
                // Delivered; not durable yet, which is reported as before.
                if let unsynced { throw unsynced }
                return InboxItem(name: entry.name, path: "\(Self.documentsInbox)/\(entry.name)", state: .pendingEvent, sourceApplication: sourceApplication,
                                 annotationJSON: annotation, size: entry.size, protection: sealedClass.protection.fileProtectionType,
                                 awaitsDefaultClass: sealedClass.awaitsDefaultClass, sequenceNumber: entry.sequence, deliveryDate: entry.deliveredAt, problem: nil)
            } catch {
                staged.unlink()
                throw error
            }
        }
    }

    /// Streams the source into a hidden file in the Inbox. Unlocked, under the Inbox's class; if the device is locked,
    /// or locks part-way (a class A key discarded), sealed for class B from the start instead.
    private func stage(_ source: InboxSource, named name: String, in inbox: OpenDirectory, progress: ((UInt64, UInt64) -> Void)?) throws
        -> (FileLocation, UInt64, (protection: ProtectionClass, awaitsDefaultClass: Bool)) {
        let target = try inheritedClass(in: inbox)
        let displayPath = directory.displayPath(inboxPath.appending(name))
        if device.state == .unlocked || target == .completeUnlessOpen {
            do {
                let (staged, size) = try stream(source, to: displayPath, in: inbox, protectionClass: target, flags: [], progress: progress)
                return (staged, size, (target, false))
            } catch let error as ProtectedStoreError where error.kind == .protectedDataUnavailable && target != .completeUnlessOpen {
                // Locked meanwhile: deliver anyway, as a locked device does.
            }
        }
        let (staged, size) = try stream(source, to: displayPath, in: inbox, protectionClass: .completeUnlessOpen, flags: .awaitsDefaultClass, progress: progress)
        return (staged, size, (.completeUnlessOpen, true))
    }

    /// Streams the source into a hidden file; returns it and the bytes written. Errors name the source and the target.
    private func stream(_ source: InboxSource, to displayPath: String, in inbox: OpenDirectory, protectionClass: ProtectionClass, flags: FileHeader.Flags,
                        progress: ((UInt64, UInt64) -> Void)?) throws -> (FileLocation, UInt64) {
        let staged = try inbox.location(".", displayPath: displayPath).temporarySibling()
        let file = try EncryptedFile.create(at: staged, protectionClass: protectionClass, flags: flags, keys: device)
        do {
            // Registered like any open file, so a lock discards a class A key mid-way.
            let handle = try ProtectedFileHandle(file: file, path: displayPath, container: self)
            defer { handle.forget() }
            let size = try PlaintextCopy(source: source.descriptor, sourcePath: source.path).copy(to: file, progress: progress)
            try file.synchronize()
            try file.close()
            return (staged, size)
        } catch let error as ProtectedStoreError {
            try? file.close()
            staged.unlink()
            throw ProtectedStoreError(error.kind, path: error.path, problem: "\(error.problem) (delivering \(source.path))", remedy: error.remedy, errno: error.errno)
        } catch {
            try? file.close()
            staged.unlink()
            throw error
        }
    }

    /// Records the delivery, then renames the staged file to a free name, both under the queue's lock. A crash between
    /// the two leaves a record naming the staged file, which the receiver finishes (`inboxItemExists`). Records whose
    /// item is gone (deleted, or moved out of the Inbox) are pruned here, so their names are free again. If it throws,
    /// nothing was delivered, and the staged file is kept for the caller unless its record could not be durably
    /// removed (then the staged file goes, so no receiver, nor a crash, finishes a delivery that failed). Once renamed it is delivered: a
    /// failure to make that durable is returned as `unsynced`, for the caller to report, not undone.
    func commit(_ staged: FileLocation, named wanted: String, in inbox: OpenDirectory, size: UInt64,
                sourceApplication: String?, annotation: String?) throws -> (entry: InboxQueue.Entry, unsynced: (any Error)?) {
        try inboxQueue.withLock {
            let inboxDisplay = directory.displayPath(inboxPath)
            func present(_ name: String) throws -> Bool { try inbox.location(name, displayPath: inboxDisplay).status() != nil }
            var recorded: [InboxQueue.Entry] = []
            for entry in try inboxQueue.entries() {
                if try present(entry.name) || present(entry.stagingName) { recorded.append(entry) } else { try inboxQueue.remove(entry) }
            }
            // A recorded name whose item is not there yet belongs to an interrupted delivery, finished later.
            let reserved = Set(recorded.map(\.name))
            let name = try Self.freeName(for: wanted) { try !present($0) && !reserved.contains($0) }
            let entry = InboxQueue.Entry(sequence: try inboxQueue.allocateSequence(above: recorded), name: name, stagingName: staged.name,
                                         sourceApplication: sourceApplication, annotation: annotation, size: size, deliveredAt: Date(), eventDelivered: false)
            let target = try inbox.location(name, displayPath: directory.displayPath(inboxPath.appending(name)))
            do {
                // Inside: a record that reached its place before its sync failed must be undone too.
                try inboxQueue.record(entry)
                try inboxQueue.noteRecorded(entry.sequence)
                try inbox.names.recordLongName(of: name, in: inbox.descriptor, displayPath: target.displayPath)
                try staged.rename(to: target, replacing: false)
            } catch {
                // Undone under the lock, so no receiver can finish this delivery after it failed.
                if (try? inboxQueue.remove(entry)) == nil { staged.unlink() }
                throw error
            }
            do {
                try target.synchronizeDirectory()
                return (entry, nil)
            } catch {
                return (entry, error)
            }
        }
    }

    // MARK: Listing

    /// The files in Documents/Inbox with their delivery records, in delivery order (unrecorded ones last, by name).
    public func inboxItems() throws -> [InboxItem] { try inboxListing().items }

    /// Damage in a container's record of Inbox deliveries (docs/FORMAT.md §6): its events are not delivered.
    public struct InboxQueueDamage: Sendable, Equatable {
        /// The file concerned in the container's `inbox-queue` folder.
        public let file: String
        /// What is wrong: a record that does not open, one restored from before its event was handled, a removed
        /// record (its event is lost), a removed or damaged queue state.
        public let problem: String
    }

    /// The Inbox's items, as `inboxItems()`, and the damage its delivery records show, so a listing reports it.
    public func inboxListing() throws -> (items: [InboxItem], damaged: [InboxQueueDamage]) {
        try foundationErrors(writing: false) {
            let inbox = try directory.openDirectory(inboxPath)
            // Names first: an item delivered meanwhile then has its record too.
            let listed = try names(in: inbox)
            let scan = try inboxQueue.scan()
            let records = Dictionary(scan.entries.map { ($0.name, $0) }, uniquingKeysWith: { $1 })
            let items: [InboxItem] = try listed.compactMap { name in
                let location = try inbox.location(name, displayPath: directory.displayPath(inboxPath.appending(name)))
                guard let info = try location.status(), info.st_mode & S_IFMT == S_IFREG else { return nil }
                let record = records[name]
                let (header, size, problem, _) = Self.fileDetails(at: location)
                return InboxItem(name: name, path: "\(Self.documentsInbox)/\(name)",
                                 state: record.map { $0.eventDelivered ? .delivered : .pendingEvent } ?? .unrecorded,
                                 sourceApplication: record?.sourceApplication, annotationJSON: record?.annotation, size: size,
                                 protection: header?.protectionClass.fileProtectionType, awaitsDefaultClass: header?.flags.contains(.awaitsDefaultClass) ?? false,
                                 sequenceNumber: record?.sequence, deliveryDate: record?.deliveredAt, problem: problem)
            }
            return (items.sorted { ($0.sequenceNumber ?? .max, $0.name) < ($1.sequenceNumber ?? .max, $1.name) },
                    scan.damage.map { InboxQueueDamage(file: $0.file, problem: $0.problem) })
        }
    }

    // MARK: Receiving (used by InboxReceiver)

    /// This program's receiver of the container's open-URL events, made when the first observer registers.
    var inboxReceiver: InboxReceiver {
        receiverLock.withLock {
            if let receiver { return receiver }
            let made = InboxReceiver(container: self)
            receiver = made
            return made
        }
    }

    /// Whether a claimed item is in the Inbox, finishing a delivery interrupted after its record was written. A record
    /// whose item is gone (deleted or moved out before its event) is dropped: there is nothing left to open.
    func inboxItemExists(_ claim: InboxQueue.Claim) throws -> Bool {
        let entry = claim.entry
        let inbox = try directory.openDirectory(inboxPath)
        let item = try inbox.location(entry.name, displayPath: directory.displayPath(inboxPath.appending(entry.name)))
        if try item.status() != nil { return true }
        return try inboxQueue.withLock {
            // A delivery that failed removed its record under this lock: nothing to finish.
            guard inboxQueue.isStillRecorded(claim) else { return false }
            if try item.status() != nil { return true }
            let staged = try inbox.location(entry.stagingName, displayPath: item.displayPath)
            if try staged.status() != nil {
                try inbox.names.recordLongName(of: entry.name, in: inbox.descriptor, displayPath: item.displayPath)
                try staged.rename(to: item, replacing: false)
                try item.synchronizeDirectory()
                return true
            }
            try inboxQueue.remove(entry)
            return false
        }
    }

    /// The open-URL event of an item already in the Inbox (`sandboxctl open`): nil without its delivery record.
    package func openURLRequest(for item: InboxItem) -> OpenURLRequest? {
        guard let sequence = item.sequenceNumber else { return nil }
        return OpenURLRequest(url: URL(fileURLWithPath: (dataPath as NSString).appendingPathComponent(item.path)), path: item.path,
                              sourceApplication: item.sourceApplication, annotationJSON: item.annotationJSON, sequenceNumber: sequence)
    }

    func openURLRequest(for entry: InboxQueue.Entry) -> OpenURLRequest {
        let path = "\(Self.documentsInbox)/\(entry.name)"
        return OpenURLRequest(url: URL(fileURLWithPath: (dataPath as NSString).appendingPathComponent(path)), path: path,
                              sourceApplication: entry.sourceApplication, annotationJSON: entry.annotation, sequenceNumber: entry.sequence)
    }

    // MARK: Rules

    /// Documents/Inbox is read-and-delete only, as on iOS: creating, writing, truncating, renaming into it and changing a
    /// class there are refused whatever the lock state. Moving an item out is the way to edit it.
    package func refuseInboxChange(_ path: ContainerPath, displayPath: String, doing action: String) throws {
        guard path.isWithin(inboxPath) else { return }
        throw ProtectedStoreError(.permissionDenied, path: displayPath, problem: "Documents/Inbox is read-and-delete only: nothing in it can be \(action)",
                                  remedy: "Move the item out of Documents/Inbox (for example to Documents) and change it there", errno: .permissionDenied)
    }

    /// An item delivered while locked takes the class it would have had unlocked, the Inbox's (the container default),
    /// at its first open with the device unlocked, wherever it has been moved since.
    package func adoptDefaultClass(_ item: ResolvedItem) throws {
        let file = try EncryptedFile.open(at: item.location, keys: device, writable: true)
        defer { try? file.close() }
        // Another program may have done it since this one looked.
        guard file.awaitsDefaultClass else { return }
        try changeClass(of: file, to: try inheritedClass(in: try directory.openDirectory(inboxPath)))
    }

    // MARK: Checks

    /// Checks a delivery's arguments without delivering: the source is a readable regular file, the name (by default the
    /// source's) is a plain file name, the source application a bundle identifier, the annotation JSON a property list
    /// can hold. Throws a `ProtectedStoreError` naming the problem, so a batch can be checked before any file is delivered.
    public static func checkInboxDelivery(fileAtPath sourcePath: String, name: String? = nil, sourceApplication: String? = nil,
                                          annotationJSON: String? = nil) throws {
        _ = try checkedDelivery(name: name, sourcePath: sourcePath, sourceApplication: sourceApplication, annotationJSON: annotationJSON)
        try InboxSource(path: sourcePath).close()
    }

    private static func checkedDelivery(name: String?, sourcePath: String, sourceApplication: String?, annotationJSON: String?) throws
        -> (name: String, annotation: String?) {
        let itemName = try checkedInboxName(name ?? (sourcePath as NSString).lastPathComponent, source: sourcePath)
        if let sourceApplication { try checkSourceApplication(sourceApplication) }
        return (itemName, try annotationJSON.map(checkedAnnotation))
    }

    /// Longest annotation accepted, in UTF-8 bytes; it is kept in the delivery record.
    static let maximumAnnotationBytes = 16 * 1024

    /// An item name as a sender may give it: one non-empty path component, not reserved.
    package static func checkedInboxName(_ name: String, source: String) throws -> String {
        func reject(_ problem: String) -> ProtectedStoreError {
            ProtectedStoreError(.invalidArgument, path: source, problem: problem, remedy: "Rename the file (or pass another name) to a plain file name, such as report.pdf")
        }
        guard !name.isEmpty else { throw reject("the item name is empty") }
        guard !name.utf8.contains(0) else { throw reject("the item name contains a NUL byte") }
        guard name != ".", name != ".." else { throw reject("the item name \"\(name)\" is not a file name") }
        guard !name.containsSlash else { throw reject("the item name \"\(name.prefix(60))\" contains \"/\"") }
        // Names end up in terminals and line-based output: no control characters or reordering marks to forge them with.
        if let bad = name.unicodeScalars.first(where: { $0.properties.generalCategory == .control || (0x202A...0x202E).contains($0.value) || (0x2066...0x2069).contains($0.value) }) {
            throw reject("the item name contains the control character U+\(String(bad.value, radix: 16, uppercase: true))")
        }
        guard name.utf8.count <= ContainerPath.maximumNameBytes else {
            throw reject("the item name is \(name.utf8.count) bytes long; the limit is \(ContainerPath.maximumNameBytes)")
        }
        guard !name.hasPrefix(ContainerPath.reservedPrefix) else {
            throw reject("names starting with \"\(ContainerPath.reservedPrefix)\" are reserved for ProtectedStore's own files")
        }
        return name
    }

    package static func checkSourceApplication(_ identifier: String) throws {
        do {
            try validate(bundleIdentifier: identifier)
        } catch let error as ProtectedStoreError {
            throw ProtectedStoreError(.invalidArgument, path: identifier, problem: "the source application is not a bundle identifier (\(error.problem))", remedy: error.remedy)
        }
    }

    /// The annotation re-encoded compactly, once checked: valid JSON, within the size limit, and nothing a property
    /// list can't hold (null).
    package static func checkedAnnotation(_ json: String) throws -> String {
        func reject(_ problem: String) -> ProtectedStoreError {
            ProtectedStoreError(.invalidArgument, problem: "the annotation \(problem)",
                                remedy: "Pass a JSON value without null, such as '{\"subject\": \"Q3 report\", \"pages\": 12}'")
        }
        guard json.utf8.count <= maximumAnnotationBytes else { throw reject("is \(json.utf8.count) bytes long; the limit is \(maximumAnnotationBytes)") }
        let value: Any
        do {
            value = try JSONSerialization.jsonObject(with: Data(json.utf8), options: .fragmentsAllowed)
        } catch {
            throw reject("is not valid JSON")
        }
        if let where_ = nullLocation(in: value, at: "") { throw reject("holds null\(where_.isEmpty ? "" : " at \(where_)"), which a property list can't") }
        let data = try JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed, .sortedKeys, .withoutEscapingSlashes])
        return String(decoding: data, as: UTF8.self)
    }

    private static func nullLocation(in value: Any, at path: String) -> String? {
        switch value {
        case is NSNull:
            return path
        case let array as [Any]:
            return array.enumerated().lazy.compactMap { nullLocation(in: $0.element, at: "\(path)[\($0.offset)]") }.first
        case let dictionary as [String: Any]:
            return dictionary.sorted { $0.key < $1.key }.lazy.compactMap { nullLocation(in: $0.value, at: "\(path).\($0.key)") }.first
        default:
            return nil
        }
    }

    /// `wanted`, else `stem-1.ext`, `stem-2.ext`… (shortening the stem to stay within the name limit), the first `isFree` accepts.
    static func freeName(for wanted: String, isFree: (String) throws -> Bool) throws -> String {
        if try isFree(wanted) { return wanted }
        let ext = (wanted as NSString).pathExtension
        // A dotfile such as ".profile" is all stem.
        let hasExtension = !ext.isEmpty && wanted.count > ext.count + 1
        let stem = hasExtension ? String(wanted.dropLast(ext.count + 1)) : wanted
        let suffix = hasExtension ? ".\(ext)" : ""
        for number in 1...10_000 {
            var shortened = stem
            var candidate: String { "\(shortened)-\(number)\(suffix)" }
            while candidate.utf8.count > ContainerPath.maximumNameBytes, !shortened.isEmpty { shortened.removeLast() }
            if try isFree(candidate) { return candidate }
        }
        throw ProtectedStoreError(.alreadyExists, path: wanted, problem: "the Inbox already holds \(wanted) and 10 000 numbered variants",
                                  remedy: "Delete items from the Inbox, or deliver under another name")
    }
}

/// The local file being delivered, open for reading: a regular file (checked when opened).
struct InboxSource {
    let path: String
    let descriptor: FileDescriptor

    init(path: String) throws {
        descriptor = try FileLocation(path: path).openRegularFile(.readOnly, doing: "open the file to deliver")
        self.path = path
    }

    func close() { try? descriptor.close() }
}
