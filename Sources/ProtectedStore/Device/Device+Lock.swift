import Dispatch
import Foundation
import ProtectedStoreCore

/// The lock state machine: beforeFirstUnlock → unlocked → locking (grace) → locked, and unlock from either locked state.
///
/// Guarantees: *will become unavailable* reaches every observer before any key is discarded;
/// *did become available* is delivered only after every class key is loaded.
extension Device {
    /// The current state.
    public var state: State { mutex.withLock { currentState } }

    /// Whether class A data can be used now (UIApplication's `isProtectedDataAvailable`): true while unlocked,
    /// and during the grace period of a lock, until the keys are discarded.
    public var isProtectedDataAvailable: Bool {
        let state = state
        return state == .unlocked || state == .locking
    }

    /// Seconds between *will become unavailable* and discarding the keys when not every observer has said it is
    /// done; 10 by default, as on iOS. 0 discards the keys as soon as the event has been handed to every observer.
    public var gracePeriod: TimeInterval {
        get { mutex.withLock { currentGracePeriod } }
        set {
            precondition(newValue >= 0 && newValue.isFinite, "the grace period must be a finite number of seconds ≥ 0")
            mutex.withLock { currentGracePeriod = newValue }
        }
    }

    // MARK: Observing

    /// Adds a delegate (held weakly) that receives every later event.
    public func addDelegate(_ delegate: any ProtectedDataDelegate) { dispatcher.add(delegate) }

    /// Stops sending events to `delegate`.
    public func removeDelegate(_ delegate: any ProtectedDataDelegate) { dispatcher.remove(delegate) }

    /// A new subscription to every later event, as an `AsyncSequence`; it ends when dropped or its task is cancelled.
    public func protectedDataEvents() -> ProtectedDataEvents { ProtectedDataEvents(subscription: dispatcher.subscribe()) }

    // MARK: Locking and unlocking

    /// Locks the device: delivers *will become unavailable* to every observer, then, once all are done or the grace
    /// period (`gracePeriod` unless given) has passed, zeroes class A's key, class B's secret key and the per-file
    /// keys of open class A files. Returns when the device is locked, or when an unlock during the grace period
    /// cancelled the lock. Does nothing before first unlock or when already locked. During another lock's grace
    /// period it waits for that lock, whose deadline it brings forward to its own grace period if that ends sooner.
    ///
    /// Attached to a daemon, it asks the daemon, which locks every program using the device (`gracePeriod` nil: the
    /// daemon's own); if the daemon can't be reached, this process drops its class A file keys and counts as locked.
    public func lock(gracePeriod: TimeInterval? = nil) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock(gracePeriod: gracePeriod) { continuation.resume() }
        }
    }

    /// `lock(gracePeriod:)` for callers off Swift concurrency (the daemon's poll loop): `then` runs once the lock
    /// is over. No task waits meanwhile, so a lock never depends on a free thread in the cooperative pool.
    package func lock(gracePeriod: TimeInterval?, then: @escaping @Sendable () -> Void) {
        precondition((gracePeriod ?? 0) >= 0 && (gracePeriod ?? 0).isFinite, "the grace period must be a finite number of seconds ≥ 0")
        holder.lock(self, gracePeriod: gracePeriod, then: then)
    }

    /// The lock state machine for keys held in this process: *will become unavailable* to every observer, then, once
    /// all are done or the grace period has passed, `discardClassKeys` (under the mutex, as the state becomes locked)
    /// and the per-file keys of open class A files.
    func runLock(gracePeriod: TimeInterval?, discardClassKeys: @escaping @Sendable () -> Void, then: @escaping @Sendable () -> Void) {
        // The state change and the hand-off of its event happen under one lock, so every observer sees
        // will/did in the order the state changed, even when a lock and an unlock race.
        let (attempt, grace, observers): (LockAttempt?, TimeInterval, (handedOver: DispatchGroup, done: DispatchGroup, taken: Counter)?) = deliveryLock.withLock {
            let (attempt, grace, isNew): (LockAttempt?, TimeInterval, Bool) = mutex.withLock {
                switch currentState {
                case .unlocked:
                    let attempt = LockAttempt()
                    pendingLock = attempt
                    currentState = .locking
                    openURLsAllowed = false
                    return (attempt, gracePeriod ?? currentGracePeriod, true)
                case .locking:
                    return (pendingLock, gracePeriod ?? currentGracePeriod, false)
                case .locked, .beforeFirstUnlock:
                    return (nil, 0, false)
                }
            }
            return (attempt, grace, isNew ? dispatcher.deliver(.willBecomeUnavailable, from: self) : nil)
        }
        guard let attempt else { return then() }
        attempt.whenComplete(then)
        if observers == nil {
            // The latest lock wins: one that arrives during another's grace period ends it by its own deadline, so
            // `lock --grace 0` typed now means now, whatever an earlier lock allowed.
            lockSteps.asyncAfter(deadline: .now() + grace) { self.discardKeys(for: attempt, discardClassKeys) }
        }
        if let observers {
            observers.done.notify(queue: lockSteps) { self.discardKeys(for: attempt, discardClassKeys) }
            // The grace period runs from the moment every observer has the event, so a grace of 0 still lets each
            // one be entered first; an observer stuck in an earlier callback is waited for at most max(grace, 1 s).
            let startGrace: @Sendable () -> Void = {
                guard attempt.startGracePeriod() else { return }
                self.lockSteps.asyncAfter(deadline: .now() + grace) { self.discardKeys(for: attempt, discardClassKeys) }
            }
            observers.handedOver.notify(queue: lockSteps, execute: startGrace)
            lockSteps.asyncAfter(deadline: .now() + max(grace, 1), execute: startGrace)
        }
    }

    /// The end of a lock: runs once per attempt, unless an unlock cancelled it first.
    private func discardKeys(for attempt: LockAttempt, _ discardClassKeys: () -> Void) {
        let files: [EncryptedFile]? = mutex.withLock {
            guard pendingLock === attempt, currentState == .locking else { return nil }
            pendingLock = nil
            discardClassKeys()
            currentState = .locked
            return takeClassAFiles()
        }
        guard let files else { return }
        // Outside the mutex: each discard waits for that file's operation in flight, if any, to finish.
        discardKeys(of: files)
        attempt.complete()
    }

    /// Unwraps classes A, B and C with the passcode and delivers *did become available* (unless already unlocked).
    /// During a lock's grace period it cancels the lock. Wrong passcodes are counted and throttled (`passcodePolicy`):
    /// throws `.wrongPasscode`, or `.throttled` while a delay runs. Attached to a daemon, the daemon checks the passcode.
    public func unlock(passcode: Passcode) throws {
        try holder.unlock(self, passcode: passcode)
    }

    /// The unlock of keys held in this process, once the passcode is checked: `insertKeys` runs under the mutex as the
    /// state becomes unlocked, *did become available* goes out unless it already was, and a pending lock is cancelled.
    func becomeUnlocked(_ insertKeys: () -> Void) {
        let cancelled: LockAttempt? = deliveryLock.withLock {
            let (wasUnlocked, cancelled): (Bool, LockAttempt?) = mutex.withLock {
                insertKeys()
                let wasUnlocked = currentState == .unlocked
                currentState = .unlocked
                return (wasUnlocked, pendingLock.take())
            }
            if !wasUnlocked { deliverDidBecomeAvailable() }
            return cancelled
        }
        cancelled?.complete()
    }

    /// Hands *did become available* to this process's observers. Once they have handled it (or the grace period has
    /// passed, for one that never finishes), open-URL events may flow and the receiving containers deliver what is
    /// pending: an app hears that data is back before it is asked to open a file that needed it. Caller holds `deliveryLock`.
    @discardableResult
    func deliverDidBecomeAvailable() -> (handedOver: DispatchGroup, done: DispatchGroup, taken: Counter) {
        let observers = dispatcher.deliver(.didBecomeAvailable, from: self)
        let started = OnceFlag()
        let pendingDelivery = pendingDelivery
        pendingDelivery.enter()
        let start: @Sendable () -> Void = { [weak self] in
            guard started.claim() else { return }
            defer { pendingDelivery.leave() }
            guard let self else { return }
            let allowed: Bool = mutex.withLock {
                if currentState == .unlocked { openURLsAllowed = true }
                return openURLsAllowed
            }
            if allowed { inboxReceivers.members.forEach { $0.deliverPending() } }
        }
        observers.done.notify(queue: lockSteps, execute: start)
        lockSteps.asyncAfter(deadline: .now() + max(gracePeriod, 1), execute: start)
        return observers
    }

    /// Returns once this process's observers have handled every event handed to them so far, including the open-URL
    /// events an unlock released: what a test waits for before looking at what the code under test did. Gives up
    /// after `timeout` seconds (an observer that never finishes, a sequence nobody iterates); true if they were idle.
    @discardableResult
    package func waitUntilObserversIdle(timeout: TimeInterval) async -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        func remaining() -> TimeInterval { max(0, deadline.timeIntervalSinceNow) }
        guard await pendingDelivery.settled(timeout: remaining()), await dispatcher.waitUntilIdle(timeout: remaining()) else { return false }
        for receiver in inboxReceivers.members where await !receiver.waitUntilIdle(timeout: remaining()) { return false }
        return true
    }

    /// Blocks until the events already received from a daemon have been handed to this process's observers (at most
    /// the grace period plus 5 s).
    package func waitUntilDaemonEventsServed() { _ = pendingDelivery.wait(timeout: .now() + max(gracePeriod, 1) + 5) }

    /// Wakes this process's receiving containers now, rather than when the kernel reports the delivery.
    package func deliverPendingOpenURLs() { inboxReceivers.members.forEach { $0.deliverPending() } }

    /// Whether a receiving container may hand out open-URL events now.
    var mayDeliverOpenURLs: Bool { mutex.withLock { openURLsAllowed && currentState == .unlocked } }

    // MARK: Open files

    /// Registers a file opened through a container, so a lock can discard its per-file key if it is class A.
    /// A class A file that raced with a lock and would outlive the class key is refused here.
    package func track(_ file: EncryptedFile) throws {
        // Read before taking the device mutex: nothing may take a file's mutex while holding the device's.
        let isComplete = file.protectionClass == .complete
        let fileID = file.fileID
        do {
            try admit(file, fileID: fileID, isComplete: isComplete)
        } catch {
            file.discardKey()
            throw error
        }
    }

    /// Registers a file whose class and id the caller read (it may hold the file's lock, which this never takes);
    /// refuses a class A file while its key is unavailable.
    package func admit(_ file: EncryptedFile, fileID: [UInt8], isComplete: Bool) throws {
        try mutex.withLock {
            if isComplete && !(currentState == .unlocked || currentState == .locking) {
                throw Self.unavailableError(.complete, state: currentState, path: file.path)
            }
            openFiles[ObjectIdentifier(file)] = TrackedFile(file: file, fileID: fileID, isComplete: isComplete)
        }
    }

    /// Zeroes the per-file keys of `files` (a lock, or the loss of the daemon), then tells the handlers, also when
    /// there were none, before the lock counts as done.
    func discardKeys(of files: [EncryptedFile]) {
        files.forEach { $0.discardKey() }
        mutex.withLock { keysDiscardedHandlers }.forEach { $0(files) }
    }

    /// Calls `handler` at every lock once it has discarded the keys of open class A files (maybe none), before the
    /// lock is reported complete, so a file system serving them can drop what the kernel and the process still hold
    /// of their plaintext.
    package func onKeysDiscarded(_ handler: @escaping @Sendable ([EncryptedFile]) -> Void) {
        mutex.withLock { keysDiscardedHandlers.append(handler) }
    }

    /// Forgets a closed file.
    package func forget(_ file: EncryptedFile) {
        _ = mutex.withLock { openFiles.removeValue(forKey: ObjectIdentifier(file)) }
    }

    /// A file is becoming class A through one handle: the handles opened before, under its old class, must lose
    /// their key at the next lock too. Called before the change, so a lock in between errs on the safe side.
    func fileBecomesComplete(fileID: [UInt8]) {
        mutex.withLock {
            for (id, tracked) in openFiles where tracked.fileID == fileID { openFiles[id]?.isComplete = true }
        }
    }

    /// The open class A files, forgotten as they are returned. Caller holds `mutex`.
    func takeClassAFiles() -> [EncryptedFile] {
        let classA = openFiles.values.filter(\.isComplete).compactMap(\.file)
        openFiles = openFiles.filter { !$0.value.isComplete && $0.value.file != nil }
        return classA
    }
}

/// One lock in progress: callers of `lock()` are told when it completes, once the keys are gone or an unlock cancelled it.
final class LockAttempt: @unchecked Sendable {
    private let mutex = NSLock()
    private let graceStarted = OnceFlag()
    private var isComplete = false
    private var waiting: [@Sendable () -> Void] = []

    /// Runs `body` when the attempt completes (at once if it has).
    func whenComplete(_ body: @escaping @Sendable () -> Void) {
        let now: Bool = mutex.withLock {
            if isComplete { return true }
            waiting.append(body)
            return false
        }
        if now { body() }
    }

    /// True the first time only: the grace timer is started once, by whichever trigger comes first.
    func startGracePeriod() -> Bool { graceStarted.claim() }

    func complete() {
        let bodies: [@Sendable () -> Void] = mutex.withLock {
            guard !isComplete else { return [] }
            isComplete = true
            defer { waiting = [] }
            return waiting
        }
        bodies.forEach { $0() }
    }
}
