import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing

/// Writes to a child's standard input. A child that exits before reading it (a command that fails early, as several
/// tests want) must not take the whole test run down with SIGPIPE: broken pipes are ignored in this process, and the
/// child's exit status is what the test looks at.
func writeToChild(_ handle: FileHandle, _ data: Data) {
    _ = brokenPipesIgnored
    try? handle.write(contentsOf: data)
}

private let brokenPipesIgnored: Void = { signal(SIGPIPE, SIG_IGN) }()

/// A spawned program whose standard output is read line by line as it arrives, with timeouts.
final class SpawnedProcess: @unchecked Sendable {
    let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private let errors = Pipe()
    private let mutex = NSLock()
    private var lines: [String] = []
    private var partial = Data()
    private var errorText = Data()
    private let arrived = DispatchSemaphore(value: 0)
    /// Left by each reader at end of file, so output written just before the exit is in when `waitForExit` returns.
    private let readers = DispatchGroup()

    /// A binary built beside the test bundle (`sandboxctl`, `ProtectedStoreProbe`).
    static func builtExecutable(_ name: String) -> URL {
        URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent(name)
    }

    init(_ executable: URL, _ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = executable
        process.arguments = arguments
        process.environment = childEnvironment(environment)
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        Self.readUntilEnd(output.fileHandleForReading, group: readers) { [weak self] data in self?.received(data) }
        Self.readUntilEnd(errors.fileHandleForReading, group: readers) { [weak self] data in self?.mutex.withLock { self?.errorText.append(data) } }
    }

    /// Blocking reads on a thread of their own until end of file, holding the handle (so its descriptor stays open)
    /// until then. Not `readabilityHandler`: Foundation's dispatch source behind it can outlive the descriptor, which
    /// another thread's `open` then reuses, and libdispatch crashed the test run (SIGSEGV in
    /// `_dispatch_event_loop_drain`) while other tests spawned processes.
    /// At end of file it delivers an empty chunk (a last line without a newline is then complete) and leaves `group`.
    private static func readUntilEnd(_ handle: FileHandle, group: DispatchGroup, _ deliver: @escaping @Sendable (Data) -> Void) {
        group.enter()
        Thread {
            defer { group.leave() }
            // read(2), which returns what has arrived; FileHandle.read(upToCount:) waits for the whole count.
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while true {
                let count = read(handle.fileDescriptor, &buffer, buffer.count)
                if count > 0 {
                    deliver(Data(buffer[0..<count]))
                } else if count < 0 && errno == EINTR {
                    continue
                } else {
                    deliver(Data())
                    return
                }
            }
        }.start()
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGCONT)
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    var pid: Int32 { process.processIdentifier }
    var standardError: String { mutex.withLock { String(decoding: errorText, as: UTF8.self) } }

    /// A chunk of standard output; an empty one is the end, which completes a last line without a newline.
    private func received(_ data: Data) {
        let complete: Int = mutex.withLock {
            partial.append(data)
            if data.isEmpty && !partial.isEmpty { partial.append(UInt8(ascii: "\n")) }
            var count = 0
            while let newline = partial.firstIndex(of: UInt8(ascii: "\n")) {
                lines.append(String(decoding: partial[partial.startIndex..<newline], as: UTF8.self))
                partial = Data(partial[partial.index(after: newline)...])
                count += 1
            }
            return count
        }
        for _ in 0..<complete { arrived.signal() }
    }

    /// The next line of standard output, or nil if none arrives within `timeout` seconds.
    func nextLine(timeout: TimeInterval = 20) -> String? {
        guard arrived.wait(timeout: .now() + timeout) == .success else { return nil }
        return mutex.withLock { lines.removeFirst() }
    }

    /// The next line parsed as a JSON object.
    func nextJSON(timeout: TimeInterval = 20) -> [String: String]? {
        guard let line = nextLine(timeout: timeout) else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: String]
    }

    func send(_ line: String) {
        writeToChild(input.fileHandleForWriting, Data((line + "\n").utf8))
    }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Ends the child's standard input.
    func closeInput() { try? input.fileHandleForWriting.close() }

    /// Waits for exit, and for its output to be read (at most 2 s more: a child it left running may hold the pipes);
    /// nil if it has not exited within `timeout` seconds.
    func waitForExit(timeout: TimeInterval = 20) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning {
            if Date() > deadline { return nil }
            usleep(10_000)
        }
        _ = readers.wait(timeout: .now() + 2)
        return process.terminationStatus
    }
}

/// This process's environment for a child, without the user's own device settings, plus `overrides`.
func childEnvironment(_ overrides: [String: String]) -> [String: String] {
    var environment = ProcessInfo.processInfo.environment
    environment["SANDBOXCTL_ROOT"] = nil
    environment["SANDBOXCTL_DEVICE_SECRET"] = nil
    return environment.merging(overrides) { $1 }
}

/// A `sandboxctl daemon` process for a test device.
final class DaemonProcess: @unchecked Sendable {
    let spawned: SpawnedProcess
    let root: String

    /// A release build of `sandboxctl`, when `make test` built one (`PROTECTEDSTORE_RELEASE_BIN`): the memory tests scan
    /// the daemon as it ships, since an optimised build leaves different residues on its stacks than a debug one.
    static var releaseExecutable: URL? {
        guard let folder = ProcessInfo.processInfo.environment["PROTECTEDSTORE_RELEASE_BIN"] else { return nil }
        let executable = URL(fileURLWithPath: folder).appendingPathComponent("sandboxctl")
        return FileManager.default.isExecutableFile(atPath: executable.path) ? executable : nil
    }

    /// `descriptorLimit` starts the daemon under `prlimit --nofile` (`N`, or `SOFT:HARD`), as a user with a small
    /// descriptor limit would.
    init(_ test: TestDevice, grace: Double = 10, extraArguments: [String] = [], executable: URL = SpawnedProcess.builtExecutable("sandboxctl"),
         descriptorLimit: String? = nil) throws {
        root = test.root
        let arguments = ["daemon", "--root", test.root, "--device-secret", test.secretPath, "--grace", String(grace)] + extraArguments
        if let descriptorLimit {
            spawned = try SpawnedProcess(URL(fileURLWithPath: "/usr/bin/prlimit"), ["--nofile=\(descriptorLimit)", executable.path] + arguments)
        } else {
            spawned = try SpawnedProcess(executable, arguments)
        }
        let deadline = Date().addingTimeInterval(20)
        while !Device.isDaemonRunning(root: root) {
            guard spawned.process.isRunning, Date() < deadline else {
                Issue.record("the daemon did not start: \(spawned.standardError)")
                return
            }
            usleep(20_000)
        }
    }

    var pid: Int32 { spawned.pid }

    /// Resident memory of the daemon process, from /proc.
    var residentKiB: Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }
}

/// Runs `sandboxctl` on a test device's root.
func sandboxctl(_ test: TestDevice, _ arguments: [String], stdin: String? = nil) throws -> CLI.Result {
    try CLI.run(arguments + ["--root", test.root, "--device-secret", test.secretPath], stdin: stdin)
}

/// Polls `condition` every 10 ms for up to `timeout` seconds.
func eventually(timeout: TimeInterval = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return true }
        usleep(10_000)
    }
    return try condition()
}
