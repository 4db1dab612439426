import CSupport
import Foundation

/// What makes a *significant time change* (UIKit's `applicationSignificantTimeChange`): the clock set (a step, by a
/// user or NTP), local midnight, and a daylight-saving transition. One realtime timerfd in the daemon's poll loop,
/// cancelled by the kernel when the clock is set, armed for the next midnight or transition, whichever comes first, and
/// at most an hour ahead, so a changed time zone is taken into account within the hour.
final class TimeChangeWatch {
    enum Reason: String, Sendable {
        case clockSet = "the clock was set"
        case midnight = "local midnight"
        case daylightSaving = "a daylight-saving transition"
    }

    /// The timerfd, for poll; -1 when none could be made (the daemon then sends no time changes, and logs why).
    let descriptor: Int32
    /// What the armed expiry is; nil for the hourly look at the time zone.
    private var armedFor: Reason?

    init() {
        descriptor = ps_realtime_alarm()
        if descriptor >= 0 { arm() }
    }

    deinit { if descriptor >= 0 { close(descriptor) } }

    /// After poll said the descriptor is readable: the change, if it was one, re-armed for the next.
    func fired() -> Reason? {
        let outcome = ps_realtime_alarm_read(descriptor)
        let reason: Reason? = switch outcome {
        case 2: .clockSet
        case 1: armedFor
        default: nil
        }
        if outcome != 0 { arm() }
        return reason
    }

    private func arm() {
        // A zone changed since the last look (/etc/localtime replaced) moves midnight: read it afresh.
        NSTimeZone.resetSystemTimeZone()
        let zone = TimeZone.current
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        let now = Date()
        let midnight = calendar.date(byAdding: .day, value: 1, to: calendar.startOfDay(for: now)) ?? now.addingTimeInterval(86_400)
        var candidates: [(Date, Reason?)] = [(midnight, .midnight), (now.addingTimeInterval(3_600), nil)]
        if let transition = zone.nextDaylightSavingTimeTransition(after: now) { candidates.append((transition, .daylightSaving)) }
        let (when, reason) = candidates.min { $0.0 < $1.0 }!
        armedFor = reason
        _ = ps_realtime_alarm_set(descriptor, Int64(when.timeIntervalSince1970.rounded(.up)))
    }
}
