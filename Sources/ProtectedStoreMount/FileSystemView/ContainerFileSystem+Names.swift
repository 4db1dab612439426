import CSupport
import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Names: removing, renaming and linking items, symbolic links, FIFOs and sockets.
extension ContainerFileSystem {
    /// unlink; allowed in the Inbox. A descriptor still open on the file keeps working.
    package func removeFile(_ kernelPath: String) throws {
        let item = try resolve(try containerPath(kernelPath))
        defer { withExtendedLifetime(item) {} }
        let removed = try? status(item)
        try Self.check(DurableIO.unlink(item.entry, relativeTo: item.parent.descriptor.rawValue))
        item.entryRemoved()
        table.unlinked(kernelPath)
        linkNames.removed(kernelPath)
        if let removed { refreshOtherNames(of: removed, changedThrough: kernelPath) }
    }

    /// rename(2) and renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE. Moving out of the Inbox is allowed, into it
    /// is refused (EACCES); the container's own folders can't be moved or replaced (EPERM).
    package func rename(_ kernelSource: String, to kernelTarget: String, flags: UInt32) throws {
        let (noReplace, exchange): (UInt32, UInt32) = (1, 2)
        guard flags & ~(noReplace | exchange) == 0, flags != noReplace | exchange else { throw Errno.invalidArgument }
        let source = try containerPath(kernelSource)
        let target = try containerPath(kernelTarget, creating: true)
        try refuseLayoutChange(source, doing: "moved")
        try refuseLayoutChange(target, doing: "replaced")
        if !Self.isHiding(source, as: target) {
            try container.refuseInboxChange(target, displayPath: display(target), doing: "created by moving an item there")
        }
        if flags & exchange != 0 {
            try container.refuseInboxChange(source, displayPath: display(source), doing: "replaced by exchanging it")
        }
        let from = try resolve(source), to = try resolve(target)
        // A cached descriptor follows its directory to the new name; paths under either name must be opened afresh,
        // also those a request running alongside cached while the rename was being done.
        defer {
            directories.removeAll()
            withExtendedLifetime((from, to)) {}
        }
        let (fromDirectory, toDirectory) = (from.parent.descriptor.rawValue, to.parent.descriptor.rawValue)
        // A hard-linked item replaced loses a name: the kernel's other names of it show one link fewer.
        let replaced = try? status(to)
        if from.parent.path != to.parent.path {
            try from.parent.names.unbindLinkTarget(at: from.location)
            if flags & exchange != 0 { try to.parent.names.unbindLinkTarget(at: to.location) }
        }
        if flags & exchange != 0 {
            try Self.check(ps_rename_exchange(fromDirectory, from.entry, toDirectory, to.entry))
            table.exchanged(kernelSource, kernelTarget)
            linkNames.removed(kernelSource)
            linkNames.removed(kernelTarget)
            return
        }
        try to.prepareEntry()
        let rename = { DurableIO.rename(from.entry, relativeTo: fromDirectory, to: to.entry, relativeTo: toDirectory, replacing: flags & noReplace == 0) }
        if rename() != 0 {
            // An otherwise empty directory being replaced holds its IV, and may hold a class marker.
            guard Foundation.errno == ENOTEMPTY || Foundation.errno == EEXIST, flags & noReplace == 0 else { throw Errno(rawValue: Foundation.errno) }
            try removeOwnFiles(in: to, then: rename)
        }
        // Renaming one hard link onto another of the same file leaves both: then the source's name stays.
        if from.path != to.path, (try? from.location.status()) == nil { from.entryRemoved() }
        table.unlinked(kernelTarget)
        table.renamed(kernelSource, to: kernelTarget)
        linkNames.renamed(kernelSource, to: kernelTarget)
        if let replaced { refreshOtherNames(of: replaced, changedThrough: kernelTarget) }
    }

    /// libfuse unlinks a file still open by renaming it to `.fuse_hidden…` in its directory (and removes it at the
    /// last close), so the open file keeps a name the lock can drop cached pages by. Allowed in the Inbox too: it is a deletion.
    private static func isHiding(_ source: ContainerPath, as target: ContainerPath) -> Bool {
        target.parent == source.parent && target.name?.hasPrefix(".fuse_hidden") == true
    }

    /// symlink; the target must be relative and stay inside the container (EPERM otherwise).
    package func createSymbolicLink(at kernelPath: String, target: String, by creator: Creator = .thisProcess) throws {
        let path = try containerPath(kernelPath, creating: true)
        try container.refuseInboxChange(path, displayPath: display(path), doing: "created")
        guard Self.staysInside(target: target, from: path.parent) else {
            logger.info("symlink \(display(path)) -> \(target): refused, the target could lead outside the container; use a relative target whose \"..\" come first and stay below the root (as ../Library/x)")
            throw Errno.notPermitted
        }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        try item.prepareEntry()
        try Self.check(symlinkat(try item.parent.names.sealedLinkTarget(target), item.parent.descriptor.rawValue, item.entry))
        do {
            try giveToCreator(item.parent.descriptor.rawValue, item.entry, in: item.parent, by: creator)
        } catch {
            item.location.unlink()
            throw error
        }
    }

    /// link(2): a second name for a file. Creating one in the Inbox is refused (EACCES), and so is a name elsewhere for
    /// an Inbox item, through which it could be written; the container's own folders have no second names (EPERM).
    package func link(_ kernelSource: String, to kernelTarget: String) throws {
        let source = try containerPath(kernelSource)
        let target = try containerPath(kernelTarget, creating: true)
        try container.refuseInboxChange(target, displayPath: display(target), doing: "created by linking")
        try container.refuseInboxChange(source, displayPath: display(source), doing: "given a second name (it could be written through it); move it out of the Inbox first")
        let from = try resolve(source), to = try resolve(target)
        defer { withExtendedLifetime((from, to)) {} }
        try to.prepareEntry()
        if from.parent.path != to.parent.path { try from.parent.names.unbindLinkTarget(at: from.location) }
        try Self.check(DurableIO.link(from.entry, relativeTo: from.parent.descriptor.rawValue, to: to.entry, relativeTo: to.parent.descriptor.rawValue))
        // The kernel gives the new name the attributes of the answer; the source's (one link fewer) it keeps.
        if let linked = try? status(from) {
            linkNames.shown(kernelSource, linked)
            refreshOtherNames(of: linked, changedThrough: kernelTarget)
        }
    }

    /// mknod of a FIFO or a Unix socket (what mkfifo and bind make): a name with no data at rest, so no class applies.
    /// Device nodes are refused (EPERM): an app container holds none, as on iOS, and the mount is nodev.
    package func createSpecialFile(_ kernelPath: String, mode: mode_t, by creator: Creator = .thisProcess) throws {
        guard mode & S_IFMT == S_IFIFO || mode & S_IFMT == S_IFSOCK else {
            logger.info("mknod \(kernelPath): device nodes can't be made in a container; only files, FIFOs and sockets")
            throw Errno.notPermitted
        }
        let (item, permissions, fromACL) = try newEntry(kernelPath, mode: mode, by: creator)
        defer { withExtendedLifetime(item) {} }
        try Self.check(DurableIO.makeSpecialFile(item.entry, relativeTo: item.parent.descriptor.rawValue, mode: mode & S_IFMT | permissions))
        do {
            try giveToCreator(item.parent.descriptor.rawValue, item.entry, in: item.parent, by: creator)
            // mknod took this process's umask out.
            if !fromACL { try Self.check(fchmodat(item.parent.descriptor.rawValue, item.entry, permissions, 0)) }
        } catch {
            item.location.unlink()
            throw error
        }
    }

    /// readlink; a link that would lead out of the container when followed (one made outside the mount, or through
    /// other links) is refused (EPERM), so the kernel never follows it.
    package func symbolicLinkTarget(_ kernelPath: String) throws -> String {
        let path = try containerPath(kernelPath)
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        let target = try item.parent.names.linkTarget(at: item.location)
        guard Self.staysInside(target: target, from: path.parent) else {
            logger.info("readlink \(display(path)) -> \(target): refused, following it could leave the container (only relative targets whose \"..\" lead, and stay below the root, are followed); remove or fix the link")
            throw Errno.notPermitted
        }
        return target
    }
}
