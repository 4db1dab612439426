import ArgumentParser
import Foundation
import ProtectedStore
import ProtectedStoreTesting

/// One load-test client: attaches to the daemon and does random operations on its own folder, keeping a model of what
/// each file must hold; prints a JSON report (counts, refusals, violations, the model) as its last line.
struct LoadClientCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "load-client", abstract: "Internal: one client process of `ps-verify load`.", shouldDisplay: false)

    @Option(help: "Device root (a daemon must serve it).") var root: String
    @Option(help: "Client number (names its folder).") var client: Int
    @Option(help: "Operations to do.") var operations: Int
    @Option(help: "Seed of the choices and contents.") var seed: UInt64

    static func folder(_ client: Int) -> String { "Documents/load-\(client)" }
    static let names = (0..<12).map { "f\($0).bin" }
    static let classes: [Data.WritingOptions] = [.completeFileProtection, .completeFileProtectionUnlessOpen,
                                                  .completeFileProtectionUntilFirstUserAuthentication, .noFileProtection]
    static let protections: [FileProtectionType] = [.complete, .completeUnlessOpen, .completeUntilFirstUserAuthentication, .none]

    /// What a file must hold, as the pieces written to it in order.
    static func content(of segments: [Segment]) -> Data {
        segments.reduce(into: Data()) { $0.append(generatedContent(seed: $1.seed, size: $1.size)) }
    }

    func run() throws {
        _ = readLine()
        let device = try Device.attach(root: root, notificationCenter: NotificationCenter())
        let container = try device.container(bundleIdentifier: ScratchDevice.bundleIdentifier)
        let folder = Self.folder(client)
        var random = SplitMix64(seed: seed)
        var report = LoadClientReport()
        for _ in 0..<operations {
            let existing = report.files.keys.sorted()
            var roll = existing.isEmpty ? 0 : Int.random(in: 0..<100, using: &random)
            let free = Self.names.filter { report.files[$0] == nil }.randomElement(using: &random)
            if (70..<80).contains(roll) && free == nil { roll = 85 }  // every name taken: delete instead of move
            let name = roll < 30 ? Self.names.randomElement(using: &random)! : existing.randomElement(using: &random)!
            let path = "\(folder)/\(name)"
            let piece = Segment(seed: random.next(), size: Int.random(in: 0...16_384, using: &random))
            let operation: String
            do {
                switch roll {
                case ..<30:
                    operation = "write"
                    let option = Self.classes.randomElement(using: &random)!
                    try attempt(operation, &report) { try container.write(generatedContent(seed: piece.seed, size: piece.size), toPath: path, options: option) }
                    if report.lastSucceeded { report.files[name] = [piece] }
                case ..<60:
                    operation = "read"
                    let expected = Self.content(of: report.files[name]!)
                    var read = Data()
                    try attempt(operation, &report) { read = try container.contents(atPath: path) }
                    if report.lastSucceeded && read != expected { report.violations.append("read of \(name) returned \(read.count) bytes that differ from what was written") }
                case ..<70:
                    operation = "append"
                    try attempt(operation, &report) {
                        let handle = try container.fileHandle(forUpdatingAtPath: path)
                        defer { try? handle.close() }
                        try handle.write(contentsOf: generatedContent(seed: piece.seed, size: piece.size), atOffset: handle.size)
                    }
                    if report.lastSucceeded { report.files[name]!.append(piece) }
                case ..<80:
                    operation = "move"
                    let free = free!
                    try attempt(operation, &report) { try container.moveItem(atPath: path, toPath: "\(folder)/\(free)") }
                    if report.lastSucceeded { report.files[free] = report.files.removeValue(forKey: name) }
                case ..<90:
                    operation = "delete"
                    try attempt(operation, &report) { try container.removeItem(atPath: path) }
                    if report.lastSucceeded { report.files[name] = nil }
                case ..<95:
                    operation = "list"
                    var listed: [String] = []
                    try attempt(operation, &report) { listed = try container.contentsOfDirectory(atPath: folder).map(\.name) }
                    if report.lastSucceeded && Set(listed) != Set(report.files.keys) {
                        report.violations.append("the listing \(listed.sorted()) differs from the files written \(report.files.keys.sorted())")
                    }
                default:
                    operation = "protection"
                    let protection = Self.protections.randomElement(using: &random)!
                    try attempt(operation, &report) { try container.setProtection(protection, ofItemAtPath: path) }
                }
            }
        }
        device.powerOff()
        emitLine(String(decoding: try JSONEncoder().encode(report), as: UTF8.self))
    }

    /// Runs one operation: a data-protection refusal is counted, any other error is a violation.
    private func attempt(_ operation: String, _ report: inout LoadClientReport, _ body: () throws -> Void) throws {
        do {
            try body()
            report.succeeded += 1
            report.lastSucceeded = true
        } catch let error as CocoaError where error.isProtectedDataUnavailable {
            report.refusals["\(operation): \(error.breakdownLabel)", default: 0] += 1
            report.lastSucceeded = false
        } catch {
            report.violations.append("\(operation) failed with something other than data protection: \(error)")
            report.lastSucceeded = false
        }
    }
}

/// A piece of a file's content: `size` bytes generated from `seed`.
struct Segment: Codable, Equatable {
    var seed: UInt64
    var size: Int
}

/// What a client reports when done.
struct LoadClientReport: Codable {
    var succeeded = 0
    var refusals: [String: Int] = [:]
    var violations: [String] = []
    /// Its files and what each must hold.
    var files: [String: [Segment]] = [:]
    var lastSucceeded = false
}
