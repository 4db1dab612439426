import Foundation
import ProtectedStoreCore

/// The protocol version this build speaks (docs/PROTOCOL.md); `hello` must name it.
package let daemonProtocolVersion = 1

/// A client's request. One flat shape for every operation keeps the decoder small; which fields an operation uses
/// is in docs/PROTOCOL.md §3.
package struct DaemonRequest: Codable, Sendable {
    package enum Operation: String, Codable, Sendable, CaseIterable {
        case hello, status, unlock, lock, subscribe, ack, wrap, unwrap
        case changePasscode = "change-passcode"
        case nameKey = "name-key"
        case wrapBatch = "wrap-batch"
        case appRegister = "app-register"
        case apps
        case appSuspend = "app-suspend"
        case appResume = "app-resume"
        case appTerminate = "app-terminate"
        case appOpenURL = "app-open-url"
        case appInterrupt = "app-interrupt"
        case appTaskBegin = "app-task-begin"
        case appTaskEnd = "app-task-end"
        case appMemoryWarning = "app-memory-warning"
        case appTimeChange = "app-time-change"
        case keychainAdd = "keychain-add"
        case keychainFind = "keychain-find"
        case keychainUpdate = "keychain-update"
        case keychainDelete = "keychain-delete"
        case keychainList = "keychain-list"

        /// The keychain requests (§7): an app's connection is answered for its own access groups only.
        package var isKeychain: Bool { [.keychainAdd, .keychainFind, .keychainUpdate, .keychainDelete, .keychainList].contains(self) }

        /// What a connection on an app's own socket may ask: events for itself and its own background tasks, nothing
        /// about the device.
        package var isAllowedForApps: Bool { [.hello, .status, .subscribe, .ack, .appTaskBegin, .appTaskEnd].contains(self) || isKeychain }
    }

    package var id: UInt64
    package var op: String
    package var version: Int?
    package var grace: Double?
    package var protectionClass: String?
    package var associatedData: String?
    /// `wrap-batch`: one header prefix (base64) per key in the attachment.
    package var associatedDataList: [String]?
    package var ephemeralPublicKey: String?
    package var sealed: String?
    package var seq: UInt64?
    package var container: String?
    /// `app-*`: the app's bundle identifier.
    package var bundle: String?
    /// `app-register`: the sandbox's first process (its PID namespace's init), as the daemon sees it.
    package var pid: Int32?
    /// `app-register`: where the daemon listens for the app's own connections.
    package var socketPath: String?
    /// `app-register`: the uid the sandbox runs as, when it is not the registering one (a root launcher's).
    package var uid: UInt32?
    /// `app-suspend`, `app-terminate`: seconds the app's observers have to handle the event; `app-register`: the
    /// launch timeout (each launch event's).
    package var timeout: Double?
    /// `app-register`: the app ran under an earlier daemon (registered again after a restart): no launch events.
    package var launched: Bool?
    /// `app-register`: a lock sends the app to the background, and the unlock brings it back (iOS's side button).
    package var backgroundOnLock: Bool?
    /// `app-register`: the longest background time background tasks extend to, in seconds.
    package var backgroundTaskTime: Double?
    /// `app-task-begin`: the task's name; `app-task-end`: the identifier `app-task-begin` gave.
    package var taskName: String?
    package var task: UInt64?
    /// `app-resume`: an Inbox item is about to be opened (`sandboxctl open`): *did become active* waits until the app's
    /// next open-URL event is sent (5 s at most), so the URL comes first.
    package var awaitingURL: Bool?
    /// `app-interrupt`: true to end the interruption.
    package var end: Bool?
    /// `ack` of *will* or *did finish launching*: the observers' answer (false: the launch option's URL is not opened).
    package var accepted: Bool?
    /// `app-open-url`: the Inbox item's container path, sender, annotation (JSON text) and place in the Inbox order.
    package var path: String?
    package var sourceApplication: String?
    package var annotation: String?
    package var sequence: UInt64?
    /// `app-register`: the keychain access groups the app gets besides its bundle identifier (`launch --keychain-group`).
    package var keychainGroups: [String]?
    /// `keychain-add`: the item (its secret is the attachment).
    package var keychainItem: KeychainItemMessage?
    /// `keychain-find`, `-update`, `-delete`, `-list`: which items.
    package var keychainQuery: KeychainQueryMessage?
    /// `keychain-find`: the secrets too, as the reply's attachment.
    package var returnSecrets: Bool?
    /// `keychain-update`: what changes (a new secret is the attachment).
    package var keychainChanges: KeychainChangesMessage?

    package init(id: UInt64, op: Operation) {
        self.id = id
        self.op = op.rawValue
    }

    package var operation: Operation? { Operation(rawValue: op) }

    /// The hello every connection starts with, naming this protocol version.
    package static var hello: DaemonRequest {
        var hello = DaemonRequest(id: 0, op: .hello)
        hello.version = daemonProtocolVersion
        return hello
    }
}

/// A reply to a request (`id` set) or an event (`event` set).
package struct DaemonReply: Codable, Sendable {
    struct Failure: Codable, Sendable {
        var code: String
        var message: String
        var remedy: String
        var path: String?
        /// A keychain request's failure: Security.framework's OSStatus (`code` is then "keychain").
        var status: Int32?
    }

    package var id: UInt64?
    var error: Failure?
    package var event: String?
    package var seq: UInt64?
    package var grace: Double?
    package var version: Int?
    package var pid: Int32?
    package var state: String?
    package var keybagID: String?
    package var classBPublicKey: String?
    package var deviceSecretPath: String?
    package var socketPath: String?
    package var gracePeriod: Double?
    package var subscribers: Int?
    package var failedPasscodeAttempts: Int?
    package var coreDumpsDisabled: Bool?
    package var lockedMemoryKiB: Int?
    package var sealed: String?
    /// `wrap-batch`: the sealed keys, in the order of the request's.
    package var sealedList: [String]?
    /// `hello`: the operations this daemon serves, so a client uses a newer one only where it exists.
    package var operations: [String]?
    /// `apps`: the launched apps.
    package var apps: [AppStatus]?
    /// `status`: the lock triggers the daemon was started with (`--lock-on`), and whether they follow logind now.
    package var lockTriggers: [String]?
    package var lockTriggersConnected: Bool?
    /// On an app's own connection: its bundle identifier.
    package var bundle: String?
    /// An `open-url` event: the Inbox item's container path, sender, annotation (JSON text) and place in the Inbox order.
    package var path: String?
    package var sourceApplication: String?
    package var annotation: String?
    package var sequence: UInt64?
    /// `keychain-add`, `-find`, `-list`: the items' attributes (a search's secrets are the attachment).
    package var keychainItems: [KeychainItemMessage]?
    /// `keychain-list`: how many more items match whose class key is unavailable.
    package var unavailable: Int?

    package init(id: UInt64?) { self.id = id }

    package static func failure(id: UInt64?, _ error: KeychainError) -> DaemonReply {
        var reply = DaemonReply(id: id)
        reply.error = Failure(code: "keychain", message: error.problem, remedy: error.remedy, path: nil, status: error.status)
        return reply
    }

    package static func failure(id: UInt64?, _ error: ProtectedStoreError) -> DaemonReply {
        var reply = DaemonReply(id: id)
        reply.error = Failure(code: DaemonErrorCode(error.kind).rawValue, message: error.problem, remedy: error.remedy, path: error.path)
        return reply
    }

    package static func failure(id: UInt64?, code: DaemonErrorCode, message: String, remedy: String) -> DaemonReply {
        var reply = DaemonReply(id: id)
        reply.error = Failure(code: code.rawValue, message: message, remedy: remedy)
        return reply
    }
}

/// Error codes on the wire: the library's error kinds, plus the protocol's own.
package enum DaemonErrorCode: String, Sendable {
    case protectedDataUnavailable = "protected-data-unavailable"
    case wrongPasscode = "wrong-passcode"
    case throttled
    case integrity
    case unsupportedFormat = "unsupported-format"
    case notFound = "not-found"
    case alreadyExists = "already-exists"
    case invalidArgument = "invalid-argument"
    case io
    case daemonUnavailable = "daemon-unavailable"
    /// At a limit that keeps room for the owner's requests (subscribers): the request is refused, the connection kept.
    case busy
    // The protocol's own; each closes the connection.
    case badFrame = "bad-frame"
    case unknownOperation = "unknown-operation"
    case unsupportedVersion = "unsupported-version"
    case permissionDenied = "permission-denied"

    package init(_ kind: ProtectedStoreError.Kind) {
        switch kind {
        case .protectedDataUnavailable: self = .protectedDataUnavailable
        case .wrongPasscode: self = .wrongPasscode
        case .throttled: self = .throttled
        case .integrity: self = .integrity
        case .unsupportedFormat: self = .unsupportedFormat
        case .notFound: self = .notFound
        case .alreadyExists: self = .alreadyExists
        case .invalidArgument: self = .invalidArgument
        case .io: self = .io
        case .daemonUnavailable: self = .daemonUnavailable
        // Not raised by any daemon operation (it is the Inbox rule, enforced in the client).
        case .permissionDenied: self = .permissionDenied
        }
    }

    /// The library error kind a client reports for this code.
    var kind: ProtectedStoreError.Kind {
        switch self {
        case .protectedDataUnavailable: .protectedDataUnavailable
        case .wrongPasscode: .wrongPasscode
        case .throttled: .throttled
        case .integrity: .integrity
        case .unsupportedFormat, .badFrame, .unknownOperation, .unsupportedVersion: .unsupportedFormat
        case .notFound: .notFound
        case .alreadyExists: .alreadyExists
        case .invalidArgument: .invalidArgument
        case .io: .io
        case .daemonUnavailable, .permissionDenied, .busy: .daemonUnavailable
        }
    }
}

/// An open-URL event on its way to a launched app: an Inbox item, relayed by the launcher (docs/PROTOCOL.md §6).
package struct OpenURLPayload: Sendable, Equatable {
    package var path: String
    package var sourceApplication: String?
    package var annotation: String?
    package var sequence: UInt64

    package init(path: String, sourceApplication: String?, annotation: String?, sequence: UInt64) {
        self.path = path
        self.sourceApplication = sourceApplication
        self.annotation = annotation
        self.sequence = sequence
    }
}

/// A launched app as the daemon tracks it (`apps`).
package struct AppStatus: Codable, Sendable, Equatable {
    package var bundle: String
    /// The sandbox's first process.
    package var pid: Int32
    /// `inactive`, `active`, `background` or `suspended`; in a reply to `app-suspend` or `app-terminate`, `ended` when the
    /// daemon ended the app without notice, `reason` saying why.
    package var state: String
    /// Seconds since 1970 when it entered that state.
    package var since: Double
    /// How the app is suspended: `cgroup` (its cgroup frozen) or `sigstop` (the fallback).
    package var freezer: String?
    package var reason: String?
    /// In the background: seconds of background time left (its tasks' extension counted).
    package var remaining: Double?
    /// `app-task-begin`: the new task's identifier, 0 when none may begin (the background time is over).
    package var task: UInt64?

    package init(bundle: String, pid: Int32, state: String, since: Double, freezer: String? = nil, reason: String? = nil) {
        self.bundle = bundle
        self.pid = pid
        self.state = state
        self.since = since
        self.freezer = freezer
        self.reason = reason
    }
}

extension ProtectedDataEvent {
    /// The event's name on the wire.
    package var wireName: String {
        switch self {
        case .willBecomeUnavailable: "will-become-unavailable"
        case .didBecomeAvailable: "did-become-available"
        }
    }

    package init?(wireName: String) {
        switch wireName {
        case "will-become-unavailable": self = .willBecomeUnavailable
        case "did-become-available": self = .didBecomeAvailable
        default: return nil
        }
    }
}

extension LifecycleEvent {
    /// The event's name on the wire.
    package var wireName: String {
        switch self {
        case .willFinishLaunching: "will-finish-launching"
        case .didFinishLaunching: "did-finish-launching"
        case .didBecomeActive: "did-become-active"
        case .willResignActive: "will-resign-active"
        case .didEnterBackground: "did-enter-background"
        case .willEnterForeground: "will-enter-foreground"
        case .willTerminate: "will-terminate"
        case .didReceiveMemoryWarning: "did-receive-memory-warning"
        case .significantTimeChange: "significant-time-change"
        case .backgroundTimeWillExpire: "background-time-will-expire"
        }
    }

    package init?(wireName: String) {
        guard let event = Self.allCases.first(where: { $0.wireName == wireName }) else { return nil }
        self = event
    }
}

extension Array where Element == UInt8 {
    package var base64: String { Data(self).base64EncodedString() }

    package init?(base64: String?) {
        guard let base64, let data = Data(base64Encoded: base64) else { return nil }
        self = Array(data)
    }
}
