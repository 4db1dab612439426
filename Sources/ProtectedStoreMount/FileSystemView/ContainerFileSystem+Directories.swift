import CSupport
import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// The mount's folders: opening and listing them (with each entry's attributes, so `ls -l` needs no lookups), making,
/// syncing and removing them.
extension ContainerFileSystem {
    /// opendir: the directory stays open for listing until `releaseDirectory`.
    package func openDirectory(_ kernelPath: String) throws -> UInt64 {
        let path = try containerPath(kernelPath)
        let directory = try cachedDirectory(path)
        return try withExtendedLifetime(directory) {
            let copy = fcntl(directory.descriptor.rawValue, F_DUPFD_CLOEXEC, 0)
            guard copy >= 0 else { throw Errno(rawValue: Foundation.errno) }
            return table.addDirectory(FileDescriptor(rawValue: copy), path: path, names: directory.names)
        }
    }

    /// One entry of a listing: its name, inode number and type, and its name as stored.
    package struct ListedEntry: Sendable {
        package var name: String
        package var inode: UInt64
        package var type: mode_t
        fileprivate var stored: String?
    }

    /// A directory's entries as one listing shows them, and the first damaged entry it met, if any.
    package struct Listing: Sendable {
        package var entries: [ListedEntry]
        /// Reported to the program once the entries are out (readdir fails with EIO at the end, as ext4 reports a
        /// damaged entry), so damage is never mistaken for an absent name.
        package var damage: ProtectedStoreError?
    }

    /// The names in an open directory, decrypted, with their inode numbers and types (`.` and `..` first), without
    /// ProtectedStore's own. An entry whose name does not decrypt is not listed (it has no name to list) but is
    /// logged and kept as the listing's damage. Read afresh when `fresh` (a listing from its start); otherwise as the
    /// last fresh read left them, so a listing the kernel asks for in several requests sees one order, and each name
    /// is decrypted once.
    package func listing(_ number: UInt64, fresh: Bool) throws -> Listing {
        let directory = try table.openDirectory(number)
        if !fresh, let cached = directory.listing { return cached }
        let names = directory.names
        // A fresh descriptor each time: its own read position from the start (and the folder's read permission
        // checked now, not when the cached descriptor was opened).
        let copy = openat(directory.descriptor.rawValue, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard copy >= 0 else { throw Errno(rawValue: Foundation.errno) }
        guard let stream = fdopendir(copy) else {
            let error = Errno(rawValue: Foundation.errno)
            close(copy)
            throw error
        }
        defer { closedir(stream) }
        var listing = Listing(entries: [ListedEntry(name: ".", inode: 0, type: S_IFDIR), ListedEntry(name: "..", inode: 0, type: S_IFDIR)])
        while let entry = readdir(stream) {
            let stored = FileSystem.name(of: entry)
            if stored == "." || stored == ".." || stored.hasPrefix(ContainerPath.reservedPrefix) { continue }
            do {
                let name = try names.name(ofEntry: stored, in: directory.descriptor, displayPath: "\(container.bundleIdentifier):\(directory.path)")
                listing.entries.append(ListedEntry(name: name, inode: UInt64(entry.pointee.d_ino), type: Self.mode(ofDirectoryEntryType: entry.pointee.d_type), stored: stored))
            } catch let error as ProtectedStoreError {
                logger.error("readdir: damaged entry \(error.path ?? stored): \(error.problem)")
                if listing.damage == nil { listing.damage = error }
            }
        }
        directory.listing = listing
        return listing
    }

    /// What `attributes(of:)` answers for a listed entry, so `ls -l` and `find` need no lookup per entry (readdirplus);
    /// nil for `.` and `..`, for symbolic links (the size shown needs the target decrypted), and for an entry gone
    /// meanwhile: the kernel then asks by lookup.
    package func attributes(ofListed entry: ListedEntry, in number: UInt64) -> stat? {
        guard let stored = entry.stored, entry.type != S_IFLNK, let directory = try? table.openDirectory(number) else { return nil }
        var info = stat()
        let observed = PlaintextSizes.now()
        guard fstatat(directory.descriptor.rawValue, stored, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT != S_IFLNK else { return nil }
        linkNames.shown(Self.kernelPath(of: directory.path.appending(entry.name)), info)
        if info.st_mode & S_IFMT == S_IFREG {
            showPlaintext(&info, observedAt: observed, of: FileLocation(directory: directory.descriptor, name: stored, displayPath: stored),
                          inInbox: directory.path.isWithin(container.inboxPath))
        }
        return info
    }

    /// releasedir.
    package func releaseDirectory(_ number: UInt64) { table.releaseDirectory(number) }

    /// fsync of an open directory (makes creations and renames in it durable).
    package func synchronizeDirectory(_ number: UInt64) throws {
        try DurableIO.synchronize(try table.directory(number), path: "directory \(number)")
    }

    /// mkdir; the new directory takes its parent's class marker, as in the library.
    package func createDirectory(_ kernelPath: String, mode: mode_t, by creator: Creator = .thisProcess) throws {
        let path = try containerPath(kernelPath, creating: true)
        try container.refuseInboxChange(path, displayPath: display(path), doing: "created")
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        let inherited = try container.directoryClass(of: item.parent)
        // Built aside (or made ahead) with its IV, given its class marker, then renamed into place: never seen without either.
        let pool = currentFolderPool
        try item.parent.makeSubdirectory(item.name, mode: mode & 0o7777, umask: creator.umask, displayPath: item.displayPath, pool: pool) { created in
            if let inherited { try container.writeDirectoryClass(inherited, in: created, displayPath: item.displayPath) }
            try giveToCreator(created.descriptor.rawValue, nil, in: item.parent, by: creator)
        }
    }

    /// rmdir; ProtectedStore's own files in it (a class marker) go with it. The container's own folders stay (EPERM).
    package func removeDirectory(_ kernelPath: String) throws {
        let path = try containerPath(kernelPath)
        try refuseLayoutChange(path, doing: "removed")
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        directories.removeAll()
        // Every directory holds its IV, so a first rmdir fails unless the directory is not one of ours.
        if DurableIO.unlink(item.entry, relativeTo: item.parent.descriptor.rawValue, flags: AT_REMOVEDIR) != 0 {
            guard Foundation.errno == ENOTEMPTY else { throw Errno(rawValue: Foundation.errno) }
            // With a pool the folder is moved out at once, and the pool makes its items' removals durable, then removes it.
            switch currentFolderPool?.remove(item.entry, in: item.parent.descriptor, displayPath: item.displayPath) {
            case .removed?:
                break
            case .holdsItems?:
                throw Errno.directoryNotEmpty
            case .notMoved?, nil:
                try removeOwnFiles(in: item) {
                    DurableIO.unlink(item.entry, relativeTo: item.parent.descriptor.rawValue, flags: AT_REMOVEDIR)
                }
            }
        }
        item.entryRemoved()
    }

    private static func mode(ofDirectoryEntryType type: UInt8) -> mode_t {
        switch Int(type) {
        case Int(DT_DIR): S_IFDIR
        case Int(DT_LNK): S_IFLNK
        case Int(DT_REG): S_IFREG
        case Int(DT_FIFO): S_IFIFO
        case Int(DT_SOCK): S_IFSOCK
        default: 0
        }
    }
}
