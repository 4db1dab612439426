import CSodium
import Glibc
import SystemPackage

/// Runs work that handles passcode-derived secrets on a thread of its own, whose whole stack is zeroed once it ends.
///
/// libsodium leaves copies of what it computes on the stack: BLAKE2b's final step keeps the hash it returns in a local
/// buffer (Argon2id's output T and the passcode key K_pass both come out of it), and ChaCha20 keeps the last partial
/// block, so a class key it unwraps too. Swift frames spill values as well. Zeroing the stack of an ordinary thread
/// would mean guessing how deep it went; a stack this process maps itself can be wiped whole after the thread is joined.
package enum ScrubbedStack {
    /// Argon2id's memory is on the heap, so the stack needs only room for libsodium's and Swift's frames.
    static let size = 1 << 20

    /// Calls `body` on a new thread whose stack is wiped before this returns; blocks until then.
    package static func run<R>(_ body: () throws -> R) throws -> R {
        var outcome: Result<R, any Error>?
        try withoutActuallyEscaping(body) { body in
            try runOnScrubbedThread(Work { outcome = Result { try body() } })
        }
        return try outcome!.get()
    }

    private final class Work {
        let body: () -> Void
        init(_ body: @escaping () -> Void) { self.body = body }
    }

    private static func runOnScrubbedThread(_ work: Work) throws {
        let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
        let mappedSize = size + pageSize
        let mapped = mmap(nil, mappedSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0)
        guard let mapped, mapped != MAP_FAILED else {
            throw ProtectedStoreError.io(Errno(rawValue: errno), path: "/proc/self", doing: "map a stack for a passcode computation")
        }
        defer { munmap(mapped, mappedSize) }
        // The lowest page stays inaccessible, so an overflow faults instead of writing past the mapping.
        mprotect(mapped, pageSize, PROT_NONE)
        let stack = mapped + pageSize
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setstack(&attributes, stack, size)
        let context = Unmanaged.passRetained(work).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(&thread, &attributes, { context in
            Unmanaged<Work>.fromOpaque(context!).takeRetainedValue().body()
            return nil
        }, context)
        guard status == 0 else {
            Unmanaged<Work>.fromOpaque(context).release()
            throw ProtectedStoreError.io(Errno(rawValue: status), path: "/proc/self", doing: "start a thread for a passcode computation")
        }
        pthread_join(thread, nil)
        // glibc keeps the thread's own descriptor and TLS at the top of a caller-given stack: both go with it.
        sodium_memzero(stack, size)
    }
}
