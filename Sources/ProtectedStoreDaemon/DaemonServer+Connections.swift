import CSupport
import Dispatch
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

// Connections: accepting them within the budget that keeps room for the owner's lock (PROTOCOL.md §1), reading
// their frames, sending replies and closing them.
extension DaemonServer {
    func acceptConnections(on listener: Int32? = nil, forApp appBundle: String? = nil, batch: Int = 256) {
        let listener = listener ?? self.listener
        // A bounded batch, so a flood of new connections can't keep the loop from reading the ones it has.
        for _ in 0..<batch {
            if connections.count >= limits.maximumConnections {
                guard makeRoomForAConnection(on: listener) else { return }
                continue
            }
            let fd = ps_accept(listener)
            if fd < 0 {
                if errno == EINTR { continue }
                if errno == EMFILE || errno == ENFILE {
                    guard makeRoomForAConnection(on: listener) else { return }
                    continue
                }
                if errno != EAGAIN && errno != EWOULDBLOCK {
                    logger.warning("accept failed: \(String(cString: strerror(errno)))")
                }
                return
            }
            admit(fd, appBundle: appBundle)
        }
    }

    /// Out of descriptors (or at `maximumConnections`): closes the least recently active idle connection so the next
    /// one can be accepted, since that one may be the owner's `lock`. With none idle, the held-back descriptor takes
    /// one connection off `listener`'s queue to refuse it, and accepting pauses for 100 ms so poll doesn't spin.
    /// False when accepting should stop for now.
    func makeRoomForAConnection(on listener: Int32) -> Bool {
        let now = ContinuousClock.now
        // An app's connections go before anyone else's: the owner's lock must get through.
        if let idle = connections.values.filter({ $0.appBundle != nil }).min(by: { $0.lastActive < $1.lastActive })
            ?? connections.values.filter(\.isIdle).min(by: { $0.lastActive < $1.lastActive }) {
            tally.note("idle connections closed for lack of descriptors", now: now, logger: logger,
                       "out of file descriptors with \(connections.count) connections: closed idle connection \(idle.id) (pid \(idle.pid))")
            close(idle, reason: nil)
            return true
        }
        acceptPausedUntil = now + .milliseconds(100)
        guard reserveDescriptor >= 0 else { return false }
        Glibc.close(reserveDescriptor)
        let refused = ps_accept(listener)
        if refused >= 0 { Glibc.close(refused) }
        reserveDescriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
        tally.note("connections refused for lack of descriptors", now: now, logger: logger,
                   "out of file descriptors with \(connections.count) connections, none idle: refusing new ones for 100 ms")
        return false
    }

    func admit(_ fd: Int32, appBundle: String?) {
        var pid: Int32 = 0
        var uid: UInt32 = UInt32.max
        let knownPeer = ps_peer_credentials(fd, &pid, &uid) == 0
        let now = ContinuousClock.now
        nextConnectionID += 1
        let connection = Connection(id: nextConnectionID, fd: fd, pid: pid, uid: uid, appBundle: appBundle, now: now)
        connections[connection.id] = connection
        // Counted from here, since `close` uncounts every connection of the app, refused ones too.
        let app = appBundle.flatMap { apps[$0] }
        app?.connections += 1
        // An app's socket also serves the uid its sandbox runs as (a root launcher's apps run as another).
        guard knownPeer, allowedUIDs.contains(uid) || uid == app?.uid else {
            tally.note("connections refused for their uid", now: now, logger: logger,
                       "refused a connection from uid \(uid) (pid \(pid)): this daemon serves uid \(allowedUIDs.sorted().map(String.init).joined(separator: " and ")) only")
            fail(connection, code: .permissionDenied, message: "this daemon serves the device's owner only (uid \(allowedUIDs.sorted().map(String.init).joined(separator: " and "))); your uid is \(uid)",
                 remedy: "Run as the user who owns the device root")
            return
        }
        logger.debug("connection \(connection.id) from pid \(pid)")
        // An app gets a few connections of its own, outside its owner's budget, so it can't crowd out a lock.
        if let app, app.connections > ConnectionLimits.maximumConnectionsPerApp {
            tally.note("app connections refused over the cap", now: now, logger: logger, "\(app.bundle) holds \(ConnectionLimits.maximumConnectionsPerApp) connections: refused another")
            close(connection, reason: nil)
        }
    }

    /// Closes each uid's idle connections beyond `ConnectionLimits.maximumIdlePerUID`, oldest first, sparing those
    /// active within `recentlyActive`: so a flood of idle connections never closes the one a `lock` is about to come
    /// on. One with a request waiting unread is read first, and kept if that makes it busy.
    func closeIdleBeyondTheirUIDsShare(now: ContinuousClock.Instant) {
        var idleByUID: [uid_t: [Connection]] = [:]
        for connection in connections.values where connection.appBundle == nil && connection.isIdle && now - connection.lastActive >= ConnectionLimits.recentlyActive {
            idleByUID[connection.uid, default: []].append(connection)
        }
        for (uid, idle) in idleByUID where idle.count > ConnectionLimits.maximumIdlePerUID {
            let excess = idle.count - ConnectionLimits.maximumIdlePerUID
            var closed = 0
            for connection in idle.sorted(by: { $0.lastActive < $1.lastActive }) where closed < excess {
                if hasUnreadInput(connection) {
                    readAvailable(connection)
                    guard connections[connection.id] != nil, connection.isIdle else { continue }
                }
                close(connection, reason: nil)
                closed += 1
            }
            if closed > 0 {
                tally.note("idle connections closed over the cap", now: now, logger: logger,
                           "uid \(uid) holds more than \(ConnectionLimits.maximumIdlePerUID) idle connections: closed the \(closed) least recently active")
            }
        }
    }

    func hasUnreadInput(_ connection: Connection) -> Bool {
        var byte: UInt8 = 0
        return recv(connection.fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) > 0
    }

    func readAvailable(_ connection: Connection) {
        let count = chunk.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        defer { if count > 0 { chunk.withUnsafeMutableBytes { zeroize($0.baseAddress!, count: count) } } }
        if count < 0 {
            if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return }
            return close(connection, reason: "receive failed: \(String(cString: strerror(errno)))")
        }
        if count == 0 { return close(connection, reason: nil) }
        guard !connection.closing else { return }
        chunk.withUnsafeBytes { connection.received.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        do {
            while !connection.closing, connections[connection.id] != nil, let frame = try connection.received.nextFrame() {
                handle(frame, on: connection)
            }
        } catch {
            tally.note("connections closed for bad frames", now: .now, logger: logger, "connection \(connection.id) (pid \(connection.pid)): \(error); closing it")
            fail(connection, code: .badFrame, message: "\(error)", remedy: "Send frames as docs/PROTOCOL.md describes")
        }
    }

    func send(_ reply: DaemonReply, attachment: SecureBytes? = nil, to connection: Connection) {
        guard connections[connection.id] != nil else { return }
        var bytes: [UInt8]
        do {
            bytes = try Frame.encode(reply, attachment: attachment)
        } catch {
            logger.error("connection \(connection.id): a reply did not fit a frame (\(error)); closing it")
            connection.closing = true
            bytes = (try? Frame.encode(DaemonReply.failure(id: reply.id, code: .io, message: "the reply did not fit a frame", remedy: "Report this as a bug"))) ?? []
        }
        bytes.withUnsafeBytes { connection.output.append($0) }
        zeroize(&bytes)
        flush(connection)
        if connection.output.count > Self.maximumPendingOutput {
            close(connection, reason: "it stopped reading its replies (\(connection.output.count) bytes pending)")
        }
    }

    /// Replies to a connection by id, from work that finished off the loop; nothing if it has gone meanwhile.
    func send(_ reply: DaemonReply, attachment: SecureBytes? = nil, toConnection id: UInt64) {
        if let connection = connections[id] { send(reply, attachment: attachment, to: connection) }
    }

    func flush(_ connection: Connection) {
        while connection.output.count > 0 {
            let pending = connection.output.bytes
            let sent = Glibc.send(connection.fd, pending.baseAddress, pending.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
            if sent < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { return }
                return close(connection, reason: "send failed: \(String(cString: strerror(errno)))")
            }
            // Replies can carry file keys: sent bytes are zeroed as they are dropped.
            connection.output.consume(sent)
        }
        if connection.closing && connection.drainDeadline == nil {
            shutdown(connection.fd, Int32(SHUT_WR))
            connection.drainDeadline = .now + .seconds(2)
        }
    }

    /// Replies with a protocol error and closes the connection once the reply is out.
    func fail(_ connection: Connection, code: DaemonErrorCode, message: String, remedy: String, id: UInt64? = nil) {
        connection.closing = true
        send(.failure(id: id, code: code, message: message, remedy: remedy), to: connection)
    }

    func close(_ connection: Connection, reason: String?) {
        guard connections.removeValue(forKey: connection.id) != nil else { return }
        if let reason { tally.note("connections closed", now: .now, logger: logger, "connection \(connection.id) closed: \(reason)") }
        Glibc.close(connection.fd)
        connection.received.wipe()
        connection.output.wipe()
        if let bundle = connection.appBundle, let app = apps[bundle] { app.connections -= 1 }
        if connection.subscribed && connection.appBundle == nil { ownerSubscribers -= 1 }
        if connection.subscribed {
            registry.remove(connection.id)
            completeLockIfAcknowledged()
            for (id, var wait) in appEventWaits where wait.remaining.remove(connection.id) != nil {
                appEventWaits[id] = wait
                if wait.remaining.isEmpty { finishWait(id) }
            }
        }
        for app in apps.values where app.owner == connection.id { forget(app) }
    }
}
