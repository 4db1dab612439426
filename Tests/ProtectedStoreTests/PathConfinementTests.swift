import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
import Testing
import SuiteThreads

/// Every path is confined to its container: hostile paths are refused with a clear error, and symlinks planted on
/// disk never lead an operation outside.
@Suite("path confinement", .ownThread)
struct PathConfinementTests {
    /// A container with symlinks planted on disk, and a canary directory outside it that must never change.
    struct Fixture {
        let test: TestDevice
        let container: Container
        let canary: String

        init() throws {
            test = try TestDevice()
            container = try test.makeContainer()
            _ = try test.makeContainer("com.example.neighbour")
            canary = test.path("canary")
            try FileManager.default.createDirectory(atPath: canary, withIntermediateDirectories: true)
            writeRaw(Array("do not touch".utf8), canary + "/victim.txt")
            try container.write(Data("inside".utf8), toPath: "Documents/secret.txt", options: .noFileProtection)
            let links: [(String, String)] = [
                ("abs", canary),                                   // absolute, to a real directory outside
                ("abs-file", canary + "/victim.txt"),               // absolute, to a file outside
                ("etc", "/etc"),
                ("up3", "../../.."),                                // climbs out of Data
                ("up4", "../../../.."),                             // to the device root's parent
                ("keybag", "../../../../keybag"),                   // the device's keybag
                ("neighbour", "../../../com.example.neighbour/Data/Documents"),
                ("loop1", "loop2"), ("loop2", "loop1"),
                ("root", ".."),                                     // the container root: allowed to walk through
                ("inside-dir", "../Library/Caches"),
                ("inside-file", "secret.txt"),
                ("chain", "root/root/up3"),
                ("marker", ".sandboxctl-class"),                    // a reserved name, reached through a link
            ]
            for (name, target) in links {
                try container.createSymbolicLink(atPath: "Documents/" + name, withDestinationPath: target)
            }
        }

        /// Every file under the test directory except the container's data, with its bytes.
        func outsideSnapshot() throws -> [String: [UInt8]] {
            var snapshot: [String: [UInt8]] = [:]
            let base = URL(fileURLWithPath: test.directory.path)
            let enumerator = FileManager.default.enumerator(at: base, includingPropertiesForKeys: [.isRegularFileKey], options: [])!
            for case let url as URL in enumerator {
                let path = url.path
                if path.hasPrefix(container.dataPath) { continue }
                var isDirectory: ObjCBool = false
                _ = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
                snapshot[path] = isDirectory.boolValue ? [] : (FileManager.default.contents(atPath: path).map(Array.init) ?? [])
            }
            return snapshot
        }
    }

    /// Lexically hostile paths: refused before touching the disk.
    static let lexical: [String] = [
        "/etc/passwd", "/", "//", "../x", "..", ".", "./Documents", "Documents/.", "Documents/..", "Documents/../../x",
        "Documents/x/../../..", "Documents/./x", "Documents//x", "Documents///", "a/\0b", "\0", "Documents/x\0",
        String(repeating: "n", count: 256), "Documents/" + String(repeating: "n", count: 300),
        Array(repeating: "d", count: 600).joined(separator: "/"),
        ".sandboxctl-class", "Documents/.sandboxctl-tmp-0011", "Documents/.sandboxctl", "../../../../etc/shadow",
    ]

    /// Paths that go through a planted symlink leading outside, a loop, or the container root.
    static let throughSymlinks: [String] = [
        "Documents/abs/victim.txt", "Documents/abs/new.txt", "Documents/abs-file", "Documents/etc/passwd", "Documents/etc/new",
        "Documents/up3/keybag", "Documents/up3/x", "Documents/up4/x", "Documents/keybag", "Documents/neighbour/x",
        "Documents/loop1", "Documents/loop1/x", "Documents/root/../x", "Documents/root/root/x", "Documents/chain/x",
        "Documents/abs", "Documents/up3", "Documents/marker",
    ]

    @Test("lexically hostile paths are refused with an error naming the path, for every operation", arguments: lexical)
    func lexicalPaths(path: String) throws {
        let fixture = try Fixture()
        let before = try fixture.outsideSnapshot()
        let container = fixture.container
        for (name, operation) in Self.operations(container, path) {
            let error = expectCocoaError(.invalidArgument, operation)
            #expect(error?.protectedStoreError?.path?.hasPrefix("\(TestDevice.bundleIdentifier):") == true, "\(name) names the container path")
        }
        #expect(try fixture.outsideSnapshot() == before)
    }

    @Test("symlinks leading outside the container, loops and absolute targets are refused; nothing outside changes", arguments: throughSymlinks)
    func symlinkPaths(path: String) throws {
        let fixture = try Fixture()
        let before = try fixture.outsideSnapshot()
        let container = fixture.container
        // Operations that act on a final symlink itself (remove, move, lstat) are legitimate and stay inside.
        let followsFinal: Set<String> = ["write", "contents", "handle", "list", "mkdir -p", "setProtection"]
        let isFinalLink = ["Documents/abs", "Documents/abs-file", "Documents/up3", "Documents/keybag", "Documents/loop1", "Documents/marker"].contains(path)
        for (name, operation) in Self.operations(container, path) where !isFinalLink || followsFinal.contains(name) {
            do {
                _ = try operation()
                Issue.record("\(name) \(path) succeeded")
            } catch let error as CocoaError {
                let library = try #require(error.protectedStoreError, "\(name): \(error)")
                #expect(library.path?.hasPrefix("\(TestDevice.bundleIdentifier):") == true)
                #expect([.invalidArgument, .notFound, .alreadyExists].contains(library.kind), "\(name) \(path): \(library)")
            }
        }
        #expect(try fixture.outsideSnapshot() == before, "nothing outside the container changed")
        #expect(readRaw(fixture.canary + "/victim.txt") == Array("do not touch".utf8))
    }

    @Test("symlinks that stay inside the container work")
    func insideLinks() throws {
        let fixture = try Fixture()
        let container = fixture.container
        #expect(try container.contents(atPath: "Documents/inside-file") == Data("inside".utf8))
        try container.write(Data("cached".utf8), toPath: "Documents/inside-dir/item", options: .noFileProtection)
        #expect(try container.contents(atPath: "Library/Caches/item") == Data("cached".utf8))
        #expect(try container.contents(atPath: "Documents/root/Documents/secret.txt") == Data("inside".utf8))
        let link = try container.itemInfo(atPath: "Documents/abs")
        #expect(link.type == .typeSymbolicLink)
        #expect(link.symbolicLinkTarget == fixture.canary)
        // Removing a link removes the link, never its target.
        try container.removeItem(atPath: "Documents/abs")
        #expect(FileManager.default.fileExists(atPath: fixture.canary + "/victim.txt"))
    }

    @Test("a directory swapped for a symlink after validation is not followed (no-follow at every step)")
    func noFollowAtEveryStep() throws {
        let fixture = try Fixture()
        let container = fixture.container
        try container.createDirectory(atPath: "Documents/dir")
        let resolved = try container.directory.resolve(try ContainerPath("Documents/dir/file", container: "t"), followingFinalSymlink: true)
        // Swap the directory itself for a link outside after it was opened: the open descriptor still names the old directory.
        try FileManager.default.removeItem(atPath: try container.storedPath("Documents/dir"))
        try container.createSymbolicLink(atPath: "Documents/dir", withDestinationPath: fixture.canary)
        let file = try? EncryptedFile.create(at: resolved.location, protectionClass: .none, keys: container.device)
        try? file?.close()
        #expect(!FileManager.default.fileExists(atPath: fixture.canary + "/file"), "the write did not land outside")
        // And a fresh resolution now refuses the link.
        expectCocoaError(.invalidArgument) { try container.write(Data(), toPath: "Documents/dir/file") }
        // A link planted in the store, its target not sealed for this directory, is not followed at all.
        try FileManager.default.createSymbolicLink(atPath: try container.storedPath("Documents/planted"), withDestinationPath: "dir")
        let error = expectCocoaError(.integrity) { try container.contents(atPath: "Documents/planted/x") }
        #expect(error?.protectedStoreError?.problem.contains("stored target does not decrypt") == true)
        #expect(!FileManager.default.fileExists(atPath: fixture.canary + "/x"))
    }

    @Test("bundle identifiers are validated")
    func bundleIdentifiers() throws {
        let test = try TestDevice()
        for bad in ["", "noDots", ".com.x", "com..x", "com.x.", "com/x", "../etc", "com.ex ample", "com.-x", "com.ex_ample", "com.é.x", String(repeating: "a.", count: 80) + "a"] {
            expectError(.invalidArgument) { try test.device.createContainer(bundleIdentifier: bad) }
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: test.root + "/containers").isEmpty)
        _ = try test.makeContainer("com.example.My-App2")
    }

    static func operations(_ container: Container, _ path: String) -> [(String, () throws -> Any)] {
        [
            ("write", { try container.write(Data("x".utf8), toPath: path) }),
            ("contents", { try container.contents(atPath: path) }),
            ("create", { try container.createFile(atPath: path).close() }),
            ("handle", { try container.fileHandle(forUpdatingAtPath: path) }),
            ("list", { try container.contentsOfDirectory(atPath: path) }),
            ("mkdir", { try container.createDirectory(atPath: path) }),
            ("mkdir -p", { try container.createDirectory(atPath: path + "/sub", withIntermediateDirectories: true) }),
            ("remove", { try container.removeItem(atPath: path) }),
            ("move from", { try container.moveItem(atPath: path, toPath: "Documents/moved") }),
            ("move to", { try container.moveItem(atPath: "Documents/secret.txt", toPath: path) }),
            ("info", { try container.itemInfo(atPath: path) }),
            ("setProtection", { try container.setProtection(.none, ofItemAtPath: path) }),
        ]
    }
}
