import CSupport
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// The key-holding daemon of one device root: holds the class keys, serves lock, unlock and per-file key requests
/// on a Unix socket, and relays the protected-data events to every attached program (docs/PROTOCOL.md).
///
/// Starting it is a reboot: the device is *before first unlock*. One daemon per root, enforced with a lock file.
public final class KeyDaemon: Sendable {
    /// The device root served.
    public let root: String
    /// The socket clients connect to (mode 0600).
    public let socketPath: String
    /// The device, held in this process; its lock and unlock reach every attached program.
    public let device: Device
    private let server: DaemonServer
    private let lockFile: Int32
    /// The socket came from systemd (socket activation): systemd owns its file, which stays when the daemon stops.
    public let isSocketActivated: Bool
    private let lockTriggers: LockTriggerWatcher?
    private let serverFinished = DispatchSemaphore(value: 0)
    private let stopped = DispatchSemaphore(value: 0)
    private let stopOnce = OnceFlag()
    private let logger: Logger

    /// The socket path used when none is given: inside the root, which only its owner can enter.
    public static func defaultSocketPath(root: String) -> String { DaemonInfo.defaultSocketPath(root: root) }

    /// Opens the device before first unlock and starts serving on `socketPath` (default: `defaultSocketPath(root:)`).
    /// Throws if another daemon serves the root or the socket; a socket left by a killed daemon is replaced. Started by
    /// systemd with a listening socket (`LISTEN_FDS`), it serves on that one, after checking that it is a Unix stream
    /// socket at `socketPath` that only its owner can use.
    public static func start(root: String, deviceSecretPath: String? = nil, socketPath: String? = nil,
                             gracePeriod: TimeInterval = Device.defaultGracePeriod, lockTriggers: LockTriggers = LockTriggers(),
                             logger: Logger = Logger(label: "sandboxctl.daemon")) throws -> KeyDaemon {
        precondition(gracePeriod >= 0 && gracePeriod.isFinite, "the grace period must be a finite number of seconds ≥ 0")
        // A socket from systemd is taken over first: before anything else starts a thread, or a child (unsealing the
        // device secret) that could inherit it.
        let socketPath = Device.absolute(socketPath ?? defaultSocketPath(root: Device.absolute(root)))
        let activated = try inheritedListener(socketPath: socketPath)
        let device: Device, lockFile: Int32
        do {
            device = try Device.open(root: root, deviceSecretPath: deviceSecretPath, notificationCenter: NotificationCenter())
            lockFile = try DaemonInfo.takeLock(root: device.root, remedy: "Use it (`sandboxctl status`, `lock`, `unlock`), or stop it first")
        } catch {
            if let activated { Glibc.close(activated) }
            throw error
        }
        device.gracePeriod = gracePeriod
        let root = device.root
        do {
            let listener: Int32
            if let activated {
                listener = activated
            } else {
                listener = try listen(at: socketPath)
            }
            var rootStatus = stat()
            guard stat(root, &rootStatus) == 0 else {
                throw ProtectedStoreError.io(Errno(rawValue: errno), path: root, doing: "read the owner of the device root")
            }
            let relay = StopRelay()
            let server = try DaemonServer(device: device, listener: listener, socketPath: socketPath,
                                          allowedUIDs: [rootStatus.st_uid, 0], gracePeriod: gracePeriod,
                                          limits: .raisingDescriptorLimit(), logger: logger,
                                          onErased: { relay.stop() })
            let info = DaemonInfo(pid: getpid(), socketPath: socketPath, protocolVersion: daemonProtocolVersion)
            try FileSystem.writeAtomically(Array(try JSONEncoder().encode(info)), to: FileLocation(path: DaemonInfo.path(root: root)), replacing: true)
            let watcher = lockTriggers.isEmpty ? nil : LockTriggerWatcher(triggers: lockTriggers, device: device, logger: logger) { [weak server] grace, done in
                guard let server, server.execute({ server.lock(grace: grace, then: done) }) else { return done() }
            }
            server.lockTriggerStatus = { (lockTriggers.names, watcher?.isConnected ?? false) }
            let daemon = KeyDaemon(root: root, socketPath: socketPath, device: device, server: server, lockFile: lockFile,
                                   isSocketActivated: activated != nil, lockTriggers: watcher, logger: logger)
            relay.daemon = daemon
            let thread = Thread { [daemon] in
                daemon.server.run()
                daemon.serverFinished.signal()
                // Also when the loop ended on its own: the keys and the socket must not outlive it.
                daemon.stop()
            }
            thread.name = "ProtectedStore.daemon"
            thread.start()
            watcher?.start()
            logger.info("serving \(root) on \(socketPath)\(activated != nil ? " (from systemd)" : "") (pid \(getpid()), grace \(gracePeriod) s); state: before first unlock")
            return daemon
        } catch {
            Glibc.close(lockFile)
            throw error
        }
    }

    private init(root: String, socketPath: String, device: Device, server: DaemonServer, lockFile: Int32, isSocketActivated: Bool,
                 lockTriggers: LockTriggerWatcher?, logger: Logger) {
        self.lockTriggers = lockTriggers
        self.root = root
        self.socketPath = socketPath
        self.device = device
        self.server = server
        self.lockFile = lockFile
        self.isSocketActivated = isSocketActivated
        self.logger = logger
    }

    /// Hardens the process that will hold the keys: no core dumps, and no other process of the same user may trace it or
    /// read its memory (`PR_SET_DUMPABLE` 0). `sandboxctl daemon` calls it first; a test hosting a daemon need not.
    /// The keys themselves are in `SecureBytes`, which libsodium mlocks on a best-effort basis (within `ulimit -l`).
    public static func hardenProcess() throws {
        try ProcessHardening.disableCoreDumps()
    }

    /// Zeroes every key, closes every connection and removes the socket. Safe from any thread, more than once.
    public func stop() {
        guard stopOnce.claim() else { return }
        lockTriggers?.stop()
        server.stop()
        serverFinished.wait()
        // After the loop: a passcode check still running finishes first, and no unlock can bring keys back.
        device.shutDown()
        if !isSocketActivated { unlink(socketPath) }
        unlink(DaemonInfo.path(root: root))
        Glibc.close(lockFile)
        logger.info("stopped; keys zeroed")
        stopped.signal()
    }

    /// Blocks until `stop()` has finished.
    public func waitUntilStopped() {
        stopped.wait()
        stopped.signal()
    }

    // MARK: The socket

    /// Binds a new socket (mode 0600), replacing one a killed daemon left.
    private static func listen(at socketPath: String) throws -> Int32 {
        try removeStaleSocket(at: socketPath)
        let listener = ps_unix_listen(socketPath, 512)
        guard listener >= 0 else {
            let error = Errno(rawValue: errno)
            if error == .fileNameTooLong {
                throw ProtectedStoreError(.invalidArgument, path: socketPath, problem: "the socket path is longer than a Unix socket address allows (107 bytes)",
                                          remedy: "Pass a shorter --socket path")
            }
            throw ProtectedStoreError.io(error, path: socketPath, doing: "listen on the daemon socket")
        }
        // Bound before the chmod: a peer connecting in between is still checked with SO_PEERCRED.
        guard chmod(socketPath, 0o600) == 0 else {
            let error = Errno(rawValue: errno)
            Glibc.close(listener)
            unlink(socketPath)
            throw ProtectedStoreError.io(error, path: socketPath, doing: "restrict the daemon socket to its owner")
        }
        return listener
    }

    /// The listening socket systemd handed over (sd_listen_fds' protocol: `LISTEN_PID` is this process, `LISTEN_FDS`
    /// descriptors from 3), or nil when started by hand. It must be one Unix stream socket bound to `socketPath`
    /// that only its owner can use; the variables are cleared so no child inherits them.
    private static func inheritedListener(socketPath: String) throws -> Int32? {
        let environment = ProcessInfo.processInfo.environment
        guard let pid = environment["LISTEN_PID"], pid == String(getpid()), let count = environment["LISTEN_FDS"] else { return nil }
        for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] { unsetenv(name) }
        guard count == "1" else {
            throw ProtectedStoreError(.invalidArgument, path: socketPath, problem: "systemd passed \(count) sockets; the daemon takes exactly one",
                                      remedy: "Give sandboxctl.socket a single ListenStream=")
        }
        // Any refusal closes it: nothing else would.
        do {
            var path = [CChar](repeating: 0, count: 128)
            guard ps_adopt_listening_unix_socket(3, &path, Int32(path.count)) == 0 else {
                let error = Errno(rawValue: errno)
                throw ProtectedStoreError(.invalidArgument, path: socketPath, problem: "the socket systemd passed is not a listening Unix stream socket bound to a path (\(error))",
                                          remedy: "Use ListenStream= with a path in sandboxctl.socket")
            }
            let bound = String(decoding: path.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            guard bound == socketPath else {
                throw ProtectedStoreError(.invalidArgument, path: bound, problem: "the socket systemd passed is \(bound), not this device's \(socketPath)",
                                          remedy: "Set ListenStream=\(socketPath) in sandboxctl.socket, or start the daemon with --socket \(bound)")
            }
            var status = stat()
            guard lstat(bound, &status) == 0, status.st_mode & S_IFMT == S_IFSOCK else {
                let error = Errno(rawValue: errno)
                throw ProtectedStoreError.io(error, path: bound, doing: "check the socket systemd passed")
            }
            guard status.st_mode & 0o077 == 0 else {
                throw ProtectedStoreError(.permissionDenied, path: bound, problem: "the socket systemd passed can be used by others than its owner (mode \(String(status.st_mode & 0o777, radix: 8)))",
                                          remedy: "Set SocketMode=0600 in sandboxctl.socket")
            }
            return 3
        } catch {
            Glibc.close(3)
            throw error
        }
    }

    // MARK: One daemon per root

    /// A socket nobody answers on is what a killed daemon leaves: remove it. A live one, or a non-socket, is refused.
    private static func removeStaleSocket(at path: String) throws {
        var status = stat()
        guard lstat(path, &status) == 0 else { return }
        guard status.st_mode & S_IFMT == S_IFSOCK else {
            throw ProtectedStoreError(.alreadyExists, path: path, problem: "something other than a socket is in the way of the daemon socket",
                                      remedy: "Remove it, or pass another --socket path")
        }
        let probe = ps_unix_connect(path)
        if probe >= 0 {
            Glibc.close(probe)
            throw ProtectedStoreError(.alreadyExists, path: path, problem: "another daemon is listening on this socket (or systemd is, for sandboxctl.socket)",
                                      remedy: "Stop that daemon (`systemctl --user stop sandboxctl.socket sandboxctl.service` if systemd serves it), or pass another --socket path")
        }
        guard unlink(path) == 0 || errno == ENOENT else {
            throw ProtectedStoreError.io(Errno(rawValue: errno), path: path, doing: "remove the stale daemon socket")
        }
    }
}

/// Lets the server stop its daemon (after an erase) without owning it: set once the daemon exists.
private final class StopRelay: @unchecked Sendable {
    weak var daemon: KeyDaemon?

    func stop() {
        // Not on the loop thread: stopping waits for the loop to end.
        DispatchQueue.global().async { [daemon] in daemon?.stop() }
    }
}
