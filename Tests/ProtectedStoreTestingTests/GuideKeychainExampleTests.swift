import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing

// The code under test: a session whose token is in the keychain ("when unlocked", the default). Woken while the
// device is locked (a background fetch, a silent push, a launch after a reboot), it cannot read the token. That is
// not "signed out": it keeps the user signed in and reads the token again when protected data is back.
final class Session: ProtectedDataDelegate, @unchecked Sendable {
    enum State: Equatable {
        case signedIn(token: String)
        case waitingForUnlock
        case signedOut
    }

    private let keychain: Keychain
    private let mutex = NSLock()
    private var current = State.signedOut
    private let tokenQuery = KeychainQuery.genericPassword(service: "com.example.api", account: "session")

    var state: State { mutex.withLock { current } }

    init(keychain: Keychain, device: Device) {
        self.keychain = keychain
        device.addDelegate(self)
        refresh()
    }

    func signIn(token: String) throws {
        try keychain.add(.genericPassword(service: "com.example.api", account: "session", secret: Data(token.utf8)))
        mutex.withLock { current = .signedIn(token: token) }
    }

    func refresh() {
        let next: State
        do {
            next = .signedIn(token: String(decoding: try keychain.secret(matching: tokenQuery), as: UTF8.self))
        } catch let error as KeychainError where error.code == .itemNotFound {
            next = .signedOut
        } catch {
            // errSecInteractionNotAllowed (-25308): locked, or before first unlock. The token is still there.
            next = .waitingForUnlock
        }
        mutex.withLock { current = next }
    }

    func protectedDataWillBecomeUnavailable(_ device: Device) {}

    func protectedDataDidBecomeAvailable(_ device: Device) { refresh() }
}

@Test("woken while locked, or after a reboot, the session waits for the unlock instead of signing the user out")
func sessionSurvivesALockedWake() async throws {
    let device = try TestDevice()
    let session = Session(keychain: try device.keychain, device: device.device)
    try session.signIn(token: "t-1")

    // A background launch while locked: the app's process starts again and reads its token.
    await device.lock()
    let woken = Session(keychain: try device.keychain, device: device.device)
    #expect(woken.state == .waitingForUnlock)
    try await device.unlock()
    #expect(woken.state == .signedIn(token: "t-1"))

    // After a reboot, before first unlock, the same; the token outlives the reboot.
    try device.reboot()
    let afterReboot = Session(keychain: try device.keychain, device: device.device)
    #expect(afterReboot.state == .waitingForUnlock)
    try await device.unlock()
    #expect(afterReboot.state == .signedIn(token: "t-1"))
}
