import Foundation
import Testing

/// Runs each test case of a suite (or one test) on threads of its own instead of the Swift concurrency pool.
///
/// Swift Testing runs tests as tasks on the cooperative pool, which has one thread per core: two here. Nearly every
/// test of this package blocks its thread (waiting for a daemon, a mount, a grace period, an fsync), so two slow
/// tests took both threads and every other test, admitted or not, waited behind them for minutes. Under this trait
/// the test's task prefers `ThreadPerJobExecutor`, so its synchronous body blocks a thread made for it and the pool
/// stays free; how many tests run at once is still Swift Testing's limit (twice the cores).
public struct OwnThreadTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        let started = ContinuousClock.now
        defer { TestTimes.record(test, started.duration(to: .now)) }
        try await withTaskExecutorPreference(ThreadPerJobExecutor.shared) { try await function() }
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
