import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// What `TestDevice.everyPowerCut` checked.
public struct PowerCutSummary: Sendable, CustomStringConvertible {
    /// The seed the states were drawn with; pass it back to check the same states again.
    public let seed: UInt64
    /// Writes, truncations, fsyncs and name changes the operation made to the device's files.
    public let operationsRecorded: Int
    /// States the operation can leave, as the simulator counts them (every cut point, each with its mixtures).
    public let statesPossible: Int
    /// States brought up and checked (all of them, or a sample of `maxStates` drawn with `seed`).
    public let statesChecked: Int

    public var description: String {
        "\(statesChecked) of \(statesPossible) power-cut states checked after \(operationsRecorded) recorded operations (seed \(seed))"
    }
}

/// Where a power cut struck, as the check on the device it left sees it (`TestDevice.powerCut`).
public struct PowerCutContext: Sendable {
    /// The state; `replayPowerCut` takes its text form.
    public let state: PowerCutStateID
    /// Whether every write of the operation had been issued: it had returned, so what it made durable (fsynced)
    /// must be there; what it did not may still be lost.
    public let operationHadReturned: Bool
}

/// The check failed on the device a power cut left: which state, what the cut did to the pending writes, and why.
public struct PowerCutFailure: Error, CustomStringConvertible {
    /// The state; `replayPowerCut(_:during:afterReboot:)` brings up exactly this one again.
    public let state: PowerCutStateID
    /// The writes and names the cut lost, kept and tore.
    public let whatTheCutDid: String
    /// What the check threw.
    public let underlying: any Error

    public var description: String {
        "the check failed after power cut \(state) (\(whatTheCutDid)): \(underlying). Replay this state with "
            + "device.replayPowerCut(\"\(state)\", during: …, afterReboot: …)"
    }
}

extension TestDevice {
    /// Runs `operation` once while recording every write, truncation, fsync and name change it makes to the device's
    /// files, then, for each state a power cut during it could leave (writes after a file's last fsync lost, kept or
    /// torn at 512-byte sectors, names persisting in order), brings up a device on that state, before first unlock as
    /// after a real power loss, and runs `afterReboot` on it. The first state whose check throws ends the run with a
    /// `PowerCutFailure` naming it. Throw (or `#require`) in the check: a failed `#expect` is not tied to the state.
    /// `rebooted.powerCut?.operationHadReturned` tells the states after the operation returned, where what it made
    /// durable must be there.
    ///
    /// At most `maxStates` states are checked, drawn reproducibly from `seed` when there are more (a random seed
    /// unless given; the summary and any failure name it). Works with either key holder: the operation runs against
    /// this device (a daemon-backed one runs its daemon in this process, so the daemon's writes are recorded too),
    /// and each state is brought up in this process. Tests may record different devices at the same time.
    @discardableResult
    public func everyPowerCut(isolation: isolated (any Actor)? = #isolation, maxStates: Int = 200, seed: UInt64? = nil,
                              during operation: () async throws -> Void,
                              afterReboot check: (TestDevice) async throws -> Void) async throws -> PowerCutSummary {
        precondition(maxStates > 0, "maxStates must be at least 1")
        let seed = seed ?? UInt64.random(in: 0...UInt64.max)
        let recording = try await record(operation)
        let cutPoints = recording.stateIDs(randomPerCut: 0, seed: seed).count / 2
        let all = recording.stateIDs(randomPerCut: max(0, maxStates / max(1, cutPoints) - 2), seed: seed)
        var chosen = all
        if chosen.count > maxStates {
            var random = SplitMix64(seed: seed)
            chosen.shuffle(using: &random)
            chosen = chosen.prefix(maxStates).sorted { ($0.cut, $0.sample) < ($1.cut, $1.sample) }
        }
        for state in chosen {
            try await bringUp(state, of: recording, check: check)
        }
        return PowerCutSummary(seed: seed, operationsRecorded: recording.steps.count(where: { if case .mark = $0 { false } else { true } }),
                               statesPossible: all.count, statesChecked: chosen.count)
    }

    /// Runs `operation` again under a recording and checks only `state` (as a `PowerCutFailure` reported it), so a
    /// failing state can be debugged alone. The operation must make the same calls as when the state was reported.
    public func replayPowerCut(_ state: String, isolation: isolated (any Actor)? = #isolation,
                               during operation: () async throws -> Void,
                               afterReboot check: (TestDevice) async throws -> Void) async throws {
        guard let id = PowerCutStateID(state) else {
            throw ProtectedStoreError(.invalidArgument, path: nil, problem: "\"\(state)\" is not a power-cut state",
                                      remedy: "Pass the state a PowerCutFailure reported, as seed:cut:sample")
        }
        let recording = try await record(operation)
        try await bringUp(id, of: recording, check: check)
    }

    private func record(isolation: isolated (any Actor)? = #isolation, _ operation: () async throws -> Void) async throws -> PowerCutRecording {
        let recording = try PowerCutRecording.start(root: root)
        defer { recording.stop() }
        try await operation()
        return recording
    }

    private func bringUp(isolation: isolated (any Actor)? = #isolation, _ id: PowerCutStateID, of recording: PowerCutRecording,
                         check: (TestDevice) async throws -> Void) async throws {
        let folder = (NSTemporaryDirectory() as NSString).appendingPathComponent("pst-cut-\(UUID().uuidString.prefix(13))")
        let state: PowerCutState
        do {
            state = try recording.materialize(id, in: folder)
            let copiedSecret = (folder as NSString).appendingPathComponent("device.secret")
            try FileManager.default.copyItem(atPath: secretPath, toPath: copiedSecret)
            // The passcode binding lies beside the secret, outside the recorded root, and goes with it.
            let binding = PasscodeBinding.path(forSecretAt: secretPath)
            if FileManager.default.fileExists(atPath: binding) {
                try FileManager.default.copyItem(atPath: binding, toPath: PasscodeBinding.path(forSecretAt: copiedSecret))
            }
        } catch {
            try? FileManager.default.removeItem(atPath: folder)
            throw error
        }
        do {
            let context = PowerCutContext(state: id, operationHadReturned: state.cut >= recording.steps.count)
            let rebooted = try TestDevice(poweringUp: folder, after: context, bundleIdentifier: bundleIdentifier, gracePeriod: gracePeriod)
            try await check(rebooted)
        } catch {
            throw PowerCutFailure(state: id, whatTheCutDid: state.description, underlying: error)
        }
    }
}
