import CSupport
import Dispatch
import Foundation
import ProtectedStoreCore
import SystemPackage

/// Folders built ahead of need and folders removed behind, for a front end that makes and removes many (the mount):
/// each made ahead already holds its IV, written and made durable, so a mkdir renames one into place instead of
/// waiting for the two fsyncs a folder costs (its IV's and its own); an rmdir renames its folder in here and returns,
/// and the fsync that makes the removals of its items durable before its IV goes is made here, after. After a power
/// cut at any point a folder in its place has its IV, as when it is built or removed in place.
///
/// They wait in a hidden folder of this pool in the container's root (`.sandboxctl-tmp-folders-<random>`), held with
/// an flock while the pool lives. `close()` removes it; a pool made later empties and removes any whose flock is free
/// (left by a process that ended without closing, or by a power cut). Only ProtectedStore's own files are ever
/// removed here: a folder found holding anything else is kept, and reported.
package final class FolderPool: @unchecked Sendable {
    /// A folder ready to be renamed into place: its name in the pool's folder, and the IV it holds.
    package struct Folder: Sendable {
        package let name: String
        package let iv: [UInt8]
    }

    static let prefix = "\(FileSystem.temporaryPrefix)folders-"
    /// Enough that a burst of mkdirs as large as a `git clone`'s (about a hundred folders for this repository) takes
    /// only folders built before it began.
    package static let defaultSize = 128

    /// The pool's folder; the ready folders and the removed ones are entries of it.
    package let directory: FileDescriptor
    /// The file system it is on: a folder can only be renamed in from, or out to, the same one.
    package let device: dev_t
    private let root: FileDescriptor
    /// Where the pool's folder is, for messages: the container's stored root, then its name.
    private let place: String
    private let name: String
    private let size: Int
    private let inBackground: Bool
    private let report: @Sendable (String) -> Void
    /// Guards everything below; signalled when the work in hand ends, when the pool closes, and when work can't wait
    /// for a pause any longer.
    private let condition = NSCondition()
    private var ready: [Folder] = []
    /// Removed folders renamed in here, still to be removed.
    private var removed: [String] = []
    private var working = false
    /// When a folder was last taken or removed (a monotonic clock: a step of the wall clock must not hold work back).
    private var lastUse: ContinuousClock.Instant?
    private var closed = false

    /// Makes the pool's folder in `root` (the container's stored root) after removing those left by earlier pools.
    /// It keeps up to `size` folders, filled at once and refilled once half are taken, in a pause (`quietPeriod`) or
    /// when at most an eighth are left. Its work runs on a thread of its own, or with `inBackground` false inside the
    /// call that hands it some, without waiting for a pause (for tests, whose power cuts must see every write in one
    /// order). `report` gets what went wrong in that work (a failed build, a removed folder that is kept).
    package init(root: FileDescriptor, rootPath: String, size: Int = defaultSize, inBackground: Bool = true, report: @escaping @Sendable (String) -> Void = { _ in }) throws {
        precondition(size >= 2)
        self.root = root
        self.size = size
        self.inBackground = inBackground
        self.report = report
        Self.removeAbandoned(in: root, rootPath: rootPath, report: report)
        // Made under another name and locked before it is given its own: no other pool ever sees it unlocked.
        let building = "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)"
        name = "\(Self.prefix)\(Random.bytes(8).hex)"
        place = (rootPath as NSString).appendingPathComponent(name)
        guard DurableIO.makeDirectory(building, relativeTo: root.rawValue, mode: 0o700) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: building, doing: "create the folder of folders made ahead")
        }
        do {
            directory = try FileLocation(directory: root, name: building, displayPath: building).open(.readOnly, options: [.directory], doing: "open the folder of folders made ahead")
        } catch {
            _ = DurableIO.unlink(building, relativeTo: root.rawValue, flags: AT_REMOVEDIR)
            throw error
        }
        // A set-group-ID bit or a default ACL inherited from the root would pass to the folders made here; a folder
        // made in place in an ordinary parent has neither.
        _ = fremovexattr(directory.rawValue, "system.posix_acl_default")
        var info = stat()
        let known = fstat(directory.rawValue, &info) == 0
        device = info.st_dev
        guard known, flock(directory.rawValue, LOCK_EX | LOCK_NB) == 0, fchmod(directory.rawValue, 0o700) == 0,
              DurableIO.rename(building, relativeTo: root.rawValue, to: name, relativeTo: root.rawValue, replacing: false) == 0 else {
            let failure = Errno(rawValue: Foundation.errno)
            // Closed here, so deinit's close() must not close it again.
            closed = true
            try? directory.close()
            _ = DurableIO.unlink(building, relativeTo: root.rawValue, flags: AT_REMOVEDIR)
            throw ProtectedStoreError.io(failure, path: building, doing: "lock and name the folder of folders made ahead")
        }
        // Filled while the mount is still quiet; inline, the first take fills it.
        if inBackground { startWork() }
    }

    deinit { close() }

    /// A ready folder, or nil while none is (the caller builds one in place). Once half are taken a refill is due.
    package func take() -> Folder? {
        let folder: Folder? = condition.withLock {
            lastUse = .now
            let folder = closed ? nil : ready.popLast()
            if ready.count <= size / 8 { condition.broadcast() }
            return folder
        }
        startWork()
        return folder
    }

    /// What `remove(_:in:)` did.
    package enum Removal {
        /// Moved here, to be removed: the rmdir is done.
        case removed
        /// It holds an item besides ProtectedStore's own files: put back (or, if its name was taken meanwhile, kept
        /// here and reported), so the rmdir fails with ENOTEMPTY.
        case holdsItems
        /// Not moved: the caller removes it in place.
        case notMoved
    }

    /// Takes the folder `entry` of `parent` out of its parent if it holds only ProtectedStore's own files, and
    /// removes it later, its items' removals made durable before its IV goes.
    package func remove(_ entry: String, in parent: FileDescriptor, displayPath: String) -> Removal {
        guard condition.withLock({ !closed }) else { return .notMoved }
        let parked = "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)"
        guard DurableIO.rename(entry, relativeTo: parent.rawValue, to: parked, relativeTo: directory.rawValue, replacing: false) == 0 else { return .notMoved }
        // Looked into once moved, so nothing made in it by then is missed.
        // A folder that can't be listed (no read or search bit for the mount) counts as holding items: it goes back.
        let items = Self.entries(of: directory, name: parked)
        guard let items, items.allSatisfy({ $0.hasPrefix(ContainerPath.reservedPrefix) }) else {
            if DurableIO.rename(parked, relativeTo: directory.rawValue, to: entry, relativeTo: parent.rawValue, replacing: false) != 0 {
                report("\(displayPath) was moved aside to be removed when an item appeared in it, and its name was taken before it could go back: it is kept, with its items, at \((place as NSString).appendingPathComponent(parked)); move that folder back into the container's stored tree by hand to reach them")
                return .holdsItems
            }
            return items == nil ? .notMoved : .holdsItems
        }
        // No write bits: a create through a descriptor opened before (another mount's cached folder) now fails,
        // as it would in a removed folder, instead of landing here unseen.
        _ = fchmodat(directory.rawValue, parked, 0o500, 0)
        condition.withLock {
            lastUse = .now
            removed.append(parked)
            if removed.count >= Self.backlogLimit { condition.broadcast() }
        }
        startWork()
        return .removed
    }

    /// Finishes the removals handed over, then removes the ready folders and the pool's own. Later calls hand out
    /// nothing and take nothing. Call it once no `take()` or `remove()` is under way and no folder taken is still
    /// being put in place (the mount closes the pool after its request threads have ended).
    package func close() {
        let left: (removed: [String], ready: [Folder])? = condition.withLock {
            guard !closed else { return nil }
            closed = true
            condition.broadcast()
            while working { condition.wait() }
            defer {
                removed.removeAll()
                ready.removeAll()
            }
            return (removed, ready)
        }
        guard let left else { return }
        finishRemovals(left.removed)
        Self.removeOwnFolders(left.ready.map(\.name), in: directory)
        try? directory.close()
        if DurableIO.unlink(name, relativeTo: root.rawValue, flags: AT_REMOVEDIR) != 0 && Foundation.errno == ENOTEMPTY {
            report("\(place) is left with the removed folders that could not be finished (logged above); the next mount of this container tries them again")
        }
    }

    private enum Job {
        case remove([String])
        case build(count: Int)
    }

    /// Folders are synced together, then changed together: on a quiet journaling file system the first fsync commits
    /// what all of them need and the others find nothing left to commit. Bounded, as each holds a descriptor open (two
    /// while it is built).
    private static let batchLimit = 64
    /// ext4 commits its journal at every fsync of a folder if anything changed since the last commit, so during a
    /// burst of mkdirs or rmdirs (`tar -x`, `rm -rf`) each would be a commit of its own, beside the burst's work. The
    /// pool waits for this long without a take or a removal before it syncs anything, unless `backlogLimit` removals
    /// wait or at most an eighth of its folders are ready.
    private static let quietPeriod: Duration = .milliseconds(50)
    private static let backlogLimit = 1024

    private func startWork() {
        let starts: Bool = condition.withLock {
            guard !closed, !working, !removed.isEmpty || ready.count <= size / 2 else { return false }
            working = true
            return true
        }
        guard starts else { return }
        if inBackground {
            // A thread of its own, not one of Dispatch's shared ones: it may wait through a whole burst for a pause.
            let thread = Thread { [self] in work() }
            thread.name = "sandboxctl folder pool"
            thread.qualityOfService = .utility
            thread.start()
        } else {
            work()
        }
    }

    private func work() {
        var building = true
        while true {
            // Deciding to stop and saying so are one step: work handed over meanwhile starts a run of its own.
            let job: Job? = condition.withLock {
                while !closed {
                    let untilQuiet = lastUse.map { Self.quietPeriod - (ContinuousClock.now - $0) } ?? .zero
                    let quiet = !inBackground || untilQuiet <= .zero
                    if !removed.isEmpty && (quiet || removed.count >= Self.backlogLimit) {
                        // Oldest first: under a long backlog none waits for ever.
                        let batch = Array(removed.prefix(Self.batchLimit))
                        removed.removeFirst(batch.count)
                        return .remove(batch)
                    }
                    if building && ready.count < size && (quiet || ready.count <= size / 8) {
                        return .build(count: min(size - ready.count, Self.batchLimit))
                    }
                    if removed.isEmpty && (!building || ready.count == size) { break }
                    _ = condition.wait(until: Date(timeIntervalSinceNow: untilQuiet / .seconds(1)))
                }
                working = false
                condition.broadcast()
                return nil
            }
            switch job {
            case nil:
                return
            case .remove(let batch):
                finishRemovals(batch)
            case .build(let count):
                let (built, failure) = build(count)
                condition.withLock { ready.append(contentsOf: built) }
                if let failure {
                    // A full disk, say: mkdirs build in place until the next refill, and report their own errors.
                    report("no folder made ahead: \(failure.localizedDescription); mkdirs build their folders in place until the next refill")
                    building = false
                }
            }
        }
    }

    /// Up to `count` folders with a new IV each in the pool's folder, durable: every IV written, then every IV synced,
    /// then every folder (its IV's entry). The IV is written under its own name at once: a folder is renamed out of
    /// here only once both syncs are done, and one a power cut leaves half-built here is removed with the pool.
    /// Returns the folders made, and why the batch stopped short, if it did.
    private func build(_ count: Int) -> (built: [Folder], failure: (any Error)?) {
        var started: [(folder: Folder, directory: FileDescriptor, iv: FileDescriptor)] = []
        var failure: (any Error)?
        while started.count < count && failure == nil {
            do { started.append(try startFolder()) } catch { failure = error }
        }
        // A folder leaves the batch at its first failed sync; the rest go on.
        var durable: [Bool] = started.map { _ in true }
        for (index, step) in started.enumerated() {
            do { try DurableIO.synchronize(step.iv, path: ivPath(of: step.folder.name)) } catch { durable[index] = false; failure = failure ?? error }
            try? step.iv.close()
        }
        for (index, step) in started.enumerated() where durable[index] {
            do { try DurableIO.synchronize(step.directory, path: path(of: step.folder.name)) } catch { durable[index] = false; failure = failure ?? error }
        }
        for step in started { try? step.directory.close() }
        let failed = started.indices.filter { !durable[$0] }.map { started[$0].folder.name }
        if !failed.isEmpty { Self.removeOwnFolders(failed, in: directory) }
        return (started.indices.filter { durable[$0] }.map { started[$0].folder }, failure)
    }

    /// A new folder in the pool's folder with a new IV written in it, neither synced yet; if that fails, nothing is left.
    private func startFolder() throws -> (folder: Folder, directory: FileDescriptor, iv: FileDescriptor) {
        let folderName = "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)"
        guard DurableIO.makeDirectory(folderName, relativeTo: directory.rawValue, mode: 0o700) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path(of: folderName), doing: "create a folder ahead")
        }
        var descriptors: [FileDescriptor] = []
        do {
            let made = try FileLocation(directory: directory, name: folderName, displayPath: path(of: folderName)).open(.readOnly, options: [.directory], doing: "open a folder made ahead")
            descriptors.append(made)
            let ivFile = try FileLocation(directory: made, name: DirectoryNames.ivName, displayPath: ivPath(of: folderName))
                .open(.writeOnly, options: [.create, .exclusiveCreate], permissions: [.ownerReadWrite], doing: "create the IV of a folder made ahead")
            descriptors.append(ivFile)
            let iv = Random.bytes(NameCipher.directoryIVBytes)
            try iv.withUnsafeBytes { try DurableIO.write($0, at: 0, to: ivFile, path: ivPath(of: folderName)) }
            return (Folder(name: folderName, iv: iv), made, ivFile)
        } catch {
            for descriptor in descriptors { try? descriptor.close() }
            Self.removeOwnFolders([folderName], in: directory)
            throw error
        }
    }

    /// Where a folder of the pool is, for messages.
    private func path(of folder: String) -> String { (place as NSString).appendingPathComponent(folder) }
    private func ivPath(of folder: String) -> String { (path(of: folder) as NSString).appendingPathComponent(DirectoryNames.ivName) }

    /// The removals of removed folders' items durable first, as an rmdir in place makes them: a power cut must not
    /// keep an item and lose the IV its name needs. Then their own files and they go; one that holds anything else
    /// (an item made through a descriptor opened before the rmdir, as root) is kept, and reported.
    private func finishRemovals(_ parked: [String]) {
        for (entry, problem) in Self.removeOwnFolders(parked, in: directory, synchronizingFirst: true) {
            report("a removed folder could not be finished, and is kept as it is at \(path(of: entry)): \(problem); the next mount of this container tries again")
        }
    }

    /// Empties and removes the pool folders in `root` that no live pool holds.
    private static func removeAbandoned(in root: FileDescriptor, rootPath: String, report: (String) -> Void) {
        for entry in entries(of: root, name: ".") ?? [] where entry.hasPrefix(prefix) {
            guard let abandoned = try? FileLocation(directory: root, name: entry, displayPath: entry).open(.readOnly, options: [.directory], doing: "open an old folder of folders") else { continue }
            defer { try? abandoned.close() }
            guard flock(abandoned.rawValue, LOCK_EX | LOCK_NB) == 0 else { continue }
            // Folders made ahead, and removed ones a mount ended before finishing: the same care as finishRemovals.
            let kept = removeOwnFolders(entries(of: abandoned, name: ".") ?? [], in: abandoned, synchronizingFirst: true)
            for (folder, problem) in kept {
                let path = ((rootPath as NSString).appendingPathComponent(entry) as NSString).appendingPathComponent(folder)
                report("a removed folder left by an earlier mount is kept as it is at \(path): \(problem)")
            }
            if kept.isEmpty { _ = DurableIO.unlink(entry, relativeTo: root.rawValue, flags: AT_REMOVEDIR) }
        }
    }

    /// Removes those of the folders `entries` of `parent` that hold only ProtectedStore's own files: all are opened,
    /// then (with `synchronizingFirst`) all synced, then each is looked into and, holding only those, loses them, the IV
    /// last, and goes. Returns the folders left as they are, each with what keeps it; one already gone is not among them.
    @discardableResult
    private static func removeOwnFolders(_ entries: [String], in parent: FileDescriptor, synchronizingFirst: Bool = false) -> [(entry: String, problem: String)] {
        var kept: [(entry: String, problem: String)] = []
        for start in stride(from: 0, to: entries.count, by: batchLimit) {
            var opened: [(entry: String, folder: FileDescriptor)] = []
            for entry in entries[start..<min(start + batchLimit, entries.count)] {
                // Removed folders are left without write bits (remove(_:in:displayPath:)).
                _ = fchmodat(parent.rawValue, entry, 0o700, 0)
                let folder: FileDescriptor
                do {
                    folder = try FileLocation(directory: parent, name: entry, displayPath: entry).open(.readOnly, options: [.directory], doing: "open a folder to remove")
                } catch {
                    var info = stat()
                    if !(fstatat(parent.rawValue, entry, &info, AT_SYMLINK_NOFOLLOW) != 0 && Foundation.errno == ENOENT) { kept.append((entry, error.localizedDescription)) }
                    continue
                }
                opened.append((entry, folder))
            }
            var synced: [(entry: String, folder: FileDescriptor)] = []
            for candidate in opened {
                if synchronizingFirst {
                    do { try DurableIO.synchronize(candidate.folder, path: candidate.entry) } catch {
                        try? candidate.folder.close()
                        kept.append((candidate.entry, error.localizedDescription))
                        continue
                    }
                }
                synced.append(candidate)
            }
            for (entry, folder) in synced {
                // Looked into after the sync, just before its IV goes: an item made in it since its rmdir (a root
                // mount's, through a descriptor opened before) keeps it, IV and all.
                switch look(into: folder) {
                case .kept(let problem):
                    try? folder.close()
                    kept.append((entry, problem))
                    continue
                case .own(let items):
                    // A folder of ours in it (one a crash left half-built) goes with what it holds.
                    OpenDirectory.removeOwnEntries(items, of: folder)
                }
                let removed = DurableIO.unlink(entry, relativeTo: parent.rawValue, flags: AT_REMOVEDIR) == 0 || Foundation.errno == ENOENT
                let failure = Errno(rawValue: Foundation.errno)
                try? folder.close()
                if !removed { kept.append((entry, "rmdir: \(failure)")) }
            }
        }
        return kept
    }

    private enum Look {
        /// Its items, all ProtectedStore's own.
        case own([String])
        /// Why it is kept as it is.
        case kept(String)
    }

    /// What an open folder to be removed holds now.
    private static func look(into folder: FileDescriptor) -> Look {
        guard let items = entries(of: folder, name: ".") else { return .kept("it can't be listed") }
        let others = items.filter { !$0.hasPrefix(ContainerPath.reservedPrefix) }
        guard others.isEmpty else {
            return .kept("it holds \(others.count) item(s) besides ProtectedStore's own files, made in it after its rmdir; the items are intact, their names encrypted with the folder's IV")
        }
        return .own(items)
    }

    /// The entries of the folder `name` of `directory` ("." for itself), read through an open description of its
    /// own (a duplicate would move the descriptor's own read position); nil if it can't be opened or read.
    private static func entries(of directory: FileDescriptor, name: String) -> [String]? {
        guard let listing = try? FileLocation(directory: directory, name: name, displayPath: name).open(.readOnly, options: [.directory], doing: "list") else { return nil }
        return try? DirectoryNames.entries(in: listing, displayPath: name)
    }
}
