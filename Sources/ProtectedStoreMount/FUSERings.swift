import CFuse
import CFuseRings
import Foundation
import Logging

/// The mount's requests over FUSE's io_uring transport (Linux 6.14+) where the administrator has turned it on
/// (`/sys/module/fuse/parameters/enable_uring`), beside libfuse's /dev/fuse loop, which keeps INIT, FORGET,
/// interrupts and notifications, and every request if the kernel declines. Each processor's requests are answered
/// by threads on that processor, without the hand-off to another one that costs most of a /dev/fuse round trip.
/// Sendable by hand: its C state is shared by design (ring threads, libfuse's threads, the unmount's `end`), guarded
/// there by atomics, a mutex and an eventfd.
final class FUSERings: @unchecked Sendable {
    /// The kernel's switch: root's, read once per mount.
    static let enableKnob = "/sys/module/fuse/parameters/enable_uring"

    private let rings: OpaquePointer
    private let reporter: Unmanaged<Reporter>

    /// Whether the administrator has turned the transport on (root's switch, read at each mount).
    static var isEnabled: Bool {
        (try? String(contentsOfFile: enableKnob, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) == "Y"
    }

    /// Asks for the rings (after `fuse_mount`, before the session's loop); nil, after logging why, if they cannot be
    /// set up, and then requests go over /dev/fuse.
    init?(fuse: OpaquePointer, logger: Logger) {
        let reporter = Unmanaged.passRetained(Reporter(logger: logger))
        guard let rings = ps_fuse_rings_start(fuse_get_session(fuse), UnsafeMutableRawPointer(fuse), UInt32(FUSESession.threads), { context, isError, message in
            let reporter = Unmanaged<Reporter>.fromOpaque(context!).takeUnretainedValue()
            let text = String(cString: message!)
            if isError != 0 { reporter.logger.error("\(text)") } else { reporter.logger.info("\(text)") }
        }, reporter.toOpaque()) else {
            reporter.release()
            return nil
        }
        self.rings = rings
        self.reporter = reporter
    }

    /// Where a READ taken from a ring can decrypt its `size` bytes straight into the reply (saving a copy of each
    /// read); nil over /dev/fuse. Only the operation's reply may follow: it is taken to be there already.
    static func replySpace(_ size: Int) -> UnsafeMutableRawPointer? { ps_fuse_rings_reply_space(size) }

    /// After the mount's own unmount: ends the rings, and libfuse's loop even if files are still open.
    func end() { ps_fuse_rings_end(rings) }

    /// Ends the ring threads: after the session's loop has returned, before `fuse_destroy`.
    func stop() {
        ps_fuse_rings_stop(rings)
        reporter.release()
    }

    /// Called from the ring threads: it only holds the logger, which is thread-safe.
    private final class Reporter: Sendable {
        let logger: Logger
        init(logger: Logger) { self.logger = logger }
    }
}
