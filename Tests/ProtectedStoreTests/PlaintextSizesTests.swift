import CSupport
import Foundation
@testable import ProtectedStoreMount
import SystemPackage
import Testing
import SuiteThreads

@Suite("the mount's kept plaintext sizes", .ownThread)
struct PlaintextSizesTests {
    private static let second: Int64 = 1_000_000_000

    private static func time(_ nanoseconds: Int64) -> timespec {
        timespec(tv_sec: Int(nanoseconds / second), tv_nsec: Int(nanoseconds % second))
    }

    private static func status(changedAt nanoseconds: Int64, inode: ino_t) -> stat {
        var info = stat()
        info.st_dev = 7
        info.st_ino = inode
        info.st_size = 5160
        info.st_ctim = time(nanoseconds)
        info.st_mtim = time(nanoseconds)
        return info
    }

    @Test("a size is kept only while the stored file's change time, modification time, size and inode stay, and only once its change time has settled")
    func keptWhileUnchanged() {
        let sizes = PlaintextSizes(keeping: true)
        let settled = Self.status(changedAt: 100 * Self.second + 123_456, inode: 42)
        sizes.keep(10, of: settled, observedAt: Self.time(100 * Self.second + 60_000_000))
        #expect(sizes.size(of: settled) == 10)
        var changed = settled
        changed.st_ctim.tv_nsec += 1
        #expect(sizes.size(of: changed) == nil)
        var modified = settled
        modified.st_mtim.tv_nsec += 1
        #expect(sizes.size(of: modified) == nil)
        var grown = settled
        grown.st_size += 4136
        #expect(sizes.size(of: grown) == nil)
        var another = settled
        another.st_ino = 43
        #expect(sizes.size(of: another) == nil)

        // Read within a tick of its last change, a change still to come could keep the same change time.
        let fresh = Self.status(changedAt: 200 * Self.second + 5, inode: 44)
        sizes.keep(10, of: fresh, observedAt: Self.time(200 * Self.second + 10_000_000))
        #expect(sizes.size(of: fresh) == nil)
    }

    @Test("on a file system that keeps whole seconds only, a size is kept once its change time is seconds old")
    func wholeSecondTimes() {
        let sizes = PlaintextSizes(keeping: true)
        let coarse = Self.status(changedAt: 300 * Self.second, inode: 45)
        sizes.keep(10, of: coarse, observedAt: Self.time(300 * Self.second + 900_000_000))
        #expect(sizes.size(of: coarse) == nil, "a change later in the same second would keep its change time")
        sizes.keep(10, of: coarse, observedAt: Self.time(304 * Self.second))
        #expect(sizes.size(of: coarse) == 10)
    }

    @Test("on a file system not known to stamp changes from this machine's clock, nothing is kept")
    func untrustedFileSystem() {
        let sizes = PlaintextSizes(keeping: false)
        let settled = Self.status(changedAt: 100 * Self.second + 123_456, inode: 42)
        sizes.keep(10, of: settled, observedAt: Self.time(200 * Self.second))
        #expect(sizes.size(of: settled) == nil)
        let here = TemporaryDirectory()
        let descriptor = open(here.path, O_RDONLY | O_DIRECTORY)
        defer { close(descriptor) }
        if [0xEF53, 0x0102_1994].contains(Int(ps_file_system_type(descriptor))) {
            #expect(PlaintextSizes.stampsChangesReliably(FileDescriptor(rawValue: descriptor)), "ext4 and tmpfs are trusted")
        }
    }
}
