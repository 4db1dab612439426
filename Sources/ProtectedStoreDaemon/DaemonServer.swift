import CSupport
import Dispatch
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// The daemon's socket server: one thread polling the listener and every connection, so all connection and
/// subscriber state is touched by that thread only. Slow work (Argon2id, waiting for a lock) runs elsewhere and
/// posts its reply back with `execute`.
final class DaemonServer: @unchecked Sendable {
    /// Replies a client has not read beyond this are a client that stopped reading: it is disconnected.
    static let maximumPendingOutput = 1 << 20
    /// A connection that has not said hello by then is closed: every real client says it at once.
    static let helloDeadline: Duration = .seconds(3)
    /// Keys one `wrap-batch` may seal: the client asks for 32; the cap bounds one request's work and guarded memory.
    static let maximumWrapBatch = 64

    let device: Device
    let socketPath: String
    let listener: Int32
    let allowedUIDs: Set<uid_t>
    let logger: Logger
    private let wakeRead: Int32
    private let wakeWrite: Int32
    let limits: ConnectionLimits
    /// Unlocks and passcode changes, one at a time in the order they came: they take the passcode lock in turn
    /// anyway, and on Dispatch's pool 64 parallel guesses held every thread, the check holding the lock among the
    /// ones waiting for a thread.
    private let passcodeChecks = DispatchQueue(label: "sandboxctl.daemon.passcode-checks")
    /// Keychain requests, one at a time, off the loop (each is a database transaction).
    let keychainCalls = DispatchQueue(label: "sandboxctl.daemon.keychain")
    /// The keychain as the owner's connections see it (every group), made at the first request.
    var ownerKeychain: KeychainStore?
    /// The clock set, local midnight, a daylight-saving transition: *significant time change* to the apps.
    private let timeChanges = TimeChangeWatch()

    // Loop thread only.
    var connections: [UInt64: Connection] = [:]
    var nextConnectionID: UInt64 = 0
    var registry = SubscriberRegistry()
    /// The owner's connections now subscribed (apps' are not counted: their sockets have their own cap).
    var ownerSubscribers = 0
    var lockDone: (@Sendable () -> Void)?
    /// Receive scratch space, reused and zeroed after each read.
    var chunk = [UInt8](repeating: 0, count: 64 * 1024)

    // Shared with other threads.
    private let mutex = NSLock()
    private var tasks: [() -> Void] = []
    private var stopping = false
    private var loopEnded = false
    var lockGrace: TimeInterval
    /// Called once if the device erases itself (too many wrong passcodes under an erase policy).
    private let onErased: @Sendable () -> Void
    /// The lock triggers asked for, and whether they follow logind now (set once, before the loop runs).
    var lockTriggerStatus: (@Sendable () -> (names: [String], connected: Bool))?
    // Loop thread only: accept paused after running out of descriptors, so poll doesn't spin on the listener.
    var acceptPausedUntil: ContinuousClock.Instant?
    /// Loop thread only: one descriptor held back (on /dev/null), so a connection can still be taken off the queue
    /// when the process has run out of them.
    var reserveDescriptor: Int32 = -1
    var tally = LogTally()
    // Loop thread only: launched apps by bundle, and app events waiting for their acknowledgements.
    var apps: [String: LaunchedApp] = [:]
    var appEventWaits: [UInt64: AppEventWait] = [:]
    var nextWaitID: UInt64 = 0



    final class Connection {
        let id: UInt64
        let fd: Int32
        let pid: Int32
        let uid: uid_t
        let accepted: ContinuousClock.Instant
        var lastActive: ContinuousClock.Instant
        let received = FrameBuffer()
        let output = FrameBuffer()
        var greeted = false
        var subscribed = false
        /// Accepted on a launched app's own socket: it may only follow its own events (docs/PROTOCOL.md §6).
        let appBundle: String?
        /// An unlock or passcode change of this connection is running: one at a time, so a peer can't pile up work.
        var passcodeOperationRunning = false
        /// Locks of this connection waiting for the keys to go; their replies come later.
        var locksPending = 0
        /// A protocol error was replied: no more requests are read; once the reply is out, the write side is shut.
        var closing = false
        /// Set when the write side is shut: input is read and dropped until the peer closes or this passes.
        /// (Closing a socket with unread input resets it, and the peer would lose the error reply.)
        var drainDeadline: ContinuousClock.Instant?

        init(id: UInt64, fd: Int32, pid: Int32, uid: uid_t, appBundle: String?, now: ContinuousClock.Instant) {
            self.id = id
            self.fd = fd
            self.pid = pid
            self.uid = uid
            self.appBundle = appBundle
            self.accepted = now
            self.lastActive = now
        }

        /// Holds nothing open for anyone: not subscribed, no passcode operation or lock waiting for its reply, nothing to send.
        /// Keychain requests sent off the loop and not answered yet.
        var keychainCallsPending = 0
        var isIdle: Bool { !subscribed && !passcodeOperationRunning && locksPending == 0 && keychainCallsPending == 0 && output.count == 0 && !closing }
    }

    init(device: Device, listener: Int32, socketPath: String, allowedUIDs: Set<uid_t>, gracePeriod: TimeInterval, limits: ConnectionLimits,
         logger: Logger, onErased: @escaping @Sendable () -> Void) throws {
        var pipeEnds: [Int32] = [0, 0]
        guard ps_pipe(&pipeEnds) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: errno), path: socketPath, doing: "create the daemon's wake-up pipe")
        }
        self.device = device
        self.listener = listener
        self.socketPath = socketPath
        self.allowedUIDs = allowedUIDs
        self.lockGrace = gracePeriod
        self.limits = limits
        self.logger = logger
        self.wakeRead = pipeEnds[0]
        self.wakeWrite = pipeEnds[1]
        self.onErased = onErased
        self.reserveDescriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
        device.dispatcher.addHandler { [weak self] event, handedOver, done in
            guard let self, self.execute({ self.broadcast(event, handedOver: handedOver, done: done) }) else {
                handedOver()
                return done()
            }
        }
    }

    /// Runs `task` on the loop thread; `ahead` puts it before the tasks already waiting. False once the loop has
    /// ended: the task is dropped.
    @discardableResult
    func execute(ahead: Bool = false, _ task: @escaping () -> Void) -> Bool {
        mutex.withLock {
            guard !loopEnded else { return false }
            ahead ? tasks.insert(task, at: 0) : tasks.append(task)
            // Under the mutex, so the pipe can't be closed (and its number reused) in between.
            var byte: UInt8 = 1
            _ = write(wakeWrite, &byte, 1)
            return true
        }
    }

    /// Makes `run()` return after closing every connection.
    func stop() {
        mutex.withLock { stopping = true }
        execute {}
    }

    /// Serves until `stop()`.
    func run() {
        while !mutex.withLock({ stopping }) {
            let now = ContinuousClock.now
            for connection in connections.values where connection.drainDeadline.map({ $0 <= now }) == true { close(connection, reason: nil) }
            for connection in connections.values where !connection.greeted && !connection.closing && connection.accepted + Self.helloDeadline <= now {
                tally.note("connections closed without hello", now: now, logger: logger,
                           "connection \(connection.id) from pid \(connection.pid) closed: no hello within \(Self.helloDeadline)")
                close(connection, reason: nil)
            }
            closeIdleBeyondTheirUIDsShare(now: now)
            tally.flush(now: now, logger: logger)
            if let paused = acceptPausedUntil, paused <= now { acceptPausedUntil = nil }
            let ordered = Array(connections.values)
            let listenerEvents = acceptPausedUntil == nil ? Int16(POLLIN) : 0
            var polled = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0), pollfd(fd: listener, events: listenerEvents, revents: 0),
                          pollfd(fd: timeChanges.descriptor, events: Int16(POLLIN), revents: 0)]
            let appList = Array(apps.values)
            for app in appList { polled.append(pollfd(fd: app.listener, events: listenerEvents, revents: 0)) }
            for connection in ordered {
                let wantsOutput = connection.output.count > 0
                let wantsInput = !connection.closing || connection.drainDeadline != nil
                polled.append(pollfd(fd: connection.fd, events: Int16((wantsInput ? POLLIN : 0) | (wantsOutput ? POLLOUT : 0)), revents: 0))
            }
            let helloDeadlines = ordered.lazy.filter { !$0.greeted && !$0.closing }.map { $0.accepted + Self.helloDeadline }
            let nextDeadline = (ordered.compactMap(\.drainDeadline) + helloDeadlines + [acceptPausedUntil, tally.nextFlush].compactMap { $0 }).min()
            let timeout = nextDeadline.map { Int32(max(1, (($0 - now) / .milliseconds(1)).rounded(.up))) } ?? -1
            let ready = poll(&polled, nfds_t(polled.count), timeout)
            if ready < 0 {
                if errno == EINTR { continue }
                logger.critical("poll failed: \(String(cString: strerror(errno)))")
                break
            }
            if polled[0].revents != 0 { runTasks() }
            if polled[1].revents & Int16(POLLIN) != 0 { acceptConnections() }
            if polled[2].revents & Int16(POLLIN) != 0, let reason = timeChanges.fired() { significantTimeChange(reason) }
            for (index, app) in appList.enumerated() where polled[index + 3].revents & Int16(POLLIN) != 0 && apps[app.bundle] === app {
                acceptConnections(on: app.listener, forApp: app.bundle, batch: ConnectionLimits.appAcceptsPerPoll)
            }
            let connectionsStart = 3 + appList.count
            for (index, connection) in ordered.enumerated() where connections[connection.id] != nil {
                let events = polled[index + connectionsStart].revents
                if events & Int16(POLLOUT) != 0 { flush(connection) }
                if events & Int16(POLLIN | POLLHUP | POLLERR) != 0, connections[connection.id] != nil { readAvailable(connection) }
            }
        }
        runTasks()
        for connection in Array(connections.values) { close(connection, reason: nil) }
        for app in Array(apps.values) { forget(app) }
        lockDone.take()?()
        Glibc.close(listener)
        if reserveDescriptor >= 0 { Glibc.close(reserveDescriptor) }
        mutex.withLock {
            loopEnded = true
            tasks = []
            Glibc.close(wakeRead)
            Glibc.close(wakeWrite)
        }
    }

    private func runTasks() {
        var drain = [UInt8](repeating: 0, count: 256)
        while read(wakeRead, &drain, drain.count) > 0 {}
        let pending = mutex.withLock { () -> [() -> Void] in
            defer { tasks = [] }
            return tasks
        }
        pending.forEach { $0() }
    }

    // MARK: Requests

    func handle(_ frame: Frame, on connection: Connection) {
        connection.lastActive = .now
        guard let request = try? JSONDecoder().decode(DaemonRequest.self, from: Data(frame.message)) else {
            return fail(connection, code: .badFrame, message: "the message is not a JSON request object with an id and an op", remedy: "Send requests as docs/PROTOCOL.md describes")
        }
        guard connection.greeted || request.op == DaemonRequest.Operation.hello.rawValue else {
            return fail(connection, code: .badFrame, message: "the first request must be hello", remedy: "Send hello with the protocol version first", id: request.id)
        }
        guard let operation = request.operation else {
            // The peer's text is echoed only in part: a reply must always fit a frame.
            return fail(connection, code: .unknownOperation, message: "unknown operation \"\(request.op.prefix(64))\"", remedy: "Use an operation of protocol version \(daemonProtocolVersion)", id: request.id)
        }
        if let bundle = connection.appBundle, !operation.isAllowedForApps {
            tally.note("app connections refused an operation", now: .now, logger: logger, "\(bundle)'s connection \(connection.id) (pid \(connection.pid)) asked for \(operation.rawValue): refused")
            return fail(connection, code: .permissionDenied, message: "\(bundle)'s own socket serves its events only, not \(operation.rawValue)",
                        remedy: "Lock, unlock and everything else about the device are for its owner, outside the sandbox", id: request.id)
        }
        switch operation {
        case .hello:
            guard request.version == daemonProtocolVersion else {
                return fail(connection, code: .unsupportedVersion, message: "protocol version \(request.version.map(String.init) ?? "none") is not supported; this daemon speaks version \(daemonProtocolVersion)",
                            remedy: "Use a sandboxctl and library of the daemon's version", id: request.id)
            }
            connection.greeted = true
            if let bundle = connection.appBundle {
                var reply = DaemonReply(id: request.id)
                reply.version = daemonProtocolVersion
                reply.state = device.state.rawValue
                reply.bundle = bundle
                reply.apps = apps[bundle].map { [$0.status] }
                reply.operations = DaemonRequest.Operation.allCases.filter(\.isAllowedForApps).map(\.rawValue)
                return send(reply, to: connection)
            }
            var reply = statusReply(id: request.id, withDiagnostics: false)
            reply.version = daemonProtocolVersion
            reply.keybagID = device.keybagID.hex
            reply.classBPublicKey = device.classBPublicKey.hex
            reply.deviceSecretPath = device.deviceSecretPath
            reply.socketPath = socketPath
            reply.operations = DaemonRequest.Operation.allCases.map(\.rawValue)
            send(reply, to: connection)
        case .status:
            send(connection.appBundle == nil ? statusReply(id: request.id) : appStatusReply(id: request.id, bundle: connection.appBundle), to: connection)
        case .subscribe:
            if !connection.subscribed, connection.appBundle == nil, ownerSubscribers >= limits.maximumSubscribers {
                tally.note("subscriptions refused over the cap", now: .now, logger: logger,
                           "\(ownerSubscribers) subscribers, the most this daemon takes with \(limits.descriptors) descriptors: refused connection \(connection.id)'s (pid \(connection.pid))")
                return send(.failure(id: request.id, code: .busy, message: "the daemon has \(ownerSubscribers) subscribers, the most it takes, keeping descriptors for requests",
                                     remedy: "Close subscribers you don't need; requests on this connection are still served"), to: connection)
            }
            if !connection.subscribed {
                connection.subscribed = true
                if connection.appBundle == nil { ownerSubscribers += 1 }
                registry.add(connection.id, available: device.state == .unlocked)
            }
            send(connection.appBundle == nil ? statusReply(id: request.id, withDiagnostics: false) : appStatusReply(id: request.id, bundle: connection.appBundle),
                 to: connection)
            if let bundle = connection.appBundle, let app = apps[bundle] { appSubscribed(app) }
        case .ack:
            guard connection.subscribed, let seq = request.seq else {
                return fail(connection, code: .badFrame, message: "ack needs a subscription and a seq", remedy: "Subscribe first; acknowledge the seq of the event received", id: request.id)
            }
            let (handled, next) = registry.acknowledge(connection.id, seq: seq)
            for delivery in next { sendEvent(delivery) }
            completeLockIfAcknowledged()
            if let handled, handled.isAppEvent { appEventAcknowledged(handled, by: connection.id, accepted: request.accepted ?? true) }
        case .keychainAdd, .keychainFind, .keychainUpdate, .keychainDelete, .keychainList:
            handleKeychain(operation, request, attachment: frame.attachment, on: connection)
        case .appRegister, .apps, .appSuspend, .appResume, .appTerminate, .appOpenURL, .appInterrupt, .appTaskBegin, .appTaskEnd, .appMemoryWarning, .appTimeChange:
            handleApp(operation, request, on: connection)
        case .lock:
            let grace = request.grace ?? device.gracePeriod
            guard grace >= 0, grace <= 3600, grace.isFinite else {
                return send(.failure(id: request.id, ProtectedStoreError(.invalidArgument, problem: "grace period \(grace) s is out of range", remedy: "Give 0 to 3600 seconds")), to: connection)
            }
            logger.info("lock requested (grace \(grace) s) by pid \(connection.pid)")
            let connectionID = connection.id
            connection.locksPending += 1
            lock(grace: grace) {
                self.execute {
                    self.logger.info("state: \(self.device.state.rawValue)")
                    self.connections[connectionID]?.locksPending -= 1
                    self.send(self.statusReply(id: request.id), toConnection: connectionID)
                }
            }
        case .unlock:
            guard let passcode = frame.attachment.map(Passcode.init(secureBytes:)) else {
                return send(.failure(id: request.id, ProtectedStoreError(.invalidArgument, problem: "unlock carries no passcode", remedy: "Send the passcode as the frame's attachment")), to: connection)
            }
            runSlowly(request, on: connection) {
                defer { passcode.bytes.discard() }
                try self.device.unlock(passcode: passcode)
            }
        case .changePasscode:
            guard let (old, new) = frame.attachment.flatMap(Self.splitPasscodes) else {
                return send(.failure(id: request.id, ProtectedStoreError(.invalidArgument, problem: "change-passcode needs the old and the new passcode", remedy: "Send both in the attachment as docs/PROTOCOL.md describes")), to: connection)
            }
            runSlowly(request, on: connection) {
                defer { [old, new].forEach { $0.bytes.discard() } }
                try self.device.changePasscode(from: old, to: new)
            }
        case .wrap:
            do {
                guard let protectionClass = request.protectionClass.flatMap(ProtectionClass.init(name:)), protectionClass != .completeUnlessOpen,
                      let associatedData = [UInt8](base64: request.associatedData), let fileKey = frame.attachment, fileKey.count == FileHeader.fileKeyBytes else {
                    throw ProtectedStoreError(.invalidArgument, problem: "wrap needs a class (not B), associated data and a \(FileHeader.fileKeyBytes)-byte key", remedy: "See docs/PROTOCOL.md")
                }
                defer { fileKey.discard() }
                var reply = DaemonReply(id: request.id)
                reply.sealed = try device.wrapFileKey(fileKey, for: protectionClass, associatedData: associatedData).base64
                send(reply, to: connection)
            } catch {
                send(.failure(id: request.id, Self.libraryError(error)), to: connection)
            }
        case .wrapBatch:
            do {
                let keyBytes = FileHeader.fileKeyBytes
                guard let protectionClass = request.protectionClass.flatMap(ProtectionClass.init(name:)), protectionClass != .completeUnlessOpen,
                      let list = request.associatedDataList, (1...Self.maximumWrapBatch).contains(list.count),
                      let keys = frame.attachment, keys.count == list.count * keyBytes else {
                    frame.attachment?.discard()
                    throw ProtectedStoreError(.invalidArgument, problem: "wrap-batch needs a class (not B), 1 to \(Self.maximumWrapBatch) associated data and a \(keyBytes)-byte key for each",
                                              remedy: "See docs/PROTOCOL.md")
                }
                defer { keys.discard() }
                var sealedList: [String] = []
                for (index, item) in list.enumerated() {
                    guard let associatedData = [UInt8](base64: item) else {
                        throw ProtectedStoreError(.invalidArgument, problem: "wrap-batch: associated data \(index) is not base64", remedy: "See docs/PROTOCOL.md")
                    }
                    let fileKey = try keys.withUnsafeBytes { all in
                        SecureBytes(count: keyBytes) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: all[index * keyBytes..<(index + 1) * keyBytes])) }
                    }
                    defer { fileKey.discard() }
                    sealedList.append(try device.wrapFileKey(fileKey, for: protectionClass, associatedData: associatedData).base64)
                }
                var reply = DaemonReply(id: request.id)
                reply.sealedList = sealedList
                send(reply, to: connection)
            } catch {
                send(.failure(id: request.id, Self.libraryError(error)), to: connection)
            }
        case .nameKey:
            do {
                let nameKey = try device.nameKey(forContainer: request.container)
                defer { nameKey.discard() }
                send(DaemonReply(id: request.id), attachment: nameKey, to: connection)
            } catch {
                send(.failure(id: request.id, Self.libraryError(error)), to: connection)
            }
        case .unwrap:
            do {
                guard let protectionClass = request.protectionClass.flatMap(ProtectionClass.init(name:)),
                      let associatedData = [UInt8](base64: request.associatedData), let sealed = [UInt8](base64: request.sealed),
                      let ephemeral = [UInt8](base64: request.ephemeralPublicKey), ephemeral.count == X25519.keyBytes else {
                    throw ProtectedStoreError(.invalidArgument, problem: "unwrap needs a class, associated data, an ephemeral public key and the sealed key", remedy: "See docs/PROTOCOL.md")
                }
                let wrapped = WrappedFileKey(protectionClass: protectionClass, associatedData: associatedData, ephemeralPublicKey: ephemeral, sealed: sealed)
                guard let fileKey = try device.unwrapFileKey(wrapped) else {
                    throw ProtectedStoreError(.integrity, problem: "the file header failed authentication: it was modified or corrupted", remedy: "Restore the file from a backup")
                }
                defer { fileKey.discard() }
                send(DaemonReply(id: request.id), attachment: fileKey, to: connection)
            } catch {
                send(.failure(id: request.id, Self.libraryError(error)), to: connection)
            }
        }
    }

    /// `withDiagnostics` false leaves out what costs a file read (the attempt counter, /proc/self/status): hello and
    /// subscribe, which every connection sends, answer at the rate a flood of them comes.
    private func statusReply(id: UInt64, withDiagnostics: Bool = true) -> DaemonReply {
        var reply = DaemonReply(id: id)
        reply.pid = getpid()
        reply.state = device.state.rawValue
        reply.gracePeriod = device.gracePeriod
        reply.subscribers = registry.count
        guard withDiagnostics else { return reply }
        reply.failedPasscodeAttempts = device.failedPasscodeAttempts
        reply.coreDumpsDisabled = ps_is_dumpable() == 0
        reply.lockedMemoryKiB = Self.lockedMemoryKiB()
        if let (names, connected) = lockTriggerStatus?() {
            reply.lockTriggers = names
            reply.lockTriggersConnected = connected
        }
        return reply
    }

    /// This process's mlocked memory (VmLck), where the keys live.
    private static func lockedMemoryKiB() -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmLck:") }) else { return nil }
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    }

    /// Runs a passcode operation off the loop (Argon2id takes a while) and replies when it is done.
    private func runSlowly(_ request: DaemonRequest, on connection: Connection, _ body: @escaping @Sendable () throws -> Void) {
        guard !connection.passcodeOperationRunning else {
            return send(.failure(id: request.id, ProtectedStoreError(.invalidArgument, problem: "a passcode operation of this connection is still running",
                                                                     remedy: "Wait for its reply before sending another")), to: connection)
        }
        connection.passcodeOperationRunning = true
        let (connectionID, pid) = (connection.id, connection.pid)
        passcodeChecks.async {
            let outcome = Result { try body() }
            let erased = !((try? FileSystem.exists(self.device.keybagPath)) ?? true)
            // Ahead of the event it caused: the caller waits for this reply, while fanning the event out to
            // every subscriber takes a while, and the caller's own copy of the event needs no particular order.
            self.execute(ahead: true) {
                self.connections[connectionID]?.passcodeOperationRunning = false
                if erased {
                    self.logger.critical("the device was erased (too many wrong passcodes under its erase policy); stopping")
                    self.onErased()
                }
                switch outcome {
                case .success:
                    self.logger.info("\(request.op) by pid \(pid): ok")
                    self.send(self.statusReply(id: request.id), toConnection: connectionID)
                case .failure(let error):
                    let libraryError = Self.libraryError(error)
                    self.logger.notice("\(request.op) by pid \(pid) failed: \(libraryError.problem)")
                    self.send(.failure(id: request.id, libraryError), toConnection: connectionID)
                }
            }
        }
    }

    static func libraryError(_ error: any Error) -> ProtectedStoreError {
        (error as? ProtectedStoreError) ?? ProtectedStoreError(.io, problem: "\(error)", remedy: "See the daemon's log")
    }

    /// Old ‖ new as sent by change-passcode: a 2-byte big-endian length of the old passcode, then both.
    private static func splitPasscodes(_ attachment: SecureBytes) -> (Passcode, Passcode)? {
        try? attachment.withUnsafeBytes { bytes -> (Passcode, Passcode)? in
            guard bytes.count > 2 else { return nil }
            let oldCount = Int(bytes[0]) << 8 | Int(bytes[1])
            let newCount = bytes.count - 2 - oldCount
            guard oldCount > 0, newCount > 0, oldCount <= Passcode.maximumLength, newCount <= Passcode.maximumLength else { return nil }
            let old = SecureBytes(count: oldCount) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[2..<2 + oldCount])) }
            let new = SecureBytes(count: newCount) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[(2 + oldCount)...])) }
            return (Passcode(secureBytes: old), Passcode(secureBytes: new))
        }
    }

    // MARK: Events

    private func broadcast(_ event: ProtectedDataEvent, handedOver: @escaping @Sendable () -> Void, done: @escaping @Sendable () -> Void) {
        // A newer event supersedes the lock that was waiting for acknowledgements.
        lockDone.take()?()
        logger.info("event \(event.wireName) to \(registry.count) subscriber(s)")
        moveAppsWithLock(event)
        sendEvents(registry.broadcast(event)[...], then: handedOver)
        if event == .willBecomeUnavailable {
            lockDone = done
            completeLockIfAcknowledged()
        } else {
            done()
        }
    }

    /// Sends a slice at a time, so replies waiting on the loop are not held up by a fan-out to thousands.
    /// Order per subscriber is safe: the registry sends it nothing more until it acknowledges this.
    /// `handedOver` runs once the last one is written: the grace period of a lock starts from there.
    private func sendEvents(_ deliveries: ArraySlice<SubscriberRegistry.Delivery>, then handedOver: @escaping @Sendable () -> Void) {
        let slice = deliveries.prefix(128)
        slice.forEach(sendEvent)
        let rest = deliveries.dropFirst(slice.count)
        if rest.isEmpty || !execute({ self.sendEvents(rest, then: handedOver) }) { handedOver() }
    }

    func sendEvent(_ delivery: SubscriberRegistry.Delivery) {
        guard let connection = connections[delivery.subscriber] else { return }
        var reply = DaemonReply(id: nil)
        reply.event = delivery.event.wireName
        reply.seq = delivery.seq
        if delivery.event == .protection(.willBecomeUnavailable) { reply.grace = mutex.withLock { lockGrace } }
        var payload: OpenURLPayload?
        switch delivery.event {
        case .openURL(let item): payload = item
        case .lifecycle(.willFinishLaunching), .lifecycle(.didFinishLaunching):
            payload = connection.appBundle.flatMap { apps[$0]?.launchOptions }
        default: break
        }
        if let payload {
            reply.path = payload.path
            reply.sourceApplication = payload.sourceApplication
            reply.annotation = payload.annotation
            reply.sequence = payload.sequence
        }
        send(reply, to: connection)
    }

    /// A lock, from a `lock` request or a trigger (`LockTriggerWatcher`), on the loop thread. Its grace period is
    /// recorded for the event only when it starts a lock (not for a no-op one), so subscribers hear the one it has.
    func lock(grace: TimeInterval, then done: @escaping @Sendable () -> Void) {
        if device.state == .unlocked { mutex.withLock { lockGrace = grace } }
        device.lock(gracePeriod: grace, then: done)
    }

    func completeLockIfAcknowledged() {
        guard lockDone != nil, registry.lockAcknowledged else { return }
        registry.lockCompleted()
        lockDone.take()?()
    }
}
