import Foundation
import Testing

/// docs/TESTING-GUIDE.md shows the example test file in full; this keeps the two identical.
@Test("the testing guide's example is GuideExampleTests.swift, word for word")
func guideExampleMatchesTheCompiledTest() throws {
    let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let marker = "<!-- example: Tests/ProtectedStoreTestingTests/GuideExampleTests.swift -->\n```swift\n"
    let guide = try String(contentsOf: repository.appendingPathComponent("docs/TESTING-GUIDE.md"), encoding: .utf8)
    let example = try String(contentsOf: repository.appendingPathComponent("Tests/ProtectedStoreTestingTests/GuideExampleTests.swift"), encoding: .utf8)
    let start = try #require(guide.range(of: marker), "the guide lost its example marker").upperBound
    let end = try #require(guide.range(of: "\n```\n", range: start..<guide.endIndex)).lowerBound
    #expect(String(guide[start..<end]) + "\n" == example, "copy Tests/ProtectedStoreTestingTests/GuideExampleTests.swift into docs/TESTING-GUIDE.md again")
}
