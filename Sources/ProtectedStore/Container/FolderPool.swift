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
/// an flock while the pool lives. `close()` removes it; a pool made later removes any whose flock is free (left by a
/// process that ended without closing, or by a power cut).
package final class FolderPool: @unchecked Sendable {
    /// A folder ready to be renamed into place: its name in the pool's folder, and the IV it holds.
    package struct Folder: Sendable {
        package let name: String
        package let iv: [UInt8]
    }

    static let prefix = "\(FileSystem.temporaryPrefix)folders-"

    /// The pool's folder; the ready folders and the removed ones are entries of it.
    package let directory: FileDescriptor
    private let root: FileDescriptor
    private let name: String
    private let size: Int
    private let inBackground: Bool
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
    /// one order).
    package init(root: FileDescriptor, size: Int = 32, inBackground: Bool = true) throws {
        precondition(size >= 2)
        self.root = root
        self.size = size
        self.inBackground = inBackground
        Self.removeAbandoned(in: root)
        name = "\(Self.prefix)\(Random.bytes(8).hex)"
        guard DurableIO.makeDirectory(name, relativeTo: root.rawValue, mode: 0o700) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: name, doing: "create the folder of folders made ahead")
        }
        do {
            directory = try FileLocation(directory: root, name: name, displayPath: name).open(.readOnly, options: [.directory], doing: "open the folder of folders made ahead")
        } catch {
            _ = DurableIO.unlink(name, relativeTo: root.rawValue, flags: AT_REMOVEDIR)
            throw error
        }
        // Held until the descriptor closes: a later pool sees this one is in use.
        _ = flock(directory.rawValue, LOCK_EX | LOCK_NB)
        // A set-group-ID bit inherited from the root would give the folders made here its group and the bit; a
        // folder made in place in an ordinary parent has neither.
        fchmod(directory.rawValue, 0o700)
    }

    deinit { close() }

    /// A ready folder, or nil while none is (the caller builds one in place). Starts a refill once half are taken.
    package func take() -> Folder? {
        let folder: Folder? = condition.withLock { closed ? nil : ready.popLast() }
        startWork()
        return folder
    }

    /// Takes the folder `entry` of `parent`, which holds only ProtectedStore's own files, out of its parent and
    /// removes it later, its items' removals made durable before its IV goes. False, with nothing changed, if it
    /// can't be moved here (the caller removes it in place).
    package func remove(_ entry: String, in parent: FileDescriptor) -> Bool {
        guard condition.withLock({ !closed }) else { return false }
        let parked = "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)"
        guard DurableIO.rename(entry, relativeTo: parent.rawValue, to: parked, relativeTo: directory.rawValue, replacing: false) == 0 else { return false }
        // An item made in it beside the mount since the caller looked: back in place, so the rmdir fails as in place.
        guard holdsOnlyOwnFiles(parked) else {
            _ = DurableIO.rename(parked, relativeTo: directory.rawValue, to: entry, relativeTo: parent.rawValue, replacing: false)
            return false
        }
        condition.withLock { removed.append(parked) }
        startWork()
        return true
    }

    /// Finishes the removals handed over, then removes the ready folders and the pool's own. Later calls hand out
    /// nothing and take nothing.
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
        for folder in left.ready { Self.removeTree(folder.name, in: directory) }
        try? directory.close()
        _ = DurableIO.unlink(name, relativeTo: root.rawValue, flags: AT_REMOVEDIR)
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
        while let job: Job = condition.withLock({
            if closed { return nil }
            if !removed.isEmpty { return .remove(removed.removeFirst()) }
            return building && ready.count < size ? .build : nil
        }) {
            switch job {
            case .remove(let parked):
                finishRemoval(parked)
            case .build:
                // A failure (a full disk, say) stops the refill: mkdirs build in place until the next, and report it.
                if let folder = try? build() {
                    condition.withLock { ready.append(folder) }
                } else {
                    building = false
                }
            }
        }
        condition.withLock {
            working = false
            condition.broadcast()
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
            Self.removeTree(folderName, in: directory)
            throw error
        }
    }

    /// The removals of a removed folder's items durable first, as an rmdir in place makes them: a power cut must not
    /// keep an item and lose the IV its name needs. If that fails the folder stays, hidden, for a later pool.
    /// An item found in it (made through a descriptor opened before the rmdir) keeps it too.
    private func finishRemoval(_ parked: String) {
        guard let folder = try? FileLocation(directory: directory, name: parked, displayPath: name).open(.readOnly, options: [.directory], doing: "open a removed folder") else { return }
        let synchronized = (try? DurableIO.synchronize(folder, path: name)) != nil
        try? folder.close()
        if synchronized && holdsOnlyOwnFiles(parked) { Self.removeTree(parked, in: directory) }
    }

    /// Whether the folder `parked` of the pool holds nothing but ProtectedStore's own files (its IV, class marker,
    /// long-name records).
    private func holdsOnlyOwnFiles(_ parked: String) -> Bool {
        guard let folder = try? FileLocation(directory: directory, name: parked, displayPath: name).open(.readOnly, options: [.directory], doing: "open a removed folder") else { return false }
        defer { try? folder.close() }
        return Self.entries(of: folder, displayPath: name).allSatisfy { $0.hasPrefix(ContainerPath.reservedPrefix) }
    }

    /// Removes the pool folders in `root` that no live pool holds, with everything in them.
    private static func removeAbandoned(in root: FileDescriptor) {
        for entry in entries(of: root, displayPath: "container root") where entry.hasPrefix(prefix) {
            guard let abandoned = try? FileLocation(directory: root, name: entry, displayPath: entry).open(.readOnly, options: [.directory], doing: "open an old folder of folders") else { continue }
            let free = flock(abandoned.rawValue, LOCK_EX | LOCK_NB) == 0
            if free { removeAll(in: abandoned, displayPath: entry) }
            try? abandoned.close()
            if free { _ = DurableIO.unlink(entry, relativeTo: root.rawValue, flags: AT_REMOVEDIR) }
        }
    }

    /// Removes every entry of `directory`, folders with what they hold. Best effort.
    private static func removeAll(in directory: FileDescriptor, displayPath: String) {
        for entry in entries(of: directory, displayPath: displayPath) { removeTree(entry, in: directory) }
    }

    /// Removes `entry` of `parent`: a file, or a folder with what it holds. Best effort.
    private static func removeTree(_ entry: String, in parent: FileDescriptor) {
        if DurableIO.unlink(entry, relativeTo: parent.rawValue) == 0 || Foundation.errno == ENOENT { return }
        guard Foundation.errno == EISDIR || Foundation.errno == EPERM,
              let folder = try? FileLocation(directory: parent, name: entry, displayPath: entry).open(.readOnly, options: [.directory], doing: "open a folder to remove") else { return }
        fchmod(folder.rawValue, 0o700)
        removeAll(in: folder, displayPath: entry)
        try? folder.close()
        _ = DurableIO.unlink(entry, relativeTo: parent.rawValue, flags: AT_REMOVEDIR)
    }

    /// The entries of `directory`, read through an open description of its own (a duplicate would move the
    /// descriptor's own read position).
    private static func entries(of directory: FileDescriptor, displayPath: String) -> [String] {
        guard let listing = try? FileLocation(directory: directory, name: ".", displayPath: displayPath).open(.readOnly, options: [.directory], doing: "list") else { return [] }
        return (try? DirectoryNames.entries(in: listing, displayPath: displayPath)) ?? []
    }
}
