extension StringProtocol {
    /// The parts between "/" bytes, as the kernel splits a path. Swift's own `split(separator: "/")` works on
    /// Characters, and a "/" followed by a combining mark is one Character, so it would not split there (found by
    /// the names fuzzer).
    package func splitAtSlashes(omittingEmpty: Bool = false) -> [String] {
        utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: omittingEmpty).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Whether a "/" byte occurs anywhere (see `splitAtSlashes`).
    package var containsSlash: Bool { utf8.contains(UInt8(ascii: "/")) }
    /// Whether the first byte is "/": an absolute path.
    package var startsWithSlash: Bool { utf8.first == UInt8(ascii: "/") }
    /// Whether the last byte is "/".
    package var endsWithSlash: Bool { utf8.reversed().first == UInt8(ascii: "/") }
}
