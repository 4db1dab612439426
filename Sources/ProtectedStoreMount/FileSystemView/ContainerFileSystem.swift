import CSupport
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// A container as a POSIX file system: the operations a FUSE front end forwards, taking the kernel's paths ("/a/b")
/// and failing with the errno a program should see.
///
/// Data protection as on iOS: a file whose class key is gone fails with EPERM (open, read, write, also on a descriptor
/// opened before the lock); the Inbox is read-and-delete only (EACCES). Names starting with `.sandboxctl` are
/// ProtectedStore's own and do not exist here. Names are encrypted at rest (docs/FORMAT.md §7): every path is
/// walked one encrypted name at a time from the container's root, never following a symlink in the last place, and
/// symlinks that would lead out are refused.
package final class ContainerFileSystem: @unchecked Sendable {
    /// The extended attribute that reads and sets an item's class, like `FileAttributeKey.protectionKey`.
    package static let protectionAttribute = "user.protection.class"

    package let container: Container
    let table = OpenFileTable()
    let linkNames = HardLinkNames()
    /// Serializes the read, change and store of an item's sealed `user.*` attributes.
    let attributesLock = NSLock()
    /// Drops the kernel's attributes of other names after a change through an open file, outside the request: its
    /// answer may be what the kernel waits for before it lets the pages of those names go.
    let namesRefresh = DispatchQueue(label: "sandboxctl.mount.hard-link-names")
    let directories = DirectoryCache()
    let aclUse: ACLUse
    private let sizes: PlaintextSizes
    let logger: Logger
    private let invalidatorLock = NSLock()
    private var frontEnd: FrontEnd?
    private let poolLock = NSLock()
    private var folderPool: FolderPool?
    /// The folders made ahead, while the mount makes them.
    var currentFolderPool: FolderPool? { poolLock.withLock { folderPool } }

    var device: Device { container.device }
    var root: Int32 { container.directory.root.rawValue }

    /// Whether a new item is given to the user who made it (chown), not left to this process: as root, serving others.
    private let givesNewItemsToCreator: Bool

    /// `givesNewItemsToCreator`: when this process, as root, serves other users (`FUSEMount.Sharing.everyone`).
    package init(container: Container, logger: Logger = Logger(label: "sandboxctl.mount"), givesNewItemsToCreator: Bool = false) {
        self.container = container
        self.logger = logger
        self.givesNewItemsToCreator = givesNewItemsToCreator && geteuid() == 0
        sizes = PlaintextSizes(keeping: PlaintextSizes.stampsChangesReliably(container.directory.root))
        aclUse = ACLUse(root: container.directory.root)
        container.device.onKeysDiscarded { [weak self] files in self?.dropCachedPlaintext(of: files) }
    }

    /// What the front end does to the kernel's caches: at a lock, drop the cached pages of a path, then zero its own
    /// buffers that may still hold plaintext; after a change through one name of a hard-linked item, drop what the
    /// kernel holds of another name (its attributes and pages).
    package struct FrontEnd: Sendable {
        package let dropCachedPages: @Sendable (String) -> Void
        package let zeroBuffers: @Sendable () -> Void
        package let forgetName: @Sendable (String) -> Void

        package init(dropCachedPages: @escaping @Sendable (String) -> Void, zeroBuffers: @escaping @Sendable () -> Void,
                     forgetName: @escaping @Sendable (String) -> Void) {
            self.dropCachedPages = dropCachedPages
            self.zeroBuffers = zeroBuffers
            self.forgetName = forgetName
        }
    }

    /// Sets the front end; nil once it is gone.
    package func setFrontEnd(_ frontEnd: FrontEnd?) {
        invalidatorLock.withLock { self.frontEnd = frontEnd }
    }

    /// Has mkdir take folders made ahead, their IVs already durable (`FolderPool`), until `stopMakingFoldersAhead()`,
    /// so it waits for no fsync. If no pool can be made (a read-only disk), every mkdir builds its folder, as without.
    package func makeFoldersAhead(size: Int = FolderPool.defaultSize, inBackground: Bool = true) {
        do {
            let pool = try FolderPool(root: container.directory.root, rootPath: container.dataPath, size: size, inBackground: inBackground) { [logger] problem in
                logger.error("\(problem)")
            }
            poolLock.withLock { folderPool = pool }
        } catch {
            logger.warning("folders are built as each mkdir asks, none ahead: \(error.localizedDescription)")
        }
    }

    /// Removes the folders made ahead; mkdir builds each folder from now on.
    package func stopMakingFoldersAhead() {
        poolLock.withLock { folderPool.take() }?.close()
    }

    /// Who asks for a new item: its umask, applied unless the folder has a default ACL (as ext4), and its user and
    /// group, who own the item when the mount gives new items to their creator.
    package struct Creator: Sendable {
        package var user: uid_t
        package var group: gid_t
        package var umask: mode_t

        /// This process, with no umask: the mode asked for is the mode given.
        package static var thisProcess: Creator { Creator(user: geteuid(), group: getegid(), umask: 0) }
    }

    /// The permission bits `mode` gives a new file, FIFO or socket in `parent`, and whether the stored file system sets
    /// them itself from the folder's default ACL (then no umask applies and the ACL is masked by the mode, as ext4
    /// does; `makeSubdirectory` does the same for folders).
    func permissions(_ mode: mode_t, in parent: OpenDirectory, by creator: Creator) -> (mode: mode_t, fromACL: Bool) {
        OpenDirectory.hasDefaultACL(parent.descriptor) ? (mode & 0o7777, true) : (mode & 0o7777 & ~creator.umask, false)
    }

    /// Where a file, FIFO or socket is to be made (its path checked, its long name recorded) and the permission bits
    /// it gets (`permissions(_:in:by:)`).
    func newEntry(_ kernelPath: String, mode: mode_t, by creator: Creator) throws -> (item: ResolvedItem, permissions: mode_t, fromACL: Bool) {
        let path = try containerPath(kernelPath, creating: true)
        try container.refuseInboxChange(path, displayPath: display(path), doing: "created")
        let item = try resolve(path)
        try item.prepareEntry()
        let (permissions, fromACL) = permissions(mode, in: item.parent, by: creator)
        return (item, permissions, fromACL)
    }

    /// Gives a new item to its creator, before its mode is set (a chown would clear set-id bits set earlier). In a
    /// set-group-ID folder the group stays the folder's, which the stored file system gave it.
    func giveToCreator(_ descriptor: Int32, _ name: String?, in parent: OpenDirectory, by creator: Creator) throws {
        guard givesNewItemsToCreator, creator.user != geteuid() || creator.group != getegid() else { return }
        var folder = stat()
        let keepsGroup = fstat(parent.descriptor.rawValue, &folder) == 0 && folder.st_mode & S_ISGID != 0
        let group = keepsGroup ? gid_t.max : creator.group
        if let name {
            try Self.check(fchownat(descriptor, name, creator.user, group, AT_SYMLINK_NOFOLLOW))
        } else {
            try Self.check(fchown(descriptor, creator.user, group))
        }
    }

    // MARK: Errors

    /// The errno a program sees for `error`, which is logged when it is more than a plain refusal.
    package func errno(for error: any Error, doing operation: String) -> Errno {
        switch error {
        case let errno as Errno:
            return errno
        case let error as ProtectedStoreError:
            switch error.kind {
            case .protectedDataUnavailable:
                logger.debug("\(operation): \(error)")
                return .notPermitted
            case .permissionDenied:
                logger.info("\(operation): \(error)")
                return .permissionDenied
            case .integrity, .unsupportedFormat:
                logger.error("\(operation): \(error)")
                return .ioError
            case .notFound:
                return .noSuchFileOrDirectory
            case .alreadyExists:
                return error.errno ?? .fileExists
            case .invalidArgument:
                return error.errno ?? .invalidArgument
            case .io where error.errno == .permissionDenied || error.errno == .notPermitted:
                // The stored items' modes refused it (the mount makes no checks of its own): a plain refusal.
                logger.info("\(operation): \(error)")
                return error.errno ?? .permissionDenied
            case .io, .wrongPasscode, .throttled, .daemonUnavailable:
                logger.error("\(operation): \(error)")
                return error.errno ?? .ioError
            }
        default:
            logger.error("\(operation): \(error)")
            return .ioError
        }
    }

    // MARK: Attributes

    /// lstat of the item, with the plaintext size of a regular file; Inbox files show no write permission.
    package func attributes(of kernelPath: String) throws -> stat {
        let path = try containerPath(kernelPath)
        guard !path.isRoot else { return try Self.status(of: container.directory.root) }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        let observed = PlaintextSizes.now()
        var info = try status(item)
        if info.st_mode & S_IFMT == S_IFREG {
            showPlaintext(&info, observedAt: observed, of: item.location, inInbox: path.isWithin(container.inboxPath))
        } else if info.st_mode & S_IFMT == S_IFLNK, let target = try? item.parent.names.linkTarget(at: item.location) {
            // As ext4 shows it: the target's length, not the stored (sealed) one's.
            info.st_size = off_t(target.utf8.count)
        }
        linkNames.shown(kernelPath, info)
        return info
    }

    /// fstat of an open file, with its plaintext size.
    package func attributes(ofHandle number: UInt64) throws -> stat {
        let handle = try table.handle(number)
        handle.file.file.waitForWritesBehind()
        var info = try Self.status(of: handle.file.file.metadataDescriptor)
        info.st_size = off_t(handle.file.file.size)
        if isInInbox(handle.file) { info.st_mode &= ~0o222 }
        return info
    }

    /// access(2) and chdir: whether the caller may read, write or run (search) the item, as the stored item's own
    /// mode says for this process, which has the caller's user and group (only they reach the mount). Items in the
    /// Inbox, shown without write permission, are not writable.
    package func checkAccess(_ kernelPath: String, mode: Int32) throws {
        let path = try containerPath(kernelPath)
        if mode & W_OK != 0 && path != container.inboxPath && path.isWithin(container.inboxPath) { throw Errno.permissionDenied }
        guard !path.isRoot else { return try Self.check(faccessat(root, ".", mode, AT_EACCESS)) }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        try Self.check(faccessat(item.parent.descriptor.rawValue, item.entry, mode, AT_EACCESS | AT_SYMLINK_NOFOLLOW))
    }

    /// Sets permission bits; in the Inbox, adding write permission is refused (EACCES).
    package func setMode(_ mode: mode_t, of kernelPath: String?, handle: UInt64?) throws {
        let requested = mode & 0o7777
        if let handle {
            let open = try table.handle(handle).file
            if requested & 0o222 != 0 {
                for path in currentPaths(of: open) { try container.refuseInboxChange(path, displayPath: display(path), doing: "made writable") }
            }
            // A write stored after the chmod would clear the set-id bits it gave.
            open.file.waitForWritesBehind()
            try Self.check(fchmod(open.file.metadataDescriptor.rawValue, requested))
            return refreshOtherNames(of: open)
        }
        let path = try containerPath(try required(kernelPath))
        if path != container.inboxPath && requested & 0o222 != 0 {
            try container.refuseInboxChange(path, displayPath: display(path), doing: "made writable")
        }
        guard !path.isRoot else {
            try Self.check(fchmod(root, requested))
            return directories.removeAll()
        }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        // fchmodat follows a symlink in the last place; the kernel never asks to chmod a link itself.
        let info = try status(item)
        let type = info.st_mode & S_IFMT
        guard type != S_IFLNK else { throw Errno.notSupported }
        if type == S_IFREG { table.openFile(FileIdentity(info))?.file.waitForWritesBehind() }
        try Self.check(fchmodat(item.parent.descriptor.rawValue, item.entry, requested, 0))
        // Walks through a cached descriptor would not meet a search permission just taken away.
        if type == S_IFDIR { directories.removeAll() }
        refreshOtherNames(of: info, changedThrough: Self.kernelPath(of: path))
    }

    /// Changes owner and group (-1 leaves one as it is); the kernel has checked the caller may.
    package func setOwner(user: uid_t, group: gid_t, of kernelPath: String?, handle: UInt64?) throws {
        if let handle {
            let open = try table.handle(handle).file
            open.file.waitForWritesBehind()
            try Self.check(fchown(open.file.metadataDescriptor.rawValue, user, group))
            return refreshOtherNames(of: open)
        }
        let path = try containerPath(try required(kernelPath))
        guard !path.isRoot else { return try Self.check(fchown(root, user, group)) }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        waitForWritesBehind(of: item)
        try Self.check(fchownat(item.parent.descriptor.rawValue, item.entry, user, group, AT_SYMLINK_NOFOLLOW))
        refreshOtherNames(of: item, changedThrough: Self.kernelPath(of: path))
    }

    /// Sets access and modification times (UTIME_NOW and UTIME_OMIT as utimensat).
    package func setTimes(_ times: UnsafePointer<timespec>?, of kernelPath: String?, handle: UInt64?) throws {
        if let handle {
            // Otherwise a write stored after it would set the modification time it gave (cp -p, rsync -t).
            let open = try table.handle(handle).file
            open.file.waitForWritesBehind()
            try Self.check(futimens(open.file.metadataDescriptor.rawValue, times))
            return refreshOtherNames(of: open)
        }
        let path = try containerPath(try required(kernelPath))
        guard !path.isRoot else { return try Self.check(futimens(root, times)) }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        waitForWritesBehind(of: item)
        try Self.check(utimensat(item.parent.descriptor.rawValue, item.entry, times, AT_SYMLINK_NOFOLLOW))
        refreshOtherNames(of: item, changedThrough: Self.kernelPath(of: path))
    }

    /// Waits for the writes queued behind on `item`, if it is a file open through the mount (`tar -x` sets each
    /// file's times by path: with nothing queued anywhere that costs no status).
    private func waitForWritesBehind(of item: ResolvedItem) {
        guard EncryptedFile.hasWritesBehindAnywhere else { return }
        var info = stat()
        guard fstatat(item.parent.descriptor.rawValue, item.entry, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFREG else { return }
        table.openFile(FileIdentity(info))?.file.waitForWritesBehind()
    }

    /// File system statistics of the disk the container lives on.
    package func statistics() throws -> statvfs {
        var info = statvfs()
        try Self.check(fstatvfs(root, &info))
        return info
    }

    /// A regular file's lstat (read after `observed`) as a program sees it: its plaintext size (an open file's own,
    /// else from its length record, read without any key, unless kept from an earlier read), and no write permission
    /// in the Inbox.
    func showPlaintext(_ info: inout stat, observedAt observed: timespec, of location: FileLocation, inInbox: Bool) {
        if let open = table.openFile(FileIdentity(info)) {
            // Times and size as they are once the writes queued before this call are stored (the lstat above may
            // predate the last of them).
            open.file.waitForWritesBehind()
            _ = fstat(open.file.metadataDescriptor.rawValue, &info)
            info.st_size = off_t(open.file.size)
        } else if let kept = sizes.size(of: info) {
            info.st_size = off_t(kept)
        } else {
            let details = Container.fileDetails(at: location)
            if details.problem == nil { sizes.keep(details.size, of: info, observedAt: observed) }
            info.st_size = off_t(details.size)
        }
        if inInbox { info.st_mode &= ~0o222 }
    }

    // MARK: Lock

    /// After a lock zeroed the keys of open class A files: the kernel must not keep serving their plaintext from its
    /// page cache to descriptors (or mappings) opened before the lock, and this process's freed buffers must not keep
    /// what it decrypted or was sent.
    private func dropCachedPlaintext(of files: [EncryptedFile]) {
        let paths = table.paths(of: files)
        // Under the lock, so the front end can't go away mid-way.
        invalidatorLock.withLock {
            guard let frontEnd else { return }
            paths.forEach(frontEnd.dropCachedPages)
            frontEnd.zeroBuffers()
        }
        PlaintextHygiene.releaseFreedMemory()
    }

    func withKeyBroughtBack<R>(_ file: EncryptedFile, _ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch let error as ProtectedStoreError where error.kind == .protectedDataUnavailable {
            // Another thread may have brought the key back since; then this only retries.
            try bringBackKey(file)
            return try body()
        }
    }

    /// Unwraps a file's key again after a lock discarded it (fails while its class is still unavailable); the file
    /// is registered with the lock before the key is installed, so the next lock, or one racing with this, discards it.
    private func bringBackKey(_ file: EncryptedFile) throws {
        guard !file.hasKey else { return }
        guard device.state == .unlocked else {
            throw ProtectedStoreError(.protectedDataUnavailable, path: file.path, problem: "the device is \(device.state.rawValue)",
                                      remedy: "Unlock the device (sandboxctl unlock)")
        }
        try file.restoreKey(keys: device) { protectionClass, fileID in
            try device.admit(file, fileID: fileID, isComplete: protectionClass == .complete)
        }
    }

    // MARK: Helpers

    func openHandle(_ item: ResolvedItem, kernelPath: String, writable: Bool) throws -> UInt64 {
        let info = try status(item)
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: throw Errno.isDirectory
        default: throw Errno.invalidArgument
        }
        return try table.handle(for: FileIdentity(info), path: kernelPath, writable: writable, reuse: { open in
            // A first open is checked by the stored file's own open (see openStored); this one opens nothing. Asked
            // of the open file itself, so a rename beside the mount can't make it ask about another file.
            try Self.check(ps_access_open_file(open.file.metadataDescriptor.rawValue, writable ? R_OK | W_OK : R_OK))
            try bringBackKey(open.file)
            if writable && !open.file.isWritable { throw Errno.permissionDenied }
        }, open: {
            var file = try openStored(item, writable: writable)
            if file.awaitsDefaultClass, device.state == .unlocked {
                try? file.close()
                // As through the library: an item delivered to the Inbox while locked takes the Inbox's class now.
                try? container.adoptDefaultClass(item)
                file = try openStored(item, writable: writable)
            }
            do {
                try device.track(file)
            } catch {
                try? file.close()
                throw error
            }
            return file
        })
    }

    /// Opens the stored file for writing when its mode lets this process, so one handle serves every descriptor.
    private func openStored(_ item: ResolvedItem, writable: Bool) throws -> EncryptedFile {
        do {
            return try container.openStoredFile(item, writable: true)
        } catch let error as ProtectedStoreError where !writable && (error.errno == .permissionDenied || error.errno == .readOnlyFileSystem) {
            return try container.openStoredFile(item, writable: false)
        }
    }

    func protectionClass(of path: ContainerPath) throws -> ProtectionClass? {
        if path.isRoot { return try container.directoryClass(of: try heldDirectory(.root)) }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        let info = try status(item)
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            let takesFolderClass = info.st_size == 0 && container.emptyFileTakesFolderClass(path)
            return takesFolderClass ? try container.inheritedClass(in: item.parent) : try EncryptedFile.header(at: item.location).protectionClass
        case S_IFDIR: return try container.directoryClass(of: try item.parent.subdirectory(item.name, displayPath: item.displayPath))
        default: return nil
        }
    }

    /// After a change to `item` through the name `kernelPath`: the kernel drops what it holds of the item's other
    /// names (HardLinkNames), at once. The kernel updates the name changed through from the answer.
    func refreshOtherNames(of item: ResolvedItem, changedThrough kernelPath: String) {
        guard !linkNames.isEmpty, let info = try? status(item) else { return }
        refreshOtherNames(of: info, changedThrough: kernelPath)
    }

    func refreshOtherNames(of info: stat, changedThrough kernelPath: String) {
        guard info.st_mode & S_IFMT != S_IFDIR else { return }
        forget(linkNames.names(of: UInt64(info.st_ino), except: [kernelPath]))
    }

    /// After a change through an open file: its own names are left alone (one of them is the node the request came
    /// by, whose pages the kernel may hold while it waits for the answer), the others are dropped once this request
    /// is answered.
    func refreshOtherNames(of open: OpenFile) {
        guard !linkNames.isEmpty else { return }
        let others = linkNames.names(of: open.identity.inode, except: Set(table.paths(of: open)))
        guard !others.isEmpty else { return }
        namesRefresh.async { [weak self] in self?.forget(others) }
    }

    func forget(_ names: [String]) {
        guard !names.isEmpty else { return }
        invalidatorLock.withLock { names.forEach { frontEnd?.forgetName($0) } }
    }

    /// The path the kernel gives for a container path.
    static func kernelPath(of path: ContainerPath) -> String { "/" + path.components.joined(separator: "/") }

    /// The path of an operation given no open file: there must be one.
    private func required(_ kernelPath: String?) throws -> String {
        guard let kernelPath else { throw Errno.badFileDescriptor }
        return kernelPath
    }

    /// The kernel's path as a container path; ProtectedStore's own names don't exist (ENOENT) and can't be made (EPERM).
    func containerPath(_ kernelPath: String, creating: Bool = false) throws -> ContainerPath {
        let components = kernelPath.splitAtSlashes(omittingEmpty: true)
        // The kernel resolves "." and ".." itself; one here would be a way past the walk's checks.
        guard !components.contains(where: { $0 == "." || $0 == ".." }) else { throw Errno.invalidArgument }
        // As ext4, also when only looking a name up: the kernel leaves NAME_MAX to the file system.
        guard !components.contains(where: { $0.utf8.count > ContainerPath.maximumNameBytes }) else { throw Errno.fileNameTooLong }
        guard !components.contains(where: { $0.hasPrefix(ContainerPath.reservedPrefix) }) else {
            if creating {
                logger.info("\(kernelPath): names starting with \(ContainerPath.reservedPrefix) are reserved for ProtectedStore's own files; choose another name")
            }
            throw creating ? Errno.notPermitted : Errno.noSuchFileOrDirectory
        }
        return ContainerPath.root.appendingComponents(components)
    }

    /// The opened parent directory (cached) and the final name.
    func resolve(_ path: ContainerPath) throws -> ResolvedItem {
        guard let name = path.name else { throw Errno.invalidArgument }
        return try ResolvedItem(parent: try cachedDirectory(path.parent), name: name, displayPath: display(path))
    }

    /// The directory at `path` from the cache (see `DirectoryCache`); the root and the container's own folders come
    /// from the ones the walks hold.
    func cachedDirectory(_ path: ContainerPath) throws -> OpenDirectory {
        try directories.directory(path, held: { path in
            path.isRoot || container.layoutPaths.contains(path) ? try heldDirectory(path) : nil
        }, displayPath: display)
    }

    /// The root or one of the container's own folders, which the walks hold open, once the caller may search the
    /// folders above it.
    func heldDirectory(_ path: ContainerPath) throws -> OpenDirectory {
        try checkSearchThroughHeldFolders(to: path)
        return try container.directory.openDirectory(path)
    }

    /// The root and the container's own folders stay open, and walks start at the deepest one on the way, so the
    /// stored file system checks search permission only from there down (at every lookup in a folder, its own); the
    /// folders above it are checked here, as ext4's path walk would.
    func checkSearchThroughHeldFolders(to path: ContainerPath) throws {
        var above = ContainerPath.root
        for component in path.components {
            let next = above.appendingComponents([component])
            guard container.layoutPaths.contains(next) else { return }
            // `next` is held open: no walk looks it up in `above`.
            let folder = try container.directory.openDirectory(above)
            try withExtendedLifetime(folder) { try Self.check(faccessat(folder.descriptor.rawValue, ".", X_OK, AT_EACCESS)) }
            above = next
        }
    }

    func status(_ item: ResolvedItem) throws -> stat {
        var info = stat()
        try Self.check(fstatat(item.parent.descriptor.rawValue, item.entry, &info, AT_SYMLINK_NOFOLLOW))
        return info
    }

    static func status(of descriptor: FileDescriptor) throws -> stat {
        var info = stat()
        try check(fstat(descriptor.rawValue, &info))
        return info
    }

    func display(_ path: ContainerPath) -> String { container.directory.displayPath(path) }

    /// Every name an open file is shown under now (hard links give it several), as container paths; none once unlinked.
    private func currentPaths(of file: OpenFile) -> [ContainerPath] {
        table.paths(of: file).compactMap { try? containerPath($0) }
    }

    private func isInInbox(_ file: OpenFile) -> Bool {
        currentPaths(of: file).contains { $0.isWithin(container.inboxPath) }
    }

    func refuseLayoutChange(_ path: ContainerPath, doing action: String) throws {
        guard path.isRoot || container.layoutPaths.contains(path) else { return }
        logger.info("\(display(path)) is one of the container's own folders and can't be \(action); work on the items inside it instead")
        throw Errno.notPermitted
    }

    /// Removes ProtectedStore's own files from a directory that holds nothing else, so that `removal` (an rmdir, or a
    /// rename over it) can succeed. The IV goes last, and comes back if the removal still fails (an entry created
    /// meanwhile), so the directory's names stay readable.
    func removeOwnFiles(in item: ResolvedItem, then removal: () -> Int32) throws {
        guard let info = try? status(item), info.st_mode & S_IFMT == S_IFDIR else { throw Errno.directoryNotEmpty }
        let directory = try item.parent.subdirectory(item.name, displayPath: item.displayPath)
        try withExtendedLifetime(directory) {
            let entries = try DirectoryNames.entries(in: try directory.reopened(), displayPath: item.displayPath)
            guard entries.allSatisfy({ $0.hasPrefix(ContainerPath.reservedPrefix) }) else { throw Errno.directoryNotEmpty }
            // The items' removals durable first: a power cut must not keep an item and lose the IV or its long name.
            try DurableIO.synchronize(directory.descriptor, path: item.displayPath)
            OpenDirectory.removeOwnEntries(entries, of: directory.descriptor)
            guard removal() == 0 else {
                let failure = Errno(rawValue: Foundation.errno)
                try? directory.names.restoreIV(in: directory.descriptor, displayPath: item.displayPath)
                throw failure
            }
        }
    }

    /// Whether a symlink target, followed from `directory`, stays inside the container: relative, its ".." only
    /// leading (so no link met on the way can make a later ".." climb from somewhere else) and no more of them than
    /// `directory` is deep, never naming ProtectedStore's own files. Checked when the link is made and each time the
    /// kernel reads it, against where the link is then.
    static func staysInside(target: String, from directory: ContainerPath) -> Bool {
        guard !target.isEmpty, !target.startsWithSlash else { return false }
        var climbs = 0
        var descended = false
        for component in target.splitAtSlashes(omittingEmpty: true) {
            switch component {
            case ".": continue
            case "..":
                guard !descended else { return false }
                climbs += 1
            default:
                if component.hasPrefix(ContainerPath.reservedPrefix) { return false }
                descended = true
            }
        }
        return climbs <= directory.components.count
    }

    static func check(_ result: Int32) throws {
        guard result == 0 else { throw Errno(rawValue: Foundation.errno) }
    }
}
