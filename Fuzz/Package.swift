// swift-tools-version:6.0
// libFuzzer targets for the parsers that read untrusted bytes (docs/SECURITY.md). Built by `make fuzz`:
//   swift build --package-path Fuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library
// Each target calls the library's FuzzHarness, which the suite's regression test also runs over Corpus/ and Regressions/.
import Foundation
import PackageDescription

// A path dependency's identity is its folder's name, which differs between clones.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

let package = Package(
    name: "ProtectedStoreFuzz",
    dependencies: [.package(path: "..")],
    targets: [.target(name: "FuzzDriver")] + ["FuzzKeybag", "FuzzFileHeader", "FuzzFrame"].map { name in
        .executableTarget(name: name, dependencies: ["FuzzDriver", .product(name: "ProtectedStore", package: root)])
    },
    swiftLanguageModes: [.v6]
)
