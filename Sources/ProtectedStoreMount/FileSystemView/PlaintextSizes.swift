import Foundation
import ProtectedStoreCore

/// Plaintext sizes of stored files, read from their length records, kept while the stored file is unchanged, so a
/// folder listed again (`rm -rf` after `ls -lR`) needs no open per file.
///
/// A stored file is unchanged while its change time, modification time and size are: every write, truncate or
/// rename beside the mount changes the change time. The kernel takes change times from a clock that moves in ticks,
/// so a change in the same tick as the last one could leave it equal; a size is therefore kept only when the change
/// time was already `settled` old when the file's status was read, since any later change then gets a later one.
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
    private let mutex = NSLock()
    private var sizes: [FileIdentity: (stamp: Stamp, size: UInt64)] = [:]

    /// The current time of the clock change times come from, taken before reading a status that may be kept.
    static func now() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    /// The plaintext size kept for the stored file whose status is `info`, if it has not changed since.
    func size(of info: stat) -> UInt64? {
        mutex.withLock {
            guard let kept = sizes[FileIdentity(info)], kept.stamp == Stamp(info) else { return nil }
            return kept.size
        }
    }

    /// Keeps `size`, read from the length record of the stored file whose status `info` was read after `observed`.
    func keep(_ size: UInt64, of info: stat, observedAt observed: timespec) {
        let changed = Int64(info.st_ctim.tv_sec) * 1_000_000_000 + Int64(info.st_ctim.tv_nsec)
        let then = Int64(observed.tv_sec) * 1_000_000_000 + Int64(observed.tv_nsec)
        guard changed < then - Self.settled else { return }
        mutex.withLock {
            if sizes.count >= Self.capacity { sizes.removeAll(keepingCapacity: true) }
            sizes[FileIdentity(info)] = (Stamp(info), size)
        }
    }
}
