import CSupport
import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Extended attributes as ext4 keeps them, so `cp -a`, `rsync -aHAX` and `tar --xattrs` round-trip: `user.*` stored
/// sealed (SealedAttributes), POSIX ACLs as the stored item's own (its file system checks them, as it checks modes),
/// and `user.protection.class`, which reads and sets the class but is never listed (docs/DESIGN.md says why).
extension ContainerFileSystem {
    private static let accessACL = "system.posix_acl_access"
    private static let defaultACL = "system.posix_acl_default"
    private static let (createOnly, replaceOnly): (Int32, Int32) = (1, 2)  // XATTR_CREATE, XATTR_REPLACE

    private enum Kind {
        case protectionClass, user, acl, unsupported
    }

    private static func kind(of name: String) throws -> Kind {
        if name == protectionAttribute { return .protectionClass }
        if name == accessACL || name == defaultACL { return .acl }
        guard name.hasPrefix(SealedAttributes.namespace) else { return .unsupported }
        // As ext4: a name needs something after its namespace.
        guard name.utf8.count > SealedAttributes.namespace.utf8.count else { throw Errno.invalidArgument }
        return .user
    }

    /// getxattr. ENODATA when the item has no such attribute; other namespaces than `user.` and the ACLs have none.
    package func extendedAttribute(_ kernelPath: String, name: String) throws -> [UInt8] {
        // security.* is asked of every item by ls -l and of every file written to: answered without a walk.
        let kind = try Self.kind(of: name)
        guard kind != .unsupported else { throw Errno.noData }
        let path = try containerPath(kernelPath)
        switch kind {
        case .protectionClass:
            guard let protectionClass = try protectionClass(of: path) else { throw Errno.noData }
            return Array(protectionClass.name.utf8)
        case .user:
            return try withStoredPath(path) { stored in
                guard let value = try userAttributes(at: stored, of: path).value(named: name) else { throw Errno.noData }
                return value
            }
        case .acl:
            // The data directory's own may have been set beside the mount; no other item has one before it is recorded.
            // A symbolic link's never reaches here: the kernel answers EOPNOTSUPP itself, as ext4 does.
            guard path.isRoot || aclUse.mayExist else { throw Errno.noData }
            return try withStoredPath(path) { stored in
                guard let value = try Self.storedAttribute(name, at: stored) else { throw Errno.noData }
                return value
            }
        case .unsupported:
            throw Errno.noData
        }
    }

    /// The item an attribute `name` is to be changed of, and which kind it is: refused in the Inbox (EACCES), and
    /// `unsupported` outside the namespaces kept.
    private func itemToChange(_ kernelPath: String, attribute name: String, unsupported: Errno) throws -> (ContainerPath, Kind) {
        let path = try containerPath(kernelPath)
        let kind = try Self.kind(of: name)
        guard kind != .unsupported else { throw unsupported }
        try container.refuseInboxChange(path, displayPath: display(path), doing: "given extended attributes")
        return (path, kind)
    }

    /// After an ACL changed the item's mode: its other names show it at once.
    private func aclChanged(_ path: ContainerPath, through kernelPath: String) throws {
        guard !path.isRoot, !linkNames.isEmpty else { return }
        refreshOtherNames(of: try resolve(path), changedThrough: kernelPath)
    }

    /// listxattr: the item's `user.*` attributes in the order they were set, then its ACLs.
    /// One call to the store's file system for an item with no `user.*` attributes (`ls -l` asks of every item).
    package func extendedAttributeNames(_ kernelPath: String) throws -> [String] {
        let path = try containerPath(kernelPath)
        return try withStoredPath(path) { stored in
            let names = try Self.storedAttributeNames(at: stored)
            let acls = names.filter { $0 == Self.accessACL || $0 == Self.defaultACL }
            guard names.contains(SealedAttributes.storedName) else { return acls }
            return try userAttributes(at: stored, of: path).entries.map(\.name) + acls
        }
    }

    /// setxattr. `user.*` on files and directories (EPERM on others, as ext4), within `SealedAttributes.capacity`
    /// (ENOSPC); ACLs as the stored item's own; `user.protection.class` takes a class name (A–D or a Foundation name)
    /// and re-wraps a file's key (which needs both classes' keys) or sets a directory's class for new items.
    package func setExtendedAttribute(_ kernelPath: String, name: String, value: [UInt8], flags: Int32) throws {
        let (path, kind) = try itemToChange(kernelPath, attribute: name, unsupported: .notSupported)
        switch kind {
        case .protectionClass:
            try setProtectionClass(of: path, kernelPath: kernelPath, to: value, flags: flags)
        case .user:
            // The store's file system refuses a symbolic link's or a FIFO's (EPERM), as ext4 does.
            try withStoredPath(path) { stored in
                try attributesLock.withLock {
                    var attributes = try userAttributes(at: stored, of: path)
                    let exists = attributes.value(named: name) != nil
                    if flags & Self.createOnly != 0 && exists { throw Errno.fileExists }
                    if flags & Self.replaceOnly != 0 && !exists { throw Errno.noData }
                    do {
                        try attributes.set(name, to: value)
                    } catch let error as ProtectedStoreError where error.errno == .noSpace {
                        logger.info("setxattr \(display(path)) \(name): \(error.problem)")
                        throw Errno.noSpace
                    }
                    try store(attributes, at: stored)
                }
            }
        case .acl:
            try withStoredPath(path) { stored in
                try aclUse.recordBeforeSetting()
                try Self.check(lsetxattr(stored.path, name, value, value.count, flags))
            }
            try aclChanged(path, through: kernelPath)
        case .unsupported:
            break
        }
    }

    /// removexattr. Removing `user.protection.class` gives a file its folder's class again (what a copy that leaves the
    /// attribute behind gets) and clears a directory's own class.
    package func removeExtendedAttribute(_ kernelPath: String, name: String) throws {
        let (path, kind) = try itemToChange(kernelPath, attribute: name, unsupported: .noData)
        switch kind {
        case .protectionClass:
            try removeProtectionClass(of: path, kernelPath: kernelPath)
        case .user:
            try withStoredPath(path) { stored in
                try attributesLock.withLock {
                    var attributes = try userAttributes(at: stored, of: path)
                    guard attributes.remove(name) else { throw Errno.noData }
                    try store(attributes, at: stored)
                }
            }
        case .acl:
            try withStoredPath(path) { stored in try Self.check(lremovexattr(stored.path, name)) }
            try aclChanged(path, through: kernelPath)
        case .unsupported:
            break
        }
    }

    // MARK: Protection class

    private func setProtectionClass(of path: ContainerPath, kernelPath: String, to value: [UInt8], flags: Int32) throws {
        let text = String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines.union(["\0"]))
        guard let newClass = ProtectionClass(name: text) else {
            logger.info("setxattr \(kernelPath): \"\(text.prefix(80))\" is not a class; use one of \(ProtectionClass.acceptedNames)")
            throw Errno.invalidArgument
        }
        let existing = try protectionClass(of: path)
        if flags & Self.createOnly != 0 && existing != nil { throw Errno.fileExists }
        if flags & Self.replaceOnly != 0 && existing == nil { throw Errno.noData }
        if path.isRoot {
            return try container.writeDirectoryClass(newClass, in: try heldDirectory(.root), displayPath: display(path))
        }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        switch try status(item).st_mode & S_IFMT {
        case S_IFDIR:
            try container.writeDirectoryClass(newClass, in: try item.parent.subdirectory(item.name, displayPath: item.displayPath), displayPath: item.displayPath)
        case S_IFREG:
            try changeClass(of: item, kernelPath: kernelPath, to: newClass)
        default:
            throw Errno.notSupported
        }
    }

    private func removeProtectionClass(of path: ContainerPath, kernelPath: String) throws {
        let directory: OpenDirectory
        if path.isRoot {
            directory = try heldDirectory(.root)
        } else {
            let item = try resolve(path)
            defer { withExtendedLifetime(item) {} }
            switch try status(item).st_mode & S_IFMT {
            case S_IFREG:
                return try changeClass(of: item, kernelPath: kernelPath, to: try container.inheritedClass(in: item.parent))
            case S_IFDIR:
                directory = try item.parent.subdirectory(item.name, displayPath: item.displayPath)
            default:
                throw Errno.noData
            }
        }
        defer { withExtendedLifetime(directory) {} }
        guard DurableIO.unlink(Container.directoryClassName, relativeTo: directory.descriptor.rawValue) == 0 else {
            throw Foundation.errno == ENOENT ? Errno.noData : Errno(rawValue: Foundation.errno)
        }
    }

    private func changeClass(of item: ResolvedItem, kernelPath: String, to newClass: ProtectionClass) throws {
        let number = try openHandle(item, kernelPath: kernelPath, writable: true)
        defer { release(number) }
        let file = try table.handle(number).file.file
        guard try EncryptedFile.header(at: item.location).protectionClass != newClass else { return }
        try container.changeClass(of: file, to: newClass)
    }

    // MARK: Stored item

    /// An item as the store's file system knows it: an entry of a folder this process holds open ("" for the
    /// folder itself, the root), reached through /proc in one call each, with no descriptor of its own.
    struct StoredName {
        let directory: Int32
        let entry: String

        /// The same as a path through /proc, for the l*xattr calls, which act on a symbolic link itself ("/." names
        /// the folder itself, where the magic link alone would be what they act on).
        var path: String { "/proc/self/fd/\(directory)/\(entry.isEmpty ? "." : entry)" }
    }

    private func withStoredPath<R>(_ path: ContainerPath, _ body: (StoredName) throws -> R) throws -> R {
        if path.isRoot {
            try checkSearchThroughHeldFolders(to: path)
            return try body(StoredName(directory: root, entry: ""))
        }
        let item = try resolve(path)
        return try withExtendedLifetime(item) { try body(StoredName(directory: item.parent.descriptor.rawValue, entry: item.entry)) }
    }

    private static func storedAttribute(_ name: String, at stored: StoredName) throws -> [UInt8]? {
        func get(_ buffer: UnsafeMutableRawPointer?, _ size: Int) -> Int { lgetxattr(stored.path, name, buffer, size) }
        while true {
            let size = get(nil, 0)
            if size < 0 {
                if Foundation.errno == ENODATA { return nil }
                throw Errno(rawValue: Foundation.errno)
            }
            var value = [UInt8](repeating: 0, count: size)
            let read = value.withUnsafeMutableBytes { get($0.baseAddress, size) }
            // Grown meanwhile: ask again.
            if read < 0 && Foundation.errno == ERANGE { continue }
            guard read >= 0 else { throw Errno(rawValue: Foundation.errno) }
            return Array(value.prefix(read))
        }
    }

    private static func storedAttributeNames(at stored: StoredName) throws -> [String] {
        func list(_ buffer: UnsafeMutablePointer<CChar>?, _ size: Int) -> Int { llistxattr(stored.path, buffer, size) }
        while true {
            let size = list(nil, 0)
            guard size >= 0 else { throw Errno(rawValue: Foundation.errno) }
            guard size > 0 else { return [] }
            var names = [UInt8](repeating: 0, count: size)
            let read = names.withUnsafeMutableBytes { list($0.baseAddress?.assumingMemoryBound(to: CChar.self), size) }
            if read < 0 && Foundation.errno == ERANGE { continue }
            guard read >= 0 else { throw Errno(rawValue: Foundation.errno) }
            return names.prefix(read).split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        }
    }

    /// The `user.*` attributes of the item stored at `stored` (a symbolic link has none: the store's file system
    /// keeps none for one); a stored value that does not open is damage, reported (EIO), never taken as none.
    private func userAttributes(at stored: StoredName, of path: ContainerPath) throws -> SealedAttributes {
        guard let sealed = try Self.storedAttribute(SealedAttributes.storedName, at: stored) else { return SealedAttributes() }
        guard let attributes = SealedAttributes.open(sealed, with: container.directory.cipher) else {
            throw ProtectedStoreError(.integrity, path: display(path), problem: "its extended attributes (\(SealedAttributes.storedName)) do not decrypt: damaged or not written by this container",
                                      remedy: "Remove the stored attribute with setfattr -x \(SealedAttributes.storedName) on the stored item, or restore it from a backup")
        }
        return attributes
    }

    /// Replaces the stored value in one setxattr (atomic on the store's file system), or removes it when none are left.
    private func store(_ attributes: SealedAttributes, at stored: StoredName) throws {
        if attributes.entries.isEmpty {
            guard lremovexattr(stored.path, SealedAttributes.storedName) == 0 || Foundation.errno == ENODATA else { throw Errno(rawValue: Foundation.errno) }
            return
        }
        let sealed = try attributes.sealed(with: container.directory.cipher)
        try Self.check(lsetxattr(stored.path, SealedAttributes.storedName, sealed, sealed.count, 0))
    }
}
