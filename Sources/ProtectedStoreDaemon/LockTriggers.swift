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
    public var idleSeconds: Double?

    /// Seconds an idle session waits when `idle` names no time.
    public static let defaultIdleSeconds: Double = 300
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
                guard item.hasPrefix("idle="), let seconds = Double(item.dropFirst(5)), seconds > 0, seconds.isFinite else {
                    throw ProtectedStoreError(.invalidArgument, path: item, problem: "not a lock trigger",
                                              remedy: "Use session-lock, sleep and idle[=SECONDS], comma-separated")
                }
                idleSeconds = seconds
            }
        }
    }

    public var isEmpty: Bool { !sessionLock && !sleep && idleSeconds == nil }

    /// The triggers as `--lock-on` spells them.
    public var names: [String] {
        (sessionLock ? ["session-lock"] : []) + (sleep ? ["sleep"] : []) + (idleSeconds.map { ["idle=\(Int($0))"] } ?? [])
    }
}

/// Follows systemd-logind on the system bus (sd-bus, in `CLogind`) and locks the device on the triggers asked for.
final class LockTriggerWatcher: @unchecked Sendable {
    private let triggers: LockTriggers
    private let device: Device
    private let logger: Logger
    private let stopFlag = UnsafeMutablePointer<Int32>.allocate(capacity: 1)
    private let finished = DispatchSemaphore(value: 0)
    private let mutex = NSLock()
    private var connected = false
    private var idleLock: DispatchWorkItem?

    init(triggers: LockTriggers, device: Device, logger: Logger) {
        self.triggers = triggers
        self.device = device
        self.logger = logger
        stopFlag.initialize(to: 0)
    }

    deinit { stopFlag.deallocate() }

    /// Whether the system bus is connected and the triggers subscribed.
    var isConnected: Bool { mutex.withLock { connected } }

    func start() {
        let thread = Thread { [self] in
            let context = Unmanaged.passUnretained(self).toOpaque()
            ps_logind_run(context, { context, event in
                Unmanaged<LockTriggerWatcher>.fromOpaque(context!).takeUnretainedValue().handle(event)
            }, triggers.sessionLock ? 1 : 0, triggers.sleep ? 1 : 0, triggers.idleSeconds == nil ? 0 : 1, stopFlag)
            finished.signal()
        }
        thread.name = "ProtectedStore.lock-triggers"
        thread.start()
    }

    func stop() {
        stopFlag.pointee = 1
        finished.wait()
        mutex.withLock { idleLock?.cancel() }
    }

    /// On the watcher's thread; only PS_LOGIND_SLEEP may block (logind waits for the inhibitor meanwhile).
    private func handle(_ event: Int32) {
        switch event {
        case Int32(PS_LOGIND_SESSION_LOCK):
            lock(because: "the session locked")
        case Int32(PS_LOGIND_SLEEP):
            let locked = DispatchSemaphore(value: 0)
            lock(because: "the machine is going to sleep", grace: min(device.gracePeriod, LockTriggers.sleepGraceCap)) { locked.signal() }
            _ = locked.wait(timeout: .now() + LockTriggers.sleepGraceCap + 2)
        case Int32(PS_LOGIND_IDLE):
            guard let seconds = triggers.idleSeconds else { return }
            let work = DispatchWorkItem { [weak self] in self?.lock(because: "the session was idle for \(Int(seconds)) s") }
            mutex.withLock {
                idleLock?.cancel()
                idleLock = work
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds, execute: work)
        case Int32(PS_LOGIND_ACTIVE):
            mutex.withLock { idleLock?.cancel() }
        case Int32(PS_LOGIND_CONNECTED):
            mutex.withLock { connected = true }
            logger.info("lock triggers \(triggers.names.joined(separator: ", ")): following logind on the system bus")
        case Int32(PS_LOGIND_DISCONNECTED):
            mutex.withLock { connected = false }
            logger.warning("lock triggers: the system bus went away; connecting again every second")
        default:
            break
        }
    }

    private func lock(because reason: String, grace: TimeInterval? = nil, then done: @escaping @Sendable () -> Void = {}) {
        guard device.state == .unlocked else { return done() }
        logger.info("locking: \(reason)")
        device.lock(gracePeriod: grace ?? device.gracePeriod, then: done)
    }
}
