extension Optional {
    /// Returns the value and leaves nil behind.
    mutating func take() -> Wrapped? {
        defer { self = nil }
        return self
    }
}
