import Dispatch
import Foundation
import Logging
import ProtectedStoreCore

/// A container's open-URL events in this program: it hands pending Inbox items to the container's observers, one at a
/// time in delivery order, while protected data is available, and records each as delivered once handled.
///
/// Woken by the kernel (inotify on the queue directory) when any program delivers, by registration, and by the device
/// when protected data becomes available, so deliveries from other processes arrive in embedded mode too.
final class InboxReceiver: @unchecked Sendable {
    let dispatcher: EventDispatcher<OpenURLRequest, Container>
    private weak var container: Container?
    private let queue: InboxQueue
    private let drains = DispatchQueue(label: "ProtectedStore.inbox")
    private let mutex = NSLock()
    private var isWatching = false
    private var watch: DispatchSourceRead?
    /// Handled by the observers, but recording that failed (a full disk): never handed out again, recorded on the next pass.
    private var handledUnrecorded: Set<UInt64> = []
    /// Damage already logged, so each is reported once per receiver, not at every drain.
    private var reportedDamage: Set<String> = []
    private static let logger = Logger(label: "ProtectedStore.inbox")

    init(container: Container) {
        self.container = container
        self.queue = container.inboxQueue
        self.dispatcher = EventDispatcher(notificationCenter: container.device.notificationCenter, postingNotifications: false,
                                          callDelegate: { delegate, request, container in
            if let relay = delegate as? any OpenURLRequestRelay { return relay.relay(request, from: container) }
            (delegate as? any OpenURLDelegate)?.container(container, open: request.url, sourceApplication: request.sourceApplication,
                                                          annotation: request.annotation)
        }, post: { center, request, container in
            center.post(name: Container.openURLNotification, object: container, userInfo: request.notificationUserInfo)
        })
    }

    // Under the mutex: the last reference can go on a thread that saw the receiver before startWatching set `watch`.
    deinit { mutex.withLock { watch }?.cancel() }

    /// An observer was added: start listening (once) and deliver what is pending.
    func observersChanged() {
        let start: Bool = mutex.withLock {
            defer { isWatching = true }
            return !isWatching
        }
        if start, let container {
            container.device.inboxReceivers.insert(self)
            startWatching()
        }
        deliverPending()
    }

    /// Delivers pending events, on the receiver's own queue.
    func deliverPending() {
        drains.async { [weak self] in self?.drain() }
    }

    /// Returns once the drains queued so far have run and the events they handed out were handled (a drain waits for
    /// its observers), or after `timeout` seconds; true if they were. Retries scheduled for later are not waited for.
    func waitUntilIdle(timeout: TimeInterval) async -> Bool {
        let drained = DispatchGroup()
        drained.enter()
        drains.async { drained.leave() }
        let start = Date()
        guard await drained.settled(timeout: timeout) else { return false }
        return await dispatcher.waitUntilIdle(timeout: max(0, timeout - Date().timeIntervalSince(start)))
    }

    private func startWatching() {
        do {
            try queue.prepare()
        } catch {
            Self.logger.warning("cannot create the Inbox queue of \(queue.bundleIdentifier): \(error)")
            return
        }
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        // Records are only ever renamed into place, so renames are the one thing worth waking for.
        guard fd >= 0, inotify_add_watch(fd, queue.path, UInt32(IN_MOVED_TO)) >= 0 else {
            let error = String(cString: strerror(errno))
            if fd >= 0 { close(fd) }
            // Registration, later registrations and unlocks still deliver; only the wake-up on a delivery is missing.
            Self.logger.warning("cannot watch the Inbox queue of \(queue.bundleIdentifier) (\(error)); deliveries from other programs arrive at the next unlock")
            return
        }
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: drains)
        source.setEventHandler { [weak self] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            while read(fd, &buffer, buffer.count) > 0 {}
            self?.drain()
        }
        source.setCancelHandler { close(fd) }
        mutex.withLock { watch = source }
        source.resume()
    }

    /// Hands each pending event to the observers and waits until they have handled it before recording it delivered,
    /// so a program that dies mid-way gets it again at its next launch rather than never. Stops at an event another
    /// receiver holds, so this one's order stays delivery order, and looks again shortly.
    private func drain() {
        guard let container, dispatcher.hasObservers else { return }
        do {
            let scan = try queue.scan()
            for damage in scan.damage where mutex.withLock({ reportedDamage.insert(damage.file + damage.problem).inserted }) {
                Self.logger.error("the Inbox queue of \(queue.bundleIdentifier) is damaged: \(damage.file): \(damage.problem)")
            }
            for entry in scan.entries where !entry.eventDelivered {
                guard container.device.mayDeliverOpenURLs else { return }
                guard let claim = try queue.claim(entry) else {
                    drains.asyncAfter(deadline: .now() + 1) { [weak self] in self?.drain() }
                    return
                }
                if mutex.withLock({ handledUnrecorded.contains(entry.sequence) }) {
                    try queue.finish(claim)
                    _ = mutex.withLock { handledUnrecorded.remove(entry.sequence) }
                    continue
                }
                guard try container.inboxItemExists(claim) else { continue }
                let delivery = dispatcher.deliver(container.openURLRequest(for: claim.entry), from: container)
                waitUntilHandled(delivery.done, entry: claim.entry)
                // Every observer went away before receiving it: it stays pending for the next receiver.
                guard delivery.taken.value > 0 else { return }
                do {
                    try queue.finish(claim)
                } catch {
                    mutex.withLock { _ = handledUnrecorded.insert(entry.sequence) }
                    drains.asyncAfter(deadline: .now() + 1) { [weak self] in self?.drain() }
                    throw error
                }
            }
        } catch {
            Self.logger.error("cannot deliver the Inbox events of \(queue.bundleIdentifier): \(error)")
        }
    }

    /// Waits for the observers; says so in the log if one takes long (a sequence nobody iterates, a stuck delegate),
    /// since every later event of the container waits behind it.
    private func waitUntilHandled(_ done: DispatchGroup, entry: InboxQueue.Entry) {
        var waited = 0
        while done.wait(timeout: .now() + 10) == .timedOut {
            waited += 10
            if waited == 10 || waited % 300 == 0 {
                Self.logger.warning("the open-URL event of \(queue.bundleIdentifier):Documents/Inbox/\(entry.name) has not been handled after \(waited) s; later ones wait for it")
            }
        }
    }
}
