import Foundation

/// A launched app's place among the seeds' states, and the moves between them the daemon makes (docs/DESIGN.md, "The
/// app lifecycle"): the one record of it, so a suspension scheduled by one entry into the background is never carried
/// out after a resume, a later entry or an ending. The testing kit's `TestApplication` moves by the same rules.
package struct AppLifecycle: Sendable {
    /// The states a running app is in; "not running" is no record at all.
    package enum State: String, Sendable {
        /// In the foreground, not taking events: its launch in progress, or an interruption.
        case inactive
        /// In the foreground.
        case active
        /// *did enter background* sent: the app runs for its background time, then is suspended.
        case background
        /// Frozen: no process of it runs; it is sent nothing.
        case suspended
    }

    package private(set) var state = State.inactive
    /// When the app entered `state`.
    package private(set) var since = Date()
    /// In the background: when its background time ends (background tasks move it later).
    package var backgroundDeadline: Date?
    /// Entries into the background so far: names the suspension each one schedules.
    private(set) var backgroundEntries = 0
    /// *will terminate* was sent, or the app is being ended: no suspension follows.
    package private(set) var ending = false

    package init() {}

    /// Seconds of background time left, in the background.
    package var backgroundTimeRemaining: Double? {
        guard state == .background, let backgroundDeadline else { return nil }
        return max(0, backgroundDeadline.timeIntervalSinceNow)
    }

    /// Whether a background task may begin: not once the app is suspended or ending, nor after its background time.
    package var mayBeginBackgroundTask: Bool {
        !ending && state != .suspended && !(state == .background && (backgroundDeadline.map { $0 <= Date() } ?? false))
    }

    /// To the background from the foreground; returns the entry its suspension must name and whether it was active
    /// (so *will resign active* goes first), nil if not in the foreground.
    package mutating func enterBackground() -> (entry: Int, wasActive: Bool)? {
        guard state == .active || state == .inactive, !ending else { return nil }
        let wasActive = state == .active
        move(to: .background)
        backgroundEntries += 1
        return (backgroundEntries, wasActive)
    }

    /// Active once its launch finished, unless it was sent to the background or ended meanwhile.
    package mutating func finishLaunching() -> Bool {
        guard state == .inactive, !ending else { return false }
        move(to: .active)
        return true
    }

    /// An interruption: active to inactive, or back; false when the app is not in the state to leave.
    package mutating func interrupt(ending interruption: Bool) -> Bool {
        guard state == (interruption ? .inactive : .active), !ending else { return false }
        move(to: interruption ? .active : .inactive)
        return true
    }

    /// Whether the suspension scheduled by entry `entry` is still due: nothing brought the app back or ended it since.
    package func isSuspensionDue(_ entry: Int) -> Bool { state == .background && backgroundEntries == entry && !ending }

    package mutating func suspend() { move(to: .suspended) }

    /// Back to the foreground from the background (which cancels the suspension) or from a suspension.
    package mutating func enterForeground() { move(to: .active) }

    package mutating func end() { ending = true }

    private mutating func move(to next: State) {
        state = next
        since = Date()
    }
}
