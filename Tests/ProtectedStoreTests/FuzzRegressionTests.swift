import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import ProtectedStoreFuzzing
import Testing
import SuiteThreads

/// Every committed fuzz seed and every input a fuzzer ever crashed on (Fuzz/Corpus, Fuzz/Regressions) goes through the
/// fuzz targets' own code: each must be refused or accepted, never crash or hang.
@Suite(.ownThread) struct FuzzRegressionTests {
    static let fuzzFolder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz")

    static func inputs(_ target: String) throws -> [(String, [UInt8])] {
        try ["Corpus", "Regressions"].flatMap { kind -> [(String, [UInt8])] in
            let folder = fuzzFolder.appendingPathComponent(kind).appendingPathComponent(target)
            return try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { !$0.hasPrefix(".") }.sorted().map { name in
                ("\(kind)/\(target)/\(name)", Array(try Data(contentsOf: folder.appendingPathComponent(name))))
            }
        }
    }

    @Test(arguments: ["keybag", "file-header", "frame", "names"])
    func committedInputsPassThroughTheirTarget(_ target: String) throws {
        let inputs = try Self.inputs(target)
        #expect(inputs.count >= 2, "the seed corpus of \(target) is missing")
        for (_, bytes) in inputs {
            switch target {
            case "keybag": FuzzHarness.keybag(bytes)
            case "file-header": FuzzHarness.fileHeader(bytes)
            case "names": FuzzHarness.names(bytes)
            default: FuzzHarness.frames(bytes)
            }
        }
    }

    @Test func theSeedsAreValidInputsSoTheFuzzersStartDeep() throws {
        let keybag = try #require(try Self.inputs("keybag").first { $0.0.hasSuffix("/valid") })
        #expect(try Keybag.peekID(keybag.1, path: "seed").count == FileHeader.idBytes)
        for (name, bytes) in try Self.inputs("file-header") {
            if name.contains("/version-1") {
                // Format version 1's headers, as `sandboxctl migrate` reads them.
                #expect(try Version1File.parseHeader(Array(bytes), path: name).protectionClass == .completeUnlessOpen)
                continue
            }
            let header = try FileHeader.parse(bytes, path: name)
            #expect(LengthRecord.parse(Array(bytes)[512..<1024], layout: header.layout) != nil, "\(name): its length record does not parse")
        }
        let hello = try #require(try Self.inputs("frame").first { $0.0.hasSuffix("/hello") })
        let decoded = try hello.1.withUnsafeBytes { try Frame.decode($0) }
        #expect(decoded?.consumed == hello.1.count)
    }
}
