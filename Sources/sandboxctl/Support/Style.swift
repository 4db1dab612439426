import Foundation

/// ANSI colours on a terminal only, so piped output stays plain.
struct Style {
    let enabled: Bool

    static let standardOutput = Style(enabled: isatty(STDOUT_FILENO) == 1)

    func heading(_ text: String) -> String { enabled ? "\u{1B}[1m\(text)\u{1B}[0m" : text }
    func good(_ text: String) -> String { enabled ? "\u{1B}[32m\(text)\u{1B}[0m" : text }
    func bad(_ text: String) -> String { enabled ? "\u{1B}[31m\(text)\u{1B}[0m" : text }
    func dim(_ text: String) -> String { enabled ? "\u{1B}[2m\(text)\u{1B}[0m" : text }
}
