import Foundation
import ProtectedStore

/// `$XDG_CONFIG_HOME` (default `~/.config`), where the user's configuration files and systemd user units live.
var configHome: String {
    ProcessInfo.processInfo.environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
        ?? (NSHomeDirectory() as NSString).appendingPathComponent(".config")
}

/// The lines of the configuration file at `path`, each without its `#` comment; none when there is no such file.
/// `what` names the file in errors ("the daemon's configuration"), `shape` says what its lines hold.
func configurationLines(at path: String, what: String, shape: String) throws -> [Substring] {
    guard try FileSystem.exists(path) else { return [] }
    let text: String
    do {
        text = try String(contentsOfFile: path, encoding: .utf8)
    } catch {
        throw ProtectedStoreError(.io, path: path, problem: "cannot read \(what) (\(error.localizedDescription))",
                                  remedy: "Make it a readable UTF-8 text file of \(shape)")
    }
    return text.split(whereSeparator: \.isNewline).map { $0.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0] }
}
