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
        /// Written beside the queue's sealed state (every record this version writes): such a record found without
        /// the state means the state was removed.
        package var watermarked: Bool? = nil
    }

    /// The queue's sealed state, `state.sealed` (docs/FORMAT.md §6): the highest number given and which events are
    /// handled (or withdrawn: a failed delivery, an item deleted first), so restoring an old record does not deliver
    /// its event again, and a removed record is noticed.
    package struct State: Codable, Sendable, Equatable {
        /// The highest number given to a recorded delivery.
        package var allocated: UInt64 = 0
        /// Every number up to this one is handled.
        package var handledThrough: UInt64 = 0
        /// Handled numbers above `handledThrough + 1`, ascending.
        package var handledAbove: [UInt64] = []
        /// The record being removed (its event handled or withdrawn first): one found after a power cut is the
        /// removal cut short, not a restored record.
        package var removing: UInt64? = nil
        /// Set for good when a writer had to rebuild the state (it was damaged, or removed though records were written
        /// beside it): the events it held back then count as handled, so `scan` keeps reporting it.
        package var rebuiltAfterDamage: Bool? = nil

        package func isHandled(_ sequence: UInt64) -> Bool {
            sequence <= handledThrough || handledAbove.contains(sequence)
        }

        package mutating func markHandled(_ sequence: UInt64) {
            guard !isHandled(sequence) else { return }
            handledAbove.append(sequence)
            handledAbove.sort()
            while let first = handledAbove.first, first == handledThrough + 1 {
                handledThrough = first
                handledAbove.removeFirst()
            }
            allocated = max(allocated, sequence)
        }
    }

    /// Damage the queue holds: a record that does not open, one restored from before its event was handled, a
    /// removed record, or a removed or damaged state. Its events are not delivered; `inbox list` names it.
    package struct Damage: Sendable, Equatable {
        /// The file concerned, in the queue folder.
        package var file: String
        package var problem: String
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

    /// Every entry, in delivery order, as the receivers act on it: damaged ones (`scan`) are left out, and one
    /// restored from before its event was handled counts as handled. Failures to read are errors, so no entry is
    /// mistaken for absent.
    package func entries() throws -> [Entry] { try scan().entries }

    /// Every record as stored, in delivery order, and the ones that do not read.
    private func records() throws -> (entries: [Entry], damage: [Damage]) {
        guard try FileSystem.exists(path) else { return ([], []) }
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: path)
        } catch {
            throw ProtectedStoreError(.io, path: path, problem: "cannot list the Inbox queue (\(error.localizedDescription))", remedy: "Check the permissions of the device root")
        }
        var damage: [Damage] = []
        var entries: [Entry] = []
        for name in names.sorted() where name.hasSuffix(Self.recordSuffix) && !name.hasPrefix(".") && name != Self.stateName {
            do {
                entries.append(try read(location(name)))
            } catch let error as ProtectedStoreError where error.kind == .notFound {
                continue  // removed since the listing
            } catch let error as ProtectedStoreError where error.kind == .integrity {
                damage.append(Damage(file: name, problem: error.problem))
            }
        }
        return (entries.sorted { $0.sequence < $1.sequence }, damage)
    }

    /// The entries and the damage met (docs/FORMAT.md §6). An entry whose event is held back because of damage (a
    /// replayed record, a removed state) is returned as handled.
    package func scan() throws -> (entries: [Entry], damage: [Damage]) {
        // Readers take no lock: the state read before and after the records must agree, or a writer was between
        // them (a record rewritten, added or removed beside its state) and the snapshot is taken again.
        var attempt = 0
        while true {
            attempt += 1
            let before = try? readState()
            let snapshot = try records()
            let after = try? readState()
            if before == after || attempt == 8 { return try check(snapshot) }
        }
    }

    private func check(_ snapshot: (entries: [Entry], damage: [Damage])) throws -> (entries: [Entry], damage: [Damage]) {
        var (entries, damage) = snapshot
        let state: State
        do {
            if let stored = try readState() {
                state = stored
            } else if entries.contains(where: { $0.watermarked == true }) {
                damage.append(Damage(file: Self.stateName, problem: "the queue's sealed state is missing though its records were written with it: it was removed, so a restored record can't be told from a pending one; no pending event is delivered"))
                return (entries.map { var held = $0; held.eventDelivered = true; return held }, damage)
            } else {
                return (entries, damage)  // a queue from before the state was kept: nothing to check against
            }
        } catch let error as ProtectedStoreError where error.kind == .integrity {
            damage.append(Damage(file: Self.stateName, problem: error.problem + "; no pending event is delivered"))
            return (entries.map { var held = $0; held.eventDelivered = true; return held }, damage)
        }
        for index in entries.indices where !entries[index].eventDelivered && state.isHandled(entries[index].sequence) {
            entries[index].eventDelivered = true
            if entries[index].sequence == state.removing { continue }
            damage.append(Damage(file: Self.fileName(entries[index].sequence), problem: "the record says its open-URL event is pending, but the queue's state has it handled: the record was restored from before (a replay); its event is not delivered again"))
        }
        if state.rebuiltAfterDamage == true {
            damage.append(Damage(file: Self.stateName, problem: "the queue's sealed state was rebuilt after it was found damaged or removed: the events then held back count as handled"))
        }
        // A record that does not open is already reported; it is not also a removed one.
        let recorded = Set(entries.map(\.sequence) + snapshot.damage.compactMap { UInt64($0.file.dropLast(Self.recordSuffix.count)) })
        if state.allocated > state.handledThrough {
            for sequence in (state.handledThrough + 1)...state.allocated where !state.isHandled(sequence) && !recorded.contains(sequence) {
                damage.append(Damage(file: Self.fileName(sequence), problem: "the record of delivery #\(sequence) is missing though its open-URL event was never handled: it was removed, and the event is lost"))
            }
        }
        return (entries, damage)
    }

    /// The number for the next delivery: above every number ever given, also those of records since pruned. Caller
    /// holds the lock, and calls `noteRecorded` once the record is durable.
    func allocateSequence(above recorded: [Entry]) throws -> UInt64 {
        let state = try currentState(recorded: recorded)
        // The state exists before the first record written beside it, so a record found without it means removal.
        if try storedState() == nil { try store(state) }
        return max(state.allocated, recorded.last?.sequence ?? 0) + 1
    }

    /// The counter of format v2 queues before the sealed state: the highest number given, in clear.
    static let legacyCounterName = "sequence"
    static let stateName = "state.sealed"

    /// Records a new entry durably; an existing record of that number is never overwritten.
    func record(_ entry: Entry) throws { try write(entry, replacing: false) }

    /// After a new record is durable: the state counts its number as given. Caller holds the lock.
    func noteRecorded(_ sequence: UInt64) throws {
        try updateState { $0.allocated = max($0.allocated, sequence) }
    }

    private func write(_ entry: Entry, replacing: Bool) throws {
        var entry = entry
        entry.watermarked = true
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = .sortedKeys
        var json = Array(try encoder.encode(entry))
        defer { zeroize(&json) }
        try FileSystem.writeAtomically(try cipher.sealedRecord(json, context: Self.context(entry.sequence), padding: Self.recordPadding),
                                       to: location(Self.fileName(entry.sequence)), replacing: replacing)
    }

    /// Records are padded to a multiple of this, so their size does not tell a name's length, nor whether the event
    /// was handled; only an annotation of over half a kilobyte or so shows, in steps of this.
    static let recordPadding = 1024

    private func read(_ entryLocation: FileLocation) throws -> Entry {
        let fileName = (entryLocation.name as NSString).lastPathComponent
        func damaged(_ problem: String) -> ProtectedStoreError {
            ProtectedStoreError(.integrity, path: entryLocation.displayPath, problem: problem, remedy: "Restore the Inbox queue from a backup, or remove the record (its event is then lost)")
        }
        guard let sequence = UInt64(fileName.dropLast(Self.recordSuffix.count)), fileName == Self.fileName(sequence) else {
            throw damaged("\(fileName) is not a record name this version writes (20 digits, then .sealed)")
        }
        let sealed = try entryLocation.readPrefix(count: 64 << 10, what: "Inbox queue entry")
        guard let json = cipher.record(fromSealed: sealed, context: Self.context(sequence)) else {
            throw damaged("the record does not open: it was modified, corrupted, or moved from another number or container")
        }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        guard let entry = try? decoder.decode(Entry.self, from: Data(json)), entry.sequence == sequence else {
            throw damaged("the record opens but does not hold a delivery of number \(sequence)")
        }
        // Checked again before any file operation uses them, as any input is.
        guard ContainerPath.isPlainName(entry.name), entry.stagingName.hasPrefix(FileSystem.temporaryPrefix),
              !entry.stagingName.containsSlash, !entry.stagingName.utf8.contains(0) else {
            throw damaged("the record names its item in a way no delivery writes")
        }
        return entry
    }

    /// Forgets an entry durably: its event counts as handled first (withdrawn, if it was pending), so the record's
    /// absence is not mistaken for a removal. Caller holds the lock.
    func remove(_ entry: Entry) throws {
        try updateState {
            $0.markHandled(entry.sequence)
            $0.removing = entry.sequence
        }
        let entryLocation = location(Self.fileName(entry.sequence))
        // Through DurableIO, like every name change, so the power-cut simulator sees it.
        guard DurableIO.unlink(entryLocation.name, relativeTo: AT_FDCWD) == 0 || Foundation.errno == ENOENT else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: entryLocation.displayPath, doing: "remove the Inbox queue entry")
        }
        try entryLocation.synchronizeDirectory()
    }

    // MARK: The sealed state

    /// Whether a pending record's event must not be delivered: the state has it handled (the record was restored),
    /// or the state is damaged, or missing though the record was written beside one.
    private func isHeldBack(_ entry: Entry) -> Bool {
        do {
            guard let state = try readState() else { return entry.watermarked == true }
            return state.isHandled(entry.sequence)
        } catch {
            return true
        }
    }

    /// Writes the state a migration's records imply (caller holds the lock): their pending events stay pending.
    func adoptMigratedRecords() throws {
        let state = try currentState(recorded: try records().entries, trustingPending: true)
        try store(state)
    }

    private static let stateContext = Array("inbox-queue-state".utf8)

    /// The stored state; nil if there is none. Throws an integrity error if it does not open.
    private func readState() throws -> State? {
        let stateLocation = location(Self.stateName)
        guard try stateLocation.status() != nil else { return nil }
        let sealed = try stateLocation.readPrefix(count: 1 << 20, what: "Inbox queue state")
        guard let json = cipher.record(fromSealed: sealed, context: Self.stateContext),
              let state = try? JSONDecoder().decode(State.self, from: Data(json)) else {
            throw ProtectedStoreError(.integrity, path: stateLocation.displayPath, problem: "the Inbox queue's sealed state does not open: it was modified or corrupted",
                                      remedy: "Restore the Inbox queue from a backup")
        }
        return state
    }

    /// The state as writers go on from (caller holds the lock): the stored one, else one derived from the records and
    /// the old counter; either way counting what the records show (a write cut short between a record and the state).
    /// Without a stored state, a pending record written beside one is taken as handled: `scan` held it back, and so
    /// keeps reporting it.
    private func currentState(recorded: [Entry], trustingPending: Bool = false) throws -> State {
        var state: State
        if let stored = try storedState() {
            state = stored
        } else {
            state = State()
            // Rebuilt over damage (or a removal) rather than from a queue that never had one: say so for good.
            if try location(Self.stateName).status() != nil || (!trustingPending && recorded.contains { $0.watermarked == true }) {
                state.rebuiltAfterDamage = true
            }
            let counter = location(Self.legacyCounterName)
            if try counter.status() != nil {
                state.allocated = UInt64(String(decoding: try counter.readPrefix(count: 32, what: "Inbox sequence counter"), as: UTF8.self)
                    .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
            }
            state.allocated = max(state.allocated, recorded.last?.sequence ?? 0)
            let pending = Set(recorded.filter { !$0.eventDelivered && ($0.watermarked != true || trustingPending) }.map(\.sequence))
            if state.allocated > 0 {
                for sequence in 1...state.allocated where !pending.contains(sequence) { state.markHandled(sequence) }
            }
        }
        for entry in recorded {
            state.allocated = max(state.allocated, entry.sequence)
            if entry.eventDelivered { state.markHandled(entry.sequence) }
        }
        return state
    }

    /// Changes the state durably (atomically replaced, synced). Caller holds the lock.
    private func updateState(_ change: (inout State) -> Void) throws {
        var state = try currentState(recorded: (try? records().entries) ?? [])
        change(&state)
        // Against what is stored: the records may already show the change (a handled event's record is rewritten first).
        guard let stored = try storedState(), stored == state else { return try store(state) }
    }

    /// The stored state for a writer: nil if there is none or it does not open (the writer rebuilds it, marked);
    /// any other failure to read it (I/O) stops the write, so no state is rebuilt over one that is merely unreadable now.
    private func storedState() throws -> State? {
        do {
            return try readState()
        } catch let error as ProtectedStoreError where error.kind == .integrity {
            return nil
        }
    }

    private func store(_ state: State) throws {
        var json = Array(try JSONEncoder().encode(state))
        defer { zeroize(&json) }
        try FileSystem.writeAtomically(try cipher.sealedRecord(json, context: Self.stateContext, padding: 256), to: location(Self.stateName), replacing: true)
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
        guard let fresh = try? read(entryLocation), !fresh.eventDelivered, !isHeldBack(fresh) else { return nil }
        keep = true
        return Claim(descriptor: descriptor, entry: fresh)
    }

    /// Whether the claimed entry is still recorded (a failed delivery or a repair may have removed it meanwhile).
    func isStillRecorded(_ claim: Claim) -> Bool {
        var info = stat()
        return fstat(claim.descriptor.rawValue, &info) == 0 && info.st_nlink > 0
    }

    /// Records that the claimed entry's event was handled, in its record and then in the state; a record removed
    /// meanwhile stays removed.
    func finish(_ claim: Claim) throws {
        var delivered = claim.entry
        delivered.eventDelivered = true
        try withLock {
            guard isStillRecorded(claim) else { return }
            try write(delivered, replacing: true)
            try updateState { $0.markHandled(delivered.sequence) }
        }
    }
}
