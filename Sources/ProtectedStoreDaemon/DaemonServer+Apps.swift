import CSupport
import Dispatch
import Foundation
import ProtectedStore

// Launched apps (docs/PROTOCOL.md §6): their registration, sockets and lifecycle requests, on the loop thread.
extension DaemonServer {

    /// An app registered by its launcher: its own listening socket, its state, and its processes, which its freezer
    /// suspends and ends.
    /// Touched on the loop thread only (a timer posts back to it through `execute`).
    final class LaunchedApp: @unchecked Sendable {
        let bundle: String
        let sandboxPID: Int32
        /// The uid the sandbox runs as: the only one besides the owner's that its socket serves.
        let uid: uid_t
        let listener: Int32
        let socketPath: String
        /// The launcher's connection: the app is forgotten when it closes.
        let owner: UInt64
        var lifecycle = AppLifecycle()
        let freezer: AppFreezer
        /// Connections open on its socket.
        var connections = 0
        /// Open-URL events relayed before the app finished launching: the first is its launch option.
        var parkedOpenURLs: [(payload: OpenURLPayload, reply: () -> Void)] = []
        /// How long each launch event may take before the app is ended.
        let launchTimeout: TimeInterval
        /// The launch events were sent (to its first subscriber), or no observer came within the launch timeout.
        var launchStarted = false
        var launchDone = false
        /// What *will* and *did finish launching* carry: the Inbox item it is launched to open.
        var launchOptions: OpenURLPayload?
        /// The longest background time its background tasks extend to.
        let backgroundTaskTime: TimeInterval
        /// Its open background tasks, by identifier: their names.
        var backgroundTasks: [UInt64: String] = [:]
        var nextTaskID: UInt64 = 0
        /// `launch --background-on-lock`: a lock sends it to the background, as the side button does on iOS.
        let backgroundOnLock: Bool
        var sentToBackgroundByLock = false
        /// Brought to the foreground to open an item: *did become active* goes after the next open-URL event.
        var activationAwaitsURL = false
        /// A significant time change came while it was suspended: one is sent at its resume, however many came.
        var timeChangePending = false
        /// Its keychain groups besides its bundle identifier (`launch --keychain-group`).
        var keychainGroups: [String] = []
        /// Its keychain, made at its first keychain request.
        var keychain: KeychainStore?
        /// *did enter background* returned with tasks open: the suspension waits for their end (or the deadline).
        var suspensionAwaitingTasks: (entry: Int, reply: (String?) -> Void)?

        init(bundle: String, sandboxPID: Int32, uid: uid_t, listener: Int32, socketPath: String, owner: UInt64, freezer: AppFreezer,
             launchTimeout: TimeInterval, backgroundTaskTime: TimeInterval, backgroundOnLock: Bool) {
            self.freezer = freezer
            self.backgroundOnLock = backgroundOnLock
            self.backgroundTaskTime = backgroundTaskTime
            self.launchTimeout = launchTimeout
            self.bundle = bundle
            self.sandboxPID = sandboxPID
            self.uid = uid
            self.listener = listener
            self.socketPath = socketPath
            self.owner = owner
        }

        var status: AppStatus {
            var status = AppStatus(bundle: bundle, pid: sandboxPID, state: lifecycle.state.rawValue, since: lifecycle.since.timeIntervalSince1970,
                                   freezer: freezer.mechanism.rawValue)
            status.remaining = lifecycle.backgroundTimeRemaining
            return status
        }
    }

    /// An app event sent to an app's subscribers; `finish` runs once all of them acknowledged or left, or the time ran
    /// out: for a lifecycle event with whether every one returned in time, for an open-URL event whether one handled it.
    /// A launch event's observers may answer false: `refused` then.
    struct AppEventWait {
        let event: SubscriberRegistry.Event
        var remaining: Set<UInt64>
        var acknowledged = false
        var refused = false
        let finish: (_ returned: Bool, _ refused: Bool) -> Void
    }

    /// On an app's own socket: the device's state, and the app's (`apps`), so its `Application` starts in it.
    func appStatusReply(id: UInt64, bundle: String?) -> DaemonReply {
        var reply = DaemonReply(id: id)
        reply.state = device.state.rawValue
        if let app = bundle.flatMap({ apps[$0] }) { reply.apps = [app.status] }
        return reply
    }

    func appFailure(_ request: DaemonRequest, _ kind: ProtectedStoreError.Kind, _ problem: String, _ remedy: String) -> DaemonReply {
        .failure(id: request.id, ProtectedStoreError(kind, path: request.bundle, problem: problem, remedy: remedy))
    }

    func handleApp(_ operation: DaemonRequest.Operation, _ request: DaemonRequest, on connection: Connection) {
        if operation == .apps {
            var reply = DaemonReply(id: request.id)
            reply.apps = apps.values.map(\.status).sorted { $0.bundle < $1.bundle }
            return send(reply, to: connection)
        }
        // An app's own connection asks about itself only.
        guard let bundle = connection.appBundle ?? request.bundle else {
            return send(appFailure(request, .invalidArgument, "\(operation.rawValue) needs a bundle", "See docs/PROTOCOL.md"), to: connection)
        }
        if operation == .appRegister { return register(bundle, request, on: connection) }
        guard let app = apps[bundle] else {
            return send(appFailure(request, .notFound, "no app of this bundle is running", "Start it with `sandboxctl launch \(bundle) -- COMMAND`"), to: connection)
        }
        if operation == .appOpenURL {
            guard let path = request.path, let sequence = request.sequence else {
                return send(appFailure(request, .invalidArgument, "app-open-url needs the item's path and sequence", "See docs/PROTOCOL.md"), to: connection)
            }
            let connectionID = connection.id
            let payload = OpenURLPayload(path: path, sourceApplication: request.sourceApplication, annotation: request.annotation, sequence: sequence)
            return relayOpenURL(payload, to: app) { [self] in send(DaemonReply(id: request.id), toConnection: connectionID) }
        }
        if operation == .appTaskBegin || operation == .appTaskEnd { return backgroundTask(operation, request, of: app, on: connection) }
        let timeout = request.timeout ?? 5
        guard timeout >= 0, timeout <= 600, timeout.isFinite else {
            return send(appFailure(request, .invalidArgument, "time \(timeout) s is out of range", "Give 0 to 600 seconds"), to: connection)
        }
        let connectionID = connection.id
        let reply = { [self] (ended: String?) in
            var reply = DaemonReply(id: request.id)
            reply.apps = apps[bundle].map { [$0.status] } ?? []
            if let ended { reply.apps = [AppStatus(bundle: bundle, pid: app.sandboxPID, state: "ended", since: Date().timeIntervalSince1970, reason: ended)] }
            send(reply, toConnection: connectionID)
        }
        switch operation {
        case .appSuspend:
            sendToBackground(app, backgroundTime: timeout, reply: reply)
        case .appResume:
            bringToForeground(app, awaitingURL: request.awaitingURL == true)
            reply(nil)
        case .appInterrupt:
            let ending = request.end ?? false
            guard app.launchDone, app.lifecycle.interrupt(ending: ending) else { return reply(nil) }
            logger.info("\(bundle): \(ending ? "interruption ended, did-become-active" : "interrupted, will-resign-active")")
            post(ending ? .didBecomeActive : .willResignActive, to: app)
            reply(nil)
        case .appMemoryWarning:
            // A suspended app is frozen: it hears nothing (under lasting pressure iOS ends it instead).
            guard app.lifecycle.state != .suspended, !app.lifecycle.ending else { return reply(nil) }
            logger.info("\(bundle): did-receive-memory-warning")
            sendLifecycle(.didReceiveMemoryWarning, to: app, timeout: timeout) { _, _ in reply(nil) }
        case .appTimeChange:
            // As the clock set by hand (`sandboxctl time-change`): what the daemon's own watch sends on a real change.
            guard app.launchDone, !app.lifecycle.ending else { return reply(nil) }
            logger.info("\(bundle): significant time change (sandboxctl time-change)\(app.lifecycle.state == .suspended ? ", kept for its resume" : "")")
            if app.lifecycle.state == .suspended {
                app.timeChangePending = true
                return reply(nil)
            }
            sendLifecycle(.significantTimeChange, to: app, timeout: timeout) { _, _ in reply(nil) }
        case .appTerminate:
            guard !app.lifecycle.ending else { return reply(nil) }
            // A suspended app can't run to handle it: iOS ends suspended apps without notice, never thawed.
            if app.lifecycle.state == .suspended {
                endWithoutNotice(app, reason: "it was suspended: ended without notice")
                return reply("it was suspended: ended without notice")
            }
            app.lifecycle.end()
            logger.info("\(bundle): will-terminate")
            sendLifecycle(.willTerminate, to: app, timeout: timeout) { _, _ in reply(nil) }
        default:
            break
        }
    }

    /// *will resign active* (if active) and *did enter background*, then the suspension once every observer returned and
    /// every background task ended; an app that overruns its background time is ended. `reply` gets the reason then.
    func sendToBackground(_ app: LaunchedApp, backgroundTime timeout: TimeInterval, reply: @escaping (String?) -> Void) {
        let bundle = app.bundle
        guard let (entry, wasActive) = app.lifecycle.enterBackground() else { return reply(nil) }
        logger.info("\(bundle): did-enter-background; suspended once it returns, or ended if it has not within \(timeout) s")
        if wasActive { post(.willResignActive, to: app) }
        let entered = Date()
        app.lifecycle.backgroundDeadline = entered.addingTimeInterval(timeout)
        sendLifecycle(.didEnterBackground, to: app, timeout: timeout) { [self] allReturned, _ in
            // Brought back to the foreground, or ended, during its background time: no suspension.
            guard apps[bundle] === app, app.lifecycle.isSuspensionDue(entry) else { return reply(nil) }
            guard allReturned else {
                // As iOS ends an app that overruns its background time: never frozen in the middle of its work.
                let reason = "it did not return from did-enter-background within its background time (\(timeout) s)"
                endWithoutNotice(app, reason: reason)
                return reply(reason)
            }
            guard !app.backgroundTasks.isEmpty else { return suspend(app) { reply(nil) } }
            awaitBackgroundTasks(of: app, entry: entry, deadline: entered.addingTimeInterval(max(timeout, app.backgroundTaskTime)), reply: reply)
        }
    }

    /// Back from the background or a suspension: *will enter foreground*, then (the registry orders it) the protection
    /// events it missed, open-URL events, *did become active*; with `awaitingURL` that last one waits for the item's
    /// open-URL event.
    func bringToForeground(_ app: LaunchedApp, awaitingURL: Bool) {
        switch app.lifecycle.state {
        case .active, .inactive: return
        case .background: logger.info("\(app.bundle): back during its background time, its suspension cancelled: will-enter-foreground")
        case .suspended:
            app.freezer.thaw()
            logger.info("\(app.bundle): resumed, will-enter-foreground")
        }
        app.lifecycle.enterForeground()
        let ids = subscribers(of: app.bundle)
        for id in ids { registry.setSuspended(id, false) }
        for delivery in registry.send(.willEnterForeground, to: ids) { sendEvent(delivery) }
        if app.timeChangePending {
            app.timeChangePending = false
            post(.significantTimeChange, to: app)
        }
        guard awaitingURL else { return post(.didBecomeActive, to: app) }
        app.activationAwaitsURL = true
        DispatchQueue.global().asyncAfter(deadline: .now() + 5) { [weak self] in
            self?.execute { self?.activateAfterURL(app) }
        }
    }

    /// The clock was set, or local midnight or a daylight-saving transition came: *significant time change* to every
    /// app that runs; a suspended one gets one at its resume, however many came meanwhile, as iOS coalesces them.
    func significantTimeChange(_ reason: TimeChangeWatch.Reason) {
        logger.info("significant time change (\(reason.rawValue)) to \(apps.count) app(s)")
        for app in apps.values where app.launchDone && !app.lifecycle.ending {
            if app.lifecycle.state == .suspended {
                app.timeChangePending = true
            } else {
                post(.significantTimeChange, to: app)
            }
        }
    }

    /// `launch --background-on-lock`, iOS's side button: a lock sends such an app to the background (its default
    /// background time), the unlock brings back the ones it sent. Called before the lock's protection event goes out,
    /// so *will resign active* comes first.
    func moveAppsWithLock(_ event: ProtectedDataEvent) {
        for app in apps.values where app.backgroundOnLock && app.launchDone {
            if event == .willBecomeUnavailable, app.lifecycle.state == .active || app.lifecycle.state == .inactive {
                app.sentToBackgroundByLock = true
                sendToBackground(app, backgroundTime: 5) { _ in }
            } else if event == .didBecomeAvailable, app.sentToBackgroundByLock {
                app.sentToBackgroundByLock = false
                bringToForeground(app, awaitingURL: false)
            }
        }
    }

    /// Background tasks open when *did enter background* returned extend the background time to `deadline`: the
    /// suspension follows their end; a few seconds before the deadline their expiration handlers run
    /// (*background time will expire*); an app whose tasks are still open at the deadline is ended, as iOS ends it.
    func awaitBackgroundTasks(of app: LaunchedApp, entry: Int, deadline: Date, reply: @escaping (String?) -> Void) {
        app.lifecycle.backgroundDeadline = deadline
        app.suspensionAwaitingTasks = (entry, reply)
        logger.info("\(app.bundle): background tasks open (\(app.backgroundTasks.values.sorted().joined(separator: ", "))): suspended when they end, by \(deadline)")
        let left = deadline.timeIntervalSinceNow
        let warning = min(3, left / 2)
        DispatchQueue.global().asyncAfter(deadline: .now() + max(0, left - warning)) { [weak self] in
            self?.execute {
                guard let self, self.apps[app.bundle] === app, app.lifecycle.isSuspensionDue(entry), !app.backgroundTasks.isEmpty else { return }
                self.post(.backgroundTimeWillExpire, to: app)
            }
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + max(0, left)) { [weak self] in
            self?.execute {
                guard let self, self.apps[app.bundle] === app, app.lifecycle.isSuspensionDue(entry), !app.backgroundTasks.isEmpty,
                      let waiting = app.suspensionAwaitingTasks else { return }
                app.suspensionAwaitingTasks = nil
                let reason = "its background tasks (\(app.backgroundTasks.values.sorted().joined(separator: ", "))) were not ended within its background time"
                    + " (\(Int(app.backgroundTaskTime)) s at most)"
                self.endWithoutNotice(app, reason: reason)
                waiting.reply(reason)
            }
        }
    }

    /// `app-task-begin` and `app-task-end`, from the app's own connection. None begins once the background time is over
    /// or in a suspension; ending the last one lets a waiting suspension happen.
    func backgroundTask(_ operation: DaemonRequest.Operation, _ request: DaemonRequest, of app: LaunchedApp, on connection: Connection) {
        var reply = DaemonReply(id: request.id)
        if operation == .appTaskBegin {
            // Bounded: an app can't grow the daemon's memory with tasks it never ends.
            guard app.backgroundTasks.count < 1_024 else {
                return send(appFailure(request, .invalidArgument, "1,024 background tasks are open already", "End the tasks you began"), to: connection)
            }
            var status = app.status
            if app.lifecycle.mayBeginBackgroundTask {
                app.nextTaskID += 1
                app.backgroundTasks[app.nextTaskID] = String((request.taskName ?? "unnamed").prefix(100))
                status.task = app.nextTaskID
            } else {
                status.task = 0
            }
            reply.apps = [status]
            return send(reply, to: connection)
        }
        if let task = request.task { app.backgroundTasks[task] = nil }
        reply.apps = [app.status]
        send(reply, to: connection)
        if app.backgroundTasks.isEmpty, let waiting = app.suspensionAwaitingTasks, app.lifecycle.isSuspensionDue(waiting.entry) {
            app.suspensionAwaitingTasks = nil
            suspend(app) { waiting.reply(nil) }
        }
    }

    /// Freezes the app after its background time: its subscribers are sent nothing more and no lock waits for them.
    /// `done` runs on the loop once the kernel reports every process frozen.
    func suspend(_ app: LaunchedApp, then done: @escaping () -> Void) {
        for id in subscribers(of: app.bundle) { registry.setSuspended(id, true) }
        completeLockIfAcknowledged()
        app.lifecycle.suspend()
        app.freezer.freeze()
        logger.info("\(app.bundle): suspended (\(app.freezer.mechanism == .cgroup ? "its cgroup frozen" : "SIGSTOP"))")
        let freezer = app.freezer
        // Runs on the loop thread only (through `execute`, or once the loop has ended).
        nonisolated(unsafe) let done = done
        DispatchQueue.global().async { [self] in
            freezer.waitUntilFrozen()
            if !execute(done) { done() }
        }
    }

    /// Kills every process of the app at once, as iOS ends an app: its launcher sees it exit and unmounts.
    func endWithoutNotice(_ app: LaunchedApp, reason: String) {
        app.lifecycle.end()
        logger.warning("\(app.bundle): ended without notice: \(reason)")
        app.freezer.kill()
    }

    func register(_ bundle: String, _ request: DaemonRequest, on connection: Connection) {
        guard connection.appBundle == nil else { return }
        guard let pid = request.pid, pid > 1, let socketPath = request.socketPath, socketPath.hasPrefix("/") else {
            return send(appFailure(request, .invalidArgument, "app-register needs the sandbox's pid and an absolute socket path", "See docs/PROTOCOL.md"), to: connection)
        }
        if let time = request.backgroundTaskTime, !(time >= 0 && time <= 600) {
            return send(appFailure(request, .invalidArgument, "background task time \(time) s is out of range", "Give 0 to 600 seconds"), to: connection)
        }
        if let timeout = request.timeout, !(timeout > 0 && timeout <= 600) {
            return send(appFailure(request, .invalidArgument, "launch timeout \(timeout) s is out of range", "Give more than 0 and at most 600 seconds"), to: connection)
        }
        let keychainGroups = request.keychainGroups ?? []
        if keychainGroups.count > 32 || keychainGroups.contains(where: { $0.isEmpty || $0.utf8.count > 1024 }) {
            return send(appFailure(request, .invalidArgument, "keychain groups must be 1 to 1024 bytes each, at most 32 of them", "Give fewer or shorter --keychain-group values"), to: connection)
        }
        guard apps[bundle] == nil else {
            return send(appFailure(request, .alreadyExists, "the app is already running (pid \(apps[bundle]!.sandboxPID))", "End it first with `sandboxctl terminate \(bundle)`"), to: connection)
        }
        do {
            _ = try device.container(bundleIdentifier: bundle)
        } catch {
            return send(.failure(id: request.id, Self.libraryError(error)), to: connection)
        }
        // The pid must be a sandbox the registering launcher started: in a PID namespace of its own (else a suspend
        // would stop every process of this one, the daemon included) and a descendant of the launcher.
        guard AppProcesses.isSandbox(pid, startedBy: connection.pid) else {
            return send(appFailure(request, .invalidArgument, "pid \(pid) is not a sandbox started by the registering process (pid \(connection.pid))",
                                   "Register the first process of a bubblewrap sandbox your launcher started"), to: connection)
        }
        // Only root may start a sandbox under another uid: a user's app runs as that user.
        let sandboxUID = request.uid ?? connection.uid
        guard sandboxUID == connection.uid || connection.uid == 0 else {
            return send(appFailure(request, .invalidArgument, "uid \(connection.uid) may not register a sandbox running as uid \(sandboxUID)",
                                   "Register the app under your own uid"), to: connection)
        }
        // The socket goes in a folder of the launcher's user (or the sandbox's) that only it can enter; the daemon
        // (maybe root) does no other path operation there than replacing a socket a killed daemon left, and changes no
        // mode: the folder's protects it.
        let folder = (socketPath as NSString).deletingLastPathComponent
        var folderInfo = stat(), existing = stat()
        guard lstat(folder, &folderInfo) == 0, folderInfo.st_mode & S_IFMT == S_IFDIR, [connection.uid, sandboxUID].contains(folderInfo.st_uid),
              folderInfo.st_mode & 0o077 == 0 else {
            return send(appFailure(request, .invalidArgument, "the socket's folder \(folder) is not a directory of uid \(sandboxUID) that only it can enter (mode 0700)",
                                   "Give a socket path in a private folder of yours"), to: connection)
        }
        if lstat(socketPath, &existing) == 0 {
            guard existing.st_mode & S_IFMT == S_IFSOCK else {
                return send(appFailure(request, .alreadyExists, "\(socketPath) exists and is not a socket", "Remove it, or give another path"), to: connection)
            }
            unlink(socketPath)
        }
        let listener = ps_unix_listen(socketPath, 64)
        guard listener >= 0 else {
            return send(appFailure(request, .io, "cannot listen on \(socketPath) (\(String(cString: strerror(errno))))", "Check the launcher's runtime folder"), to: connection)
        }
        // Connecting needs write access to the socket: the sandbox's uid gets it when it is not ours.
        if sandboxUID != geteuid(), lchown(socketPath, sandboxUID, gid_t.max) != 0 {
            let reason = String(cString: strerror(errno))
            Glibc.close(listener)
            unlink(socketPath)
            return send(appFailure(request, .permissionDenied, "cannot give the app's socket \(socketPath) to uid \(sandboxUID) (\(reason))",
                                   "Run the daemon as root, or launch the app as the device's owner"), to: connection)
        }
        // Registered means running. A sandbox whose daemon died while it was suspended would otherwise stay stopped;
        // moved out of its old frozen cgroup into the new one, it runs again.
        let freezer = AppFreezer.make(bundle: bundle, sandboxPID: pid)
        if freezer.mechanism == .signals { AppProcesses.signal(SIGCONT, inSandboxOf: pid) }
        let launchTimeout = request.timeout ?? 20
        let app = LaunchedApp(bundle: bundle, sandboxPID: pid, uid: sandboxUID, listener: listener, socketPath: socketPath, owner: connection.id,
                              freezer: freezer, launchTimeout: launchTimeout, backgroundTaskTime: request.backgroundTaskTime ?? 30,
                              backgroundOnLock: request.backgroundOnLock ?? false)
        app.keychainGroups = keychainGroups
        apps[bundle] = app
        logger.info("\(bundle): launched (sandbox pid \(pid)), its socket \(socketPath)")
        if request.launched == true {
            // It launched under an earlier daemon: no launch events again.
            launchWithoutObservers(app)
        } else {
            DispatchQueue.global().asyncAfter(deadline: .now() + launchTimeout) { [weak self] in
                self?.execute { self?.launchWithoutObservers(app) }
            }
        }
        if let cgroup = freezer.cgroup {
            logger.info("\(bundle): suspended through its cgroup \(cgroup)")
        } else {
            logger.warning("\(bundle): suspended with SIGSTOP, which the app can see: \(freezer.fallbackReason ?? "")")
        }
        var reply = DaemonReply(id: request.id)
        reply.apps = [apps[bundle]!.status]
        send(reply, to: connection)
    }

    /// The launcher is gone: the app's socket and connections go too, and a stopped app is let go on.
    func forget(_ app: LaunchedApp) {
        guard apps[app.bundle] === app else { return }
        apps[app.bundle] = nil
        Glibc.close(app.listener)
        unlink(app.socketPath)
        if app.lifecycle.state == .suspended { app.freezer.thaw() }
        app.freezer.remove()
        // Their launcher is gone with its connection: nobody waits for these replies.
        app.parkedOpenURLs = []
        for connection in Array(connections.values) where connection.appBundle == app.bundle { close(connection, reason: nil) }
        logger.info("\(app.bundle): ended")
    }

    func subscribers(of bundle: String) -> [UInt64] {
        connections.values.filter { $0.appBundle == bundle && $0.subscribed }.map(\.id)
    }

    /// Sends `event` to the app's subscribers without waiting for them.
    func post(_ event: LifecycleEvent, to app: LaunchedApp) {
        for delivery in registry.send(event, to: subscribers(of: app.bundle)) { sendEvent(delivery) }
    }

    /// Sends `event` to the app's subscribers and calls `finish` once each acknowledged or left (true), or after
    /// `timeout` (false), with whether one refused it (a launch event answered false).
    func sendLifecycle(_ event: LifecycleEvent, to app: LaunchedApp, timeout: TimeInterval, finish: @escaping (Bool, Bool) -> Void) {
        let ids = subscribers(of: app.bundle)
        guard !ids.isEmpty else { return finish(true, false) }
        let waitID = wait(for: .lifecycle(event), from: ids, finish: finish)
        for delivery in registry.send(event, to: ids) { sendEvent(delivery) }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout) { [weak self] in
            self?.execute { self?.finishWait(waitID) }
        }
    }

    /// Sends an Inbox item's open-URL event to the app's subscribers and replies once one of them handled it. With
    /// none yet, or if all leave without acknowledging, it waits for the next one: an open-URL event is never lost,
    /// and the launcher records it delivered only after the reply.
    func relayOpenURL(_ payload: OpenURLPayload, to app: LaunchedApp, reply: @escaping () -> Void) {
        let ids = subscribers(of: app.bundle)
        guard !ids.isEmpty, app.launchDone else { return app.parkedOpenURLs.append((payload, reply)) }
        _ = wait(for: .openURL(payload), from: ids) { [self] acknowledged, _ in
            guard !acknowledged else { return reply() }
            if apps[app.bundle] === app { relayOpenURL(payload, to: app, reply: reply) }
        }
        for delivery in registry.send(payload, to: ids) { sendEvent(delivery) }
        activateAfterURL(app)
    }

    /// The *did become active* an item's opening held back, after its open-URL event (or after 5 s without one).
    func activateAfterURL(_ app: LaunchedApp) {
        guard apps[app.bundle] === app, app.activationAwaitsURL else { return }
        app.activationAwaitsURL = false
        if app.lifecycle.state == .active { post(.didBecomeActive, to: app) }
    }

    /// A subscriber on the app's socket: the first one starts the launch events; later ones get the parked open-URL
    /// events (if it subscribed again after losing its connection).
    func appSubscribed(_ app: LaunchedApp) {
        guard app.launchStarted else { return launch(app) }
        if app.launchDone { relayParkedOpenURLs(of: app) }
    }

    /// *will finish launching* and *did finish launching* with the launch options (the first Inbox item waiting), each
    /// within the launch timeout or the app is ended; an answer of false drops that item's open-URL event (recorded
    /// delivered: the app declined it, as the seeds' rule says); then the waiting open-URL events and *did become
    /// active*.
    func launch(_ app: LaunchedApp) {
        app.launchStarted = true
        let options = app.parkedOpenURLs.first?.payload
        app.launchOptions = options
        logger.info("\(app.bundle): will-finish-launching\(options.map { " to open \($0.path)" } ?? "")")
        sendLifecycle(.willFinishLaunching, to: app, timeout: app.launchTimeout) { [self] returned, refusedFirst in
            guard apps[app.bundle] === app else { return }
            guard returned else { return endWithoutNotice(app, reason: "it did not finish launching within \(app.launchTimeout) s (will-finish-launching)") }
            sendLifecycle(.didFinishLaunching, to: app, timeout: app.launchTimeout) { [self] returned, refusedSecond in
                guard apps[app.bundle] === app else { return }
                guard returned else { return endWithoutNotice(app, reason: "it did not finish launching within \(app.launchTimeout) s (did-finish-launching)") }
                app.launchOptions = nil
                app.launchDone = true
                if let options, refusedFirst || refusedSecond, app.parkedOpenURLs.first?.payload == options {
                    logger.info("\(app.bundle): declined to open \(options.path) at its launch")
                    app.parkedOpenURLs.removeFirst().reply()
                }
                relayParkedOpenURLs(of: app)
                if app.lifecycle.finishLaunching() { post(.didBecomeActive, to: app) }
            }
        }
    }

    /// A program that attaches no observer within its launch timeout gets no launch events: it is active from then.
    func launchWithoutObservers(_ app: LaunchedApp) {
        guard apps[app.bundle] === app, !app.launchStarted else { return }
        app.launchStarted = true
        app.launchDone = true
        _ = app.lifecycle.finishLaunching()
        if !app.lifecycle.ending { logger.info("\(app.bundle): active without launch events (no observer within \(app.launchTimeout) s, or launched under an earlier daemon)") }
        relayParkedOpenURLs(of: app)
    }

    func relayParkedOpenURLs(of app: LaunchedApp) {
        let parked = app.parkedOpenURLs
        app.parkedOpenURLs = []
        for (payload, reply) in parked { relayOpenURL(payload, to: app, reply: reply) }
    }

    func wait(for event: SubscriberRegistry.Event, from ids: [UInt64], finish: @escaping (Bool, Bool) -> Void) -> UInt64 {
        nextWaitID += 1
        appEventWaits[nextWaitID] = AppEventWait(event: event, remaining: Set(ids), finish: finish)
        return nextWaitID
    }

    func appEventAcknowledged(_ event: SubscriberRegistry.Event, by subscriber: UInt64, accepted: Bool) {
        for (id, var wait) in appEventWaits where wait.event == event && wait.remaining.remove(subscriber) != nil {
            wait.acknowledged = true
            if !accepted { wait.refused = true }
            appEventWaits[id] = wait
            // An open-URL event is handled once one observer of the app has it; a lifecycle event waits for all.
            if wait.remaining.isEmpty || !event.isLifecycle { finishWait(id) }
        }
    }

    func finishWait(_ id: UInt64) {
        guard let wait = appEventWaits.removeValue(forKey: id) else { return }
        wait.finish(wait.event.isLifecycle ? wait.remaining.isEmpty : wait.acknowledged, wait.refused)
    }
}
