import CSupport
import Foundation
import ProtectedStoreCore
import SystemPackage

/// Plaintext sizes of stored files, read from their length records, kept while the stored file is unchanged, so a
/// folder listed again (`rm -rf` after `ls -lR`) needs no open per file.
///
/// A stored file is unchanged while its change time, modification time and size are: every write, truncate or
/// rename beside the mount changes the change time. The kernel takes change times from a clock that moves in ticks,
/// so a change in the same tick as the last one could leave it equal; a size is therefore kept only when the change
/// time was already `settled` old when the file's status was read, since any later change then gets a later one. A
/// file system that keeps whole seconds (a change time without nanoseconds) ticks once a second: there it takes
/// `settledCoarse`. Only local file systems whose change times come from this machine's clock are trusted, and a
/// clock set back empties what was kept.
final class PlaintextSizes: @unchecked Sendable {
    private struct Stamp: Equatable {
        let changed: timespec
        let modified: timespec
        let storedSize: off_t

        init(_ info: stat) {
            changed = info.st_ctim
            modified = info.st_mtim
            storedSize = info.st_size
        }

        static func == (a: Stamp, b: Stamp) -> Bool {
            a.storedSize == b.storedSize && a.changed.tv_sec == b.changed.tv_sec && a.changed.tv_nsec == b.changed.tv_nsec
                && a.modified.tv_sec == b.modified.tv_sec && a.modified.tv_nsec == b.modified.tv_nsec
        }
    }

    private static let capacity = 65_536
    /// Well past a kernel tick (at most 10 ms).
    private static let settled: Int64 = 50_000_000
    private static let settledCoarse: Int64 = 2_050_000_000
    /// ext2/3/4, tmpfs, XFS and Btrfs (statfs magic numbers): local, stamped by this kernel.
    private static let trustedFileSystems: Set<Int> = [0xEF53, 0x0102_1994, 0x5846_5342, 0x9123_683E]

    private let keeping: Bool
    private let mutex = NSLock()
    private var sizes: [FileIdentity: (stamp: Stamp, size: UInt64)] = [:]
    /// The wall clock less the monotonic one when sizes were first kept: smaller means the wall clock was set back.
    private var clockOffset: Int64?

    /// With `keeping` false (see `stampsChangesReliably`) nothing is kept and every size is read.
    init(keeping: Bool) { self.keeping = keeping }

    /// Whether the file system holding `directory` stamps change times from this machine's clock.
    static func stampsChangesReliably(_ directory: FileDescriptor) -> Bool {
        trustedFileSystems.contains(Int(ps_file_system_type(directory.rawValue)))
    }

    /// The current time of the clock change times come from, taken before reading a status that may be kept.
    static func now() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    /// The plaintext size kept for the stored file whose status is `info`, if it has not changed since.
    func size(of info: stat) -> UInt64? {
        guard keeping else { return nil }
        let offset = Self.clockOffset()
        return mutex.withLock {
            if let kept = clockOffset, offset < kept - Self.settled {
                sizes.removeAll()
                clockOffset = nil
            }
            guard let kept = sizes[FileIdentity(info)], kept.stamp == Stamp(info) else { return nil }
            return kept.size
        }
    }

    /// Keeps `size`, read from the length record of the stored file whose status `info` was read after `observed`.
    func keep(_ size: UInt64, of info: stat, observedAt observed: timespec) {
        guard keeping else { return }
        let changed = Self.nanoseconds(info.st_ctim)
        let settled = info.st_ctim.tv_nsec == 0 ? Self.settledCoarse : Self.settled
        guard changed < Self.nanoseconds(observed) - settled else { return }
        let offset = Self.clockOffset()
        mutex.withLock {
            if sizes.count >= Self.capacity { sizes.removeAll(keepingCapacity: true) }
            if clockOffset == nil || sizes.isEmpty { clockOffset = offset }
            sizes[FileIdentity(info)] = (Stamp(info), size)
        }
    }

    private static func nanoseconds(_ time: timespec) -> Int64 {
        Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }

    private static func clockOffset() -> Int64 {
        var monotonic = timespec()
        clock_gettime(CLOCK_MONOTONIC, &monotonic)
        return nanoseconds(now()) - nanoseconds(monotonic)
    }
}
