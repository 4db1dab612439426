import Foundation
@testable import ProtectedStore
import Testing
import SuiteThreads

/// After a lock, none of a class A file's plaintext may be left in a process of ours that handled it: the mount's
/// buffers, freed heap blocks, stacks, libfuse's request buffers and the io_uring entries included (docs/SECURITY.md;
/// the launcher's test is in `LaunchTests`). Root reads their memory; those processes are not dumpable, so no other
/// process of the user can.
@Suite("plaintext after the lock", .ownThread, .enabled(if: FUSEAvailability.isAvailable, "needs /dev/fuse and fusermount3"))
struct PlaintextAfterLockTests {
    /// Random bytes, so a copy found is a copy.
    static func random(_ count: Int) -> Data {
        Data((0..<count).map { _ in UInt8.random(in: 0...255) })
    }

    /// A process's mappings, with what they are (the heap, a thread's stack, a library).
    static func maps(_ pid: Int32) -> String {
        String(decoding: FileHandle(forReadingAtPath: "/proc/\(pid)/maps")?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
    }

    /// Root reads any process's memory; for anyone else, a process of ours must be closed to its own user (not
    /// dumpable): then there is nothing to scan, and the test says so.
    static func canScan(_ pid: Int32) -> Bool {
        guard geteuid() == 0 else {
            #expect(!FileManager.default.isReadableFile(atPath: "/proc/\(pid)/mem"), "process \(pid) can be read by other processes of its user")
            print("plaintext after the lock: skipping the scan of process \(pid): it needs root (the process is not dumpable)")
            return false
        }
        return true
    }

    @Test("sandboxctl mount: a 4 MiB class A file written through it and a 300 KB one read through it leave nothing in it after the lock",
          arguments: MountTransport.testable)
    func mountHoldsNoPlaintextAfterTheLock(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let written = Self.random(4 << 20), read = Self.random(300_000)
        #expect(FileManager.default.createFile(atPath: mounted.path("Documents/written.bin"), contents: written))
        // Written past the mount, so reading it through the mount has the mount decrypt it.
        try mounted.container.write(read, toPath: "Documents/read.bin", options: .completeFileProtection)
        #expect(FileManager.default.contents(atPath: mounted.path("Documents/read.bin")) == read)
        // The scan is not blind: this process holds both.
        #expect(try PlaintextScan(pid: getpid(), plaintexts: [written, read]).foundBytes >= written.count + read.count)
        try mounted.lock()
        guard Self.canScan(mounted.mount.pid) else { return }
        let scan = try PlaintextScan(pid: mounted.mount.pid, plaintexts: [written, read])
        print("plaintext after the lock: sandboxctl mount over \(transport): \(scan.foundBytes) bytes of \(written.count + read.count) found in \(scan.scannedBytes >> 20) MiB \(scan.found)")
        #expect(scan.foundBytes == 0, "left in the mount after the lock: \(scan.found) at \(scan.addresses); its mappings: \(Self.maps(mounted.mount.pid))")
    }
}
