import Foundation
import Testing
import SuiteThreads

/// The layering of Package.swift as a fact about the built code: what an app links (`ProtectedStore` and the core
/// beneath it) defines no benchmark, fuzzing, daemon-server or mount symbol. Read with `nm` from the objects of each
/// module's own sources, so a type moved back into the product fails here even if it still compiles.
@Suite("Module boundaries", .ownThread) struct ModuleBoundaryTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let buildFolder = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()

    /// Names of types that belong to the modules an app does not link.
    static let foreign = ["Benchmark", "FuzzHarness", "KeyDaemon", "DaemonServer", "SubscriberRegistry", "ContainerFileSystem", "OpenFileTable", "FUSEMount", "MountPoint"]

    /// The defined symbols of a module's objects, one per source file of the module.
    static func definedSymbols(module: String) throws -> [String] {
        let sources = repository.appendingPathComponent("Sources").appendingPathComponent(module)
        let files = FileManager.default.enumerator(atPath: sources.path)!.compactMap { $0 as? String }.filter { $0.hasSuffix(".swift") }
        #expect(!files.isEmpty, "no sources found for \(module) in \(sources.path)")
        var symbols: [String] = []
        for file in files {
            let object = buildFolder.appendingPathComponent("\(module).build").appendingPathComponent((file as NSString).lastPathComponent + ".o")
            try #require(FileManager.default.fileExists(atPath: object.path), "\(object.path) is missing: is the build folder where the test binary is?")
            let nm = Process()
            nm.executableURL = URL(fileURLWithPath: "/usr/bin/nm")
            nm.arguments = ["--defined-only", "--format=just-symbols", object.path]
            let output = Pipe()
            nm.standardOutput = output
            try nm.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            nm.waitUntilExit()
            try #require(nm.terminationStatus == 0, "nm failed on \(object.path)")
            symbols += String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        }
        return symbols
    }

    @Test("the ProtectedStore product defines no benchmark, fuzzing, daemon-server or mount symbol",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/nm"), "needs nm (binutils)"))
    func productHasNoForeignSymbols() throws {
        for module in ["ProtectedStoreCore", "ProtectedStore"] {
            let symbols = try Self.definedSymbols(module: module)
            #expect(symbols.count > 100, "\(module): too few symbols read (\(symbols.count)); the check would be blind")
            for name in Self.foreign {
                let found = symbols.filter { $0.contains(name) }
                #expect(found.isEmpty, "\(module) defines \(name): \(found.prefix(3))")
            }
        }
        // The check can see what it looks for: the benchmarks' own module defines them.
        #expect(try Self.definedSymbols(module: "ProtectedStoreBenchmarks").contains { $0.contains("Benchmark") })
        #expect(try Self.definedSymbols(module: "ProtectedStoreDaemon").contains { $0.contains("KeyDaemon") })
    }
}
