import CSupport
import ProtectedStoreCore

/// What a process serving plaintext (`sandboxctl mount`, `launch`, `inbox mount`) does so that none of a class A
/// file's outlives a lock in it, nor is read out of it by another process of the user (docs/SECURITY.md).
package enum PlaintextHygiene {
    /// Before any plaintext: no core file and no tracing or /proc/PID/mem reads by other processes of the user
    /// (PR_SET_DUMPABLE 0, as the daemon), and heap blocks overwritten as they are freed.
    package static func hardenProcess() throws {
        try ProcessHardening.disableCoreDumps()
        _ = ps_overwrite_freed_memory()
    }

    /// At a lock, once the buffers holding plaintext are freed: the heap's free pages go back to the kernel, which
    /// zeroes them.
    package static func releaseFreedMemory() {
        ps_release_freed_memory()
    }
}
