import Foundation
import Testing

/// The DocC article "Testing your storage code" (ProtectedStoreTesting.docc) shows the example test files in full; this keeps each copy identical to the compiled file.
@Test("the testing guide's examples are the compiled test files, word for word",
      arguments: ["Tests/ProtectedStoreTestingTests/GuideExampleTests.swift", "Tests/ProtectedStoreTestingTests/GuidePowerCutExampleTests.swift",
                 "Tests/ProtectedStoreTestingTests/GuideLifecycleExampleTests.swift"])
func guideExampleMatchesTheCompiledTest(file: String) throws {
    let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let marker = "<!-- example: \(file) -->\n```swift\n"
    let guide = try String(contentsOf: repository.appendingPathComponent("Sources/ProtectedStoreTesting/ProtectedStoreTesting.docc/TestingYourStorageCode.md"), encoding: .utf8)
    let example = try String(contentsOf: repository.appendingPathComponent(file), encoding: .utf8)
    let start = try #require(guide.range(of: marker), "the guide lost its example marker for \(file)").upperBound
    let end = try #require(guide.range(of: "\n```\n", range: start..<guide.endIndex)).lowerBound
    #expect(String(guide[start..<end]) + "\n" == example, "copy \(file) into Sources/ProtectedStoreTesting/ProtectedStoreTesting.docc/TestingYourStorageCode.md again")
}
