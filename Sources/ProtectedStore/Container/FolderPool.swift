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
    /// Enough that a burst of mkdirs (a `git clone` makes a few hundred folders) seldom waits for a refill.
    package static let defaultSize = 32

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
    /// Guards everything below; signalled when the work in hand ends.
    private let condition = NSCondition()
    private var ready: [Folder] = []
    /// Removed folders renamed in here, still to be removed.
    private var removed: [String] = []
    private var working = false
    private var closed = false

    /// Makes the pool's folder in `root` (the container's stored root) after removing those left by earlier pools.
    /// It keeps up to `size` folders, refilling once half are taken. Its work runs on a background queue, or with
    /// `inBackground` false inside the call that hands it some (for tests, whose power cuts must see every write in
    /// one order). `report` gets what went wrong in that work (a failed build, a removed folder that is kept).
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
    }

    deinit { close() }

    /// A ready folder, or nil while none is (the caller builds one in place). Starts a refill once half are taken.
    package func take() -> Folder? {
        let folder: Folder? = condition.withLock { closed ? nil : ready.popLast() }
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
        condition.withLock { removed.append(parked) }
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
            while working { condition.wait() }
            defer {
                removed.removeAll()
                ready.removeAll()
            }
            return (removed, ready)
        }
        guard let left else { return }
        left.removed.forEach(finishRemoval)
        for folder in left.ready { Self.removeOwnFolder(folder.name, in: directory) }
        try? directory.close()
        if DurableIO.unlink(name, relativeTo: root.rawValue, flags: AT_REMOVEDIR) != 0 && Foundation.errno == ENOTEMPTY {
            report("\(place) is left with the removed folders that could not be finished (logged above); the next mount of this container tries them again")
        }
    }

    private enum Job {
        case remove(String)
        case build
    }

    private func startWork() {
        let starts: Bool = condition.withLock {
            guard !closed, !working, !removed.isEmpty || ready.count <= size / 2 else { return false }
            working = true
            return true
        }
        guard starts else { return }
        if inBackground {
            DispatchQueue.global(qos: .utility).async { [self] in work() }
        } else {
            work()
        }
    }

    private func work() {
        var building = true
        while true {
            // Deciding to stop and saying so are one step: work handed over meanwhile starts a run of its own.
            let job: Job? = condition.withLock {
                if !closed {
                    if let parked = removed.popLast() { return .remove(parked) }
                    if building && ready.count < size { return .build }
                }
                working = false
                condition.broadcast()
                return nil
            }
            switch job {
            case nil:
                return
            case .remove(let parked):
                finishRemoval(parked)
            case .build:
                do {
                    let folder = try build()
                    condition.withLock { ready.append(folder) }
                } catch {
                    // A full disk, say: mkdirs build in place until the next refill, and report their own errors.
                    report("no folder made ahead: \(error.localizedDescription)")
                    building = false
                }
            }
        }
    }

    /// A folder with a new IV in the pool's folder, durable (FileSystem.writeAtomically syncs the IV, then the folder).
    private func build() throws -> Folder {
        let folderName = "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)"
        guard DurableIO.makeDirectory(folderName, relativeTo: directory.rawValue, mode: 0o700) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: name, doing: "create a folder ahead")
        }
        do {
            let made = try FileLocation(directory: directory, name: folderName, displayPath: name).open(.readOnly, options: [.directory], doing: "open a folder made ahead")
            defer { try? made.close() }
            let iv = Random.bytes(NameCipher.directoryIVBytes)
            try FileSystem.writeAtomically(iv, to: FileLocation(directory: made, name: DirectoryNames.ivName, displayPath: name), replacing: false)
            return Folder(name: folderName, iv: iv)
        } catch {
            Self.removeOwnFolder(folderName, in: directory)
            throw error
        }
    }

    /// The removals of a removed folder's items durable first, as an rmdir in place makes them: a power cut must not
    /// keep an item and lose the IV its name needs. Then its own files and itself go; one that holds anything else
    /// (an item made through a descriptor opened before the rmdir, as root) is kept, and reported.
    private func finishRemoval(_ parked: String) {
        if let problem = Self.removeOwnFolder(parked, in: directory, synchronizingFirst: true) {
            report("a removed folder could not be finished, and is kept as it is at \((place as NSString).appendingPathComponent(parked)): \(problem); the next mount of this container tries again")
        }
    }

    /// Empties and removes the pool folders in `root` that no live pool holds.
    private static func removeAbandoned(in root: FileDescriptor, rootPath: String, report: (String) -> Void) {
        for entry in entries(of: root, name: ".") ?? [] where entry.hasPrefix(prefix) {
            guard let abandoned = try? FileLocation(directory: root, name: entry, displayPath: entry).open(.readOnly, options: [.directory], doing: "open an old folder of folders") else { continue }
            defer { try? abandoned.close() }
            guard flock(abandoned.rawValue, LOCK_EX | LOCK_NB) == 0 else { continue }
            // Folders made ahead, and removed ones a mount ended before finishing: the same care as finishRemoval.
            var kept = 0
            for folder in entries(of: abandoned, name: ".") ?? [] {
                guard let problem = removeOwnFolder(folder, in: abandoned, synchronizingFirst: true) else { continue }
                kept += 1
                let path = ((rootPath as NSString).appendingPathComponent(entry) as NSString).appendingPathComponent(folder)
                report("a removed folder left by an earlier mount is kept as it is at \(path): \(problem)")
            }
            if kept == 0 { _ = DurableIO.unlink(entry, relativeTo: root.rawValue, flags: AT_REMOVEDIR) }
        }
    }

    /// Removes the folder `entry` of `parent` if it holds only ProtectedStore's own files: them first (after an
    /// fsync of the folder, with `synchronizingFirst`), the IV last, then the folder. Nil once it is gone; else what
    /// keeps it, and it is left as it is.
    @discardableResult
    private static func removeOwnFolder(_ entry: String, in parent: FileDescriptor, synchronizingFirst: Bool = false) -> String? {
        // Removed folders are left without write bits (remove(_:in:displayPath:)).
        _ = fchmodat(parent.rawValue, entry, 0o700, 0)
        let folder: FileDescriptor
        do {
            folder = try FileLocation(directory: parent, name: entry, displayPath: entry).open(.readOnly, options: [.directory], doing: "open a folder to remove")
        } catch {
            var info = stat()
            return fstatat(parent.rawValue, entry, &info, AT_SYMLINK_NOFOLLOW) != 0 && Foundation.errno == ENOENT ? nil : error.localizedDescription
        }
        defer { try? folder.close() }
        guard let items = entries(of: folder, name: ".") else { return "it can't be listed" }
        let others = items.filter { !$0.hasPrefix(ContainerPath.reservedPrefix) }
        guard others.isEmpty else { return "it holds \(others.count) item(s) besides ProtectedStore's own files, made in it after its rmdir; the items are intact, their names encrypted with the folder's IV" }
        if synchronizingFirst {
            do { try DurableIO.synchronize(folder, path: entry) } catch { return error.localizedDescription }
        }
        // A folder of ours in it (one a crash left half-built) goes with what it holds.
        OpenDirectory.removeOwnEntries(items, of: folder)
        if DurableIO.unlink(entry, relativeTo: parent.rawValue, flags: AT_REMOVEDIR) == 0 || Foundation.errno == ENOENT { return nil }
        return "rmdir: \(Errno(rawValue: Foundation.errno))"
    }

    /// The entries of the folder `name` of `directory` ("." for itself), read through an open description of its
    /// own (a duplicate would move the descriptor's own read position); nil if it can't be opened or read.
    private static func entries(of directory: FileDescriptor, name: String) -> [String]? {
        guard let listing = try? FileLocation(directory: directory, name: name, displayPath: name).open(.readOnly, options: [.directory], doing: "list") else { return nil }
        return try? DirectoryNames.entries(in: listing, displayPath: name)
    }
}
