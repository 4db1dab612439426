import CLogind
import Foundation
import Logging
import ProtectedStore

/// What locks the device besides `sandboxctl lock` (`daemon --lock-on`): the user's session locking, the machine
/// going to sleep, the session staying idle. Each is an ordinary lock: observers get *will become unavailable* and the
/// grace period applies (capped before sleep, so the keys are gone inside logind's inhibitor delay).
public struct LockTriggers: Sendable, Equatable {
    public var sessionLock = false
    public var sleep = false
    /// Seconds a session stays idle (logind's IdleHint) before the lock; nil: idleness does not lock.
    public var idleSeconds: Int?

    /// Seconds an idle session waits when `idle` names no time.
    public static let defaultIdleSeconds = 300
    /// The longest idle time accepted: a week.
    public static let maximumIdleSeconds = 7 * 24 * 3600
    /// The longest grace period before sleep: logind's default inhibitor delay is 5 s.
    public static let sleepGraceCap: TimeInterval = 2

    public init() {}

    /// Parses `session-lock,sleep,idle[=SECONDS]` (any of them, comma-separated).
    public init(parsing specification: String) throws {
        for item in specification.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !item.isEmpty {
            switch item {
            case "session-lock": sessionLock = true
            case "sleep": sleep = true
            case "idle": idleSeconds = Self.defaultIdleSeconds
            default:
                guard item.hasPrefix("idle="), let seconds = Int(item.dropFirst(5)), (1...Self.maximumIdleSeconds).contains(seconds) else {
                    throw ProtectedStoreError(.invalidArgument, path: item, problem: "not a lock trigger",
                                              remedy: "Use session-lock, sleep and idle[=SECONDS] (whole seconds, 1 to \(Self.maximumIdleSeconds)), comma-separated")
                }
                idleSeconds = seconds
            }
        }
    }

    public var isEmpty: Bool { !sessionLock && !sleep && idleSeconds == nil }

    /// The triggers as `--lock-on` spells them.
    public var names: [String] {
        (sessionLock ? ["session-lock"] : []) + (sleep ? ["sleep"] : []) + (idleSeconds.map { ["idle=\($0)"] } ?? [])
    }
}

/// Follows systemd-logind on the system bus (sd-bus, in `CLogind`) and locks the device on the triggers asked for.
final class LockTriggerWatcher: @unchecked Sendable {
    private let triggers: LockTriggers
    private let device: Device
    /// Locks as a `lock` request does (the event's grace period recorded), then calls back when the keys are gone or
    /// the lock was cancelled by an unlock.
    private let lock: @Sendable (_ grace: TimeInterval, _ done: @escaping @Sendable () -> Void) -> Void
    private let logger: Logger
    private let stopRequest: OpaquePointer
    private let finished = DispatchSemaphore(value: 0)
    private let mutex = NSLock()
    private var connected = false
    private var idleLock: DispatchWorkItem?

    init(triggers: LockTriggers, device: Device, logger: Logger,
         lock: @escaping @Sendable (_ grace: TimeInterval, _ done: @escaping @Sendable () -> Void) -> Void) {
        self.triggers = triggers
        self.device = device
        self.lock = lock
        self.logger = logger
        stopRequest = ps_logind_stop_new()
    }

    deinit { ps_logind_stop_free(stopRequest) }

    /// Whether the system bus is connected and the triggers subscribed.
    var isConnected: Bool { mutex.withLock { connected } }

    func start() {
        let thread = Thread { [self] in
            let context = Unmanaged.passUnretained(self).toOpaque()
            ps_logind_run(context, { context, event in
                Unmanaged<LockTriggerWatcher>.fromOpaque(context!).takeUnretainedValue().handle(event)
            }, triggers.sessionLock ? 1 : 0, triggers.sleep ? 1 : 0, triggers.idleSeconds == nil ? 0 : 1, stopRequest)
            finished.signal()
        }
        thread.name = "ProtectedStore.lock-triggers"
        thread.start()
    }

    func stop() {
        ps_logind_stop_request(stopRequest)
        finished.wait()
        cancelIdleLock()
    }

    /// On the watcher's thread; only PS_LOGIND_SLEEP blocks (logind waits for the inhibitor meanwhile).
    private func handle(_ event: Int32) {
        switch event {
        case Int32(PS_LOGIND_SESSION_LOCK):
            lock(because: "the session locked", grace: device.gracePeriod)
        case Int32(PS_LOGIND_SLEEP):
            lockBeforeSleep()
        case Int32(PS_LOGIND_IDLE):
            guard let seconds = triggers.idleSeconds else { return }
            let work = DispatchWorkItem { [weak self] in self?.lock(because: "the session was idle for \(seconds) s", grace: self?.device.gracePeriod ?? 0) }
            mutex.withLock {
                idleLock?.cancel()
                idleLock = work
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(seconds), execute: work)
        case Int32(PS_LOGIND_ACTIVE):
            cancelIdleLock()
        case Int32(PS_LOGIND_CONNECTED):
            mutex.withLock { connected = true }
            logger.info("lock triggers \(triggers.names.joined(separator: ", ")): following logind on the system bus")
        case Int32(PS_LOGIND_DISCONNECTED):
            mutex.withLock { connected = false }
            // An "active again" may be missed while away: no stale idle lock.
            cancelIdleLock()
            logger.warning("lock triggers: the system bus went away; connecting again every second")
        default:
            break
        }
    }

    private func cancelIdleLock() { mutex.withLock { idleLock?.cancel() } }

    /// Locks unless already locked, also over a lock still in its grace period (the latest lock's deadline wins).
    private func lock(because reason: String, grace: TimeInterval, then done: @escaping @Sendable () -> Void = {}) {
        guard device.state != .locked else { return done() }
        logger.info("locking: \(reason)")
        lock(grace, done)
    }

    /// The keys must be gone before the machine sleeps: a lock with the grace period capped, and, if that has not
    /// finished in time (or an unlock cancelled it), one with none.
    private func lockBeforeSleep() {
        for (grace, wait) in [(min(device.gracePeriod, LockTriggers.sleepGraceCap), LockTriggers.sleepGraceCap + 1.5), (0, 2.5)] {
            let locked = DispatchSemaphore(value: 0)
            lock(because: "the machine is going to sleep", grace: grace) { locked.signal() }
            _ = locked.wait(timeout: .now() + wait)
            if device.state == .locked { return }
        }
        logger.error("the keys were not discarded before sleep: a file operation still held them")
    }
}
