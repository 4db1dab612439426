import CFuse
import CFuseRings
import CSupport
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Serves a container's decrypted view at a mount point through libfuse3 (high-level API, multithreaded), until
/// SIGINT, SIGTERM or SIGHUP, or until `fusermount3 -u` unmounts it.
///
/// The front end only translates: every rule (classes, the Inbox, confinement) lives in `ContainerFileSystem`.
package final class FUSEMount: @unchecked Sendable {
    package let fileSystem: ContainerFileSystem
    package let mountPoint: String
    private let logger: Logger
    private let sharing: Sharing

    /// Who besides the mounting user reaches the mount.
    package enum Sharing: Sendable {
        /// No one (FUSE's default): every request acts as the mounting user, and the store's file system checks it.
        case owner
        /// A root launcher's sandbox, under another uid, in a folder only that uid can enter (`allow_other`).
        case sandbox
        /// Every user (`allow_other`), the kernel checking modes and ACLs as ext4 (`default_permissions`, POSIX ACLs);
        /// run as root, new items belong to the user who made them.
        case everyone
    }

    package init(container: Container, mountPoint: String, logger: Logger, sharing: Sharing = .owner) {
        self.fileSystem = ContainerFileSystem(container: container, logger: logger, givesNewItemsToCreator: sharing == .everyone)
        self.mountPoint = mountPoint
        self.logger = logger
        self.sharing = sharing
    }

    /// Mounts, calls `ready` once the file system is visible, serves requests, and unmounts. Throws if mounting fails.
    /// With `unmountedBy`, signals are the caller's, and it is handed the call that unmounts (see `FUSESession.serve`).
    /// `overIOUring` false keeps requests on /dev/fuse where FUSE over io_uring is on.
    package func run(overIOUring: Bool = true, unmountedBy: ((@escaping @Sendable () -> Void) -> Void)? = nil, ready: () -> Void) throws {
        let container = fileSystem.container
        // nodev and nosuid: an app container holds no device nodes and no set-id programs, as on iOS. No
        // default_permissions: without allow_other only the mounting user reaches the mount, and every request acts
        // on the stored items as that user, so the store's own file system makes ext4's permission checks (where the
        // mount answers from something it holds open, it checks itself). With it, the kernel would ask for the
        // folder's attributes again before each change in it: one request more per created or removed file.
        // allow_other for a root launcher's sandbox: its mount point is in a folder only the sandbox's own uid can
        // enter, so that uid is the only other one reaching it. For everyone, the kernel checks each request.
        let shared = switch sharing {
        case .owner: ""
        case .sandbox: ",allow_other"
        case .everyone: ",allow_other,default_permissions"
        }
        let options = "nodev,nosuid,fsname=sandboxctl:\(container.bundleIdentifier),subtype=sandboxctl" + shared
        // A git clone or tar -x makes hundreds of folders: each then costs a rename instead of two fsyncs.
        fileSystem.makeFoldersAhead()
        defer { fileSystem.stopMakingFoldersAhead() }
        // After the session: writes the mount accepted are stored before the process can end.
        defer { fileSystem.closeOpenFiles() }
        try FUSESession.serve(mountPoint: mountPoint, options: options, operations: Self.operations, context: Unmanaged.passUnretained(self).toOpaque(),
                              what: container.bundleIdentifier, logger: logger, overIOUring: overIOUring, started: { [fileSystem, logger, mountPoint] handle in
            fileSystem.setFrontEnd(.init(dropCachedPages: { path in
                let result = path.withCString { fuse_invalidate_path(handle.fuse, $0) }
                // ENOENT: the kernel holds nothing for that path (never looked up, or forgotten): nothing to drop.
                if result != 0 && result != -ENOENT {
                    logger.error("could not drop the kernel's cached pages of \(path) at the lock (\(Errno(rawValue: -result))); a descriptor opened before the lock may still read them")
                }
            }, zeroBuffers: {
                // Over io_uring, a READ's answer stays in its ring entry until the entry's next request.
                let holding = ps_fuse_rings_scrub(UnsafeMutableRawPointer(handle.fuse), mountPoint)
                if holding > 0 { logger.error("\(holding) io_uring entries still hold a read's plaintext after the lock: they took no request") }
            }, forgetName: { path in
                let result = path.withCString { fuse_invalidate_path(handle.fuse, $0) }
                if result != 0 && result != -ENOENT {
                    logger.warning("could not drop the kernel's attributes of \(path), a hard link of a changed file (\(Errno(rawValue: -result))); they may show stale for up to a second")
                }
            }))
        }, stopping: { [fileSystem] in
            // Before fuse_destroy: a lock arriving later must not reach a freed instance.
            fileSystem.setFrontEnd(nil)
        }, unmountedBy: unmountedBy, ready: {
            widenReadahead()
            ready()
        })
    }

    /// The kernel reads ahead 128 KiB on a FUSE mount; 1 MiB keeps several requests in flight, which the threads decrypt
    /// at once. Needs root (a sysfs knob of the mount's backing device); without it reads are only slower.
    private func widenReadahead() {
        guard let device = MountPoint.mountedDevice(at: mountPoint) else { return }
        let knob = "/sys/class/bdi/\(device)/read_ahead_kb"
        do {
            try Data("1024\n".utf8).write(to: URL(fileURLWithPath: knob))
        } catch {
            logger.debug("cannot widen the readahead (\(knob)): \(error.localizedDescription); sequential reads stay at 128 KiB requests")
        }
    }

    // MARK: Operations

    private static let operations: fuse_operations = {
        var operations = fuse_operations()
        operations.`init` = { connection, config in
            if let connection {
                // Requests of up to 1 MiB: fewer round trips, and each large enough to decrypt on every core.
                connection.pointee.max_write = 1 << 20
                connection.pointee.max_readahead = 1 << 20
                // The mode as asked, with the umask beside it: the mount applies it unless the folder has a default
                // ACL, as ext4 does.
                let (dontMask, posixACL) = (UInt32(FUSE_CAP_DONT_MASK), UInt32(FUSE_CAP_POSIX_ACL))
                if connection.pointee.capable & dontMask != 0 { connection.pointee.want |= dontMask }
                // Serving everyone, the kernel checks ACLs too; otherwise the store's file system does, as the owner.
                if currentMount().sharing == .everyone, connection.pointee.capable & posixACL != 0 { connection.pointee.want |= posixACL }
            }
            if let config {
                // Inode numbers of the stored files, so hard-link-aware tools (tar, cp -a, find) see stable ones.
                config.pointee.use_ino = 1
                // Descriptors carry the open file, so read and write need no path. An open file that is unlinked
                // is renamed to .fuse_hidden… until its last close (hard_remove off), so a lock can still drop its pages.
                config.pointee.nullpath_ok = 1
            }
            // The return value becomes the private data: keep the mount.
            return fuse_get_context().pointee.private_data
        }
        operations.getattr = { path, info, file in
            serve("getattr", path) { fs in
                info!.pointee = try file.map { try fs.attributes(ofHandle: $0.pointee.fh) } ?? fs.attributes(of: try kernelString(path))
            }
        }
        operations.readlink = { path, buffer, size in
            serve("readlink", path) { fs in
                let target = Array(try fs.symbolicLinkTarget(try kernelString(path)).utf8)
                guard let buffer, size > 0 else { throw Errno.invalidArgument }
                let count = min(target.count, size - 1)
                target.withUnsafeBytes { UnsafeMutableRawPointer(buffer).copyMemory(from: $0.baseAddress!, byteCount: count) }
                buffer[count] = 0
            }
        }
        operations.mknod = { path, mode, _ in
            serve("mknod", path) { fs in
                if mode & S_IFMT == S_IFREG {
                    fs.release(try fs.create(try kernelString(path), mode: mode, by: creator()))
                } else {
                    try fs.createSpecialFile(try kernelString(path), mode: mode, by: creator())
                }
            }
        }
        operations.mkdir = { path, mode in serve("mkdir", path) { try $0.createDirectory(try kernelString(path), mode: mode, by: creator()) } }
        operations.unlink = { path in serve("unlink", path) { try $0.removeFile(try kernelString(path)) } }
        operations.rmdir = { path in serve("rmdir", path) { try $0.removeDirectory(try kernelString(path)) } }
        operations.symlink = { target, path in serve("symlink", path) { try $0.createSymbolicLink(at: try kernelString(path), target: try kernelString(target), by: creator()) } }
        operations.rename = { source, target, flags in serve("rename", source) { try $0.rename(try kernelString(source), to: try kernelString(target), flags: flags) } }
        operations.link = { source, target in serve("link", source) { try $0.link(try kernelString(source), to: try kernelString(target)) } }
        operations.chmod = { path, mode, file in
            serve("chmod", path) { try $0.setMode(mode, of: try path.map(kernelString), handle: file?.pointee.fh) }
        }
        operations.chown = { path, user, group, file in
            serve("chown", path) { try $0.setOwner(user: user, group: group, of: try path.map(kernelString), handle: file?.pointee.fh) }
        }
        operations.truncate = { path, size, file in
            serve("truncate", path) { try $0.truncate(try path.map(kernelString), handle: file?.pointee.fh, to: Int64(size)) }
        }
        operations.utimens = { path, times, file in
            serve("utimens", path) { try $0.setTimes(times, of: try path.map(kernelString), handle: file?.pointee.fh) }
        }
        operations.open = { path, file in
            serve("open", path) { fs in
                file!.pointee.fh = try fs.open(try kernelString(path), flags: file!.pointee.flags)
                // Cached pages of the file are dropped at every open, and for class A files at every lock.
                file!.pointee.keep_cache = 0
            }
        }
        operations.create = { path, mode, file in
            serve("create", path) { fs in file!.pointee.fh = try fs.create(try kernelString(path), mode: mode, by: creator()) }
        }
        operations.read = { path, buffer, size, offset, file in
            transfer("read", path) { fs in
                let target = FUSERings.replySpace(size) ?? buffer.map(UnsafeMutableRawPointer.init)
                return try fs.read(file!.pointee.fh, into: UnsafeMutableRawBufferPointer(start: target, count: size), at: Int64(offset))
            }
        }
        operations.write = { path, buffer, size, offset, file in
            transfer("write", path) { fs in
                // The plaintext is in libfuse's receive buffer, which it keeps for the next request: zeroed once used,
                // so none of it outlives a lock there.
                defer { if let buffer { memset(UnsafeMutableRawPointer(mutating: buffer), 0, size) } }
                return try fs.write(file!.pointee.fh, from: UnsafeRawBufferPointer(start: buffer, count: size), at: Int64(offset))
            }
        }
        operations.fallocate = { path, mode, offset, length, file in
            serve("fallocate", path) { try $0.allocate(file!.pointee.fh, mode: mode, offset: Int64(offset), length: Int64(length)) }
        }
        operations.lseek = { path, offset, whence, file in
            answer("lseek", path) { try $0.seek(file!.pointee.fh, from: Int64(offset), whence: whence) }
        }
        operations.access = { path, mode in serve("access", path) { try $0.checkAccess(try kernelString(path), mode: mode) } }
        operations.statfs = { path, info in serve("statfs", path) { info!.pointee = try $0.statistics() } }
        operations.flush = { path, file in serve("flush", path) { try $0.finishWrites(file!.pointee.fh) } }
        operations.release = { path, file in serve("release", path) { $0.release(file!.pointee.fh) } }
        operations.fsync = { path, _, file in serve("fsync", path) { try $0.synchronize(file!.pointee.fh) } }
        operations.setxattr = { path, name, value, size, flags in
            serve("setxattr", path) { fs in
                let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
                try fs.setExtendedAttribute(try kernelString(path), name: try kernelString(name), value: bytes, flags: flags)
            }
        }
        operations.getxattr = { path, name, buffer, size in
            transfer("getxattr", path) { fs in try copyOut(try fs.extendedAttribute(try kernelString(path), name: try kernelString(name)), to: buffer, size: size) }
        }
        operations.listxattr = { path, buffer, size in
            transfer("listxattr", path) { fs in
                try copyOut(try fs.extendedAttributeNames(try kernelString(path)).flatMap { Array($0.utf8) + [0] }, to: buffer, size: size)
            }
        }
        operations.removexattr = { path, name in serve("removexattr", path) { try $0.removeExtendedAttribute(try kernelString(path), name: try kernelString(name)) } }
        operations.opendir = { path, file in serve("opendir", path) { fs in file!.pointee.fh = try fs.openDirectory(try kernelString(path)) } }
        operations.readdir = { path, buffer, fill, offset, file, flags in
            serve("readdir", path) { fs in
                // Entry i goes out with offset i + 1, so the kernel can ask for the rest where a full reply stopped.
                // Offsets are also what makes libfuse (before 3.17) pass readdirplus attributes on to the kernel.
                let plus = flags.rawValue & FUSE_READDIR_PLUS.rawValue != 0
                let listing = try fs.listing(file!.pointee.fh, fresh: offset == 0)
                let entries = listing.entries
                if Int(offset) >= entries.count, let damage = listing.damage { throw damage }
                var index = Int(offset)
                while index < entries.count {
                    let entry = entries[index]
                    var info = stat()
                    var entryFlags = fuse_fill_dir_flags(0)
                    if plus, let attributes = fs.attributes(ofListed: entry, in: file!.pointee.fh) {
                        info = attributes
                        entryFlags = FUSE_FILL_DIR_PLUS
                    } else {
                        info.st_ino = ino_t(entry.inode)
                        info.st_mode = entry.type
                    }
                    index += 1
                    if fill!(buffer, entry.name, &info, off_t(index), entryFlags) != 0 { break }
                }
            }
        }
        operations.releasedir = { path, file in serve("releasedir", path) { $0.releaseDirectory(file!.pointee.fh) } }
        operations.fsyncdir = { path, _, file in serve("fsyncdir", path) { try $0.synchronizeDirectory(file!.pointee.fh) } }
        return operations
    }()
}

/// The mount serving the current request.
private func currentMount() -> FUSEMount {
    Unmanaged<FUSEMount>.fromOpaque(fuse_get_context().pointee.private_data).takeUnretainedValue()
}

private func currentFileSystem() -> ContainerFileSystem { currentMount().fileSystem }

/// Who sent the current request, which makes an item.
private func creator() -> ContainerFileSystem.Creator {
    let context = fuse_get_context().pointee
    return ContainerFileSystem.Creator(user: context.uid, group: context.gid, umask: context.umask)
}

/// Runs one operation: 0, or the negated errno libfuse expects.
private func serve(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (ContainerFileSystem) throws -> Void) -> Int32 {
    transfer(operation, path) { fs in
        try body(fs)
        return 0
    }
}

/// Runs a read or a write, which answers with a byte count (or 0), or the negated errno. Plaintext passes through the
/// calls it makes, and libsodium leaves a cipher's last partial block on their stack (ScrubbedStack says more), so
/// the stack below this frame is zeroed once it is answered.
private func transfer(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (ContainerFileSystem) throws -> Int) -> Int32 {
    defer { ps_scrub_stack_below(32 << 10) }
    return Int32(answer(operation, path, body))
}

/// Runs an operation that answers with a number as wide as a file offset, or the negated errno.
private func answer(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (ContainerFileSystem) throws -> Int) -> Int {
    let fs = currentFileSystem()
    do {
        return try body(fs)
    } catch {
        let name = path.map { String(cString: $0) } ?? "(open file)"
        return -Int(fs.errno(for: error, doing: "\(operation) \(name)").rawValue)
    }
}

/// getxattr and listxattr: the size when asked with no buffer, ERANGE when the buffer is too small.
private func copyOut(_ bytes: [UInt8], to buffer: UnsafeMutablePointer<CChar>?, size: Int) throws -> Int {
    guard size > 0, let buffer else { return bytes.count }
    guard bytes.count <= size else { throw Errno.outOfRange }
    bytes.withUnsafeBytes { UnsafeMutableRawPointer(buffer).copyMemory(from: $0.baseAddress ?? UnsafeRawPointer(buffer), byteCount: bytes.count) }
    return bytes.count
}
