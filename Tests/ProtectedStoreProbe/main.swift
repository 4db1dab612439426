// A client program for the daemon tests: a real second process that attaches to the daemon, keeps a class A file
// open, reports every event it receives (with the daemon's state at that moment), and reads on command.
//
//   ProtectedStoreProbe ROOT BUNDLE PATH
//
// Standard input, one command per line: `read` (reads through the open handle and afresh), `exit`.
// Standard output, JSON lines: {"kind":"ready"}, {"kind":"event","event":…,"daemonState":…}, {"kind":"read","handle":…,"fresh":…}.
import Foundation
import ProtectedStore

let arguments = CommandLine.arguments

// `ProtectedStoreProbe keychain-worker ROOT WORKER ROUNDS`: attaches to the daemon and, ROUNDS times, replaces the
// secret of the shared item (service "shared") with one of its own and adds an item of its own (service "mine");
// exits 0 when every call succeeded, else prints the failure and exits 1.
if arguments.count == 5, arguments[1] == "keychain-worker", let rounds = Int(arguments[4]) {
    let (root, worker) = (arguments[2], arguments[3])
    do {
        let device = try Device.attach(root: root, notificationCenter: NotificationCenter())
        let keychain = try Keychain(device: device)
        let padding = String(repeating: "p", count: 3000)
        for round in 1...rounds {
            try keychain.update(matching: .genericPassword(service: "shared", accessGroup: "com.example.keychain"),
                                with: KeychainChanges(secret: Data("w\(worker)-\(round)-\(padding)".utf8)))
            try keychain.add(.genericPassword(service: "mine", account: "w\(worker)-\(round)", secret: Data("x".utf8), accessGroup: "com.example.keychain"))
        }
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("worker \(worker): \(error)\n".utf8))
        exit(1)
    }
}

guard arguments.count == 4 else {
    FileHandle.standardError.write(Data("usage: ProtectedStoreProbe ROOT BUNDLE PATH\n".utf8))
    exit(64)
}
let (root, bundle, path) = (arguments[1], arguments[2], arguments[3])

let outputLock = NSLock()
func emit(_ fields: [String: String]) {
    let data = try! JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])
    outputLock.withLock {
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }
}

/// "ok", "denied" for a data-protection refusal, else the error itself.
func outcome(_ body: () throws -> Void) -> String {
    do {
        try body()
        return "ok"
    } catch {
        return (error as? CocoaError)?.isProtectedDataUnavailable == true ? "denied" : "\(error)"
    }
}

final class Reporter: ProtectedDataDelegate {
    func protectedDataWillBecomeUnavailable(_ device: Device) { report(.willBecomeUnavailable, device) }
    func protectedDataDidBecomeAvailable(_ device: Device) { report(.didBecomeAvailable, device) }

    private func report(_ event: ProtectedDataEvent, _ device: Device) {
        // Asked while the delegate still runs: the daemon must not have discarded the keys yet.
        let state = (try? device.daemonStatus()?.state.rawValue) ?? "unreachable"
        emit(["kind": "event", "event": event.rawValue, "daemonState": state])
    }
}

do {
    let device = try Device.attach(root: root)
    let container = try device.container(bundleIdentifier: bundle)
    let handle = try container.fileHandle(forReadingAtPath: path)
    _ = try handle.read(upToCount: 1 << 20, atOffset: 0)
    let reporter = Reporter()
    device.addDelegate(reporter)
    emit(["kind": "ready"])
    while let line = readLine() {
        switch line {
        case "read":
            let viaHandle = outcome { _ = try handle.read(upToCount: 1 << 20, atOffset: 0) }
            let fresh = outcome { _ = try container.contents(atPath: path) }
            emit(["kind": "read", "handle": viaHandle, "fresh": fresh])
        case "state":
            emit(["kind": "state", "state": device.state.rawValue])
        case "exit":
            withExtendedLifetime(reporter) { exit(0) }
        default:
            emit(["kind": "error", "message": "unknown command \(line)"])
        }
    }
    withExtendedLifetime(reporter) {}
} catch {
    emit(["kind": "error", "message": "\(error)"])
    exit(1)
}
