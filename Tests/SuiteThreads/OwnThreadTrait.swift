import Foundation
import Testing

/// Runs each test case of a suite (or one test) on threads of its own instead of the Swift concurrency pool, a few
/// such cases at once (`TestSlots`).
///
/// Swift Testing runs tests as tasks on the cooperative pool, which has one thread per core: two here. Nearly every
/// test of this package blocks its thread (waiting for a daemon, a mount, a grace period, an fsync), so two slow
/// tests took both threads and every other test waited behind them for minutes. Under this trait the test's task
/// prefers `ThreadPerJobExecutor`, so its synchronous body blocks a thread made for it and the pool stays free. Off
/// the pool nothing else bounds how many tests run (Swift Testing started them all at once, and a power-cut test
/// took four times its time alone), so the trait admits a few at a time, in the order they arrive.
public struct OwnThreadTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        // Only a test case runs code of its own: a suite holding a slot while its cases wait for one could deadlock.
        guard testCase != nil else { return try await function() }
        await TestSlots.shared.acquire()
        let started = ContinuousClock.now
        var failure: (any Error)?
        do {
            try await withTaskExecutorPreference(ThreadPerJobExecutor.shared) { try await function() }
        } catch {
            failure = error
        }
        TestTimes.record(test, started.duration(to: .now))
        await TestSlots.shared.release()
        if let failure { throw failure }
    }
}

/// How many test cases under `.ownThread` run at once: `PROTECTEDSTORE_TEST_WIDTH`, else twice the cores, the width
/// Swift Testing means to keep to (cases waiting on a process or a timer leave the cores to the others; with no bound,
/// CPU-bound cases took four times their time alone). Waiting for a slot suspends, holding no thread.
actor TestSlots {
    /// The slots every suite shares.
    static let shared = TestSlots(width: ProcessInfo.processInfo.environment["PROTECTEDSTORE_TEST_WIDTH"].flatMap(Int.init)
        ?? 2 * ProcessInfo.processInfo.activeProcessorCount)

    private var free: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    private init(width: Int) {
        free = max(1, width)
    }

    /// Returns once a slot is this caller's, at once if one is free.
    func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    /// Gives a slot back, to the longest waiting caller if there is one.
    func release() {
        if waiting.isEmpty {
            free += 1
        } else {
            waiting.removeFirst().resume()
        }
    }
}

/// Each test case's own time, from when it began to run to its end, appended as `seconds<TAB>test id` lines to the file
/// `PROTECTEDSTORE_TEST_TIMES` names (scripts/timed-suite.sh reads them). Swift Testing's own figure for a test counts
/// from the moment it was scheduled, so a test queued behind others looks slow though it is not.
enum TestTimes {
    private static let descriptor: Int32? = ProcessInfo.processInfo.environment["PROTECTEDSTORE_TEST_TIMES"].flatMap { path in
        let descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        return descriptor >= 0 ? descriptor : nil
    }

    static func record(_ test: Test, _ duration: Duration) {
        guard let descriptor else { return }
        let (seconds, attoseconds) = duration.components
        // One write(2) of a short line to an O_APPEND file: lines of cases ending together do not interleave.
        let line = String(format: "%.3f", Double(seconds) + Double(attoseconds) / 1e18) + "\t\(test.id)\n"
        _ = line.withCString { write(descriptor, $0, strlen($0)) }
    }
}

extension Trait where Self == OwnThreadTrait {
    /// Each test case runs on threads of its own, so blocking in it holds no thread of the concurrency pool.
    public static var ownThread: Self { OwnThreadTrait() }
}

/// A task executor that runs every job on a new thread.
///
/// A thread per job, not one per test: a test whose child tasks wait for each other (a task group, `async let`) would
/// deadlock on a single thread. A job is one stretch of a task between two suspensions, so a synchronous test is one
/// or two threads, and an async test with a thousand awaits a thousand short-lived ones (tens of microseconds each).
public final class ThreadPerJobExecutor: TaskExecutor {
    /// The one instance: it has no state, so every test can share it.
    public static let shared = ThreadPerJobExecutor()

    private init() {}

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        let thread = Thread { job.runSynchronously(on: executor) }
        // Tests recurse through deep generic code (the power-cut simulator, JSON, SQLite): the main thread's size.
        thread.stackSize = 8 << 20
        thread.start()
    }
}
