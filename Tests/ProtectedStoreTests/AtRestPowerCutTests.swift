import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// The durable writes that guard against replay and rollback (the Inbox queue's sealed state, the passcode binding
/// and the keybag it names), under every power cut the simulator can make of them.
@Suite("power cuts: the replay and rollback guards", .ownThread, .serialized)
struct AtRestPowerCutTests {
    @Test("deliveries, a handled event and a pruned record leave an Inbox queue with no false damage after any power cut")
    func inboxQueueState() async throws {
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .none)
        let sources = TemporaryDirectory()
        let source = sources.file("item")
        writeRaw(Array("delivered".utf8), source)
        try device.container.deliverToInbox(fileAtPath: source, name: "first.txt")
        let summary = try await device.everyPowerCut(maxStates: 300, seed: 5, during: {
            let queue = device.container.inboxQueue
            try queue.finish(try #require(try queue.claim(try queue.entries()[0])))
            try device.container.deliverToInbox(fileAtPath: source, name: "second.txt")
            try device.container.removeItem(atPath: "Documents/Inbox/first.txt")
            // Prunes the record of first.txt, whose item is gone.
            try device.container.deliverToInbox(fileAtPath: source, name: "third.txt")
        }, afterReboot: { rebooted in
            let scan = try rebooted.container.inboxQueue.scan()
            try #require(scan.damage.isEmpty, "\(scan.damage)")
            guard rebooted.powerCut?.operationHadReturned == true else { return }
            // The removal of first.txt is not synced (as ext4's unlink is not): its record goes only with it.
            let firstKept = rebooted.container.fileExists(atPath: "Documents/Inbox/first.txt")
            try #require(scan.entries.map(\.name) == (firstKept ? ["first.txt"] : []) + ["second.txt", "third.txt"])
            try #require(scan.entries.map(\.eventDelivered) == (firstKept ? [true] : []) + [false, false])
        })
        print("power cuts, the Inbox queue's state: \(summary)")
        #expect(summary.statesChecked > 50)
    }

    @Test("a passcode change leaves a device that opens with the old passcode or the new one after any power cut, and only with the new one once it returned")
    func passcodeChange() throws {
        let test = try TestDevice()
        let old = try Passcode(TestDevice.passcode), new = try Passcode("changed-passcode")
        // The root and the secret's folder (the binding lies beside the secret), recorded together.
        try FileSystem.synchronizeDirectory(test.directory.path)
        let recording = try PowerCutRecording.start(root: test.directory.path)
        do {
            try test.device.changePasscode(from: old, to: new)
            recording.mark(1)
        } catch {
            recording.stop()
            throw error
        }
        recording.stop()
        let scratch = TemporaryDirectory()
        let report = try recording.check(workload: "passcode change", statesPerCut: 8, seed: 3, scratch: scratch.path) { state in
            func opens(with passcode: Passcode) throws -> Bool {
                let device = try Device.open(root: (state.path as NSString).appendingPathComponent("root"),
                                             deviceSecretPath: (state.path as NSString).appendingPathComponent("device.secret"), notificationCenter: NotificationCenter())
                do {
                    try device.unlock(passcode: passcode)
                    return true
                } catch let error as ProtectedStoreError where error.kind == .wrongPasscode {
                    return false
                }
            }
            do {
                let (withNew, withOld) = (try opens(with: new), try opens(with: old))
                if state.marks.contains(1) {
                    return withNew && !withOld ? [] : ["after the change returned: the new passcode opens \(withNew), the old one \(withOld)"]
                }
                return withNew || withOld ? [] : ["neither passcode opens the device"]
            } catch {
                return ["the device does not open: \(error)"]
            }
        }
        print("power-cut: \(report.description)")
        #expect(report.violations.isEmpty, "\(report)")
        #expect(report.statesChecked > 20)
    }
}
