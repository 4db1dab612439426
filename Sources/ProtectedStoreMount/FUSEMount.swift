import CFuse
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

    package init(container: Container, mountPoint: String, logger: Logger) {
        self.fileSystem = ContainerFileSystem(container: container, logger: logger)
        self.mountPoint = mountPoint
        self.logger = logger
    }

    /// Mounts, calls `ready` once the file system is visible, serves requests, and unmounts. Throws if mounting fails.
    package func run(ready: () -> Void) throws {
        let container = fileSystem.container
        // nodev and nosuid: an app container holds no device nodes and no set-id programs, as on iOS.
        let options = "default_permissions,nodev,nosuid,fsname=sandboxctl:\(container.bundleIdentifier),subtype=sandboxctl"
        var arguments = fuse_args()
        defer { fuse_opt_free_args(&arguments) }
        for argument in ["sandboxctl", "-o", options] where fuse_opt_add_arg(&arguments, argument) != 0 {
            throw mountError("libfuse could not take its arguments (out of memory)")
        }
        var operations = Self.operations
        guard let fuse = ps_fuse_new(&arguments, &operations, Unmanaged.passUnretained(self).toOpaque()) else {
            throw mountError("libfuse refused the mount options \(options) (see the message above)")
        }
        defer { fuse_destroy(fuse) }
        let handle = FuseHandle(fuse: fuse)
        fileSystem.setPageCacheInvalidator { [logger] path in
            let result = path.withCString { fuse_invalidate_path(handle.fuse, $0) }
            // ENOENT: the kernel holds nothing for that path (never looked up, or forgotten): nothing to drop.
            if result != 0 && result != -ENOENT {
                logger.error("could not drop the kernel's cached pages of \(path) at the lock (\(Errno(rawValue: -result))); a descriptor opened before the lock may still read them")
            }
        }
        // Before fuse_destroy: a lock arriving later must not reach a freed instance.
        defer { fileSystem.setPageCacheInvalidator(nil) }
        guard fuse_mount(fuse, mountPoint) == 0 else {
            throw mountError("libfuse could not mount it (see the message above); check that /dev/fuse exists and fusermount3 is installed (apt-get install fuse3)")
        }
        let unmount = OnceUnmount(handle)
        defer { unmount.run() }
        // libfuse's own handlers only flag the session, which wakes its loop only if the signal lands on the loop's
        // thread; unmounting ends every worker's read, wherever the signal lands.
        let signals = [SIGINT, SIGTERM, SIGHUP].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { [logger] in
                logger.info("signal \(number): unmounting")
                unmount.run()
            }
            source.resume()
            return source
        }
        defer { signals.forEach { $0.cancel() } }
        signal(SIGPIPE, SIG_IGN)
        widenReadahead()
        logger.info("serving \(container.bundleIdentifier) at \(mountPoint)")
        ready()
        let result = ps_fuse_loop_mt(fuse, 16)
        if result != 0 && result != -EINTR {
            logger.error("the FUSE session ended with an error (\(Errno(rawValue: abs(result))))")
        }
        logger.info("unmounting \(mountPoint)")
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

    private func mountError(_ problem: String) -> ProtectedStoreError {
        ProtectedStoreError(.io, path: mountPoint, problem: "cannot mount: \(problem)", remedy: "Fix that and mount again")
    }

    // MARK: Operations

    private static let operations: fuse_operations = {
        var operations = fuse_operations()
        operations.`init` = { connection, config in
            if let connection {
                // Requests of up to 1 MiB: fewer round trips, and each large enough to decrypt on every core.
                connection.pointee.max_write = 1 << 20
                connection.pointee.max_readahead = 1 << 20
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
                info!.pointee = try file.map { try fs.attributes(ofHandle: $0.pointee.fh) } ?? fs.attributes(of: try string(path))
            }
        }
        operations.readlink = { path, buffer, size in
            serve("readlink", path) { fs in
                let target = Array(try fs.symbolicLinkTarget(try string(path)).utf8)
                guard let buffer, size > 0 else { throw Errno.invalidArgument }
                let count = min(target.count, size - 1)
                target.withUnsafeBytes { UnsafeMutableRawPointer(buffer).copyMemory(from: $0.baseAddress!, byteCount: count) }
                buffer[count] = 0
            }
        }
        operations.mknod = { path, mode, _ in
            serve("mknod", path) { fs in
                if mode & S_IFMT == S_IFREG {
                    fs.release(try fs.create(try string(path), mode: mode))
                } else {
                    try fs.createSpecialFile(try string(path), mode: mode)
                }
            }
        }
        operations.mkdir = { path, mode in serve("mkdir", path) { try $0.createDirectory(try string(path), mode: mode) } }
        operations.unlink = { path in serve("unlink", path) { try $0.removeFile(try string(path)) } }
        operations.rmdir = { path in serve("rmdir", path) { try $0.removeDirectory(try string(path)) } }
        operations.symlink = { target, path in serve("symlink", path) { try $0.createSymbolicLink(at: try string(path), target: try string(target)) } }
        operations.rename = { source, target, flags in serve("rename", source) { try $0.rename(try string(source), to: try string(target), flags: flags) } }
        operations.link = { source, target in serve("link", source) { try $0.link(try string(source), to: try string(target)) } }
        operations.chmod = { path, mode, file in
            serve("chmod", path) { try $0.setMode(mode, of: try path.map(string), handle: file?.pointee.fh) }
        }
        operations.chown = { path, user, group, file in
            serve("chown", path) { try $0.setOwner(user: user, group: group, of: try path.map(string), handle: file?.pointee.fh) }
        }
        operations.truncate = { path, size, file in
            serve("truncate", path) { try $0.truncate(try path.map(string), handle: file?.pointee.fh, to: Int64(size)) }
        }
        operations.utimens = { path, times, file in
            serve("utimens", path) { try $0.setTimes(times, of: try path.map(string), handle: file?.pointee.fh) }
        }
        operations.open = { path, file in
            serve("open", path) { fs in
                file!.pointee.fh = try fs.open(try string(path), flags: file!.pointee.flags)
                // Cached pages of the file are dropped at every open, and for class A files at every lock.
                file!.pointee.keep_cache = 0
            }
        }
        operations.create = { path, mode, file in
            serve("create", path) { fs in file!.pointee.fh = try fs.create(try string(path), mode: mode) }
        }
        operations.read = { path, buffer, size, offset, file in
            transfer("read", path) { fs in
                try fs.read(file!.pointee.fh, into: UnsafeMutableRawBufferPointer(start: buffer, count: size), at: Int64(offset))
            }
        }
        operations.write = { path, buffer, size, offset, file in
            transfer("write", path) { fs in
                try fs.write(file!.pointee.fh, from: UnsafeRawBufferPointer(start: buffer, count: size), at: Int64(offset))
            }
        }
        operations.fallocate = { path, mode, offset, length, file in
            serve("fallocate", path) { try $0.allocate(file!.pointee.fh, mode: mode, offset: Int64(offset), length: Int64(length)) }
        }
        operations.lseek = { path, offset, whence, file in
            answer("lseek", path) { try $0.seek(file!.pointee.fh, from: Int64(offset), whence: whence) }
        }
        operations.statfs = { path, info in serve("statfs", path) { info!.pointee = try $0.statistics() } }
        operations.flush = { _, _ in 0 }
        operations.release = { path, file in serve("release", path) { $0.release(file!.pointee.fh) } }
        operations.fsync = { path, _, file in serve("fsync", path) { try $0.synchronize(file!.pointee.fh) } }
        operations.setxattr = { path, name, value, size, flags in
            serve("setxattr", path) { fs in
                let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
                try fs.setExtendedAttribute(try string(path), name: try string(name), value: bytes, flags: flags)
            }
        }
        operations.getxattr = { path, name, buffer, size in
            transfer("getxattr", path) { fs in try copyOut(try fs.extendedAttribute(try string(path), name: try string(name)), to: buffer, size: size) }
        }
        operations.listxattr = { path, buffer, size in
            transfer("listxattr", path) { fs in
                try copyOut(try fs.extendedAttributeNames(try string(path)).flatMap { Array($0.utf8) + [0] }, to: buffer, size: size)
            }
        }
        operations.removexattr = { path, name in serve("removexattr", path) { try $0.removeExtendedAttribute(try string(path), name: try string(name)) } }
        operations.opendir = { path, file in serve("opendir", path) { fs in file!.pointee.fh = try fs.openDirectory(try string(path)) } }
        operations.readdir = { path, buffer, fill, _, file, _ in
            serve("readdir", path) { fs in
                for entry in try fs.directoryEntries(file!.pointee.fh) {
                    var info = stat()
                    info.st_ino = ino_t(entry.inode)
                    info.st_mode = entry.type
                    if fill!(buffer, entry.name, &info, 0, fuse_fill_dir_flags(0)) != 0 { break }
                }
            }
        }
        operations.releasedir = { path, file in serve("releasedir", path) { $0.releaseDirectory(file!.pointee.fh) } }
        operations.fsyncdir = { path, _, file in serve("fsyncdir", path) { try $0.synchronizeDirectory(file!.pointee.fh) } }
        return operations
    }()
}

/// The mount serving the current request.
private func currentFileSystem() -> ContainerFileSystem {
    Unmanaged<FUSEMount>.fromOpaque(fuse_get_context().pointee.private_data).takeUnretainedValue().fileSystem
}

/// Runs one operation: 0, or the negated errno libfuse expects.
private func serve(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (ContainerFileSystem) throws -> Void) -> Int32 {
    transfer(operation, path) { fs in
        try body(fs)
        return 0
    }
}

/// Runs an operation that answers with a byte count (or 0), or the negated errno.
private func transfer(_ operation: String, _ path: UnsafePointer<CChar>?, _ body: (ContainerFileSystem) throws -> Int) -> Int32 {
    Int32(answer(operation, path, body))
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

/// A name from the kernel. Names that are not UTF-8 are refused (EILSEQ): repaired, two of them could become one.
private func string(_ pointer: UnsafePointer<CChar>?) throws -> String {
    guard let pointer else { throw Errno.badFileDescriptor }
    guard let string = String(validatingCString: pointer) else { throw Errno.illegalByteSequence }
    return string
}

/// The libfuse instance, handed to the lock's cache invalidation on another thread (libfuse locks its own tree).
private struct FuseHandle: @unchecked Sendable {
    let fuse: OpaquePointer
}

/// Unmounts once, from a signal's handler or at the end of the loop, whichever comes first.
private final class OnceUnmount: @unchecked Sendable {
    private let handle: FuseHandle
    private let mutex = NSLock()
    private var done = false

    init(_ handle: FuseHandle) { self.handle = handle }

    func run() {
        mutex.withLock {
            guard !done else { return }
            done = true
            fuse_session_exit(fuse_get_session(handle.fuse))
            fuse_unmount(handle.fuse)
        }
    }
}
