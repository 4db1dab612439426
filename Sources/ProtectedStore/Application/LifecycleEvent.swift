/// A launched app's lifecycle events (`sandboxctl launch`, `suspend`, `resume`, `terminate`), named after
/// `UIApplicationDelegate`'s methods.
public enum LifecycleEvent: String, Sendable, CaseIterable, CustomStringConvertible {
    /// Sent before the app is suspended; it has the suspension's background time to save its state and return.
    case didEnterBackground
    /// Sent when a suspended app resumes, before the protection events it missed.
    case willEnterForeground
    /// Sent before the app is ended.
    case willTerminate

    public var description: String { rawValue }
}
