import CSupport
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import ProtectedStoreDaemon
import SystemPackage

/// Lock fan-out, key discard and unlock overhead of the key daemon, each beside a baseline measured in the same run:
/// a status round trip for the socket, raw Argon2id with the keybag's parameters for unlock.
///
/// The daemon runs in this process on a real socket; the subscribers are N connections served by one polling
/// thread that acknowledges each event as soon as it arrives.
public struct LockBenchmark: Sendable {
    public struct Result: Sendable, Codable {
        public var subscribers: Int
        public var rounds: Int
        public var kdf: String
        /// Median round trip of a status request (the socket baseline).
        public var statusRoundTripMilliseconds: Double
        /// Grace 0: from the lock request until every subscriber has *will become unavailable* (median).
        public var fanOutMilliseconds: Double
        /// Grace 0: from the lock request until the lock's reply, sent once the keys are discarded (median).
        public var keysDiscardedMilliseconds: Double
        /// Grace 60 s, so the daemon waits for acknowledgements: from the last acknowledgement sent until the lock's reply (median).
        public var discardAfterLastAcknowledgementMilliseconds: Double
        /// Unlock request to reply (median).
        public var unlockMilliseconds: Double
        /// Argon2id alone with the keybag's parameters (median).
        public var argon2idMilliseconds: Double
        /// Unlock minus Argon2id.
        public var unlockOverheadMilliseconds: Double { unlockMilliseconds - argon2idMilliseconds }
    }

    public var subscribers: Int
    public var rounds: Int
    public var kdf: KDFPreset
    /// Directory for the temporary device (removed afterwards).
    public var directory: String

    public init(subscribers: Int, rounds: Int = 7, kdf: KDFPreset = .interactive, directory: String) {
        self.subscribers = subscribers
        self.rounds = rounds
        self.kdf = kdf
        self.directory = directory
    }

    public func run() throws -> Result {
        let base = (directory as NSString).appendingPathComponent("sandboxctl-bench-lock-\(Random.bytes(4).hex)")
        try FileSystem.createDirectories(base)
        defer { try? FileManager.default.removeItem(atPath: base) }
        let root = (base as NSString).appendingPathComponent("device")
        let secret = (base as NSString).appendingPathComponent("device.secret")
        let passcode = try Passcode("benchmark")
        _ = try Device.create(root: root, deviceSecretPath: secret, passcode: passcode, kdf: kdf, notificationCenter: NotificationCenter())
        let daemon = try KeyDaemon.start(root: root, deviceSecretPath: secret, logger: .init(label: "bench", factory: { _ in SwiftLogNoOpLogHandler() }))
        defer { daemon.stop() }
        let swarm = try Swarm(socketPath: daemon.socketPath, count: subscribers)
        defer { swarm.stop() }
        let control = try ControlConnection(socketPath: daemon.socketPath)
        defer { control.close() }

        let kdfParameters = PasscodeKDF(preset: kdf)
        var statusTimes: [Double] = [], fanOut: [Double] = [], discarded: [Double] = [], afterAck: [Double] = []
        var unlock: [Double] = [], argon2id: [Double] = []
        for _ in 0..<rounds {
            statusTimes.append(try milliseconds { _ = try control.call(DaemonRequest(id: 0, op: .status)) })
            // Interleaved with the unlocks, so both see the same machine load.
            argon2id.append(try milliseconds { try kdfParameters.derive(from: passcode).discard() })
            unlock.append(try milliseconds { _ = try control.call(DaemonRequest(id: 0, op: .unlock), attachment: passcode.bytes) })
            try swarm.waitForAll(.didBecomeAvailable)

            for grace in [0.0, 60] {
                swarm.reset()
                var request = DaemonRequest(id: 0, op: .lock)
                request.grace = grace
                let start = ContinuousClock.now
                _ = try control.call(request)
                let replied = ContinuousClock.now
                try swarm.waitForAll(.willBecomeUnavailable)
                if grace == 0 {
                    fanOut.append((swarm.lastReceipt - start) / .milliseconds(1))
                    discarded.append((replied - start) / .milliseconds(1))
                } else {
                    afterAck.append((replied - swarm.lastAcknowledgement) / .milliseconds(1))
                }
                if grace == 0 {
                    _ = try control.call(DaemonRequest(id: 0, op: .unlock), attachment: passcode.bytes)
                    try swarm.waitForAll(.didBecomeAvailable)
                }
            }
        }
        return Result(subscribers: subscribers, rounds: rounds, kdf: kdf.rawValue, statusRoundTripMilliseconds: median(statusTimes),
                      fanOutMilliseconds: median(fanOut), keysDiscardedMilliseconds: median(discarded),
                      discardAfterLastAcknowledgementMilliseconds: median(afterAck), unlockMilliseconds: median(unlock),
                      argon2idMilliseconds: median(argon2id))
    }

    private func milliseconds(_ body: () throws -> Void) rethrows -> Double {
        let start = ContinuousClock.now
        try body()
        return (ContinuousClock.now - start) / .milliseconds(1)
    }

    private func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
}

/// A blocking connection that sends requests and reads their replies (no subscription).
private final class ControlConnection {
    private let fd: Int32
    private let buffer = FrameBuffer()

    init(socketPath: String) throws {
        fd = ps_unix_connect(socketPath)
        guard fd >= 0 else { throw ProtectedStoreError.io(Errno(rawValue: errno), path: socketPath, doing: "connect to the daemon") }
        _ = try DaemonLink.greet(on: fd, buffer: buffer)
    }

    func call(_ request: DaemonRequest, attachment: SecureBytes? = nil) throws -> DaemonReply {
        try DaemonLink.exchange(request, attachment: attachment, on: fd, buffer: buffer)
    }

    func close() { Glibc.close(fd) }
}

/// N subscribed connections, served by one thread that acknowledges every event on arrival and notes the times.
private final class Swarm: @unchecked Sendable {
    private let descriptors: [Int32]
    private let changed = NSCondition()
    private var received: [ProtectedDataEvent: Int] = [:]
    private(set) var lastReceipt = ContinuousClock.now
    private(set) var lastAcknowledgement = ContinuousClock.now
    private var stopping = false
    private let finished = DispatchSemaphore(value: 0)

    init(socketPath: String, count: Int) throws {
        var descriptors: [Int32] = []
        for _ in 0..<count {
            let fd = ps_unix_connect(socketPath)
            guard fd >= 0 else {
                descriptors.forEach { Glibc.close($0) }
                throw ProtectedStoreError.io(Errno(rawValue: errno), path: socketPath, doing: "connect subscriber \(descriptors.count + 1) (raise `ulimit -n`?)")
            }
            let buffer = FrameBuffer()
            _ = try DaemonLink.greet(on: fd, buffer: buffer)
            _ = try DaemonLink.exchange(DaemonRequest(id: 1, op: .subscribe), on: fd, buffer: buffer)
            descriptors.append(fd)
        }
        self.descriptors = descriptors
        let thread = Thread { [self] in serve() }
        thread.name = "bench.subscribers"
        thread.start()
    }

    func stop() {
        changed.withLock { stopping = true }
        finished.wait()
        descriptors.forEach { Glibc.close($0) }
    }

    func reset() { changed.withLock { received = [:] } }

    /// Waits until every subscriber has received `event` since the last reset (at most 60 s).
    func waitForAll(_ event: ProtectedDataEvent) throws {
        let deadline = Date().addingTimeInterval(60)
        try changed.withLock {
            while received[event, default: 0] < descriptors.count {
                guard changed.wait(until: deadline) else {
                    throw ProtectedStoreError(.io, problem: "only \(received[event, default: 0]) of \(descriptors.count) subscribers received \(event) within 60 s", remedy: "Check the daemon")
                }
            }
            received[event] = 0
        }
    }

    private func serve() {
        let buffers = descriptors.map { _ in FrameBuffer() }
        var polled = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !changed.withLock({ stopping }) {
            guard poll(&polled, nfds_t(polled.count), 50) > 0 else { continue }
            for index in polled.indices where polled[index].revents != 0 {
                let count = chunk.withUnsafeMutableBytes { recv(descriptors[index], $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                guard count > 0 else {
                    polled[index].events = 0
                    continue
                }
                chunk.withUnsafeBytes { buffers[index].append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
                while let frame = try? buffers[index].nextFrame() {
                    guard let reply = try? JSONDecoder().decode(DaemonReply.self, from: Data(frame.message)),
                          let event = reply.event.flatMap(ProtectedDataEvent.init(wireName:)), let seq = reply.seq else { continue }
                    let receipt = ContinuousClock.now
                    var ack = DaemonRequest(id: 0, op: .ack)
                    ack.seq = seq
                    if let bytes = try? Frame.encode(ack) {
                        _ = bytes.withUnsafeBytes { send(descriptors[index], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    }
                    let acknowledged = ContinuousClock.now
                    changed.withLock {
                        received[event, default: 0] += 1
                        lastReceipt = receipt
                        lastAcknowledgement = acknowledged
                        changed.broadcast()
                    }
                }
            }
        }
        finished.signal()
    }
}
