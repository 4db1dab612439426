import Foundation
import Testing

/// The DocC articles of ProtectedStoreTesting.docc show the example test files in full; this keeps each copy identical to the compiled file.
@Test("the testing guides' examples are the compiled test files, word for word",
      arguments: [("Tests/ProtectedStoreTestingTests/GuideExampleTests.swift", "TestingYourStorageCode.md"),
                  ("Tests/ProtectedStoreTestingTests/GuidePowerCutExampleTests.swift", "TestingYourStorageCode.md"),
                  ("Tests/ProtectedStoreTestingTests/GuideLifecycleExampleTests.swift", "TestingYourStorageCode.md"),
                  ("Tests/ProtectedStoreTestingTests/GuideKeychainExampleTests.swift", "TestingKeychainCode.md")])
func guideExampleMatchesTheCompiledTest(file: String, article: String) throws {
    let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let marker = "<!-- example: \(file) -->\n```swift\n"
    let guide = try String(contentsOf: repository.appendingPathComponent("Sources/ProtectedStoreTesting/ProtectedStoreTesting.docc/\(article)"), encoding: .utf8)
    let example = try String(contentsOf: repository.appendingPathComponent(file), encoding: .utf8)
    let start = try #require(guide.range(of: marker), "the guide lost its example marker for \(file)").upperBound
    let end = try #require(guide.range(of: "\n```\n", range: start..<guide.endIndex)).lowerBound
    #expect(String(guide[start..<end]) + "\n" == example, "copy \(file) into Sources/ProtectedStoreTesting/ProtectedStoreTesting.docc/\(article) again")
}
