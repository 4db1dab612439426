// swift-tools-version:6.0
// libFuzzer targets for the parsers that read untrusted bytes (docs/SECURITY.md). Built by `make fuzz`:
//   swift build --package-path Fuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library
// Each target calls FuzzHarness (the root package's _ProtectedStoreFuzzing product), which the suite's regression test also runs over Corpus/ and Regressions/.
import Foundation
import PackageDescription

// A path dependency's identity is its folder's name, which differs between clones.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

let package = Package(
    name: "ProtectedStoreFuzz",
    dependencies: [.package(path: "..")],
    targets: [.target(name: "FuzzDriver")] + ["FuzzKeybag", "FuzzFileHeader", "FuzzFrame", "FuzzNames"].map { name in
        .executableTarget(name: name, dependencies: ["FuzzDriver", .product(name: "_ProtectedStoreFuzzing", package: root)])
    },
    swiftLanguageModes: [.v6]
)
