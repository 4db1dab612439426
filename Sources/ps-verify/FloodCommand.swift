import ArgumentParser
import CSupport
import Foundation
import ProtectedStore

/// A hostile program of the owner's uid: opens connections to a daemon socket as fast as it can, keeps the newest ones
/// open, and prints what it managed. The tests run the owner's `lock`, `unlock` and `status` beside it.
struct FloodCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "flood",
        abstract: "Open connections to a daemon socket as fast as possible (a same-uid attacker), until a count or end of input.",
        discussion: """
            Each connection sends nothing (silent), hello (idle), or hello and subscribe (subscribed), and is kept open \
            until it is among the oldest beyond --open. The flood ends after --total connections or when standard \
            input ends, whichever comes first; then it closes them all and prints one JSON line: connections made, \
            connects refused or failed, seconds, and the rate.
            """
    )

    enum Mode: String, ExpressibleByArgument, CaseIterable {
        case silent, idle, subscribed
    }

    @Option(help: "The socket to flood (the daemon's, or an app's).") var socket: String
    @Option(help: ArgumentHelp("What each connection sends: \(Mode.allCases.map(\.rawValue).joined(separator: ", ")).")) var mode: Mode = .idle
    @Option(help: "Connections kept open at once; the oldest beyond are closed.") var open: Int = 4000
    @Option(help: "Connections to make before stopping.") var total: Int = 1_000_000
    @Option(help: "Threads connecting at once.") var threads: Int = 4

    func validate() throws {
        guard open >= 1, total >= 1, (1...64).contains(threads) else { throw ValidationError("--open and --total must be positive, --threads 1 to 64") }
    }

    func run() throws {
        let greeting: [UInt8] = switch mode {
        case .silent: []
        case .idle: try Frame.encode(DaemonRequest.hello)
        case .subscribed: try Frame.encode(DaemonRequest.hello) + Frame.encode(DaemonRequest(id: 1, op: .subscribe))
        }
        let state = FloodState(total: total)
        // Standard input's end stops the flood: the test that started it decides when.
        Thread { while readLine() != nil {}; state.stop() }.start()
        let start = ContinuousClock.now
        let workers = (0..<threads).map { _ in
            Thread {
                while state.take() {
                    let fd = ps_unix_connect(socket)
                    guard fd >= 0 else {
                        state.noteFailure()
                        continue
                    }
                    if !greeting.isEmpty { _ = greeting.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }
                    if let oldest = state.keep(fd, open: open) { close(oldest) }
                }
                state.finished()
            }
        }
        workers.forEach { $0.start() }
        state.waitForWorkers(workers.count)
        state.hold()
        state.closeAll()
        let seconds = ((state.ended ?? .now) - start) / .seconds(1)
        let report: [String: Any] = ["connections": state.made - state.failed, "failed": state.failed, "seconds": seconds,
                                     "perSecond": seconds > 0 ? Double(state.made - state.failed) / seconds : 0]
        print(String(decoding: try JSONSerialization.data(withJSONObject: report, options: [.sortedKeys]), as: UTF8.self))
    }
}

/// The flood's counts and open connections, shared by its threads. After the count, the connections stay open until
/// standard input ends, so a test sees them held while it works.
private final class FloodState: @unchecked Sendable {
    private let lock = NSCondition()
    private let total: Int
    private var kept: [Int32] = []
    private var oldestKept = 0
    private var stopped = false
    private var done = 0
    private(set) var made = 0
    private(set) var failed = 0
    /// When the first thread found the flood over.
    private(set) var ended: ContinuousClock.Instant?

    init(total: Int) { self.total = total }

    /// Claims one more connection; false once the count is reached or the flood was stopped.
    func take() -> Bool {
        lock.withLock {
            guard !stopped, made < total else {
                if ended == nil { ended = .now }
                return false
            }
            made += 1
            return true
        }
    }

    func noteFailure() { lock.withLock { failed += 1 } }

    /// Keeps `fd` open; returns the oldest one to close when more than `open` are.
    func keep(_ fd: Int32, open: Int) -> Int32? {
        lock.withLock {
            kept.append(fd)
            guard kept.count - oldestKept > open else { return nil }
            let oldest = kept[oldestKept]
            oldestKept += 1
            // The closed ones are dropped in bulk, not one by one from the front.
            if oldestKept >= 65_536 {
                kept.removeFirst(oldestKept)
                oldestKept = 0
            }
            return oldest
        }
    }

    func closeAll() { lock.withLock { kept[oldestKept...].forEach { close($0) } } }

    func stop() {
        lock.withLock {
            stopped = true
            lock.broadcast()
        }
    }

    /// Waits for the stop (end of input).
    func hold() {
        lock.withLock { while !stopped { lock.wait() } }
    }

    func finished() {
        lock.withLock {
            done += 1
            lock.broadcast()
        }
    }

    func waitForWorkers(_ count: Int) {
        lock.withLock { while done < count { lock.wait() } }
    }
}
