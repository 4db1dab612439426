import Foundation
import ProtectedStore
import SystemPackage

/// Reads passcodes from the terminal with echo off, or one line from standard input; never from argv.
enum PasscodeInput {
    /// Whether a controlling terminal exists to ask on.
    static var terminalAvailable: Bool {
        let terminal = open("/dev/tty", O_RDWR | O_CLOEXEC)
        guard terminal >= 0 else { return false }
        close(terminal)
        return true
    }

    static func read(prompt: String, fromStandardInput: Bool) throws -> Passcode {
        if fromStandardInput {
            return try Passcode.read(from: .standardInput)
        }
        return try onTerminal(prompt: prompt, asking: "the passcode", remedy: "Pass --passcode-stdin and write the passcode as one line on standard input") {
            try Passcode.read(from: $0)
        }
    }

    /// Prints `prompt` on the terminal and runs `read` on it with echo off (restored however it ends).
    static func onTerminal<R>(prompt: String, asking what: String, remedy: String, _ read: (FileDescriptor) throws -> R) throws -> R {
        let terminal = open("/dev/tty", O_RDWR | O_CLOEXEC)
        guard terminal >= 0 else {
            throw ProtectedStoreError(.invalidArgument, problem: "no terminal to ask for \(what)", remedy: remedy)
        }
        let tty = FileDescriptor(rawValue: terminal)
        defer { try? tty.close() }
        var saved = termios()
        let canHideEcho = tcgetattr(terminal, &saved) == 0
        if canHideEcho {
            var silent = saved
            silent.c_lflag &= ~tcflag_t(ECHO)
            EchoGuard.arm(terminal: terminal, saved: saved)
            tcsetattr(terminal, TCSAFLUSH, &silent)
        }
        defer {
            if canHideEcho {
                tcsetattr(terminal, TCSAFLUSH, &saved)
                EchoGuard.disarm()
            }
            _ = try? tty.writeAll(Array("\n".utf8))
        }
        _ = try? tty.writeAll(Array(prompt.utf8))
        return try read(tty)
    }

    /// Asks for a new passcode; on a terminal it is asked twice and both entries must match.
    static func readNew(fromStandardInput: Bool) throws -> Passcode {
        let first = try read(prompt: "New passcode: ", fromStandardInput: fromStandardInput)
        if fromStandardInput { return first }
        let second = try read(prompt: "Repeat the passcode: ", fromStandardInput: false)
        guard try first.matches(second) else {
            throw ProtectedStoreError(.invalidArgument, problem: "the two passcodes differ", remedy: "Run the command again and type the same passcode twice")
        }
        return first
    }
}

/// Restores terminal echo if the user interrupts the prompt (Ctrl-C, SIGTERM), then exits as the signal would.
private enum EchoGuard {
    nonisolated(unsafe) static var terminal: Int32 = -1
    nonisolated(unsafe) static var saved = termios()

    static func arm(terminal: Int32, saved: termios) {
        Self.terminal = terminal
        Self.saved = saved
        for signalNumber in [SIGINT, SIGTERM, SIGHUP] {
            signal(signalNumber) { received in
                if EchoGuard.terminal >= 0 { tcsetattr(EchoGuard.terminal, TCSANOW, &EchoGuard.saved) }
                _exit(128 + received)
            }
        }
    }

    static func disarm() {
        for signalNumber in [SIGINT, SIGTERM, SIGHUP] { signal(signalNumber, SIG_DFL) }
        terminal = -1
    }
}
