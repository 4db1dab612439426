import CFuse
import Foundation
import Logging
import ProtectedStore
import SystemPackage

/// One libfuse session (high-level API, multithreaded) at a mount point, shared by the container mount and the Inbox
/// drop folder: it mounts, serves until SIGINT, SIGTERM or SIGHUP or until `fusermount3 -u`, and unmounts.
enum FUSESession {
    /// How many threads libfuse's /dev/fuse loop may start; the io_uring transport starts about as many.
    static let threads = 16

    /// Mounts with `operations` (whose requests find `context` as their private data), calls `started` with the
    /// libfuse instance, `ready` once the file system is visible, and `stopping` before the instance is destroyed.
    /// With `unmountedBy`, SIGINT, SIGTERM and SIGHUP are left to the caller, which is handed the call that unmounts.
    /// Requests come over FUSE's io_uring transport where the administrator turned it on, unless `overIOUring` is false.
    static func serve(mountPoint: String, options: String, operations: fuse_operations, context: UnsafeMutableRawPointer, what: String,
                      logger: Logger, overIOUring: Bool = true, started: (FuseHandle) -> Void = { _ in }, stopping: () -> Void = {},
                      unmountedBy: ((@escaping @Sendable () -> Void) -> Void)? = nil, ready: () -> Void) throws {
        var arguments = fuse_args()
        defer { fuse_opt_free_args(&arguments) }
        for argument in ["sandboxctl", "-o", options] where fuse_opt_add_arg(&arguments, argument) != 0 {
            throw mountError("libfuse could not take its arguments (out of memory)", mountPoint: mountPoint)
        }
        var operations = operations
        guard let fuse = ps_fuse_new(&arguments, &operations, context) else {
            throw mountError("libfuse refused the mount options \(options) (see the message above)", mountPoint: mountPoint)
        }
        defer { fuse_destroy(fuse) }
        let handle = FuseHandle(fuse: fuse)
        var rings: FUSERings?
        // After `stopping`: no invalidation at a lock reaches the reply router once it is gone.
        defer { rings?.stop() }
        started(handle)
        defer { stopping() }
        guard fuse_mount(fuse, mountPoint) == 0 else {
            throw mountError("libfuse could not mount it (see the message above); check that /dev/fuse exists and fusermount3 is installed (apt-get install fuse3)",
                             mountPoint: mountPoint)
        }
        if !overIOUring {
            logger.debug("requests go over /dev/fuse, as asked")
        } else if FUSERings.isEnabled {
            rings = FUSERings(fuse: fuse, logger: logger)
        } else {
            logger.debug("requests go over /dev/fuse: FUSE over io_uring is off (\(FUSERings.enableKnob) is not Y; root can turn it on before mounting, docs/FUSE-IO-URING.md)")
        }
        let unmount = OnceUnmount(handle, rings: rings)
        defer { unmount.run() }
        // libfuse's own handlers only flag the session, which wakes its loop only if the signal lands on the loop's
        // thread; unmounting ends every worker's read, wherever the signal lands.
        unmountedBy?({ unmount.run() })
        let signals: [any DispatchSourceSignal] = (unmountedBy != nil ? [] : [SIGINT, SIGTERM, SIGHUP]).map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                logger.info("signal \(number): unmounting")
                unmount.run()
            }
            source.resume()
            return source
        }
        defer { signals.forEach { $0.cancel() } }
        signal(SIGPIPE, SIG_IGN)
        logger.info("serving \(what) at \(mountPoint)")
        ready()
        let result = ps_fuse_loop_mt(fuse, UInt32(threads))
        if result != 0 && result != -EINTR {
            logger.error("the FUSE session ended with an error (\(Errno(rawValue: abs(result))))")
        }
        logger.info("unmounting \(mountPoint)")
    }

    private static func mountError(_ problem: String, mountPoint: String) -> ProtectedStoreError {
        ProtectedStoreError(.io, path: mountPoint, problem: "cannot mount: \(problem)", remedy: "Fix that and mount again")
    }
}

/// A name from the kernel. Names that are not UTF-8 are refused (EILSEQ): repaired, two of them could become one.
func kernelString(_ pointer: UnsafePointer<CChar>?) throws -> String {
    guard let pointer else { throw Errno.badFileDescriptor }
    guard let string = String(validatingCString: pointer) else { throw Errno.illegalByteSequence }
    return string
}

/// The libfuse instance, handed to the lock's cache invalidation on another thread (libfuse locks its own tree).
struct FuseHandle: @unchecked Sendable {
    let fuse: OpaquePointer
}

/// Unmounts once, from a signal's handler or at the end of the loop, whichever comes first.
private final class OnceUnmount: @unchecked Sendable {
    private let handle: FuseHandle
    private let rings: FUSERings?
    private let mutex = NSLock()
    private var done = false

    init(_ handle: FuseHandle, rings: FUSERings?) {
        self.handle = handle
        self.rings = rings
    }

    func run() {
        mutex.withLock {
            guard !done else { return }
            done = true
            fuse_session_exit(fuse_get_session(handle.fuse))
            fuse_unmount(handle.fuse)
            rings?.end()
        }
    }
}
