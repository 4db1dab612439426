import Logging

/// Logs a repeated kind of trouble (refused peers, bad frames, idle connections closed) as at most two lines a second:
/// the first occurrence in full, then how many more came. Whoever can connect can make trouble as fast as the daemon
/// accepts, and one line each would let them fill the disk through the log.
struct LogTally {
    static let interval: Duration = .seconds(1)

    private var more: [String: Int] = [:]
    private var intervalEnd: ContinuousClock.Instant?

    /// When `flush` has something to say; nil while nothing is counted.
    var nextFlush: ContinuousClock.Instant? { more.isEmpty ? nil : intervalEnd }

    /// Logs `detail` if it is the first of its `kind` in this interval, else counts it.
    mutating func note(_ kind: String, now: ContinuousClock.Instant, logger: Logger, _ detail: @autoclosure () -> Logger.Message) {
        if intervalEnd == nil { intervalEnd = now + Self.interval }
        if let count = more[kind] {
            more[kind] = count + 1
        } else {
            more[kind] = 0
            logger.notice(detail())
        }
    }

    /// Once the interval is over, logs the counts ("N more connections closed for bad frames") and starts a new one.
    mutating func flush(now: ContinuousClock.Instant, logger: Logger) {
        guard let end = intervalEnd, end <= now else { return }
        for (kind, count) in more.sorted(by: { $0.key < $1.key }) where count > 0 {
            logger.notice("\(count) more \(kind) in the last \(Self.interval)")
        }
        more = [:]
        intervalEnd = nil
    }
}
