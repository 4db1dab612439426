extension StringProtocol {
    /// The parts between "/" bytes, as the kernel splits a path. Swift's own `split(separator: "/")` works on
    /// Characters, and a "/" followed by a combining mark is one Character, so it would not split there (found by
    /// the names fuzzer). A loop over contiguous bytes, inlinable: every kernel path the mount serves is split here, and
    /// the standard library's generic `split`, unspecialised across modules, cost a tenth of `tar -x`'s CPU time.
    @inlinable
    package func splitAtSlashes(omittingEmpty: Bool = false) -> [String] {
        var string = String(self)
        return string.withUTF8 { bytes in
            var parts: [String] = []
            var start = 0
            for index in 0...bytes.count where index == bytes.count || bytes[index] == UInt8(ascii: "/") {
                if !(omittingEmpty && index == start) {
                    parts.append(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
                }
                start = index + 1
            }
            return parts
        }
    }

    /// Whether a "/" byte occurs anywhere (see `splitAtSlashes`).
    package var containsSlash: Bool { utf8.contains(UInt8(ascii: "/")) }
    /// Whether the first byte is "/": an absolute path.
    package var startsWithSlash: Bool { utf8.first == UInt8(ascii: "/") }
    /// Whether the last byte is "/". Through `String`, whose UTF-8 view is bidirectional: the protocol's view is only
    /// a `Collection`, whose `reversed()` copied the whole path into an array on every container call.
    package var endsWithSlash: Bool { String(self).utf8.last == UInt8(ascii: "/") }
}
