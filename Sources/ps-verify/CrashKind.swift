import ArgumentParser
import Foundation
import ProtectedStore

/// One kind of operation the crash harness interrupts. Version `n` of a kind is a state the worker moves to with
/// one operation; after a crash the harness accepts only version `acknowledged` (old) or `acknowledged + 1` (new).
enum CrashKind: String, CaseIterable, ExpressibleByArgument, Sendable {
    case write, overwrite, move, protection, passcode, inbox

    /// What one operation of this kind does, for the tally.
    var summary: String {
        switch self {
        case .write: "whole-file write of a new file"
        case .overwrite: "whole-file write over an existing file (0 B–300 KiB)"
        case .move: "move between Documents and Application Support"
        case .protection: "protection class change (A→B→C→D→A)"
        case .passcode: "passcode change"
        case .inbox: "Inbox delivery (locked or unlocked)"
        }
    }

    static let overwritePath = "Documents/crash-overwrite.bin"
    static let movePaths = ["Documents/crash-move.bin", "\(Container.applicationSupport(ScratchDevice.bundleIdentifier))/crash-move.bin"]
    static let protectionPath = "Documents/crash-class.bin"
    static let protectionCycle: [FileProtectionType] = [.complete, .completeUnlessOpen, .completeUntilFirstUserAuthentication, .none]
    /// Files of classes A, B and C (the ones the passcode wraps) that passcode trials read back after every change.
    static let passcodeChecks: [(path: String, option: Data.WritingOptions)] = [
        ("Documents/passcode-check-a.bin", .completeFileProtection),
        ("Documents/passcode-check-b.bin", .completeFileProtectionUnlessOpen),
        ("Documents/passcode-check-c.bin", .completeFileProtectionUntilFirstUserAuthentication),
    ]
    static let writeFolder = "Documents/crash-write"
    static let fixedContent = generatedContent(seed: 0xC0FFEE, size: 20_000)

    static func passcode(version: Int) -> String { "crash-passcode-\(version)" }

    static func writeName(trial: Int, version: Int) -> String { "t\(trial)-\(version).bin" }
    static func writeContent(trial: Int, version: Int) -> Data {
        let seed = UInt64(trial) << 32 | UInt64(version)
        return generatedContent(seed: seed, size: Int(seed.multipliedReportingOverflow(by: 2_654_435_761).partialValue % 20_000))
    }

    /// Sizes chosen to grow and shrink across block boundaries and past the parallel-encryption threshold.
    static let overwriteSizes = [0, 1, 4095, 4096, 4097, 70_000, 300_000, 12_345]
    static func overwriteContent(version: Int) -> Data {
        generatedContent(seed: 0xA11CE &+ UInt64(version), size: overwriteSizes[version % overwriteSizes.count])
    }

    static func inboxName(trial: Int, version: Int) -> String { "t\(trial)-\(version).txt" }

    /// Moves the device from version `version - 1` to `version` with one operation of this kind; `passcode` is the
    /// current one, replaced by a passcode change; Inbox sources are written to the folder `sources`.
    func perform(version next: Int, trial: Int, device: Device, container: Container, passcode: inout String, sources: String) throws {
        switch self {
        case .write:
            try container.write(Self.writeContent(trial: trial, version: next), toPath: "\(Self.writeFolder)/\(Self.writeName(trial: trial, version: next))")
        case .overwrite:
            try container.write(Self.overwriteContent(version: next), toPath: Self.overwritePath)
        case .move:
            try container.moveItem(atPath: Self.movePaths[(next - 1) % 2], toPath: Self.movePaths[next % 2])
        case .protection:
            try container.setProtection(Self.protectionCycle[next % 4], ofItemAtPath: Self.protectionPath)
        case .passcode:
            let newPasscode = Self.passcode(version: next)
            try device.changePasscode(from: try Passcode(passcode), to: try Passcode(newPasscode))
            passcode = newPasscode
        case .inbox:
            let source = "\(sources)/\(next)"
            try Self.inboxContent(trial: trial, version: next).write(to: URL(fileURLWithPath: source))
            try container.deliverToInbox(fileAtPath: source, name: Self.inboxName(trial: trial, version: next))
        }
    }
    static func inboxContent(trial: Int, version: Int) -> Data { writeContent(trial: trial, version: version) }
}
