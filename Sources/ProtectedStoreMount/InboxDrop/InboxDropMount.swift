import CFuse
import Foundation
import Logging
import ProtectedStore
import SystemPackage

/// Serves an Inbox drop folder (`InboxDropFileSystem`) at a mount point through libfuse3, until SIGINT, SIGTERM or
/// SIGHUP, or until `fusermount3 -u` unmounts it. The front end only translates.
package final class InboxDropMount: @unchecked Sendable {
    package let fileSystem: InboxDropFileSystem
    package let mountPoint: String
    private let logger: Logger

    package init(fileSystem: InboxDropFileSystem, mountPoint: String, logger: Logger) {
        self.fileSystem = fileSystem
        self.mountPoint = mountPoint
        self.logger = logger
    }

    /// Recovers what an earlier drop folder left, mounts, calls `ready` once the folder is visible, serves requests, and
    /// unmounts, delivering the files that were done and discarding the rest. Throws if mounting fails. `overIOUring`
    /// false keeps requests on /dev/fuse where FUSE over io_uring is on.
    package func run(overIOUring: Bool = true, ready: () -> Void) throws {
        let container = fileSystem.container
        let recovered = try container.recoverAbandonedInboxDrops()
        if recovered.finished > 0 { logger.info("finished \(recovered.finished) delivery(ies) an earlier drop folder was stopped in") }
        if recovered.removed > 0 { logger.info("removed \(recovered.removed) unfinished file(s) an earlier drop folder left in the Inbox") }
        // Every file waiting for its writer or its rename holds a descriptor: as many as the hard limit allows.
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        let options = "default_permissions,nodev,nosuid,noexec,fsname=sandboxctl-inbox:\(container.bundleIdentifier),subtype=sandboxctl-inbox"
        defer { fileSystem.stop() }
        try FUSESession.serve(mountPoint: mountPoint, options: options, operations: Self.operations, context: Unmanaged.passUnretained(self).toOpaque(),
                              what: "the Inbox of \(container.bundleIdentifier)", logger: logger, overIOUring: overIOUring,
                              started: { _ in }, stopping: {}, ready: { ready() })
    }

    private static let operations: fuse_operations = {
        var operations = fuse_operations()
        operations.`init` = { connection, config in
            if let connection {
                connection.pointee.max_write = 1 << 20
                // O_TRUNC reaches open, so a second writer of a name gets a file of its own instead of a truncate.
                connection.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC)
            }
            if let config {
                config.pointee.use_ino = 1
                config.pointee.nullpath_ok = 1
                // An unlink or a rename over an open file reaches the drop folder as such (it discards the file),
                // instead of libfuse's rename to .fuse_hidden… until the last close.
                config.pointee.hard_remove = 1
                // Names change under the kernel only by its own requests, but sizes grow with every write.
                config.pointee.attr_timeout = 0
                config.pointee.entry_timeout = 0
                config.pointee.negative_timeout = 0
            }
            return fuse_get_context().pointee.private_data
        }
        operations.getattr = { path, info, file in
            dropServe("getattr", path) { fs in
                info!.pointee = try file.map { try fs.attributes(ofHandle: $0.pointee.fh) } ?? fs.attributes(of: try kernelString(path))
            }
        }
        operations.create = { path, _, file in
            dropServe("create", path) { fs in file!.pointee.fh = try fs.create(try kernelString(path), writer: fuse_get_context().pointee.pid) }
        }
        operations.open = { path, file in
            dropServe("open", path) { fs in
                file!.pointee.fh = try fs.open(try kernelString(path), flags: file!.pointee.flags, writer: fuse_get_context().pointee.pid)
            }
        }
        operations.write = { path, buffer, size, offset, file in
            Int32(dropAnswer("write", path) { fs in
                try fs.write(file!.pointee.fh, from: UnsafeRawBufferPointer(start: buffer, count: size), at: Int64(offset))
            })
        }
        operations.read = { path, _, _, _, _ in dropServe("read", path) { _ in throw Errno.permissionDenied } }
        operations.truncate = { path, size, file in
            dropServe("truncate", path) { try $0.truncate(try path.map(kernelString), handle: file?.pointee.fh, to: Int64(size)) }
        }
        operations.flush = { path, file in
            dropServe("flush", path) { $0.flush(file!.pointee.fh, by: fuse_get_context().pointee.pid) }
        }
        operations.release = { path, file in dropServe("release", path) { $0.release(file!.pointee.fh) } }
        operations.fsync = { path, _, file in dropServe("fsync", path) { try $0.synchronize(file!.pointee.fh) } }
        operations.rename = { source, target, flags in
            dropServe("rename", source) { try $0.rename(try kernelString(source), to: try kernelString(target), flags: flags) }
        }
        operations.unlink = { path in dropServe("unlink", path) { try $0.unlink(try kernelString(path)) } }
        // A flat folder: subfolders, links and special files are refused (docs/DESIGN.md, "The drop folder").
        operations.mkdir = { path, _ in dropServe("mkdir", path) { _ in throw Errno.notPermitted } }
        operations.mknod = { path, _, _ in dropServe("mknod", path) { _ in throw Errno.notPermitted } }
        operations.symlink = { _, path in dropServe("symlink", path) { _ in throw Errno.notPermitted } }
        operations.link = { _, path in dropServe("link", path) { _ in throw Errno.notPermitted } }
        operations.rmdir = { path in dropServe("rmdir", path) { _ in throw Errno.noSuchFileOrDirectory } }
        // Modes, owners and times that copy tools set (cp -p, rsync -a) are accepted and not kept: the Inbox sets its own.
        operations.chmod = { path, _, file in dropServe("chmod", path) { try $0.checkExists(try path.map(kernelString), handle: file?.pointee.fh) } }
        operations.chown = { path, _, _, file in dropServe("chown", path) { try $0.checkExists(try path.map(kernelString), handle: file?.pointee.fh) } }
        operations.utimens = { path, _, file in dropServe("utimens", path) { try $0.checkExists(try path.map(kernelString), handle: file?.pointee.fh) } }
        operations.setxattr = { path, name, value, size, _ in
            dropServe("setxattr", path) { fs in
                guard try kernelString(name) == "user.inbox.annotation" else { throw Errno.notSupported }
                try fs.setAnnotation(try kernelString(path), json: value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? [])
            }
        }
        operations.getxattr = { path, _, _, _ in dropServe("getxattr", path) { _ in throw Errno.noData } }
        operations.listxattr = { _, _, _ in 0 }
        operations.statfs = { path, info in dropServe("statfs", path) { info!.pointee = try $0.statistics() } }
        operations.opendir = { path, _ in
            dropServe("opendir", path) { _ in
                let name = try kernelString(path)
                if name != "/" { throw Errno.notDirectory }
            }
        }
        operations.readdir = { path, buffer, fill, _, _, _ in
            dropServe("readdir", path) { fs in
                for name in [".", ".."] + fs.names() {
                    if fill!(buffer, name, nil, 0, fuse_fill_dir_flags(0)) != 0 { break }
                }
            }
        }
        return operations
    }()
}

private func currentDropFileSystem() -> InboxDropFileSystem {
    Unmanaged<InboxDropMount>.fromOpaque(fuse_get_context().pointee.private_data).takeUnretainedValue().fileSystem
}

/// Runs one operation: 0, or the negated errno libfuse expects.
private func dropServe(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (InboxDropFileSystem) throws -> Void) -> Int32 {
    Int32(dropAnswer(operation, path) { fs in
        try body(fs)
        return 0
    })
}

private func dropAnswer(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (InboxDropFileSystem) throws -> Int) -> Int {
    do {
        return try body(currentDropFileSystem())
    } catch let errno as Errno {
        return -Int(errno.rawValue)
    } catch let error as CocoaError where error.code == .fileWriteOutOfSpace {
        return -Int(ENOSPC)
    } catch {
        return -Int(EIO)
    }
}
