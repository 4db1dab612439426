import ArgumentParser
import Foundation
import ProtectedStore

/// Prints `value` as JSON for scripts: sorted keys, ISO 8601 dates; `pretty: false` for one line (JSON lines).
func printJSON(_ value: some Encodable, pretty: Bool = true) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = pretty ? [.prettyPrinted, .sortedKeys] : [.sortedKeys]
    encoder.dateEncodingStrategy = .iso8601
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

extension ProtectionClass {
    /// Help for an option taking a class name, listing every accepted spelling.
    static func optionHelp(_ abstract: String) -> ArgumentHelp {
        ArgumentHelp("\(abstract): \(acceptedNames).", valueName: "class")
    }
}

/// After a listing has printed what it could read: names every damaged entry on standard error and exits 65, so
/// damage is never mistaken for an absent item (the listing itself shows the entry, marked).
func failIfDamaged(_ damaged: [(path: String, problem: String)]) throws {
    guard !damaged.isEmpty else { return }
    for entry in damaged { printError("\(entry.path): damaged: \(entry.problem)") }
    printError("\(damaged.count) damaged item(s): restore them from a backup, or remove them")
    throw ExitCode(ExitStatus.integrity)
}
