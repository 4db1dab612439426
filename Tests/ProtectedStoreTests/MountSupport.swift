import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import Testing

/// Whether this machine can mount FUSE file systems, and why not.
enum FUSEAvailability {
    static let problem: String? = {
        guard FileManager.default.fileExists(atPath: "/dev/fuse") else { return "/dev/fuse is missing (no FUSE in this kernel or container)" }
        guard executable("fusermount3") != nil else { return "fusermount3 is not installed (apt-get install fuse3)" }
        return nil
    }()

    static var isAvailable: Bool { canRun("mount tests", unless: problem) }

    static func executable(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}

/// How the kernel hands the mount its requests. The mount takes io_uring wherever the administrator turned it on.
enum MountTransport: String, CustomStringConvertible, Sendable {
    case devFuse = "/dev/fuse"
    case ioUring = "io_uring"

    var description: String { rawValue }

    /// The transports the mount tests run over: /dev/fuse, and io_uring where this process can turn it on.
    static let testable: [MountTransport] = [.devFuse] + (canRun("mount tests over FUSE's io_uring transport", unless: RingSwitch.problem) ? [.ioUring] : [])
}

/// The kernel's switch for FUSE over io_uring, turned on for one mount's start and set back after: the kernel reads it
/// when a mount starts and when its rings register, and a connection keeps the transport it got. One start at a time.
/// `MountedDevice` and `DropFolder` over /dev/fuse say so with --no-io-uring instead of turning it off; other mounts
/// that start meanwhile (`launch`, other suites' own `sandboxctl mount` calls) may take the rings, which they serve alike.
enum RingSwitch {
    static let path = FUSERings.enableKnob
    private static let lock = NSLock()

    static let problem: String? = {
        guard FileManager.default.fileExists(atPath: path) else { return "\(path) is missing (Linux 6.14+ with CONFIG_FUSE_IO_URING)" }
        guard geteuid() == 0, FileManager.default.isWritableFile(atPath: path) else { return "setting \(path) needs root" }
        return nil
    }()

    /// Runs `body` with the switch on, then sets it back.
    static func on<Result>(_ body: () throws -> Result) throws -> Result {
        lock.lock()
        defer { lock.unlock() }
        let was = try String(contentsOfFile: path, encoding: .utf8)
        try "Y".write(toFile: path, atomically: false, encoding: .utf8)
        defer {
            do {
                try was.write(toFile: path, atomically: false, encoding: .utf8)
            } catch {
                Issue.record("could not set \(path) back to \(was): \(error); set it by hand")
            }
        }
        return try body()
    }
}

extension MountTransport {
    /// Starts a mount's process at `mountPoint` with `spawn`, which adds the arguments it is given (--no-io-uring over
    /// /dev/fuse). Over io_uring the switch is on for the start, and the rings have carried a request before this
    /// returns (the process logs at info level).
    func start(at mountPoint: String, _ spawn: ([String]) throws -> SpawnedProcess) throws -> SpawnedProcess {
        func start() throws -> SpawnedProcess {
            let mount = try spawn(self == .devFuse ? ["--no-io-uring"] : [])
            let mounted = eventually(timeout: 20) { MountPoint.mountedFileSystem(at: mountPoint) != nil || !mount.process.isRunning }
            #expect(mounted && mount.process.isRunning, "the mount did not come up: \(mount.standardError)")
            return mount
        }
        guard self == .ioUring else { return try start() }
        return try RingSwitch.on {
            let mount = try start()
            // The rings register after INIT's reply; a stat waits for them, and the first request they carry is logged.
            var info = stat()
            let overRings = eventually(timeout: 20) {
                stat(mountPoint, &info) == 0 && mount.standardError.contains("requests come over io_uring now") || !mount.process.isRunning
            }
            #expect(overRings && mount.process.isRunning, "the mount did not take requests over io_uring: \(mount.standardError)")
            return mount
        }
    }

    /// After SIGTERM to a mount's process. Over io_uring: it ends within 30 s, no ring thread stopped early, and its
    /// count at unmount has on /dev/fuse only INIT's reply and the odd one (an INTERRUPT's; FORGETs get none).
    func expectEnded(_ mount: SpawnedProcess) {
        let exited = mount.waitForExit(timeout: 30) != nil
        guard self == .ioUring else { return }
        let log = mount.standardError
        #expect(exited, "the mount did not end within 30 s of SIGTERM: \(log)")
        guard exited else { return }
        #expect(!log.contains("FUSE over io_uring: "), "a ring failed: \(log)")
        guard let line = log.split(separator: "\n").last(where: { $0.contains("replies: ") }),
              let counts = try? #/replies: (\d+) over io_uring, (\d+) over /dev/fuse/#.firstMatch(in: line),
              let overRings = Int(counts.1), let overDevice = Int(counts.2) else {
            Issue.record("the mount did not report its replies at unmount: \(log)")
            return
        }
        #expect(overRings > 0 && overDevice <= 3, "replies: \(overRings) over io_uring, \(overDevice) over /dev/fuse")
    }
}

/// A test device with a daemon, unlocked, and its container mounted with `sandboxctl mount --foreground`.
final class MountedDevice: @unchecked Sendable {
    let test: TestDevice
    let container: Container
    let daemon: DaemonProcess
    let mount: SpawnedProcess
    let mountPoint: String
    let transport: MountTransport

    /// Over io_uring, the mount has answered a request from its rings before this returns. `allowOther` mounts
    /// with --allow-other.
    init(defaultProtection: FileProtectionType = .complete, in directory: TemporaryDirectory = TemporaryDirectory(),
         transport: MountTransport = .devFuse, allowOther: Bool = false) throws {
        test = try TestDevice(in: directory)
        container = try test.makeContainer(defaultProtection: defaultProtection)
        daemon = try DaemonProcess(test, grace: 1)
        mountPoint = test.path("mnt")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        try Self.unlock(test)
        self.transport = transport
        let (test, mountPoint) = (test, mountPoint)
        mount = try transport.start(at: mountPoint) { transportArguments in
            try SpawnedProcess(SpawnedProcess.builtExecutable("sandboxctl"),
                               ["mount", TestDevice.bundleIdentifier, mountPoint, "--foreground", "--verbose",
                                "--root", test.root, "--device-secret", test.secretPath] + (allowOther ? ["--allow-other"] : []) + transportArguments)
        }
    }

    deinit {
        // Unmounting first ends the mount cleanly even if a test left a descriptor open; then make sure it is gone.
        _ = try? CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("fusermount3") ?? "/bin/fusermount3"), ["-u", "-z", mountPoint])
        mount.signal(SIGTERM)
        transport.expectEnded(mount)
    }

    /// A path inside the mount ("Documents/a.txt").
    func path(_ relative: String) -> String { (mountPoint as NSString).appendingPathComponent(relative) }

    /// The app's data folder through the mount.
    var applicationSupport: String { path(container.applicationSupportPath) }

    static func unlock(_ test: TestDevice) throws {
        let result = try sandboxctl(test, ["unlock", "--passcode-stdin"], stdin: TestDevice.passcode + "\n")
        #expect(result.status == 0, "\(result.stderr)")
    }

    func unlock() throws { try Self.unlock(test) }

    func lock() throws {
        let result = try sandboxctl(test, ["lock"])
        #expect(result.status == 0, "\(result.stderr)")
    }

    /// The mount's log so far (standard error of the foreground process).
    var log: String { mount.standardError }
}

/// A Python child holding one SQLite connection (the C library under it), driven one statement per line:
/// prints `ok <rows as JSON>` or `error <message>`. Lets a connection live across a lock, and crash on its own.
final class SQLiteClient {
    let spawned: SpawnedProcess

    private static let script = """
        import json, sqlite3, sys
        connection = sqlite3.connect(sys.argv[1], isolation_level=None)
        for line in sys.stdin:
            try:
                rows = connection.execute(line).fetchall()
                print("ok " + json.dumps(rows), flush=True)
            except Exception as error:
                print("error " + str(error), flush=True)
        """

    init(database: String) throws {
        spawned = try SpawnedProcess(URL(fileURLWithPath: FUSEAvailability.executable("python3") ?? "/usr/bin/python3"), ["-c", Self.script, database])
    }

    /// The answer to one statement: "ok [[…]]" or "error …"; nil if the process gave none (it died).
    func execute(_ statement: String) -> String? {
        spawned.send(statement)
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let line = spawned.nextLine(timeout: 0.1) { return line }
            if !spawned.process.isRunning { return spawned.nextLine(timeout: 0.1) }
        }
        return nil
    }
}

/// Runs a python3 snippet with arguments; its exit status, output and the signal that ended it, if any.
func python(_ script: String, _ arguments: [String] = []) throws -> (status: Int32, signal: Int32?, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: FUSEAvailability.executable("python3") ?? "/usr/bin/python3")
    process.arguments = ["-c", script] + arguments
    let output = Pipe()
    process.standardOutput = output
    process.standardError = output
    try process.run()
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    let signalled = process.terminationReason == .uncaughtSignal
    return (signalled ? -1 : process.terminationStatus, signalled ? process.terminationStatus : nil, text)
}

/// errno of a failed POSIX call in this process, or 0 if it succeeded.
func posixError(_ result: Int) -> Int32 { result < 0 ? errno : 0 }
