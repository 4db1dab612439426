import Dispatch
import Foundation
import ProtectedStoreCore

/// A running daemon as its status request reports it.
public struct DaemonStatus: Sendable, Codable, Equatable {
    /// The daemon's process id.
    public var pid: Int32
    /// The socket it listens on.
    public var socketPath: String
    /// The device's state in the daemon.
    public var state: Device.State
    /// Connections subscribed to events (every attached program has one).
    public var subscribers: Int
    /// The grace period a lock uses when it names none.
    public var gracePeriod: TimeInterval
    /// Wrong passcodes in a row so far.
    public var failedPasscodeAttempts: Int
    /// Whether the daemon's process is protected from core dumps and from other processes reading its memory.
    public var coreDumpsDisabled: Bool
    /// The daemon's mlocked memory in KiB (where its keys live), if the system reports it.
    public var lockedMemoryKiB: Int?
    /// What else locks the device (`daemon --lock-on`: session-lock, sleep, idle=SECONDS); empty: only `lock`.
    public var lockTriggers: [String] = []
    /// Whether those triggers follow systemd-logind now (the system bus is there).
    public var lockTriggersConnected = false
}

extension Device.State: Codable {}

extension Device {
    /// Attaches to the key daemon serving `root` (see `KeyDaemon`): the daemon holds the class keys and unwraps per-file
    /// keys, this process encrypts and decrypts, and every event reaches this process's observers as in-process.
    /// Throws `.daemonUnavailable` when no daemon serves the root.
    public static func attach(root: String, socketPath: String? = nil, notificationCenter: NotificationCenter = .default) throws -> Device {
        let root = absolute(root)
        try DeviceFormat.requireCurrent(root: root)
        let (link, hello) = try DaemonLink.connect(root: root, socketPath: socketPath)
        guard let keybagID = hello.keybagID.flatMap([UInt8].init(hex:)), keybagID.count == FileHeader.idBytes,
              let classBPublicKey = hello.classBPublicKey.flatMap([UInt8].init(hex:)), classBPublicKey.count == X25519.keyBytes else {
            link.close()
            throw ProtectedStoreError(.unsupportedFormat, path: link.socketPath, problem: "the key daemon's hello lacks the device's identity",
                                      remedy: "Use a daemon of this version")
        }
        let device = Device(root: root, deviceSecretPath: hello.deviceSecretPath ?? "", keybagID: keybagID, classBPublicKey: classBPublicKey,
                            holder: DaemonKeyHolder(link: link, hello: hello), state: Self.attachedState(hello.state), passcodePolicy: (try? loadPasscodePolicy(root: root)) ?? .default,
                            notificationCenter: notificationCenter)
        if let grace = hello.gracePeriod { device.currentGracePeriod = grace }
        link.start { [weak device, weak link] notice in
            if let link { device?.receive(notice, from: link) }
        }
        return device
    }

    /// Whether a key daemon answers for `root` now (the CLI then uses it instead of holding keys itself).
    public static func isDaemonRunning(root: String) -> Bool { DaemonLink.isDaemonRunning(root: root) }

    /// The daemon's own view (state, subscribers), for a device attached to one; nil for an in-process device.
    public func daemonStatus() throws -> DaemonStatus? { try holder.daemonStatus() }

    /// The daemon's state as this process starts from: a lock in progress already sent its event to others, so a
    /// newcomer counts as locked (it must not open class A files the lock would not close).
    static func attachedState(_ name: String?) -> State {
        switch name.flatMap(State.init(rawValue:)) {
        case .unlocked: .unlocked
        case .beforeFirstUnlock: .beforeFirstUnlock
        default: .locked
        }
    }

    /// Blocks until a daemon's event has made this device unlocked, or `timeout` seconds have passed.
    func waitUntilUnlocked(timeout: TimeInterval) {
        let deadline = Date().addingTimeInterval(timeout)
        mutex.withLock {
            while currentState != .unlocked && mutex.wait(until: deadline) {}
        }
    }

    // MARK: Events from the daemon

    /// Called on the link's reader thread, in order: state changes here, observers are served on `daemonEvents`.
    func receive(_ notice: DaemonLink.Notice, from link: DaemonLink) {
        // Counted from before the state changes, so nobody sees the new state with the delivery not yet counted.
        pendingDelivery.enter()
        defer { pendingDelivery.leave() }
        switch notice {
        case .event(.willBecomeUnavailable, let seq, let grace, let connection):
            mutex.withLock {
                if currentState == .unlocked { currentState = .locking }
                openURLsAllowed = false
            }
            serveDaemonEvent { finished in
                self.handleWillBecomeUnavailable(grace: grace) {
                    link.acknowledge(seq: seq, connection: connection)
                    finished()
                }
            }
        case .event(.didBecomeAvailable, let seq, _, let connection):
            mutex.withLock {
                currentState = .unlocked
                mutex.broadcast()
            }
            serveDaemonEvent { finished in
                let observers = self.deliveryLock.withLock { self.deliverDidBecomeAvailable() }
                // Bounded as in-process: an observer stuck in an earlier callback must not stop this process
                // from acknowledging, which would keep the next lock's event from reaching it.
                observers.handedOver.notify(timeout: max(self.gracePeriod, 1)) { _ in
                    link.acknowledge(seq: seq, connection: connection)
                    finished()
                }
            }
        case .lifecycle(_, _, let seq, let connection), .openURL(_, let seq, let connection):
            // Only an app's own socket sends these, and a device never attaches through one.
            link.acknowledge(seq: seq, connection: connection)
        case .lost:
            daemonLost()
        case .restored(let hello):
            (holder as? DaemonKeyHolder)?.prewrapped.daemonChanged(sealsBatches: DaemonKeyHolder.sealsBatches(hello))
            // A daemon found unlocked (a restarted one unlocked before this process reconnected) sent its *did* to
            // others only: this process's observers hear it now, as they would have.
            let becameAvailable: Bool = mutex.withLock {
                let wasUnlocked = currentState == .unlocked
                currentState = Self.attachedState(hello.state)
                mutex.broadcast()
                return !wasUnlocked && currentState == .unlocked
            }
            guard becameAvailable else { return }
            serveDaemonEvent { finished in
                _ = self.deliveryLock.withLock { self.deliverDidBecomeAvailable() }
                finished()
            }
        }
    }

    /// Runs `work` on the daemon events queue, counted as a delivery still to come until it calls `finished`. The queue
    /// is suspended meanwhile, so the next event waits for this one without a thread blocked on it: a process with
    /// many attached devices (a test, a server) would otherwise starve the dispatch pool that their observers run on.
    private func serveDaemonEvent(_ work: @escaping @Sendable (_ finished: @escaping @Sendable () -> Void) -> Void) {
        pendingDelivery.enter()
        daemonEvents.async { [pendingDelivery, daemonEvents] in
            daemonEvents.suspend()
            let once = OnceFlag()
            work {
                guard once.claim() else { return }
                daemonEvents.resume()
                pendingDelivery.leave()
            }
        }
    }

    /// The daemon went away: this process can unwrap nothing until one is back, so it locks itself.
    func daemonLost() {
        let wasAvailable: Bool = mutex.withLock {
            openURLsAllowed = false
            defer { currentState = .locked }
            return currentState == .unlocked || currentState == .locking
        }
        serveDaemonEvent { finished in
            if wasAvailable {
                self.handleWillBecomeUnavailable(grace: self.gracePeriod, then: finished)
            } else {
                // Keys sealed ahead for new files go with the per-file keys of open class A files.
                self.holder.discardClassKeys()
                self.discardKeys(of: self.mutex.withLock { self.takeClassAFiles() })
                finished()
            }
        }
    }

    /// Tells this process's observers and, once they are done (or `grace` has passed), zeroes the per-file keys of open
    /// class A files, then calls `then` (which reports back). A lock cancelled meanwhile still costs those handles their
    /// keys: the process can't tell a cancelled lock from one that completed and was followed by an unlock.
    private func handleWillBecomeUnavailable(grace: TimeInterval, then: @escaping @Sendable () -> Void) {
        let observers = deliveryLock.withLock { dispatcher.deliver(.willBecomeUnavailable, from: self) }
        observers.done.notify(timeout: grace) { _ in
            let files: [EncryptedFile] = self.mutex.withLock {
                if self.currentState == .locking { self.currentState = .locked }
                return self.takeClassAFiles()
            }
            self.holder.discardClassKeys()
            self.discardKeys(of: files)
            then()
        }
    }
}

extension Array where Element == UInt8 {
    init?(hex: String) {
        guard hex.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        self = bytes
    }
}

// MARK: Launched apps

extension Device {
    /// A launched-app request to the daemon this device is attached to (`sandboxctl launch`, `ps`, `suspend`,
    /// `resume`, `interrupt`, `terminate`; docs/PROTOCOL.md §6): the apps it concerns, as the daemon tracks them.
    package func appRequest(_ operation: DaemonRequest.Operation, bundle: String? = nil, timeout: TimeInterval? = nil,
                            sandboxPID: Int32? = nil, socketPath: String? = nil, sandboxUID: uid_t? = nil, openURL: OpenURLRequest? = nil,
                            launched: Bool? = nil, endingInterruption: Bool? = nil, backgroundTaskTime: TimeInterval? = nil,
                            awaitingURL: Bool? = nil, backgroundOnLock: Bool? = nil, keychainGroups: [String]? = nil) throws -> [AppStatus] {
        guard let link = (holder as? DaemonKeyHolder)?.link else {
            throw ProtectedStoreError(.daemonUnavailable, path: root, problem: "launched apps are tracked by the key daemon, and this device is not attached to one",
                                      remedy: "Start `sandboxctl daemon`")
        }
        var request = DaemonRequest(id: 0, op: operation)
        request.bundle = bundle
        request.timeout = timeout
        request.pid = sandboxPID
        request.socketPath = socketPath
        request.uid = sandboxUID
        request.launched = launched
        request.backgroundTaskTime = backgroundTaskTime
        request.awaitingURL = awaitingURL
        request.backgroundOnLock = backgroundOnLock
        request.keychainGroups = keychainGroups
        request.end = endingInterruption
        request.path = openURL?.path
        request.sourceApplication = openURL?.sourceApplication
        request.annotation = openURL?.annotationJSON
        request.sequence = openURL?.sequenceNumber
        return try link.call(request).reply.apps ?? []
    }
}

// MARK: The keychain through the daemon

extension Keychain {
    /// The keychain as the key daemon serving `device` opens it for this connection (every group, the owner's): each
    /// call one keychain request (docs/PROTOCOL.md §7), as a launched app's are. For the benchmarks, which compare it
    /// with `Keychain(device:)`, where this process opens the items and the daemon only unwraps their keys.
    package convenience init(daemonOf device: Device) throws {
        guard let link = (device.holder as? DaemonKeyHolder)?.link else {
            throw KeychainError(.notAvailable, problem: "the device is not attached to a key daemon", remedy: "Attach with Device.attach(root:)")
        }
        self.init(backend: AppSocketKeychain(link: link))
    }
}
