import Foundation

/// `$XDG_CONFIG_HOME` (default `~/.config`), where the user's configuration files and systemd user units live.
var configHome: String {
    ProcessInfo.processInfo.environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
        ?? (NSHomeDirectory() as NSString).appendingPathComponent(".config")
}
