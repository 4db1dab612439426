import CSodium
import Foundation

/// The writes an open file has accepted but not yet stored (`EncryptedFile.writeBehind`), in the order they came.
///
/// One background job at a time stores them, so a program's next write is copied in while the one before it is
/// encrypted. A write that fails once accepted becomes the file's `failure`, and the writes after it are dropped
/// rather than stored over the gap, until the failure is taken and reported.
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
    private var failure: ProtectedStoreError?
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

    /// Whether a failure waits to be reported.
    var hasFailure: Bool { condition.withLock { failure != nil } }

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
            if failure != nil { droppedAfterFailure += 1 }
            return (queue[queueHead], failure != nil)
        }
    }

    /// Marks `write` done; `error` (if storing it failed) becomes the failure to report.
    func finish(_ write: Write, failedWith error: (any Error)?, path: String) {
        condition.withLock {
            if let error {
                let underlying = error as? ProtectedStoreError
                failure = ProtectedStoreError(underlying?.kind ?? .io, path: path,
                                              problem: "a write of \(write.bytes.count) bytes at offset \(write.offset), accepted earlier, was not stored (\(underlying?.problem ?? "\(error)"))",
                                              remedy: "Write those bytes again; the file keeps what was stored before them",
                                              errno: underlying?.errno ?? .ioError)
            }
            finished += 1
            Self.outstandingInProcess.withLock { $0 -= write.storedBytes }
            condition.broadcast()
        }
        Self.discard(write)
    }

    /// Waits until the writes accepted before this call are stored or dropped; later ones may still be queued.
    func waitUntilStored() {
        condition.withLock {
            let target = accepted
            while finished < target { condition.wait() }
        }
    }

    /// The failure of a stored write, if one has not been reported yet; it is reported once, and storing resumes.
    func takeFailure() -> ProtectedStoreError? {
        condition.withLock {
            guard let reported = failure else { return nil }
            let dropped = droppedAfterFailure
            failure = nil
            droppedAfterFailure = 0
            guard dropped > 0 else { return reported }
            return ProtectedStoreError(reported.kind, path: reported.path, problem: "\(reported.problem); the \(dropped) write(s) accepted after it were not stored either",
                                       remedy: reported.remedy, errno: reported.errno)
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
