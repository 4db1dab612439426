import CSupport
import Foundation
import ProtectedStoreCore
import SystemPackage

/// A connection to the key daemon serving a device root: requests that wait for their reply, and the events of the
/// subscription every attached device holds. When the daemon goes away it reports `.lost`, then reconnects in the
/// background and reports `.restored` once a daemon serves the root again.
package final class DaemonLink: @unchecked Sendable {
    /// How a root daemon appears inside a root launcher's sandbox, a user namespace without host uid 0: the overflow
    /// uid. Accepted only in a user namespace other than the host's (there 65534 is `nobody`, a user like others); in
    /// the sandbox the socket's folder is read-only, made by the launcher and filled by the daemon.
    private static let unmappedRoot: uid_t? = {
        func read(_ path: String) -> String? { try? String(contentsOfFile: path, encoding: .utf8) }
        let map = read("/proc/self/uid_map")?.split(whereSeparator: \.isWhitespace) ?? []
        guard map != ["0", "0", "4294967295"], let overflow = read("/proc/sys/kernel/overflowuid") else { return nil }
        return uid_t(overflow.trimmingCharacters(in: .whitespacesAndNewlines))
    }()

    /// What the link tells its device, in the order it happened. `connection` numbers the connections, so an
    /// acknowledgement never reaches a newer daemon whose event numbers started again.
    package enum Notice: Sendable {
        case event(ProtectedDataEvent, seq: UInt64, grace: TimeInterval, connection: UInt64)
        /// On an app's own socket (`Application`).
        /// `options`: a launch event's launch options (the Inbox item the app is launched to open).
        case lifecycle(LifecycleEvent, options: OpenURLPayload?, seq: UInt64, connection: UInt64)
        case openURL(OpenURLPayload, seq: UInt64, connection: UInt64)
        case lost
        case restored(DaemonReply)
    }

    let root: String
    let socketPath: String
    /// An app's own socket: reconnect to it, not to whatever socket the root's daemon records.
    private let isAppSocket: Bool
    /// Whether the connection subscribes to events (at once for a device; for an app once it has an observer, so the
    /// open-URL events waiting for it go to someone), also when it reconnects.
    private var subscribing: Bool
    /// Whether the daemon took the subscription: at its subscriber limit it refuses it (`busy`), and the link then
    /// serves requests without events.
    private var subscribed: Bool
    private let mutex = NSLock()
    // Held around every send and around closing the descriptor, so a send never goes to a number that was
    // closed and reused meanwhile (it would carry a passcode or a key to a stranger).
    private let writeLock = NSLock()
    private var descriptor: Int32
    private var connection: UInt64 = 1
    private let received: FrameBuffer
    private var nextID: UInt64 = 2
    private var waiting: [UInt64: Waiter] = [:]
    private var closed = false
    private var onNotice: (@Sendable (Notice) -> Void)?

    private final class Waiter: @unchecked Sendable {
        let done = DispatchSemaphore(value: 0)
        var reply: DaemonReply?
        var attachment: SecureBytes?
    }

    /// The socket of the daemon serving `root`: the one its running daemon recorded, else the default.
    static func socketPath(root: String) -> String {
        DaemonInfo.load(root: Device.absolute(root))?.socketPath ?? DaemonInfo.defaultSocketPath(root: root)
    }

    /// Whether a daemon answers on the socket of `root` now.
    static func isDaemonRunning(root: String) -> Bool {
        let fd = ps_unix_connect(socketPath(root: root))
        guard fd >= 0 else { return false }
        Glibc.close(fd)
        return true
    }

    /// Connects, says hello and subscribes; the reply describes the daemon and its state.
    /// Call `start(_:)` to begin receiving events.
    static func connect(root: String, socketPath: String?) throws -> (DaemonLink, DaemonReply) {
        let root = Device.absolute(root)
        let path = Device.absolute(socketPath ?? Self.socketPath(root: root))
        let received = FrameBuffer()
        let (descriptor, hello, subscribed) = try handshake(root: root, socketPath: path, buffer: received, subscribing: true)
        return (DaemonLink(root: root, socketPath: path, isAppSocket: false, subscribing: true, subscribed: subscribed, descriptor: descriptor, received: received), hello)
    }

    /// Connects to a launched app's own socket (`sandboxctl launch`) and says hello; `subscribe()` starts the events.
    static func connect(appSocket: String) throws -> (DaemonLink, DaemonReply) {
        let received = FrameBuffer()
        let (descriptor, hello, _) = try handshake(root: appSocket, socketPath: appSocket, buffer: received, subscribing: false)
        return (DaemonLink(root: appSocket, socketPath: appSocket, isAppSocket: true, subscribing: false, subscribed: false, descriptor: descriptor, received: received), hello)
    }

    /// Subscribes a link made without a subscription (the reply: the state the events start from); from then on it
    /// also subscribes when it reconnects. Nil if it was subscribed already.
    package func subscribe() throws -> DaemonReply? {
        guard !mutex.withLock({ subscribing }) else { return nil }
        let reply = try call(DaemonRequest(id: 0, op: .subscribe)).reply
        mutex.withLock { subscribing = true; subscribed = true }
        return reply
    }

    /// Whether events come on this link (see `subscribed`).
    var hearsEvents: Bool { mutex.withLock { subscribed } }

    private init(root: String, socketPath: String, isAppSocket: Bool, subscribing: Bool, subscribed: Bool, descriptor: Int32, received: FrameBuffer) {
        self.root = root
        self.socketPath = socketPath
        self.isAppSocket = isAppSocket
        self.subscribing = subscribing
        self.subscribed = subscribed
        self.descriptor = descriptor
        self.received = received
    }

    /// Starts the reader thread; `onNotice` is called on it, in order, and must not block.
    package func start(_ onNotice: @escaping @Sendable (Notice) -> Void) {
        mutex.withLock { self.onNotice = onNotice }
        let thread = Thread { [self] in readLoop() }
        thread.name = "ProtectedStore.daemon-link"
        thread.start()
    }

    /// Ends the connection for good (the device is going away).
    package func close() {
        writeLock.withLock {
            let fd: Int32 = mutex.withLock {
                closed = true
                return descriptor
            }
            if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    // MARK: Requests

    /// Sends `request` and waits for its reply; a reply carrying an error is thrown as the library error it names.
    func call(_ request: DaemonRequest, attachment: SecureBytes? = nil) throws -> (reply: DaemonReply, attachment: SecureBytes?) {
        var request = request
        let waiter = Waiter()
        try mutex.withLock {
            guard descriptor >= 0, !closed else { throw unavailable() }
            request.id = nextID
            nextID += 1
            waiting[request.id] = waiter
        }
        var bytes = try Frame.encode(request, attachment: attachment)
        defer { zeroize(&bytes) }
        guard send(&bytes, onConnection: nil) else {
            _ = mutex.withLock { waiting.removeValue(forKey: request.id) }
            throw unavailable()
        }
        waiter.done.wait()
        guard let reply = waiter.reply else { throw unavailable() }
        if let failure = reply.error {
            if let status = failure.status, let code = KeychainError.Code(rawValue: status) {
                throw KeychainError(code, problem: failure.message, remedy: failure.remedy)
            }
            throw Self.error(from: failure)
        }
        return (reply, waiter.attachment)
    }

    /// Acknowledges event `seq` of connection `connection`; moot if that connection is gone.
    /// `accepted`: the answer to a launch event.
    package func acknowledge(seq: UInt64, connection: UInt64, accepted: Bool? = nil) {
        var request = DaemonRequest(id: 0, op: .ack)
        request.seq = seq
        request.accepted = accepted
        guard var bytes = try? Frame.encode(request) else { return }
        _ = send(&bytes, onConnection: connection)
    }

    func unavailable() -> ProtectedStoreError {
        ProtectedStoreError(.daemonUnavailable, path: socketPath, problem: "the key daemon serving \(root) has stopped",
                            remedy: "Start it again with `sandboxctl daemon --root \(root)`; it starts before first unlock, so unlock after")
    }

    static func error(from failure: DaemonReply.Failure) -> ProtectedStoreError {
        let kind = DaemonErrorCode(rawValue: failure.code)?.kind ?? .io
        return ProtectedStoreError(kind, path: failure.path, problem: failure.message, remedy: failure.remedy)
    }

    /// Sends on the current connection (or only on `onConnection`, if given); false if there is none or it failed.
    private func send(_ bytes: inout [UInt8], onConnection expected: UInt64?) -> Bool {
        writeLock.withLock {
            let (fd, current): (Int32, UInt64) = mutex.withLock { (closed ? -1 : descriptor, connection) }
            guard fd >= 0, expected == nil || expected == current else { return false }
            var offset = 0
            while offset < bytes.count {
                let sent = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
                if sent < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += sent
            }
            return true
        }
    }

    // MARK: Reading

    private func readLoop() {
        while true {
            let (fd, current) = mutex.withLock { (descriptor, connection) }
            readUntilClosed(fd, connection: current)
            let (pending, isClosed): ([Waiter], Bool) = writeLock.withLock {
                Glibc.close(fd)
                return mutex.withLock {
                    descriptor = -1
                    received.wipe()
                    defer { waiting = [:] }
                    return (Array(waiting.values), closed)
                }
            }
            pending.forEach { $0.done.signal() }
            if isClosed { return }
            notify(.lost)
            guard let hello = reconnect() else { return }
            notify(.restored(hello))
        }
    }

    private func readUntilClosed(_ fd: Int32, connection: UInt64) {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        defer { zeroize(&chunk) }
        while true {
            do {
                while let frame = try mutex.withLock({ try received.nextFrame() }) { dispatch(frame, connection: connection) }
            } catch {
                return
            }
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { return }
            chunk.withUnsafeBytes { bytes in mutex.withLock { received.append(UnsafeRawBufferPointer(rebasing: bytes[0..<count])) } }
            chunk.withUnsafeMutableBytes { zeroize($0.baseAddress!, count: count) }
        }
    }

    private func dispatch(_ frame: Frame, connection: UInt64) {
        guard let reply = try? JSONDecoder().decode(DaemonReply.self, from: Data(frame.message)) else { return }
        if let id = reply.id, let waiter = mutex.withLock({ waiting.removeValue(forKey: id) }) {
            waiter.reply = reply
            waiter.attachment = frame.attachment
            waiter.done.signal()
        } else if let name = reply.event, let event = ProtectedDataEvent(wireName: name), let seq = reply.seq {
            notify(.event(event, seq: seq, grace: reply.grace ?? Device.defaultGracePeriod, connection: connection))
        } else if let name = reply.event, let event = LifecycleEvent(wireName: name), let seq = reply.seq {
            let options = reply.path.flatMap { path in
                reply.sequence.map { OpenURLPayload(path: path, sourceApplication: reply.sourceApplication, annotation: reply.annotation, sequence: $0) }
            }
            notify(.lifecycle(event, options: options, seq: seq, connection: connection))
        } else if reply.event == "open-url", let path = reply.path, let sequence = reply.sequence, let seq = reply.seq {
            let payload = OpenURLPayload(path: path, sourceApplication: reply.sourceApplication, annotation: reply.annotation, sequence: sequence)
            notify(.openURL(payload, seq: seq, connection: connection))
        }
    }

    private func notify(_ notice: Notice) {
        mutex.withLock { onNotice }?(notice)
    }

    /// Tries again every 200 ms until a daemon serves the root or the link is closed.
    private func reconnect() -> DaemonReply? {
        while !mutex.withLock({ closed }) {
            if let (fd, hello, subscribed) = try? Self.handshake(root: root, socketPath: isAppSocket ? socketPath : Self.socketPath(root: root), buffer: received,
                                                                 subscribing: mutex.withLock({ subscribing })) {
                let stillWanted: Bool = mutex.withLock {
                    guard !closed else { return false }
                    descriptor = fd
                    self.subscribed = subscribed
                    connection += 1
                    return true
                }
                if stillWanted { return hello }
                Glibc.close(fd)
                return nil
            }
            usleep(200_000)
        }
        return nil
    }

    // MARK: Handshake

    /// Connects (checking that the daemon runs as this user or root), says hello and subscribes, with blocking reads:
    /// no reader thread exists yet. Returns the subscribe reply, completed with the hello fields, and whether the
    /// daemon took the subscription.
    private static func handshake(root: String, socketPath: String, buffer: FrameBuffer, subscribing: Bool) throws -> (Int32, DaemonReply, Bool) {
        let fd = ps_unix_connect(socketPath)
        guard fd >= 0 else {
            let error = Errno(rawValue: errno)
            switch error {
            case .noSuchFileOrDirectory, .connectionRefused:
                throw ProtectedStoreError(.daemonUnavailable, path: socketPath, problem: "no key daemon is running for \(root)",
                                          remedy: "Start one with `sandboxctl daemon --root \(root)` (in another terminal, or as a service)")
            case .resourceTemporarilyUnavailable:
                throw ProtectedStoreError(.daemonUnavailable, path: socketPath, problem: "the key daemon serving \(root) accepted no connection for 5 s (its queue is full)",
                                          remedy: "It is overloaded or stuck: see its log, or stop it and start it again")
            case .fileNameTooLong:
                throw ProtectedStoreError(.invalidArgument, path: socketPath, problem: "the socket path is longer than a Unix socket address allows",
                                          remedy: "Run the daemon with a shorter --socket path")
            default:
                throw ProtectedStoreError(.daemonUnavailable, path: socketPath, problem: "cannot connect to the key daemon (\(error))",
                                          remedy: "Check that the socket belongs to you and the daemon runs as you")
            }
        }
        var pid: Int32 = 0
        var uid: UInt32 = 0
        guard ps_peer_credentials(fd, &pid, &uid) == 0, uid == getuid() || uid == 0 || uid == Self.unmappedRoot else {
            Glibc.close(fd)
            throw ProtectedStoreError(.daemonUnavailable, path: socketPath, problem: "the process listening on the socket runs as uid \(uid), not as you or root",
                                      remedy: "Don't trust it: remove the socket and start your own daemon")
        }
        // A daemon stopped with SIGSTOP still accepts (the backlog): don't hang on it.
        setTimeouts(fd, seconds: 5)
        do {
            // Hello and subscribe in one write: the daemon reads them together, so this connection is never one that
            // holds nothing, which a flood of idle connections could get closed (docs/PROTOCOL.md §1).
            let replies = try pipeline(subscribing ? [.hello, DaemonRequest(id: 1, op: .subscribe)] : [.hello], attachment: nil, on: fd, buffer: buffer)
            if let failure = replies[0].error { throw error(from: failure) }
            var helloReply = replies[0]
            var subscribed = false
            if subscribing {
                // At its subscriber limit the daemon still serves requests: this link works, without events.
                if let failure = replies[1].error, failure.code != DaemonErrorCode.busy.rawValue { throw error(from: failure) }
                subscribed = replies[1].error == nil
                helloReply.state = replies[1].state ?? helloReply.state
            }
            setTimeouts(fd, seconds: 0)
            return (fd, helloReply, subscribed)
        } catch {
            Glibc.close(fd)
            buffer.wipe()
            throw error
        }
    }

    /// One request and its reply on a blocking socket without a reader thread (handshakes, the lock benchmark).
    /// The hello every connection starts with.
    package static func greet(on fd: Int32, buffer: FrameBuffer) throws -> DaemonReply {
        try exchange(.hello, on: fd, buffer: buffer)
    }

    private static func setTimeouts(_ fd: Int32, seconds: Int) {
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    package static func exchange(_ request: DaemonRequest, attachment: SecureBytes? = nil, on fd: Int32, buffer: FrameBuffer) throws -> DaemonReply {
        let reply = try pipeline([request], attachment: attachment, on: fd, buffer: buffer)[0]
        if let failure = reply.error { throw error(from: failure) }
        return reply
    }

    /// Sends `requests` in one write (the attachment goes with the last) and returns their replies, failures included.
    private static func pipeline(_ requests: [DaemonRequest], attachment: SecureBytes?, on fd: Int32, buffer: FrameBuffer) throws -> [DaemonReply] {
        var frames = try requests.enumerated().map { try Frame.encode($1, attachment: $0 == requests.count - 1 ? attachment : nil) }
        var bytes: [UInt8] = []
        // Reserved first, so no copy of an attachment is left behind in memory a reallocation freed.
        bytes.reserveCapacity(frames.reduce(0) { $0 + $1.count })
        for index in frames.indices {
            bytes += frames[index]
            zeroize(&frames[index])
        }
        defer { zeroize(&bytes) }
        guard bytes.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else {
            throw ProtectedStoreError(.daemonUnavailable, problem: "the key daemon closed the connection", remedy: "Check the daemon's log")
        }
        var replies: [DaemonReply] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            while replies.count < requests.count, let frame = try buffer.nextFrame() {
                replies.append(try JSONDecoder().decode(DaemonReply.self, from: Data(frame.message)))
            }
            if replies.count == requests.count { return replies }
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                throw ProtectedStoreError(.daemonUnavailable, problem: "the key daemon closed the connection or did not answer within 5 s", remedy: "Check that it runs (not stopped), and its log")
            }
            chunk.withUnsafeBytes { buffer.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        }
    }
}

// MARK: Key operations

extension DaemonLink {
    func wrapFileKey(_ fileKey: SecureBytes, for protectionClass: ProtectionClass, associatedData: [UInt8]) throws -> [UInt8] {
        var request = DaemonRequest(id: 0, op: .wrap)
        request.protectionClass = protectionClass.name
        request.associatedData = associatedData.base64
        guard let sealed = [UInt8](base64: try call(request, attachment: fileKey).reply.sealed) else {
            throw ProtectedStoreError(.unsupportedFormat, path: socketPath, problem: "the key daemon's wrap reply has no sealed key", remedy: "Use a daemon of this version")
        }
        return sealed
    }

    /// Seals `keys` (32 bytes each) for `protectionClass`, key i with header prefix `associatedData[i]`, in one round trip.
    func wrapFileKeys(_ keys: SecureBytes, for protectionClass: ProtectionClass, associatedData: [[UInt8]]) throws -> [[UInt8]] {
        var request = DaemonRequest(id: 0, op: .wrapBatch)
        request.protectionClass = protectionClass.name
        request.associatedDataList = associatedData.map(\.base64)
        let reply = try call(request, attachment: keys).reply
        guard let list = reply.sealedList, list.count == associatedData.count else {
            throw ProtectedStoreError(.unsupportedFormat, path: socketPath, problem: "the key daemon's wrap-batch reply has not one sealed key per key sent", remedy: "Use a daemon of this version")
        }
        return try list.map { item in
            guard let sealed = [UInt8](base64: item) else {
                throw ProtectedStoreError(.unsupportedFormat, path: socketPath, problem: "the key daemon's wrap-batch reply holds a sealed key that is not base64", remedy: "Use a daemon of this version")
            }
            return sealed
        }
    }

    /// The name key of a container, or the device's own with nil, from the daemon (the device secret stays there).
    func nameKey(forContainer bundleIdentifier: String?) throws -> SecureBytes {
        var request = DaemonRequest(id: 0, op: .nameKey)
        request.container = bundleIdentifier
        guard let key = try call(request).attachment, key.count == AEAD.keyBytes else {
            throw ProtectedStoreError(.unsupportedFormat, path: socketPath, problem: "the key daemon's name-key reply has no key", remedy: "Use a daemon of this version")
        }
        return key
    }

    func unwrapFileKey(_ wrapped: WrappedFileKey) throws -> SecureBytes? {
        var request = DaemonRequest(id: 0, op: .unwrap)
        request.protectionClass = wrapped.protectionClass.name
        request.associatedData = wrapped.associatedData.base64
        request.ephemeralPublicKey = wrapped.ephemeralPublicKey.base64
        request.sealed = wrapped.sealed.base64
        do {
            guard let fileKey = try call(request).attachment, fileKey.count == FileHeader.fileKeyBytes else {
                throw ProtectedStoreError(.unsupportedFormat, path: socketPath, problem: "the key daemon's unwrap reply has no key", remedy: "Use a daemon of this version")
            }
            return fileKey
        } catch let error as ProtectedStoreError where error.kind == .integrity {
            return nil
        }
    }

    func changePasscode(from oldPasscode: Passcode, to newPasscode: Passcode) throws {
        let both = try oldPasscode.bytes.withUnsafeBytes { old in
            try newPasscode.bytes.withUnsafeBytes { new in
                SecureBytes(count: 2 + old.count + new.count) { out in
                    out[0] = UInt8(old.count >> 8)
                    out[1] = UInt8(old.count & 0xff)
                    UnsafeMutableRawBufferPointer(rebasing: out[2..<2 + old.count]).copyMemory(from: old)
                    UnsafeMutableRawBufferPointer(rebasing: out[(2 + old.count)...]).copyMemory(from: new)
                }
            }
        }
        defer { both.discard() }
        _ = try call(DaemonRequest(id: 0, op: .changePasscode), attachment: both)
    }
}
