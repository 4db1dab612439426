import CFuse
import CFuseRings
import Foundation
import Logging
import SystemPackage

/// The mount's requests over FUSE's io_uring transport (Linux 6.14+) where the administrator has turned it on
/// (`/sys/module/fuse/parameters/enable_uring`), beside libfuse's /dev/fuse loop, which keeps INIT, FORGET,
/// interrupts and notifications, and every request if the kernel declines. Each processor's requests are answered
/// by threads on that processor, without the hand-off to another one that costs most of a /dev/fuse round trip.
final class FUSERings {
    /// The kernel's switch: root's, read once per mount.
    static let enableKnob = "/sys/module/fuse/parameters/enable_uring"

    private let rings: OpaquePointer
    private let reporter: Unmanaged<Reporter>

    /// Routes the session's replies (after `fuse_mount`, before its loop); nil, after logging why, if libfuse refused.
    init?(session: OpaquePointer, mountPoint: String, logger: Logger) {
        let enabled = (try? String(contentsOfFile: Self.enableKnob, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) == "Y"
        if !enabled {
            logger.debug("requests go over /dev/fuse: FUSE over io_uring is off (\(Self.enableKnob) is not Y; root can turn it on before mounting, docs/FUSE-IO-URING.md)")
        }
        let reporter = Unmanaged.passRetained(Reporter(logger: logger))
        // About as many threads as libfuse's own loop may start (16), pinned two or more to each processor.
        guard let rings = ps_fuse_rings_start(session, enabled ? 1 : 0, 16, { context, isError, message in
            let reporter = Unmanaged<Reporter>.fromOpaque(context!).takeUnretainedValue()
            let text = String(cString: message!)
            if isError != 0 { reporter.logger.error("\(text)") } else { reporter.logger.info("\(text)") }
        }, reporter.toOpaque()) else {
            logger.error("cannot route \(mountPoint)'s replies (\(Errno(rawValue: errno))); requests go over /dev/fuse")
            reporter.release()
            return nil
        }
        self.rings = rings
        self.reporter = reporter
    }

    /// Ends the ring threads: after the session's loop has returned, before `fuse_destroy`.
    func stop() {
        ps_fuse_rings_stop(rings)
        reporter.release()
    }

    private final class Reporter {
        let logger: Logger
        init(logger: Logger) { self.logger = logger }
    }
}
