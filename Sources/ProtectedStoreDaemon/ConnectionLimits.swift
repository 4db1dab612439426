import Foundation

/// The daemon's budget of connections, which keeps room for the owner's `lock`, `unlock` and `status` whatever a
/// program of the same uid opens (docs/PROTOCOL.md §1): idle connections are culled oldest first beyond a few per uid,
/// subscribers stop well below the descriptor limit, and an app's socket gets a few connections and a few accepts
/// per poll.
struct ConnectionLimits {
    /// Idle connections (nothing subscribed, running or to send) one uid may hold beyond the recent ones.
    static let maximumIdlePerUID = 32
    /// A connection that connected or was answered this recently is not culled for idleness: its next request is on
    /// its way. A flood holds at most its rate times this, which the descriptors kept free absorb.
    static let recentlyActive: Duration = .seconds(1)
    /// Connections one launched app may hold on its own socket.
    static let maximumConnectionsPerApp = 8
    /// Connections taken from one app's socket per poll: a flood there can't crowd out the owner's socket.
    static let appAcceptsPerPoll = 8
    /// Descriptors kept free of subscribers, for idle and in-flight connections, apps and files.
    static let descriptorsKeptFree = 1024

    /// Descriptors never used for connections: libdispatch aborts the process when it can't open /proc, and the
    /// daemon opens files (the keybag, the attempt counter, logs).
    static let descriptorsForTheProcess = 64

    /// The soft limit on descriptors in force.
    let descriptors: Int

    /// Connections open at once, all sockets together; at this many, the least recently active idle one is closed
    /// for the next, as when descriptors run out.
    var maximumConnections: Int { max(16, descriptors - Self.descriptorsForTheProcess) }

    /// Subscriptions the daemon takes from all of the owner's connections together; beyond, `subscribe` is refused
    /// with `busy` and the connection still serves requests.
    var maximumSubscribers: Int {
        descriptors >= 2 * Self.descriptorsKeptFree ? descriptors - Self.descriptorsKeptFree : descriptors / 2
    }

    /// Raises the soft limit on open descriptors to the hard one (systemd starts services at 1024 of 524288, and the
    /// shipped unit asks for 65536): one descriptor per connection.
    static func raisingDescriptorLimit() -> ConnectionLimits {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return ConnectionLimits(descriptors: Int(clamping: min(limit.rlim_cur, rlim_t(Int32.max))))
    }
}
