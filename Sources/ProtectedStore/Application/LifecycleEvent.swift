/// A launched app's lifecycle events (`sandboxctl launch`, `suspend`, `resume`, `terminate`), named after
/// `UIApplicationDelegate`'s methods.
public enum LifecycleEvent: String, Sendable, CaseIterable, CustomStringConvertible {
    /// The first event of a launch, with the launch options; the app is inactive.
    case willFinishLaunching
    /// The launch is done, with the same options; *did become active* follows.
    case didFinishLaunching
    /// The app is in the foreground and active: after its launch, an interruption's end or a return to the foreground.
    case didBecomeActive
    /// The app is becoming inactive: an interruption (`sandboxctl interrupt`), or the first step to the background.
    case willResignActive
    /// Sent before the app is suspended; it has the suspension's background time to save its state and return.
    case didEnterBackground
    /// Sent when a suspended app resumes, before the protection events it missed.
    case willEnterForeground
    /// Sent before the app is ended.
    case willTerminate
    /// The system is short of memory (`sandboxctl memory-warning`): free what can be rebuilt, such as caches. Only a
    /// running app gets it; a suspended one is frozen, and under lasting pressure iOS ends it without notice instead.
    case didReceiveMemoryWarning
    /// The clock was set, or local midnight or a daylight-saving transition came: recompute what depends on the date.
    /// A suspended app gets one at its resume, however many came meanwhile.
    case significantTimeChange
    /// Not a delegate method: the background time is about to run out with background tasks still open; their
    /// expiration handlers run (`Application.beginBackgroundTask(withName:expirationHandler:)`).
    case backgroundTimeWillExpire

    public var description: String { rawValue }
}
