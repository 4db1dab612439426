import CSupport
import Foundation
import ProtectedStoreCore
import SystemPackage

/// An open directory descriptor, closed when released, with what encrypts the names in it.
package final class OpenDirectory: @unchecked Sendable {
    package let descriptor: FileDescriptor
    /// Its path inside the container, after symlinks.
    package let path: ContainerPath
    /// The container's name cipher and this directory's IV.
    package let names: DirectoryNames
    /// What all directories of the container share.
    let shared: ContainerNames

    /// Takes ownership of `descriptor`; reads the directory's IV, so a directory without one is refused here.
    init(descriptor: FileDescriptor, path: ContainerPath, shared: ContainerNames, displayPath: String) throws {
        self.descriptor = descriptor
        self.path = path
        self.shared = shared
        do {
            names = DirectoryNames(cipher: shared.cipher, iv: try shared.iv(of: descriptor, at: path, displayPath: displayPath))
        } catch {
            try? descriptor.close()
            throw error
        }
    }

    init(descriptor: FileDescriptor, path: ContainerPath, names: DirectoryNames, shared: ContainerNames) {
        self.descriptor = descriptor
        self.path = path
        self.names = names
        self.shared = shared
    }

    deinit { try? descriptor.close() }

    /// The directory entry that stands for `name` here: its encrypted form, or `name` itself for ProtectedStore's
    /// own files (reserved names) and "." or "..".
    package func entry(for name: String) throws -> String { try names.entry(for: name) }

    /// `name` (a plaintext name) in this directory, named in errors as `displayPath`.
    package func location(_ name: String, displayPath: String) throws -> FileLocation {
        FileLocation(directory: descriptor, name: try entry(for: name), displayPath: displayPath)
    }

    /// Opens the subdirectory `name` relative to this descriptor, refusing a symlink: what was checked is what is opened.
    package func subdirectory(_ name: String, displayPath: String) throws -> OpenDirectory {
        let fd = try location(name, displayPath: displayPath).open(.readOnly, options: [.directory], doing: "open the directory")
        return try OpenDirectory(descriptor: fd, path: path.appending(name), shared: shared, displayPath: displayPath)
    }

    /// A new open file description of this directory, so a listing has its own read position.
    package func reopened() throws -> FileDescriptor {
        try location(".", displayPath: path.description).open(.readOnly, options: [.directory], doing: "open the directory")
    }

    /// The plaintext names of the entries read from this directory, skipping "." and "..", and ProtectedStore's own
    /// files unless `includingReserved` (those are returned as stored). An entry whose name does not decrypt is an
    /// integrity error naming it.
    package func plaintextNames(includingReserved: Bool = false, displayPath: String) throws -> [String] {
        var names: [String] = []
        for entry in try DirectoryNames.entries(in: try reopened(), displayPath: displayPath) {
            if entry.hasPrefix(ContainerPath.reservedPrefix) {
                if includingReserved { names.append(entry) }
                continue
            }
            names.append(try self.names.name(ofEntry: entry, in: descriptor, displayPath: displayPath))
        }
        return names
    }

    /// Creates the subdirectory `name` with its own IV (and whatever `prepare` adds, such as a class marker), built
    /// under a temporary name and renamed into place, so no directory is ever seen without its IV. With a `pool`, a
    /// folder it made ahead (its IV already durable) is used when one is ready. `umask` is taken out of `mode` unless
    /// this directory has a default ACL, which then gives the new one its ACL masked by `mode`, as ext4 does.
    package func makeSubdirectory(_ name: String, mode requested: mode_t, umask: mode_t = 0, displayPath: String, pool: FolderPool? = nil,
                                  prepare: (OpenDirectory) throws -> Void = { _ in }) throws {
        let target = try names.storedName(for: name)
        try names.recordLongName(target, in: descriptor, displayPath: displayPath)
        let staging: FileLocation
        let stagingParent: FileDescriptor
        let made: FolderPool.Folder?
        // A set-group-ID parent gives a folder made in it its group and the bit (as ext4 does), and a default ACL gives
        // it that ACL: one made ahead has neither, so such a parent gets a folder built in it, as does one on another
        // file system than the pool (a rename can't cross).
        var parent = stat()
        let known = fstat(descriptor.rawValue, &parent) == 0
        let setsGroupID = known && parent.st_mode & S_ISGID != 0
        let inheritsACL = Self.hasDefaultACL(descriptor)
        let mode = inheritsACL ? requested : requested & ~umask
        if let pool, known, !setsGroupID, parent.st_dev == pool.device, !inheritsACL, let folder = pool.take() {
            stagingParent = pool.directory
            staging = FileLocation(directory: stagingParent, name: folder.name, displayPath: displayPath)
            made = folder
        } else {
            stagingParent = descriptor
            staging = FileLocation(directory: stagingParent, name: "\(FileSystem.temporaryPrefix)\(Random.bytes(8).hex)", displayPath: displayPath)
            made = nil
            // Under a default ACL, as ext4: the ACL masked by the mode (the owner's bits are settled below).
            guard DurableIO.makeDirectory(staging.name, relativeTo: descriptor.rawValue, mode: inheritsACL ? mode & 0o777 | 0o700 : 0o700) == 0 else {
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "create the directory")
            }
        }
        do {
            let fd = try staging.open(.readOnly, options: [.directory], doing: "open the new directory")
            let created = OpenDirectory(descriptor: fd, path: path.appending(name),
                                        names: DirectoryNames(cipher: names.cipher, iv: made?.iv ?? Random.bytes(NameCipher.directoryIVBytes)), shared: shared)
            if made == nil {
                try FileSystem.writeAtomically(created.names.iv, to: FileLocation(directory: fd, name: DirectoryNames.ivName, displayPath: displayPath), replacing: false)
            } else if futimens(fd.rawValue, nil) != 0 {
                // Made ahead: its times become those of this mkdir.
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "set the new directory's times")
            }
            try prepare(created)
            var finalMode = mode & 0o7777 | (setsGroupID ? S_ISGID : 0)
            var built = stat()
            if inheritsACL, fstat(fd.rawValue, &built) == 0 {
                // The group bits are the inherited ACL's mask: a chmod to the mode's own would replace it.
                finalMode = finalMode & 0o7000 | built.st_mode & mode & 0o700 | built.st_mode & 0o077
            }
            if finalMode != 0o700 {
                // Last, since a mode without the owner's write bit would keep the files above from being written.
                guard fchmod(fd.rawValue, finalMode) == 0 else {
                    throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "set the new directory's mode")
                }
            }
            try staging.rename(to: FileLocation(directory: descriptor, name: target.entry, displayPath: displayPath), replacing: false)
        } catch {
            Self.removeOwnEntry(staging.name, in: stagingParent)
            throw error
        }
    }

    /// Whether new items in `directory` take its default ACL (and no umask), as the stored file system gives it them.
    package static func hasDefaultACL(_ directory: FileDescriptor) -> Bool {
        fgetxattr(directory.rawValue, "system.posix_acl_default", nil, 0) > 0
    }

    /// Removes `entries` of `folder`, all ProtectedStore's own, its IV last: a removal cut short leaves the IV while
    /// anything else of ours is left, so the folder's names stay readable.
    package static func removeOwnEntries(_ entries: [String], of folder: FileDescriptor) {
        for entry in entries where entry != DirectoryNames.ivName { removeOwnEntry(entry, in: folder) }
        if entries.contains(DirectoryNames.ivName) { _ = DurableIO.unlink(DirectoryNames.ivName, relativeTo: folder.rawValue) }
    }

    /// Removes one of ProtectedStore's own entries: a file, or a directory a crash left half-built (which holds
    /// only its IV and class marker). Best effort; returns whether it is gone.
    @discardableResult
    package static func removeOwnEntry(_ name: String, in parent: FileDescriptor) -> Bool {
        if DurableIO.unlink(name, relativeTo: parent.rawValue) == 0 || Foundation.errno == ENOENT { return true }
        guard Foundation.errno == EISDIR || Foundation.errno == EPERM else { return false }
        let fd = openat(parent.rawValue, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        if fd >= 0 {
            defer { close(fd) }
            fchmod(fd, 0o700)
            let listing = fcntl(fd, F_DUPFD_CLOEXEC, 0)
            if listing >= 0, let entries = try? DirectoryNames.entries(in: FileDescriptor(rawValue: listing), displayPath: name) {
                for entry in entries { _ = DurableIO.unlink(entry, relativeTo: fd) }
            }
        }
        return DurableIO.unlink(name, relativeTo: parent.rawValue, flags: AT_REMOVEDIR) == 0
    }
}

/// What every directory of one container shares: the name cipher, and the IVs of the container's own folders. Those
/// can't be removed or moved (the library and the mount refuse it), so one found again with the same device and
/// inode is the same folder, and its IV need not be read again on every path walked through it.
package final class ContainerNames: @unchecked Sendable {
    let cipher: NameCipher
    private let layoutPaths: Set<ContainerPath>
    private let lock = NSLock()
    private var layoutIVs: [ContainerPath: (device: UInt64, inode: UInt64, iv: [UInt8])] = [:]

    init(cipher: NameCipher, layoutPaths: Set<ContainerPath>) {
        self.cipher = cipher
        self.layoutPaths = layoutPaths
    }

    /// Whether `path` is one of the container's own folders, which can't be removed or moved.
    func isLayout(_ path: ContainerPath) -> Bool { layoutPaths.contains(path) }

    /// The IV of the directory open as `descriptor` at `path`: for the container's own folders, the one read before if
    /// the open directory is still the same (device and inode, from the descriptor itself).
    func iv(of descriptor: FileDescriptor, at path: ContainerPath, displayPath: String) throws -> [UInt8] {
        guard layoutPaths.contains(path) else { return try DirectoryNames.readIV(in: descriptor, displayPath: displayPath) }
        var info = stat()
        guard fstat(descriptor.rawValue, &info) == 0 else { return try DirectoryNames.readIV(in: descriptor, displayPath: displayPath) }
        let identity = (device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
        if let cached = lock.withLock({ layoutIVs[path] }), cached.device == identity.device, cached.inode == identity.inode {
            return cached.iv
        }
        let iv = try DirectoryNames.readIV(in: descriptor, displayPath: displayPath)
        lock.withLock { layoutIVs[path] = (identity.device, identity.inode, iv) }
        return iv
    }
}

/// How names are stored in one directory (docs/FORMAT.md §7): the container's name cipher and the directory's IV,
/// kept in the directory as `.sandboxctl-diriv`; a name too long for an entry is kept beside it in `.sandboxctl-name-…`.
package struct DirectoryNames: Sendable {
    /// The file holding a directory's IV.
    package static let ivName = "\(ContainerPath.reservedPrefix)-diriv"
    /// Prefix of the file holding a long name's encrypted name; the entry (without its "~") follows.
    static let longNamePrefix = "\(ContainerPath.reservedPrefix)-name-"

    let cipher: NameCipher
    let iv: [UInt8]

    /// Reads the IV of the directory open as `descriptor`. One that holds no item and lost its IV (a removal cut
    /// short by a power cut, which removes the IV last) gets a fresh one: it has no name to be consistent with.
    static func readIV(in descriptor: FileDescriptor, displayPath: String) throws -> [UInt8] {
        let location = FileLocation(directory: descriptor, name: ivName, displayPath: displayPath)
        let stored: [UInt8]
        do {
            stored = try location.readPrefix(count: NameCipher.directoryIVBytes + 1, what: "directory IV")
        } catch let error as ProtectedStoreError where error.kind == .notFound {
            let listing = fcntl(descriptor.rawValue, F_DUPFD_CLOEXEC, 0)
            if listing >= 0, let entries = try? entries(in: FileDescriptor(rawValue: listing), displayPath: displayPath),
               entries.allSatisfy({ $0.hasPrefix(ContainerPath.reservedPrefix) }) {
                let iv = Random.bytes(NameCipher.directoryIVBytes)
                try? FileSystem.writeAtomically(iv, to: location, replacing: false)
                return (try? location.readPrefix(count: NameCipher.directoryIVBytes + 1, what: "directory IV")).flatMap { $0.count == iv.count ? $0 : nil } ?? iv
            }
            throw ProtectedStoreError(.integrity, path: displayPath, problem: "the directory has no name IV (\(ivName)): it was made outside ProtectedStore or by a version that stored names in clear, or the file was removed",
                                      remedy: "Restore the directory from a backup; make directories through the library, the mount or sandboxctl")
        }
        guard stored.count == NameCipher.directoryIVBytes else {
            throw ProtectedStoreError(.integrity, path: displayPath, problem: "the directory's name IV (\(ivName)) is \(stored.count) bytes, not \(NameCipher.directoryIVBytes): it was modified or corrupted",
                                      remedy: "Restore the directory from a backup")
        }
        return stored
    }

    /// Puts this directory's IV back after it was removed for an rmdir that then failed.
    package func restoreIV(in descriptor: FileDescriptor, displayPath: String) throws {
        try FileSystem.writeAtomically(iv, to: FileLocation(directory: descriptor, name: Self.ivName, displayPath: displayPath), replacing: true)
    }

    /// Writes a fresh IV into an empty directory made outside `OpenDirectory.makeSubdirectory` (a container's data root).
    static func writeNewIV(in descriptor: FileDescriptor, displayPath: String) throws {
        try FileSystem.writeAtomically(Random.bytes(NameCipher.directoryIVBytes),
                                       to: FileLocation(directory: descriptor, name: ivName, displayPath: displayPath), replacing: false)
    }

    func storedName(for name: String) throws -> NameCipher.StoredName { try cipher.storedName(for: name, directoryIV: iv) }

    func entry(for name: String) throws -> String {
        if name == "." || name == ".." || name.hasPrefix(ContainerPath.reservedPrefix) { return name }
        return try storedName(for: name).entry
    }

    /// Before an entry is created under `stored`: a long name's encrypted name is written beside it (atomically,
    /// durably), so the entry never exists without it. Deterministic content, so an existing one is simply replaced.
    func recordLongName(_ stored: NameCipher.StoredName, in descriptor: FileDescriptor, displayPath: String) throws {
        guard case .long(let entry, let encryptedName) = stored else { return }
        try FileSystem.writeAtomically(Array(encryptedName.utf8), to: Self.longNameLocation(entry, in: descriptor, displayPath: displayPath), replacing: true)
    }

    /// As `recordLongName`, for the plaintext `name`.
    package func recordLongName(of name: String, in descriptor: FileDescriptor, displayPath: String) throws {
        guard !name.hasPrefix(ContainerPath.reservedPrefix) else { return }
        try recordLongName(try storedName(for: name), in: descriptor, displayPath: displayPath)
    }

    /// After the entry `entry` is gone (removed, or renamed away): drops a long name's file, once the entry's removal
    /// is durable (a power cut must not keep the entry and lose its name). Best effort: one left behind by a crash
    /// holds only the encrypted name, and goes with its directory.
    package static func forgetLongName(_ entry: String, in descriptor: FileDescriptor) {
        guard NameCipher.isLongEntry(entry), (try? DurableIO.synchronize(descriptor, path: entry)) != nil else { return }
        _ = DurableIO.unlink(longNamePrefix + entry.dropFirst(NameCipher.longEntryPrefix.count), relativeTo: descriptor.rawValue)
    }

    private static func longNameLocation(_ entry: String, in descriptor: FileDescriptor, displayPath: String) -> FileLocation {
        FileLocation(directory: descriptor, name: longNamePrefix + entry.dropFirst(NameCipher.longEntryPrefix.count), displayPath: displayPath)
    }

    /// The plaintext name of the stored entry `entry` (not a reserved one) of the directory open as `descriptor`.
    package func name(ofEntry entry: String, in descriptor: FileDescriptor, displayPath: String) throws -> String {
        var encrypted = entry
        if NameCipher.isLongEntry(entry) {
            let location = Self.longNameLocation(entry, in: descriptor, displayPath: displayPath)
            let bytes = try? location.readPrefix(count: 4096, what: "long name")
            // Only a name too long for an entry is stored this way: each name has one stored form.
            guard let bytes, let text = String(validating: bytes, as: UTF8.self), text.utf8.count > NameCipher.maximumEntryBytes,
                  NameCipher.longEntry(for: text) == entry else {
                throw ProtectedStoreError(.integrity, path: "\(displayPath)/\(entry)", problem: "the stored entry \(entry) is a long name whose encrypted name (\(location.name)) is missing or does not match it",
                                          remedy: "Restore the directory from a backup, or remove the stored entry")
            }
            encrypted = text
        }
        guard let name = cipher.name(fromEncrypted: encrypted, directoryIV: iv) else {
            throw ProtectedStoreError(.integrity, path: "\(displayPath)/\(entry)", problem: "the stored entry \(entry) is not a name encrypted for this directory: it was made outside ProtectedStore, moved from another directory, or modified",
                                      remedy: "Restore the directory from a backup, or remove the stored entry")
        }
        return name
    }

    /// The target a symbolic link stores for `target` (readable in any directory).
    package func sealedLinkTarget(_ target: String) throws -> String { try cipher.sealedLinkTarget(target) }

    /// Before the item at `location` in this directory is moved or linked into another directory: a symbolic link
    /// whose target is stored in the first form, bound to this directory, is sealed again in the current form. A new
    /// link (owner and times kept) is renamed over it, durably, so a power cut leaves one or the other. Anything else
    /// is left as it is.
    package func unbindLinkTarget(at location: FileLocation) throws {
        guard let info = try location.status(), info.st_mode & S_IFMT == S_IFLNK else { return }
        let stored = try location.readLink()
        guard NameCipher.isBoundToDirectory(linkTarget: stored) else { return }
        let target = try linkTarget(fromStored: stored, at: location)
        let fresh = location.temporarySibling()
        guard symlinkat(try sealedLinkTarget(target), location.directoryDescriptor, fresh.name) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: location.displayPath, doing: "seal the symbolic link's target again")
        }
        var times = [info.st_atim, info.st_mtim]
        // Only root may give the new link another owner; as anyone else the owner is this process's already.
        guard (geteuid() != 0 || fchownat(location.directoryDescriptor, fresh.name, info.st_uid, info.st_gid, AT_SYMLINK_NOFOLLOW) == 0),
              utimensat(location.directoryDescriptor, fresh.name, &times, AT_SYMLINK_NOFOLLOW) == 0 else {
            let failure = Errno(rawValue: Foundation.errno)
            fresh.unlink()
            throw ProtectedStoreError.io(failure, path: location.displayPath, doing: "seal the symbolic link's target again")
        }
        do {
            try fresh.rename(to: location, replacing: true)
        } catch {
            fresh.unlink()
            throw error
        }
        try location.synchronizeDirectory()
    }

    /// The plaintext target of the symbolic link at `location` in this directory; an integrity error unless authentic.
    package func linkTarget(at location: FileLocation) throws -> String {
        try linkTarget(fromStored: try location.readLink(), at: location)
    }

    private func linkTarget(fromStored stored: String, at location: FileLocation) throws -> String {
        guard let target = cipher.linkTarget(fromSealed: stored, directoryIV: iv) else {
            throw ProtectedStoreError(.integrity, path: location.displayPath, problem: "the symbolic link's stored target does not decrypt: it was made outside ProtectedStore or modified, or, stored by an earlier version, moved from its directory outside ProtectedStore",
                                      remedy: "Remove the link and make it again through the library, the mount or sandboxctl")
        }
        return target
    }

    /// Every entry of a directory (closing `descriptor`), as stored, without "." and "..".
    package static func entries(in descriptor: FileDescriptor, displayPath: String) throws -> [String] {
        guard let stream = fdopendir(descriptor.rawValue) else {
            let errno = Errno(rawValue: Foundation.errno)
            try? descriptor.close()
            throw ProtectedStoreError.io(errno, path: displayPath, doing: "list the directory")
        }
        defer { closedir(stream) }
        var entries: [String] = []
        while let entry = readdir(stream) {
            let name = FileSystem.name(of: entry)
            if name != "." && name != ".." { entries.append(name) }
        }
        return entries
    }
}

/// Where a container path leads: the opened parent directory and the final name in it.
package struct ResolvedItem {
    package let parent: OpenDirectory
    /// The final name, in plaintext.
    package let name: String
    /// The directory entry that stands for `name` in `parent`.
    package let entry: String
    /// The path as the caller wrote it, prefixed with the container, for errors.
    package let displayPath: String

    package init(parent: OpenDirectory, name: String, displayPath: String) throws {
        self.parent = parent
        self.name = name
        self.entry = try parent.entry(for: name)
        self.displayPath = displayPath
    }

    package var location: FileLocation { FileLocation(directory: parent.descriptor, name: entry, displayPath: displayPath) }
    package var path: ContainerPath { parent.path.appending(name) }

    /// Call before creating the entry (a file, directory, link or rename target): a long name's encrypted name goes first.
    package func prepareEntry() throws {
        try parent.names.recordLongName(of: name, in: parent.descriptor, displayPath: displayPath)
    }

    /// Call once the entry is gone from this place (removed, or renamed away).
    package func entryRemoved() {
        DirectoryNames.forgetLongName(entry, in: parent.descriptor)
    }
}

/// A container's data directory, through which every path is resolved one component at a time with
/// `openat(O_NOFOLLOW)`. Symlinks found on the way are followed only while they stay inside the container;
/// absolute targets, targets climbing above the root, and loops are refused.
package final class ConfinedDirectory: @unchecked Sendable {
    /// Same bound as the kernel's (MAXSYMLINKS).
    static let maximumSymlinks = 40

    package let root: FileDescriptor
    /// Names the container in errors ("com.example.app:Documents/x").
    let containerName: String
    /// The root's names: the container's cipher and the root's IV, read once.
    let rootNames: DirectoryNames
    let shared: ContainerNames
    private let sharedLock = NSLock()
    /// The root and the container's own folders, each opened once and shared by every walk: they can't be removed or
    /// moved, so a walk through them (most go through Library/Application Support/<bundle id>) starts at the deepest
    /// one instead of opening and checking every folder on the way. Nobody reads entries through these descriptors
    /// (listings open the directory afresh), so sharing them shares no read position.
    private var sharedDirectories: [ContainerPath: OpenDirectory] = [:]

    /// `layoutPaths` are the container's own folders, whose IVs are kept once read.
    init(path: String, containerName: String, cipher: NameCipher, layoutPaths: Set<ContainerPath>) throws {
        shared = ContainerNames(cipher: cipher, layoutPaths: layoutPaths)
        // No-follow: a Data symlink would move the whole container elsewhere.
        let root = try FileLocation(path: path).open(.readOnly, options: [.directory, .noFollow], doing: "open the container")
        do {
            rootNames = DirectoryNames(cipher: cipher, iv: try DirectoryNames.readIV(in: root, displayPath: "\(containerName):"))
        } catch {
            try? root.close()
            throw error
        }
        self.root = root
        self.containerName = containerName
    }

    package var cipher: NameCipher { rootNames.cipher }

    /// The root, opened afresh.
    package func openRoot() throws -> OpenDirectory { OpenDirectory(descriptor: try duplicateRoot(), path: .root, names: rootNames, shared: shared) }

    deinit { try? root.close() }

    package func displayPath(_ path: ContainerPath) -> String { "\(containerName):\(path)" }

    /// The root or one of the container's own folders, opened once (nil if it can't be: the walk then goes the
    /// careful way and names the problem).
    private func sharedDirectory(_ path: ContainerPath) -> OpenDirectory? {
        if let opened = sharedLock.withLock({ sharedDirectories[path] }) { return opened }
        let opened: OpenDirectory?
        if path.isRoot {
            opened = try? openRoot()
        } else if let name = path.name, let parent = sharedDirectory(path.parent) {
            opened = try? parent.subdirectory(name, displayPath: displayPath(path))
        } else {
            opened = nil
        }
        guard let opened else { return nil }
        return sharedLock.withLock {
            if let raced = sharedDirectories[path] { return raced }
            sharedDirectories[path] = opened
            return opened
        }
    }

    /// The parent of `path`, opened, and its final name. With `followingFinalSymlink`, a symlink in the last place
    /// is resolved (inside the container) too, so the item reached is the link's target.
    func resolve(_ path: ContainerPath, followingFinalSymlink: Bool) throws -> ResolvedItem {
        let display = displayPath(path)
        guard !path.isRoot else {
            throw ProtectedStoreError(.invalidArgument, path: display, problem: "the container root is not a file", remedy: "Give a path inside the container")
        }
        let rootDirectory = try sharedDirectory(.root) ?? openRoot()
        var opened: [(directory: OpenDirectory, name: String)] = []
        var current: OpenDirectory { opened.last?.directory ?? rootDirectory }
        var remaining = Array(path.components.reversed())
        // Start below the deepest of the container's own folders on the way (never at the final name).
        var layoutPrefix = ContainerPath.root
        while remaining.count > 1, let next = remaining.last, shared.isLayout(layoutPrefix.appending(next)),
              let directory = sharedDirectory(layoutPrefix.appending(next)) {
            layoutPrefix = layoutPrefix.appending(next)
            opened.append((directory, next))
            remaining.removeLast()
        }
        var symlinks = 0
        // ".." can only come from a symlink target: user paths may not contain it.
        var lastLink = ContainerPath.root

        func error(_ problem: String, _ remedy: String) -> ProtectedStoreError {
            ProtectedStoreError(.invalidArgument, path: display, problem: problem, remedy: remedy)
        }

        while let component = remaining.popLast() {
            switch component {
            case "", ".":
                continue
            case "..":
                guard opened.popLast() != nil else {
                    throw error("the symbolic link \(lastLink) leads outside the container",
                                "Symbolic links may point only inside the container; remove or fix the link")
                }
                continue
            default:
                break
            }
            let parent = current
            let isFinal = remaining.isEmpty
            let here = try parent.location(component, displayPath: display)
            // Most components on the way are plain directories: one open (no-follow) finds that out. Anything else
            // (a symlink, a file, nothing, a refusal) takes the careful way below, which names the problem.
            if !isFinal, let descriptor = try? here.open(.readOnly, options: [.directory], doing: "open the directory") {
                opened.append((try OpenDirectory(descriptor: descriptor, path: parent.path.appending(component), shared: shared,
                                                 displayPath: displayPath(parent.path.appending(component))), component))
                continue
            }
            guard let info = try here.status() else {
                if isFinal { return try ResolvedItem(parent: parent, name: component, displayPath: display) }
                throw ProtectedStoreError(.notFound, path: display, problem: "the directory \(parent.path.appending(component)) does not exist",
                                          remedy: "Create it first, or check the path")
            }
            if info.st_mode & S_IFMT == S_IFLNK, !isFinal || followingFinalSymlink {
                symlinks += 1
                guard symlinks <= Self.maximumSymlinks else {
                    throw error("more than \(Self.maximumSymlinks) symbolic links on the way (a loop?)", "Remove the symbolic link loop")
                }
                lastLink = parent.path.appending(component)
                let target = try parent.names.linkTarget(at: here)
                guard !target.startsWithSlash else {
                    throw error("the symbolic link \(parent.path.appending(component)) points to the absolute path \(target), outside the container",
                                "Symbolic links may point only inside the container, with a relative target; remove or fix the link")
                }
                let targetComponents = target.splitAtSlashes()
                if let bad = targetComponents.first(where: { $0.hasPrefix(ContainerPath.reservedPrefix) || $0.utf8.count > ContainerPath.maximumNameBytes }) {
                    throw error("the symbolic link \(lastLink) points to \"\(bad.prefix(60))\", a reserved or over-long name",
                                "Remove or fix the link")
                }
                remaining.append(contentsOf: targetComponents.reversed())
                continue
            }
            if isFinal {
                guard !path.mustBeDirectory || info.st_mode & S_IFMT == S_IFDIR else {
                    throw ProtectedStoreError(.invalidArgument, path: display, problem: "it is not a directory, but the path ends with \"/\"",
                                              remedy: "Write the path without the trailing slash")
                }
                return try ResolvedItem(parent: parent, name: component, displayPath: display)
            }
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw ProtectedStoreError(.invalidArgument, path: display, problem: "\(parent.path.appending(component)) is not a directory",
                                          remedy: "Check the path")
            }
            let descriptor = try here.open(.readOnly, options: [.directory], doing: "open the directory")
            opened.append((try OpenDirectory(descriptor: descriptor, path: parent.path.appending(component), shared: shared,
                                             displayPath: displayPath(parent.path.appending(component))), component))
        }
        // Every component was used up by "." or ".." from a symlink: the item is the directory reached.
        guard let last = opened.popLast() else {
            throw error("the path leads to the container root through a symbolic link", "Give a path inside the container")
        }
        return try ResolvedItem(parent: current, name: last.name, displayPath: display)
    }

    /// Opens the directory at `path` (the root for an empty path), following symlinks inside the container.
    package func openDirectory(_ path: ContainerPath) throws -> OpenDirectory {
        if path.isRoot || shared.isLayout(path), let opened = sharedDirectory(path) { return opened }
        guard !path.isRoot else { return try openRoot() }
        let item = try resolve(path, followingFinalSymlink: true)
        do {
            return try item.parent.subdirectory(item.name, displayPath: item.displayPath)
        } catch let error as ProtectedStoreError where error.errno == .noSuchFileOrDirectory {
            throw ProtectedStoreError(.notFound, path: item.displayPath, problem: "no such directory", remedy: "Check the path, or create the directory first")
        } catch let error as ProtectedStoreError where error.errno == .notDirectory || error.errno == .tooManySymbolicLinkLevels {
            throw ProtectedStoreError(.invalidArgument, path: item.displayPath, problem: "it is a file, not a directory", remedy: "Give the path of a directory")
        }
    }

    /// Where `path` is stored below the data directory: its directory entries joined by "/", no symlink followed.
    /// For tools and tests that look at the bytes at rest.
    package func storedPath(of path: ContainerPath) throws -> String {
        var current = try openRoot()
        var entries: [String] = []
        for (index, component) in path.components.enumerated() {
            entries.append(try current.entry(for: component))
            if index < path.components.count - 1 {
                current = try current.subdirectory(component, displayPath: displayPath(path))
            }
        }
        return entries.joined(separator: "/")
    }

    /// The container path stored as `stored` (entries joined by "/", relative to the data directory); reserved
    /// names (files being written, markers) stay as they are.
    package func plaintextPath(ofStored stored: String) throws -> String {
        var current = try openRoot()
        var names: [String] = []
        let entries = stored.splitAtSlashes(omittingEmpty: true)
        for (index, entry) in entries.enumerated() {
            if entry.hasPrefix(ContainerPath.reservedPrefix) {
                names.append(entry)
            } else {
                names.append(try current.names.name(ofEntry: entry, in: current.descriptor, displayPath: displayPath(.root)))
            }
            if index < entries.count - 1 {
                let fd = try FileLocation(directory: current.descriptor, name: entry, displayPath: displayPath(.root))
                    .open(.readOnly, options: [.directory], doing: "open the directory")
                current = try OpenDirectory(descriptor: fd, path: current.path.appending(names.last!), shared: shared, displayPath: displayPath(.root))
            }
        }
        return names.joined(separator: "/")
    }

    private func duplicateRoot() throws -> FileDescriptor {
        let copy = fcntl(root.rawValue, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath(.root), doing: "duplicate the container descriptor") }
        return FileDescriptor(rawValue: copy)
    }
}
