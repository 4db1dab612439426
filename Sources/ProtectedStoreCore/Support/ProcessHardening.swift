import CSupport
import Foundation
import SystemPackage

/// What a process holding keys or plaintext does first (the daemon, the mount, the launcher).
package enum ProcessHardening {
    /// No core file, and no tracing or /proc/PID/mem reads by other processes of the same user (`RLIMIT_CORE` 0,
    /// `PR_SET_DUMPABLE` 0); root still can.
    package static func disableCoreDumps() throws {
        guard ps_disable_core_dumps() == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: errno), path: "/proc/self", doing: "disable core dumps (prctl PR_SET_DUMPABLE)")
        }
    }
}
