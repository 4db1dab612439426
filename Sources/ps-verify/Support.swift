import Foundation
import ProtectedStore
import ProtectedStoreTesting

/// Content named by a seed: `size` bytes a reader can regenerate to compare, so a torn or mixed file never matches.
func generatedContent(seed: UInt64, size: Int) -> Data {
    var generator = SplitMix64(seed: seed)
    var data = Data(count: size)
    data.withUnsafeMutableBytes { buffer in
        var offset = 0
        while offset < size {
            var word = generator.next()
            let count = min(8, size - offset)
            withUnsafeBytes(of: &word) { buffer.baseAddress!.advanced(by: offset).copyMemory(from: $0.baseAddress!, byteCount: count) }
            offset += count
        }
    }
    return data
}

/// A throwaway device in a fresh temporary folder: its root, device secret and passcode. Removed by `remove()`.
struct ScratchDevice {
    let folder: String
    var root: String { folder + "/root" }
    var secretPath: String { folder + "/device-secret" }
    static let bundleIdentifier = "com.example.verify"

    /// Creates the device (fast KDF) with one container, unlocked, and returns it with the open device.
    static func create(label: String, passcode: String, defaultProtection: FileProtectionType = .complete) throws -> (ScratchDevice, Device, Container) {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("ps-verify-\(label)-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let scratch = ScratchDevice(folder: folder)
        let device = try Device.create(root: scratch.root, deviceSecretPath: scratch.secretPath, passcode: try Passcode(passcode), kdf: .fast,
                                       notificationCenter: NotificationCenter())
        let container = try device.createContainer(bundleIdentifier: bundleIdentifier, defaultProtection: defaultProtection)
        return (scratch, device, container)
    }

    /// The device opened afresh in this process (before first unlock), as a relaunched program would.
    func open() throws -> Device { try Device.open(root: root, deviceSecretPath: secretPath, notificationCenter: NotificationCenter()) }

    func remove() { try? FileManager.default.removeItem(atPath: folder) }
}

/// A child process of this program, fed one line on standard input (a passcode never goes on the command line).
/// Each instance is used by one thread at a time (the caller, or the one reader thread it hands the child to).
final class ChildProcess: @unchecked Sendable {
    let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private var buffered = Data()

    /// Starts `executable` (default: this program) with `arguments` and writes `firstLine` to its standard input.
    /// Standard error goes to `errors`, else passes through so a child's complaint reaches the user.
    init(executable: URL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath(), arguments: [String],
         firstLine: String? = nil, errors: FileHandle? = nil) throws {
        process.executableURL = executable
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        if let errors { process.standardError = errors }
        try process.run()
        if let firstLine { try? input.fileHandleForWriting.write(contentsOf: Data((firstLine + "\n").utf8)) }
        try? input.fileHandleForWriting.close()
    }

    var pid: Int32 { process.processIdentifier }

    /// The next line of standard output; nil at end of file (the child exited).
    func nextLine() -> String? {
        while true {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffered[buffered.startIndex..<newline], as: UTF8.self)
                buffered = Data(buffered[buffered.index(after: newline)...])
                return line
            }
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { return nil }
            buffered.append(chunk)
        }
    }

    /// Every remaining line, after the child has gone.
    func remainingLines() -> [String] {
        var lines: [String] = []
        while let line = nextLine() { lines.append(line) }
        return lines
    }

    func kill(_ signal: Int32 = SIGKILL) { Foundation.kill(pid, signal) }

    /// Waits for exit; returns "exit N" or "signal N".
    @discardableResult
    func wait() -> String {
        process.waitUntilExit()
        return process.terminationReason == .uncaughtSignal ? "signal \(process.terminationStatus)" : "exit \(process.terminationStatus)"
    }
}

/// Writes one line to standard output at once (unbuffered), so a parent that kills this process has every line it saw.
func emitLine(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    bytes.withUnsafeBytes { buffer in
        var offset = 0
        while offset < buffer.count {
            let written = Foundation.write(STDOUT_FILENO, buffer.baseAddress!.advanced(by: offset), buffer.count - offset)
            if written <= 0 { if errno == EINTR { continue }; return }
            offset += written
        }
    }
}

/// Every file under `folder` whose name marks an unfinished write (`.sandboxctl-tmp-…`).
func temporaryFiles(under folder: String) -> [String] {
    guard let walker = FileManager.default.enumerator(atPath: folder) else { return [] }
    return walker.compactMap { $0 as? String }.filter { ($0 as NSString).lastPathComponent.hasPrefix(".sandboxctl-tmp-") }
}

extension CocoaError {
    /// The code's name in the load test's breakdown of data-protection refusals (any other error is a violation).
    var breakdownLabel: String {
        switch code {
        case .fileReadNoPermission: "fileReadNoPermission"
        case .fileWriteNoPermission: "fileWriteNoPermission"
        default: "CocoaError \(code.rawValue)"
        }
    }
}
