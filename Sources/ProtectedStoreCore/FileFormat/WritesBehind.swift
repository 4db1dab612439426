import CSodium
import Foundation

/// The writes an open file has accepted but not yet stored (`EncryptedFile.writeBehind`), in the order they came.
///
/// One background job at a time stores them, so a program's next write is copied in while the one before it is
/// encrypted. A write that fails once accepted is counted and kept as the latest failure, and the writes after it are
/// dropped rather than stored over the gap, until the failure is reported to someone.
final class WritesBehind: @unchecked Sendable {
    struct Write {
        let bytes: UnsafeMutableRawBufferPointer
        let offset: Int64
        /// The stored bytes it may take (its blocks and their length records), counted against the disk's free space.
        let storedBytes: Int64
    }

    /// Room for the copies of accepted writes in the whole process, so memory stays bounded however many files are
    /// written at once; 16 MiB drains in tens of milliseconds, which is about what a lock waits for them.
    private static let budget = Budget(limit: 16 << 20)
    private static let outstandingInProcess = Locked<Int64>(0)

    private let condition = NSCondition()
    private var queue: [Write] = []
    private var queueHead = 0
    private var accepted: UInt64 = 0
    private var finished: UInt64 = 0
    private var isStoring = false
    private var failures = 0
    private var latestFailure: ProtectedStoreError?
    private var dropping = false
    private var droppedAfterFailure = 0

    /// A copy of `buffer`, once the process's budget has room for it (waits otherwise).
    static func copy(_ buffer: UnsafeRawBufferPointer, at offset: Int64, storedBytes: Int64) -> Write {
        budget.take(buffer.count)
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: buffer.count, alignment: 16)
        bytes.copyMemory(from: buffer)
        return Write(bytes: bytes, offset: offset, storedBytes: storedBytes)
    }

    /// Zeroes and frees a copy (plaintext must not linger in freed memory after a lock) and gives its room back.
    static func discard(_ write: Write) {
        sodium_memzero(write.bytes.baseAddress, write.bytes.count)
        write.bytes.deallocate()
        budget.give(write.bytes.count)
    }

    /// Stored bytes the accepted writes of every file in this process may still take.
    static var outstandingEverywhere: Int64 { outstandingInProcess.withLock { $0 } }

    /// Whether every accepted write has been stored (or dropped).
    var isSettled: Bool { condition.withLock { finished == accepted } }

    /// How many writes were ever accepted.
    var acceptedCount: UInt64 { condition.withLock { accepted } }

    /// How many accepted writes could not be stored, so far.
    var failureCount: Int { condition.withLock { failures } }

    /// Queues `write`; true when no job is storing, so the caller must start one.
    func accept(_ write: Write) -> Bool {
        condition.withLock {
            queue.append(write)
            accepted += 1
            Self.outstandingInProcess.withLock { $0 += write.storedBytes }
            defer { isStoring = true }
            return !isStoring
        }
    }

    /// The next write to store, and whether it must be dropped (an earlier one failed); nil ends the job.
    func next() -> (write: Write, drop: Bool)? {
        condition.withLock {
            guard queueHead < queue.count else {
                queue.removeAll(keepingCapacity: true)
                queueHead = 0
                isStoring = false
                return nil
            }
            // A writer that keeps ahead of the job never lets the queue empty: drop the stored half now and then.
            if queueHead >= 1024 && queueHead * 2 >= queue.count {
                queue.removeFirst(queueHead)
                queueHead = 0
            }
            defer { queueHead += 1 }
            if dropping { droppedAfterFailure += 1 }
            return (queue[queueHead], dropping)
        }
    }

    /// Marks `write` done; `error` (if storing it failed) becomes the failure to report.
    func finish(_ write: Write, failedWith error: (any Error)?, path: String) {
        let (count, offset, storedBytes) = (write.bytes.count, write.offset, write.storedBytes)
        // Zeroed before anyone waiting hears it is done: a lock that waited for it finds no plaintext left.
        Self.discard(write)
        condition.withLock {
            if let error {
                let underlying = error as? ProtectedStoreError
                failures += 1
                dropping = true
                droppedAfterFailure = 0
                latestFailure = ProtectedStoreError(underlying?.kind ?? .io, path: path,
                                                    problem: "a write of \(count) bytes at offset \(offset), accepted earlier, was not stored (\(underlying?.problem ?? "\(error)"))",
                                                    remedy: "Write those bytes again; the file keeps what was stored before them",
                                                    errno: underlying?.errno ?? .ioError)
            }
            finished += 1
            Self.outstandingInProcess.withLock { $0 -= storedBytes }
            condition.broadcast()
        }
    }

    /// Waits until the writes accepted before this call are stored or dropped; later ones may still be queued.
    func waitUntilStored() {
        condition.withLock {
            let target = accepted
            while finished < target { condition.wait() }
        }
    }

    /// The latest failure, for a reader that has heard of `seen` of them (and now of all): nil if none is new. Once
    /// someone has heard, storing resumes.
    func failure(after seen: inout Int) -> ProtectedStoreError? {
        condition.withLock {
            guard failures > seen, let latest = latestFailure else { return nil }
            seen = failures
            dropping = false
            guard droppedAfterFailure > 0 else { return latest }
            return ProtectedStoreError(latest.kind, path: latest.path, problem: "\(latest.problem); the \(droppedAfterFailure) write(s) accepted after it were not stored either",
                                       remedy: latest.remedy, errno: latest.errno)
        }
    }

    /// A byte count shared by waiters: `take` waits while `limit` would be passed (one oversized take goes alone).
    private final class Budget: @unchecked Sendable {
        private let limit: Int
        private let condition = NSCondition()
        private var used = 0

        init(limit: Int) { self.limit = limit }

        func take(_ count: Int) {
            condition.withLock {
                while used > 0 && used + count > limit { condition.wait() }
                used += count
            }
        }

        func give(_ count: Int) {
            condition.withLock {
                used -= count
                condition.broadcast()
            }
        }
    }
}
