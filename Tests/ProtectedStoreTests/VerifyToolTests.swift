import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// `ps-verify`, the campaign's harness, in short runs: it must pass on this code, and its checks must be live.
@Suite(.ownThread) struct VerifyToolTests {
    private func run(_ arguments: [String]) throws -> (status: Int32, output: String) {
        let spawned = try SpawnedProcess(SpawnedProcess.builtExecutable("ps-verify"), arguments)
        let status = spawned.waitForExit(timeout: 240)
        var lines: [String] = []
        while let line = spawned.nextLine(timeout: 0.5) { lines.append(line) }
        return (status ?? -1, lines.joined(separator: "\n") + spawned.standardError)
    }

    @Test func crashHarnessFindsNoViolationInAFewKillsOfEveryKind() throws {
        let (status, output) = try run(["crash", "--trials", "4"])
        #expect(status == 0, "\(output)")
        for kind in ["write", "overwrite", "move", "protection", "passcode", "inbox"] {
            let tally = "  \(kind.padding(toLength: 11, withPad: " ", startingAt: 0)) 4 kills"
            #expect(output.contains(tally), "no tally for \(kind): \(output)")
        }
    }

    @Test func powerCutHarnessFindsNoViolationInEveryKindAndFindsTheVersion1GrowthHazard() throws {
        let (status, output) = try run(["powercut", "--operations", "2", "--states-per-cut", "2", "--seed", "3"])
        #expect(status == 0, "\(output)")
        for kind in ["write", "overwrite", "move", "protection", "passcode", "inbox", "growth", "names"] {
            #expect(output.contains("  \(kind.padding(toLength: 11, withPad: " ", startingAt: 0)) 2 ops, ") && output.contains("violations 0"),
                    "no clean tally for \(kind): \(output)")
        }
        #expect(output.contains("as expected)"), "\(output)")
    }

    /// Also the regression test of the daemon reporting a class key zeroed mid-use as I/O instead of data protection.
    @Test func loadThroughTheDaemonLosesNothingAndRefusesOnlyForDataProtection() throws {
        let (status, output) = try run(["load", "--clients", "3", "--operations", "300", "--toggle-ms", "5"])
        #expect(status == 0, "\(output)")
        #expect(output.contains("every refusal a data-protection error"), "\(output)")
        #expect(output.contains("lock/unlock cycles"), "\(output)")
    }
}
