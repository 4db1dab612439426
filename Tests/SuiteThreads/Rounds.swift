import Foundation

/// Work by worker threads in rounds of counted steps, granted and awaited by a test's main loop.
///
/// For stress tests whose workers race a loop of events (lock/unlock cycles): each round lets every worker take so
/// many steps while the loop's events happen, and the loop waits for them before it goes on. The work is then a
/// count, the same on any machine: workers that ran until a flag did more on a slower machine, which made every
/// cycle slower again (the class B journal grew with every note written while locked).
public final class Rounds: @unchecked Sendable {
    private let condition = NSCondition()
    private var granted = 0
    private var taken: [Int]
    private var ended: [Bool]
    private var closed = false
    private var waiter: CheckedContinuation<Void, Never>?

    /// Rounds for `workers` workers, numbered from 0.
    public init(workers: Int) {
        taken = Array(repeating: 0, count: workers)
        ended = Array(repeating: false, count: workers)
    }

    /// Worker `worker`'s loop, on its own thread: `step` runs once for each step granted (with the worker's count of
    /// steps so far), until `close()`. A step that throws ends the worker, which then holds no round back.
    public func work(worker: Int, _ step: (Int) throws -> Void) rethrows {
        defer { end(worker) }
        while let index = nextStep(worker) {
            try step(index)
            condition.withLock {
                taken[worker] += 1
                resumeWaiterIfRoundDone()
            }
        }
    }

    /// Starts a round: every worker may take `steps` more steps.
    public func start(steps: Int) {
        condition.withLock {
            granted += steps
            condition.broadcast()
        }
    }

    /// Returns once every worker has taken all the steps granted so far, or ended. Suspends, holding no thread.
    public func finished() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            condition.withLock {
                if roundDone {
                    continuation.resume()
                } else {
                    waiter = continuation
                }
            }
        }
    }

    /// Ends the rounds: every worker's `work` returns after its step in progress.
    public func close() {
        condition.withLock {
            closed = true
            condition.broadcast()
        }
    }

    /// The steps each worker took.
    public var steps: [Int] { condition.withLock { taken } }

    private func nextStep(_ worker: Int) -> Int? {
        condition.withLock {
            while taken[worker] >= granted && !closed { condition.wait() }
            return taken[worker] < granted && !closed ? taken[worker] : nil
        }
    }

    private func end(_ worker: Int) {
        condition.withLock {
            ended[worker] = true
            resumeWaiterIfRoundDone()
        }
    }

    /// Caller holds `condition`.
    private var roundDone: Bool {
        taken.indices.allSatisfy { ended[$0] || taken[$0] >= granted }
    }

    /// Caller holds `condition`.
    private func resumeWaiterIfRoundDone() {
        guard roundDone, let waiter else { return }
        self.waiter = nil
        waiter.resume()
    }
}
