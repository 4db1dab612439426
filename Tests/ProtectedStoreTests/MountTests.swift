import CSupport
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import ProtectedStoreTesting
import SystemPackage
import Testing
import SuiteThreads

/// `sandboxctl mount` through the kernel: real programs (sqlite3, cp, tar, python) and this process's own system calls.
@Suite("FUSE mount", .ownThread, .serialized, .enabled(if: FUSEAvailability.isAvailable, "needs /dev/fuse and fusermount3"))
struct MountTests {
    // MARK: SQLite

    @Test("SQLite in rollback-journal mode: a connection held across the lock gets I/O errors, works again after unlock, nothing lost",
          .timeLimit(.minutes(2)))
    func sqliteRollbackJournal() throws {
        let (mounted, database, client) = try lockedDatabase(journalMode: "delete")
        let lockedQuery = client.execute("SELECT count(*) FROM notes")
        #expect(lockedQuery?.hasPrefix("error disk I/O error") == true, "\(lockedQuery ?? "no answer")")
        let lockedInsert = client.execute("INSERT INTO notes(body) VALUES ('while locked')")
        #expect(lockedInsert?.hasPrefix("error") == true, "\(lockedInsert ?? "no answer")")
        try expectUnopenable(database)

        try mounted.unlock()
        #expect(client.execute("PRAGMA integrity_check") == "ok [[\"ok\"]]")
        #expect(client.execute("SELECT count(*) FROM notes") == "ok [[1001]]")
        #expect(client.execute("INSERT INTO notes(body) VALUES ('after unlock')") == "ok []")
        let check = try sqlite3(database, "PRAGMA integrity_check; SELECT count(*) FROM notes;")
        #expect(check.stdout == "ok\n1002\n", "\(check)")
        #expect(try sandboxctl(mounted.test, ["protection", "\(TestDevice.bundleIdentifier):\(mounted.container.applicationSupportPath)/notes.db"])
            .stdout.contains("complete"))
    }

    @Test("SQLite in WAL mode: a connection held across the lock crashes on the mapped -shm (SIGBUS, as iOS apps do); every committed row survives",
          .timeLimit(.minutes(2)))
    func sqliteWAL() throws {
        let (mounted, database, client) = try lockedDatabase(journalMode: "wal")
        // SQLite reads the WAL index from its shared mapping of notes.db-shm; the lock dropped those pages and
        // refaulting them fails, like walIndexTryHdr's crash on a locked iPhone.
        #expect(client.execute("SELECT count(*) FROM notes") == nil)
        #expect(client.spawned.waitForExit(timeout: 10) != nil)
        #expect(client.spawned.process.terminationReason == .uncaughtSignal && client.spawned.process.terminationStatus == SIGBUS)
        try expectUnopenable(database)

        try mounted.unlock()
        let check = try sqlite3(database, "PRAGMA integrity_check; SELECT count(*) FROM notes; PRAGMA journal_mode;")
        #expect(check.stdout == "ok\n1001\nwal\n", "\(check)")
        let reopened = try SQLiteClient(database: database)
        #expect(reopened.execute("INSERT INTO notes(body) VALUES ('after unlock')") == "ok []")
        #expect(reopened.execute("SELECT count(*) FROM notes") == "ok [[1002]]")
    }

    /// A mounted device with notes.db (class A) in the app's folder: 1001 committed rows in `journalMode`, a
    /// connection holding it open, then the lock.
    private func lockedDatabase(journalMode: String) throws -> (MountedDevice, String, SQLiteClient) {
        let mounted = try MountedDevice()
        let database = (mounted.applicationSupport as NSString).appendingPathComponent("notes.db")
        let client = try SQLiteClient(database: database)
        #expect(client.execute("PRAGMA journal_mode=\(journalMode)") == "ok [[\"\(journalMode)\"]]")
        try fill(client, rows: 1000)
        #expect(client.execute("INSERT INTO notes(body) VALUES ('last before lock')") == "ok []")
        try mounted.lock()
        return (mounted, database, client)
    }

    /// A fresh sqlite3 can't open the database while locked.
    private func expectUnopenable(_ database: String) throws {
        let fresh = try sqlite3(database, "SELECT count(*) FROM notes;")
        #expect(fresh.status != 0 && fresh.stderr.contains("unable to open database"), "\(fresh)")
    }

    private func fill(_ client: SQLiteClient, rows: Int) throws {
        #expect(client.execute("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)") == "ok []")
        #expect(client.execute("BEGIN") == "ok []")
        for index in 0..<rows {
            if client.execute("INSERT INTO notes(body) VALUES ('note \(index) \(String(repeating: "x", count: index % 200))')") != "ok []" {
                Issue.record("insert \(index) failed")
                return
            }
        }
        #expect(client.execute("COMMIT") == "ok []")
        #expect(client.execute("SELECT count(*) FROM notes") == "ok [[\(rows)]]")
    }

    private func sqlite3(_ database: String, _ sql: String) throws -> CLI.Result {
        try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("sqlite3") ?? "/usr/bin/sqlite3"), [database, sql])
    }

    // MARK: Copies

    @Test("a tree copied in and out with cp -a and tar is byte-identical, modes, times and symlinks included", arguments: MountTransport.testable)
    func copyRoundTrip(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let scratch = TemporaryDirectory()
        let tree = scratch.file("tree")
        try makeTree(at: tree)
        let inside = mounted.path("Documents/tree")
        #expect(try run("/bin/cp", ["-a", tree, inside]).status == 0)
        #expect(try run("/usr/bin/diff", ["-r", "--no-dereference", tree, inside]).status == 0)
        #expect(try run("/bin/cp", ["-a", inside, scratch.file("back")]).status == 0)
        #expect(try listing(tree) == listing(scratch.file("back")))

        let archive = scratch.file("tree.tar")
        #expect(try run("/bin/tar", ["-C", tree, "-cf", archive, "."]).status == 0)
        try FileManager.default.createDirectory(atPath: mounted.path("Documents/untarred"), withIntermediateDirectories: false)
        #expect(try run("/bin/tar", ["-C", mounted.path("Documents/untarred"), "-xf", archive]).status == 0)
        let again = scratch.file("again.tar")
        #expect(try run("/bin/tar", ["-C", mounted.path("Documents/untarred"), "-cf", again, "."]).status == 0)
        try FileManager.default.createDirectory(atPath: scratch.file("out"), withIntermediateDirectories: false)
        #expect(try run("/bin/tar", ["-C", scratch.file("out"), "-xf", again]).status == 0)
        #expect(try listing(tree) == listing(scratch.file("out")))

        // Stored encrypted: no file of the container holds the plaintext.
        let marker = Array("plaintext marker that must not be stored".utf8)
        let stored = try FileManager.default.subpathsOfDirectory(atPath: mounted.container.dataPath)
        for name in stored {
            let bytes = FileManager.default.contents(atPath: (mounted.container.dataPath as NSString).appendingPathComponent(name)) ?? Data()
            #expect(!Array(bytes).contains(subsequence: marker), "\(name) holds plaintext")
        }
        #expect(try run("/bin/rm", ["-rf", inside, mounted.path("Documents/untarred")]).status == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: mounted.path("Documents")) == ["Inbox"])
    }

    @Test("folders made ahead and removed behind: each mkdir gets its mode and its own times, rm -rf leaves no stored folder, and unmount leaves nothing of the pool", arguments: MountTransport.testable)
    func foldersMadeAheadAndRemovedBehind(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let pools = { try FileManager.default.contentsOfDirectory(atPath: mounted.container.dataPath).filter { $0.hasPrefix(".sandboxctl-tmp-folders-") } }
        #expect(try pools().count == 1, "the mount's pool")
        // The pool fills when the mount starts; its folders are two seconds old when these mkdirs take them.
        #expect(mkdir(mounted.path("Documents/f0"), 0o750) == 0)
        Thread.sleep(forTimeInterval: 2)
        let before = Date().addingTimeInterval(-0.5)
        // More than the pool holds, so some are made ahead and some built in place while it refills.
        let count = FolderPool.defaultSize + 32
        for index in 1..<count {
            #expect(mkdir(mounted.path("Documents/f\(index)"), 0o750) == 0, "mkdir f\(index): \(String(cString: strerror(errno)))")
        }
        #expect(try run("/bin/mkdir", ["-p", mounted.path("Documents/f7/a/b/c")]).status == 0)
        for index in 0..<count {
            let attributes = try FileManager.default.attributesOfItem(atPath: mounted.path("Documents/f\(index)"))
            #expect((attributes[.posixPermissions] as? Int) == 0o750)
            #expect(index == 0 || ((attributes[.modificationDate] as? Date) ?? .distantPast) >= before, "f\(index) has the times of its mkdir")
        }
        // In a set-group-ID folder a new folder takes the group and the bit, as on ext4: it is built there, not taken.
        #expect(chmod(mounted.path("Documents/f0"), 0o2770) == 0)
        #expect(mkdir(mounted.path("Documents/f0/shared"), 0o750) == 0)
        var shared = stat()
        #expect(stat(mounted.path("Documents/f0/shared"), &shared) == 0 && shared.st_mode & S_ISGID != 0, "mode \(String(shared.st_mode, radix: 8))")
        writeRaw(Array("inside".utf8), mounted.path("Documents/f7/a/b/c/note.txt"))
        #expect(String(decoding: readRaw(mounted.path("Documents/f7/a/b/c/note.txt")), as: UTF8.self) == "inside")
        #expect(try mounted.container.contents(atPath: "Documents/f7/a/b/c/note.txt") == Data("inside".utf8), "the library reads it beside the mount")

        // A folder a crash left half-built inside one (ours, hidden) goes with it.
        let halfBuilt = (try mounted.container.storedPath("Documents/f3") as NSString).appendingPathComponent(".sandboxctl-tmp-0123456789abcdef")
        try FileManager.default.createDirectory(atPath: halfBuilt, withIntermediateDirectories: false)
        writeRaw([UInt8](repeating: 1, count: 16), (halfBuilt as NSString).appendingPathComponent(".sandboxctl-diriv"))
        #expect(rmdir(mounted.path("Documents/f3")) == 0)
        #expect(posixError(Int(rmdir(mounted.path("Documents/f7")))) == ENOTEMPTY, "a folder with items is not removed")
        #expect(try run("/bin/rm", ["-rf"] + (0..<count).filter { $0 != 3 }.map { mounted.path("Documents/f\($0)") }).status == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: mounted.path("Documents")) == ["Inbox"])
        let storedDocuments = try mounted.container.storedPath("Documents")
        #expect(try FileManager.default.contentsOfDirectory(atPath: storedDocuments).filter { !$0.hasPrefix(".sandboxctl") }.count == 1, "only the Inbox is stored")
        // The removed folders go once their removals are durable; at unmount the pool goes with the rest.
        #expect(try run(FUSEAvailability.executable("fusermount3") ?? "/bin/fusermount3", ["-u", mounted.mountPoint]).status == 0)
        #expect(mounted.mount.waitForExit(timeout: 30) != nil)
        let left = try FileManager.default.subpathsOfDirectory(atPath: mounted.container.dataPath).filter { ($0 as NSString).lastPathComponent.hasPrefix(".sandboxctl-tmp-") }
        #expect(left.isEmpty, "left after unmount: \(left)")
    }

    @Test("a pool of folders left by an ended mount is emptied and removed by the next; one still held is not; a folder in it holding an item of the user's is kept and reported")
    func abandonedFolderPools() throws {
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .none)
        let root = device.container.dataPath
        let pools = { try FileManager.default.contentsOfDirectory(atPath: root).filter { $0.hasPrefix(".sandboxctl-tmp-folders-") }.sorted() }
        let live = ContainerFileSystem(container: device.container)
        live.makeFoldersAhead(size: 2, inBackground: false)
        let held = try pools()
        #expect(held.count == 1)
        // Left by a mount that was killed: a folder made ahead (its IV only) and a removed one an item landed in.
        let old = (root as NSString).appendingPathComponent(".sandboxctl-tmp-folders-0123456789abcdef")
        for folder in ["ahead", "removed"] {
            let path = (old as NSString).appendingPathComponent(".sandboxctl-tmp-\(folder)")
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            writeRaw([UInt8](repeating: 7, count: 16), (path as NSString).appendingPathComponent(".sandboxctl-diriv"))
        }
        writeRaw(Array("keep me".utf8), (old as NSString).appendingPathComponent(".sandboxctl-tmp-removed/item"))
        let logged = Locked<[String]>([])
        let next = try FolderPool(root: device.container.directory.root, rootPath: root, size: 2, inBackground: false) { problem in logged.withLock { $0.append(problem) } }
        let afterSweep = try pools()
        #expect(afterSweep.count == 3, "the live pool, the new one, and the old one with what it keeps: \(afterSweep)")
        #expect(!FileManager.default.fileExists(atPath: (old as NSString).appendingPathComponent(".sandboxctl-tmp-ahead")))
        #expect(readRaw((old as NSString).appendingPathComponent(".sandboxctl-tmp-removed/item")) == Array("keep me".utf8))
        #expect(logged.withLock { $0 }.contains { $0.contains(".sandboxctl-tmp-folders-0123456789abcdef/.sandboxctl-tmp-removed") && $0.contains("is kept as it is") && $0.contains("1 item(s)") })
        next.close()
        live.stopMakingFoldersAhead()
        #expect(try pools() == [".sandboxctl-tmp-folders-0123456789abcdef"], "closed pools are gone")
        // Once the item is moved out, the next pool removes the rest.
        try FileManager.default.removeItem(atPath: (old as NSString).appendingPathComponent(".sandboxctl-tmp-removed/item"))
        try FolderPool(root: device.container.directory.root, rootPath: root, size: 2, inBackground: false).close()
        #expect(try pools().isEmpty)
    }

    @Test("a pool in the background fills at once, removes a removed folder in a pause, and when closed while it waits finishes what it holds")
    func folderPoolInTheBackground() throws {
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .none)
        let root = device.container.dataPath
        let stored = { (name: String) in (root as NSString).appendingPathComponent(name) }
        let parent = device.container.directory.root
        func makeOwnFolder(_ name: String) {
            try? FileManager.default.createDirectory(atPath: stored(name), withIntermediateDirectories: false)
            writeRaw([UInt8](repeating: 3, count: 16), (stored(name) as NSString).appendingPathComponent(".sandboxctl-diriv"))
        }
        func eventually(_ condition: () throws -> Bool) rethrows -> Bool {
            for _ in 0..<200 {
                if try condition() { return true }
                Thread.sleep(forTimeInterval: 0.05)
            }
            return try condition()
        }
        let pool = try FolderPool(root: parent, rootPath: root, size: 16)
        let poolFolder = try #require(try FileManager.default.contentsOfDirectory(atPath: root).first { $0.hasPrefix(".sandboxctl-tmp-folders-") })
        let inPool = { (name: String) in ((stored(poolFolder) as NSString).appendingPathComponent(name) as NSString).appendingPathComponent(".sandboxctl-diriv") }
        // The worker may be building or removing one meanwhile: a folder without its IV reads as nil.
        let poolIVs = { try FileManager.default.contentsOfDirectory(atPath: stored(poolFolder)).map { FileManager.default.contents(atPath: inPool($0)).map(Array.init) } }
        // As a mkdir does: out of the pool, into place (once a refill under way has handed its folders out).
        func takeIntoPlace(_ name: String) throws {
            var taken = pool.take()
            for _ in 0..<200 where taken == nil {
                Thread.sleep(forTimeInterval: 0.05)
                taken = pool.take()
            }
            let folder = try #require(taken)
            #expect(readRaw(inPool(folder.name)) == folder.iv)
            #expect(rename((stored(poolFolder) as NSString).appendingPathComponent(folder.name), stored(name)) == 0)
        }
        #expect(try eventually { let ivs = try poolIVs(); return ivs.count == 16 && !ivs.contains(nil) }, "filled without a take")

        try takeIntoPlace("made-0")
        makeOwnFolder("gone-in-a-pause")
        #expect(pool.remove("gone-in-a-pause", in: parent, displayPath: "gone-in-a-pause") == .removed)
        #expect(!FileManager.default.fileExists(atPath: stored("gone-in-a-pause")))
        #expect(try eventually { let ivs = try poolIVs(); return ivs.count == 16 && !ivs.contains(nil) && !ivs.contains([UInt8](repeating: 3, count: 16)) },
                "in a pause the removed folder goes and the taken one is made again")

        // Taken down to a refill, with a removal parked: the worker waits for a pause, which close() cuts short.
        for index in 1...8 { try takeIntoPlace("made-\(index)") }
        makeOwnFolder("gone-at-close")
        #expect(pool.remove("gone-at-close", in: parent, displayPath: "gone-at-close") == .removed)
        pool.close()
        #expect(try !FileManager.default.contentsOfDirectory(atPath: root).contains { $0.hasPrefix(".sandboxctl-tmp-folders-") }, "closing finished the removal and removed the pool")
    }

    @Test("a refill whose IV fsyncs fail hands out no folder, leaves none behind, and says what went wrong; the next one works")
    func folderPoolFailedRefill() throws {
        let device = try ProtectedStoreTesting.TestDevice(defaultProtection: .none)
        let root = device.container.dataPath
        let logged = Locked<[String]>([])
        let pool = try FolderPool(root: device.container.directory.root, rootPath: root, size: 4, inBackground: false) { problem in logged.withLock { $0.append(problem) } }
        defer { pool.close() }
        let poolFolder = try #require(try FileManager.default.contentsOfDirectory(atPath: root).first { $0.hasPrefix(".sandboxctl-tmp-folders-") })
        let rule = FaultInjection.install(FaultInjection.Rule(.synchronize, folder: root, pattern: "\(poolFolder)/*/.sandboxctl-diriv", errno: .ioError))
        #expect(pool.take() == nil, "nothing was ready")
        FaultInjection.remove(rule)
        #expect(try FileManager.default.contentsOfDirectory(atPath: (root as NSString).appendingPathComponent(poolFolder)).isEmpty, "the folders whose IV was not durable are gone")
        let messages = logged.withLock { $0 }
        #expect(messages.count == 1 && messages[0].contains("\(poolFolder)/.sandboxctl-tmp-") && messages[0].contains(".sandboxctl-diriv")
                && messages[0].contains("fsync") && messages[0].contains("mkdirs build their folders in place"), "\(messages)")
        #expect(pool.take() == nil, "the failed refill handed out nothing; this take starts the next")
        #expect(pool.take() != nil)
    }

    @Test("a directory too large for one reply lists every entry once, with the plaintext sizes in its attributes", arguments: MountTransport.testable)
    func largeListing(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let folder = mounted.path("Documents/many")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        var expected: [String: Int] = [:]
        for index in 0..<600 {
            // Long names, so the listing takes many replies (readdirplus entries carry attributes too).
            let name = String(format: "%04d-", index) + String(repeating: "n", count: 150)
            writeRaw(pattern(index), "\(folder)/\(name)")
            expected[name] = index
        }
        let names = try FileManager.default.contentsOfDirectory(atPath: folder)
        #expect(names.count == expected.count && Set(names) == Set(expected.keys))
        // Listed afresh after the kernel forgot the entries: the sizes come with the listing, not from lookups.
        sync()
        try? Data("2\n".utf8).write(to: URL(fileURLWithPath: "/proc/sys/vm/drop_caches"))
        let found = try run("/usr/bin/find", [folder, "-mindepth", "1", "-printf", "%s %f\n"])
        var sizes: [String: Int] = [:]
        for line in found.stdout.split(separator: "\n") {
            let fields = line.split(separator: " ", maxSplits: 1)
            sizes[String(fields[1])] = Int(fields[0])
        }
        let wrong = expected.filter { sizes[$0.key] != $0.value }.map { "\($0.key.prefix(4)): \(sizes[$0.key].map(String.init) ?? "missing")" }
        #expect(sizes.count == expected.count && wrong.isEmpty, "\(sizes.count) listed; wrong sizes: \(wrong.prefix(5))")
    }

    /// Files of several sizes (empty, one block, around block edges, 3 MiB), nested folders, modes, an old mtime, symlinks.
    private func makeTree(at root: String) throws {
        let manager = FileManager.default
        try manager.createDirectory(atPath: "\(root)/src/deep/er", withIntermediateDirectories: true)
        var generator = SplitMix64(seed: 6)
        for (index, size) in [0, 1, 4095, 4096, 4097, 65_537, 3 << 20].enumerated() {
            let bytes = (0..<size).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
            writeRaw(bytes, "\(root)/src/file\(index).bin")
        }
        writeRaw(Array("plaintext marker that must not be stored\n".utf8), "\(root)/src/deep/er/marker.txt")
        try manager.setAttributes([.posixPermissions: 0o640], ofItemAtPath: "\(root)/src/file1.bin")
        try manager.setAttributes([.posixPermissions: 0o755], ofItemAtPath: "\(root)/src/file2.bin")
        try manager.setAttributes([.modificationDate: Date(timeIntervalSince1970: 1_000_000_000)], ofItemAtPath: "\(root)/src/file3.bin")
        try manager.createSymbolicLink(atPath: "\(root)/src/link", withDestinationPath: "deep/er/marker.txt")
        try manager.createSymbolicLink(atPath: "\(root)/src/deep/up", withDestinationPath: "../file0.bin")
    }

    /// Every entry's path, type, mode, size, mtime (seconds), link target and content digest.
    private func listing(_ root: String) throws -> [String] {
        let result = try run("/usr/bin/find", [root, "-mindepth", "1", "-printf", "%P %y %m %s %T@ %l\n"])
        let checksums = try run("/bin/sh", ["-c", "cd '\(root)' && find . -type f -exec sha256sum {} + | sort"])
        return result.stdout.split(separator: "\n").map { line in
            // Whole seconds: tar keeps only those.
            var fields = line.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
            if fields.count > 4 { fields[4] = String(fields[4].prefix(while: { $0 != "." })) }
            return fields.joined(separator: " ")
        }.sorted() + checksums.stdout.split(separator: "\n").map(String.init)
    }

    // MARK: Protection

    @Test("class A: a descriptor read once fails after the lock (no cached plaintext), new opens and creates fail; after unlock the descriptor works again", arguments: MountTransport.testable)
    func classAAcrossLock(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let path = (mounted.applicationSupport as NSString).appendingPathComponent("secret.txt")
        writeRaw(Array("class A secret\n".utf8), path)
        #expect(try xattr(path) == "complete")
        let fd = open(path, O_RDONLY)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(readString(fd) == "class A secret\n")
        // Open files whose name is gone: unlinked, and replaced by a rename (an editor's save).
        let unlinkedPath = (mounted.applicationSupport as NSString).appendingPathComponent("unlinked.txt")
        let replacedPath = (mounted.applicationSupport as NSString).appendingPathComponent("replaced.txt")
        writeRaw(Array("unlinked secret".utf8), unlinkedPath)
        writeRaw(Array("replaced secret".utf8), replacedPath)
        let unlinked = open(unlinkedPath, O_RDONLY), replaced = open(replacedPath, O_RDONLY)
        defer { close(unlinked); close(replaced) }
        #expect(readString(unlinked) == "unlinked secret" && readString(replaced) == "replaced secret")
        #expect(unlink(unlinkedPath) == 0)
        writeRaw(Array("new version".utf8), replacedPath + ".new")
        #expect(rename(replacedPath + ".new", replacedPath) == 0)
        #expect(readString(unlinked) == "unlinked secret" && readString(replaced) == "replaced secret")

        try mounted.lock()
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(posixError(pread(fd, &buffer, 64, 0)) == EPERM, "the cached page was served after the lock")
        #expect(posixError(pread(unlinked, &buffer, 64, 0)) == EPERM, "an unlinked open file's cached page was served after the lock")
        #expect(posixError(pread(replaced, &buffer, 64, 0)) == EPERM, "a replaced open file's cached page was served after the lock")
        #expect(posixError(Int(open(path, O_RDONLY))) == EPERM)
        let created = (mounted.applicationSupport as NSString).appendingPathComponent("new.txt")
        #expect(posixError(Int(open(created, O_CREAT | O_WRONLY, 0o600))) == EPERM)
        #expect(!FileManager.default.fileExists(atPath: created))
        // Names and sizes stay visible, as on iOS.
        #expect((try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) == 15)

        try mounted.unlock()
        #expect(readString(fd) == "class A secret\n")
        #expect(readString(unlinked) == "unlinked secret")
    }

    @Test("large writes are answered before they are stored: times set after them stay, a lock right after them keeps every byte, and the next write fails at once", arguments: MountTransport.testable)
    func writesBehindAcrossLock(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let path = mounted.path("Documents/big.bin")
        let fd = open(path, O_CREAT | O_WRONLY, 0o600)
        #expect(fd >= 0)
        defer { close(fd) }
        let chunk = 2 * EncryptedFile.writeBehindThreshold
        var expected: [UInt8] = []
        for index in 0..<64 {
            let data = pattern(chunk, seed: UInt8(index))
            #expect(data.withUnsafeBytes { write(fd, $0.baseAddress, chunk) } == chunk)
            expected += data
        }
        try mounted.lock()
        #expect(posixError(pattern(chunk).withUnsafeBytes { write(fd, $0.baseAddress, chunk) }) == EPERM)
        try mounted.unlock()
        #expect(readRaw(path) == expected)
        let reopened = open(path, O_WRONLY | O_APPEND)
        #expect(reopened >= 0)
        #expect(pattern(chunk).withUnsafeBytes { write(reopened, $0.baseAddress, chunk) } == chunk)
        #expect(close(reopened) == 0)
        #expect(readRaw(path) == expected + pattern(chunk))

        // Times set while writes are queued stay (cp -p, rsync -t): the stored file is not written after them.
        let stamped = mounted.path("Documents/stamped.bin")
        let chunks = (0..<64).map { pattern(chunk, seed: UInt8($0)) }
        let stampedFD = open(stamped, O_CREAT | O_WRONLY, 0o600)
        #expect(stampedFD >= 0)
        for data in chunks {
            #expect(data.withUnsafeBytes { write(stampedFD, $0.baseAddress, chunk) } == chunk)
        }
        var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        #expect(futimens(stampedFD, &times) == 0)
        #expect(close(stampedFD) == 0)
        let storedDate = try mounted.container.attributesOfItem(atPath: "Documents/stamped.bin")[.modificationDate] as? Date
        #expect(storedDate == Date(timeIntervalSince1970: 1_000_000_000))
    }

    @Test("class A: a mapping made before the lock faults with SIGBUS after it, and maps again after unlock", arguments: MountTransport.testable)
    func classAMapping(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let path = (mounted.applicationSupport as NSString).appendingPathComponent("mapped.bin")
        writeRaw(Array("mapped secret".utf8), path)
        let script = """
            import mmap, os, signal, subprocess, sys
            path, sandboxctl, root, secret = sys.argv[1:5]
            fd = os.open(path, os.O_RDONLY)
            mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            assert mapping[:13] == b"mapped secret"
            subprocess.run([sandboxctl, "lock", "--root", root, "--device-secret", secret], check=True, stdout=subprocess.DEVNULL)
            child = os.fork()
            if child == 0:
                mapping[:13]
                os._exit(0)
            _, status = os.waitpid(child, 0)
            print("child", os.WTERMSIG(status) if os.WIFSIGNALED(status) else "exited")
            subprocess.run([sandboxctl, "unlock", "--passcode-stdin", "--root", root, "--device-secret", secret],
                           input=sys.argv[5].encode() + b"\\n", check=True, stdout=subprocess.DEVNULL)
            # The mount hears of the unlock as an event, a moment after `sandboxctl unlock` returns: wait for it.
            import time
            for _ in range(500):
                try:
                    with open(path, "rb") as f: f.read(13)
                    break
                except PermissionError:
                    time.sleep(0.01)
            print("after unlock", mapping[:13].decode())
            """
        let result = try python(script, [path, SpawnedProcess.builtExecutable("sandboxctl").path, mounted.test.root, mounted.test.secretPath, TestDevice.passcode])
        #expect(result.output == "child \(SIGBUS)\nafter unlock mapped secret\n", "\(result)")
    }

    @Test("class B: a descriptor opened before the lock keeps reading and writing; new class B files are created and written while locked", arguments: MountTransport.testable)
    func classBAcrossLock(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let folder = mounted.path("Documents/outbox")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        #expect(setxattr(folder, ContainerFileSystem.protectionAttribute, "complete-unless-open", 20, 0) == 0)
        let path = (folder as NSString).appendingPathComponent("draft.txt")
        writeRaw(Array("draft\n".utf8), path)
        #expect(try xattr(path) == "complete-unless-open")
        let fd = open(path, O_RDWR)
        #expect(fd >= 0)
        defer { close(fd) }

        try mounted.lock()
        #expect(readString(fd) == "draft\n")
        #expect(pwrite(fd, "more\n", 5, 6) == 5)
        #expect(readString(fd) == "draft\nmore\n")
        let queued = (folder as NSString).appendingPathComponent("queued.txt")
        let created = open(queued, O_CREAT | O_WRONLY, 0o600)
        #expect(created >= 0)
        #expect(write(created, "written while locked", 20) == 20)
        close(created)
        // Closed while locked: it can't be read until the unlock. The kernel sends the mount the last close (RELEASE)
        // after close(2) has returned, and an open can be served first (on another ring thread over io_uring), so
        // it is the mount's answer once the close has reached it. A reopen that still succeeds closes again at once.
        #expect(eventually(timeout: 5) {
            let reopened = open(queued, O_RDONLY)
            if reopened >= 0 { close(reopened) }
            return reopened < 0 && errno == EPERM
        })

        try mounted.unlock()
        #expect(String(decoding: readRaw(queued), as: UTF8.self) == "written while locked")
        #expect(String(decoding: try mounted.container.contents(atPath: "Documents/outbox/draft.txt"), as: UTF8.self) == "draft\nmore\n")
    }

    // MARK: Inbox

    @Test("the Inbox through the mount: read and unlink only; create, write, truncate, rename into, chmod +w, mkdir and symlink get EACCES")
    func inboxRule() throws {
        let mounted = try MountedDevice()
        let source = mounted.test.path("report.txt")
        writeRaw(Array("delivered\n".utf8), source)
        let delivered = try sandboxctl(mounted.test, ["inbox", "deliver", TestDevice.bundleIdentifier, source])
        #expect(delivered.status == 0, "\(delivered.stderr)")
        let item = mounted.path("Documents/Inbox/report.txt")
        // Listed first, before any lookup: the attributes the listing carries (readdirplus) follow the same rules.
        let listed = try run("/usr/bin/find", [mounted.path("Documents/Inbox"), "-mindepth", "1", "-printf", "%M %s %f\n"])
        #expect(listed.stdout.hasPrefix("-r") && !listed.stdout.contains("w") && listed.stdout.hasSuffix(" 10 report.txt\n"), "\(listed.stdout)")
        #expect(String(decoding: readRaw(item), as: UTF8.self) == "delivered\n")
        let mode = (try FileManager.default.attributesOfItem(atPath: item)[.posixPermissions] as? Int) ?? -1
        #expect(mode & 0o222 == 0, "Inbox items show no write permission: \(String(mode, radix: 8))")

        #expect(posixError(Int(open(item, O_WRONLY))) == EACCES)
        #expect(posixError(Int(access(item, W_OK))) == EACCES, "access(2) says so too, even to root")
        #expect(access(item, R_OK) == 0)
        #expect(posixError(Int(open(item, O_RDONLY | O_TRUNC))) == EACCES)
        #expect(posixError(Int(open(mounted.path("Documents/Inbox/new.txt"), O_CREAT | O_WRONLY, 0o600))) == EACCES)
        #expect(posixError(Int(truncate(item, 0))) == EACCES)
        #expect(posixError(Int(chmod(item, 0o644))) == EACCES)
        #expect(chmod(item, 0o400) == 0, "removing permissions is allowed")
        #expect(posixError(Int(mkdir(mounted.path("Documents/Inbox/folder"), 0o700))) == EACCES)
        #expect(posixError(Int(symlink("report.txt", mounted.path("Documents/Inbox/link")))) == EACCES)
        #expect(posixError(Int(setxattr(item, ContainerFileSystem.protectionAttribute, "none", 4, 0))) == EACCES)
        writeRaw(Array("outside".utf8), mounted.path("Documents/outside.txt"))
        #expect(posixError(Int(rename(mounted.path("Documents/outside.txt"), mounted.path("Documents/Inbox/moved.txt")))) == EACCES)
        #expect(posixError(Int(rename(item, mounted.path("Documents/Inbox/renamed.txt")))) == EACCES)
        #expect(eventually { mounted.log.contains("Documents/Inbox is read-and-delete only") }, "the refusal is logged with its remedy")

        #expect(rename(item, mounted.path("Documents/report.txt")) == 0, "moving out is allowed")
        #expect(String(decoding: readRaw(mounted.path("Documents/report.txt")), as: UTF8.self) == "delivered\n")
        #expect(rename(mounted.path("Documents/report.txt"), item) != 0)
        let second = try sandboxctl(mounted.test, ["inbox", "deliver", TestDevice.bundleIdentifier, source])
        #expect(second.status == 0, "\(second.stderr)")
        let reader = open(item, O_RDONLY)
        #expect(reader >= 0)
        #expect(unlink(item) == 0, "deleting is allowed, also while a reader has the item open")
        #expect(readString(reader) == "delivered\n")
        close(reader)
        #expect(eventually { (try? FileManager.default.contentsOfDirectory(atPath: mounted.path("Documents/Inbox")).isEmpty) == true })
    }

    // MARK: Extended attribute

    @Test("user.protection.class reads and sets a file's class and a directory's class for new files; bad values are refused; removing it gives the folder's")
    func protectionAttribute() throws {
        let mounted = try MountedDevice()
        let file = mounted.path("Documents/a.txt")
        writeRaw(Array("a".utf8), file)
        #expect(try xattr(file) == "complete")
        #expect(try attributeNames(file) == [], "not listed: copies take their new folder's class")
        #expect(setxattr(file, ContainerFileSystem.protectionAttribute, "none", 4, 0) == 0)
        #expect(try xattr(file) == "none")
        #expect(mounted.container.protection(of: "Documents/a.txt")?.rawValue == FileProtectionType.none.rawValue)
        #expect(setxattr(file, ContainerFileSystem.protectionAttribute, "NSFileProtectionCompleteUnlessOpen", 34, 0) == 0)
        #expect(try xattr(file) == "complete-unless-open")
        #expect(posixError(Int(setxattr(file, ContainerFileSystem.protectionAttribute, "secret", 6, 0))) == EINVAL)
        #expect(posixError(Int(getxattr(file, "user.other", nil, 0))) == ENODATA)
        #expect(removexattr(file, ContainerFileSystem.protectionAttribute) == 0)
        #expect(try xattr(file) == "complete", "removed: the folder's class")

        let folder = mounted.path("Documents/plain")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        #expect(posixError(Int(getxattr(folder, ContainerFileSystem.protectionAttribute, nil, 0))) == ENODATA)
        #expect(setxattr(folder, ContainerFileSystem.protectionAttribute, "C", 1, 0) == 0)
        #expect(try xattr(folder) == "complete-until-first-user-authentication")
        writeRaw(Array("b".utf8), "\(folder)/b.txt")
        #expect(try xattr("\(folder)/b.txt") == "complete-until-first-user-authentication")
        try FileManager.default.createDirectory(atPath: "\(folder)/sub", withIntermediateDirectories: false)
        #expect(try xattr("\(folder)/sub") == "complete-until-first-user-authentication", "new folders take their parent's class")
        #expect(removexattr(folder, ContainerFileSystem.protectionAttribute) == 0)
        #expect(posixError(Int(getxattr(folder, ContainerFileSystem.protectionAttribute, nil, 0))) == ENODATA)
        // The marker is ProtectedStore's own: invisible, and the folder can be removed once its files are gone.
        #expect(try FileManager.default.contentsOfDirectory(atPath: "\(folder)/sub").isEmpty)
        #expect(rmdir("\(folder)/sub") == 0)
    }

    // MARK: POSIX surface

    @Test("POSIX surface: offsets, truncate, rename over, RENAME_NOREPLACE and EXCHANGE, unlink while open, statfs, utimens, chmod, locks", arguments: MountTransport.testable)
    func posixSurface(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let a = mounted.path("Documents/a.bin"), b = mounted.path("Documents/b.bin")
        let fd = open(a, O_CREAT | O_RDWR, 0o640)
        #expect(fd >= 0)
        let big = pattern(8 << 20, seed: 3)
        #expect(big.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 4096 * 3 + 17) } == big.count)
        #expect(ftruncate(fd, 5_000_000) == 0)
        #expect(fsync(fd) == 0)
        var info = stat()
        #expect(fstat(fd, &info) == 0 && info.st_size == 5_000_000 && info.st_mode & 0o777 == 0o640)
        var back = [UInt8](repeating: 0xFF, count: 5_000_000)
        #expect(back.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) } == 5_000_000)
        #expect(back[0..<12305].allSatisfy { $0 == 0 })
        #expect(Array(back[12305...]) == Array(big[0..<(5_000_000 - 12305)]))
        close(fd)
        #expect(truncate(a, 10) == 0)
        #expect(stat(a, &info) == 0 && info.st_size == 10)

        writeRaw(Array("bee".utf8), b)
        #expect(rename(b, a) == 0, "rename over an existing file")
        #expect(String(decoding: readRaw(a), as: UTF8.self) == "bee")
        writeRaw(Array("sea".utf8), b)
        #expect(ps_rename_noreplace(AT_FDCWD, b, AT_FDCWD, a) == -1 && errno == EEXIST)
        #expect(ps_rename_exchange(AT_FDCWD, b, AT_FDCWD, a) == 0)
        #expect(String(decoding: readRaw(a), as: UTF8.self) == "sea" && String(decoding: readRaw(b), as: UTF8.self) == "bee")

        let held = open(b, O_RDWR)
        #expect(unlink(b) == 0 && held >= 0)
        #expect(pwrite(held, "still", 5, 0) == 5 && readString(held) == "still")
        close(held)

        var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, a, &times, 0) == 0)
        #expect(stat(a, &info) == 0 && info.st_mtim.tv_sec == 1_000_000_000)
        #expect(chmod(a, 0o600) == 0 && stat(a, &info) == 0 && info.st_mode & 0o777 == 0o600)
        var fileSystem = statvfs()
        #expect(statvfs(mounted.mountPoint, &fileSystem) == 0 && fileSystem.f_bsize > 0 && fileSystem.f_blocks > 0)

        // ProtectedStore's own names neither show nor can be made; the container's own folders stay.
        #expect(posixError(Int(open(mounted.path("Documents/.sandboxctl-x"), O_CREAT | O_WRONLY, 0o600))) == EPERM)
        #expect(posixError(Int(rmdir(mounted.path("Documents/Inbox")))) == EPERM)
        #expect(posixError(Int(rename(mounted.path("tmp"), mounted.path("Documents/tmp")))) == EPERM)

        // Byte-range locks (SQLite's) and flock, between this process and another.
        let lockScript = """
            import fcntl, sys, time
            f = open(sys.argv[1], "r+b")
            fcntl.lockf(f, fcntl.LOCK_EX, 4, 0)
            print("locked", flush=True)
            sys.stdin.readline()
            """
        let holder = try SpawnedProcess(URL(fileURLWithPath: FUSEAvailability.executable("python3") ?? "/usr/bin/python3"), ["-c", lockScript, a])
        #expect(holder.nextLine() == "locked")
        let mine = open(a, O_RDWR)
        var range = flock(l_type: Int16(F_WRLCK), l_whence: Int16(SEEK_SET), l_start: 0, l_len: 4, l_pid: 0)
        #expect(fcntl(mine, F_SETLK, &range) == -1 && (errno == EAGAIN || errno == EACCES), "the other process's byte-range lock is seen")
        range.l_start = 4
        #expect(fcntl(mine, F_SETLK, &range) == 0, "a disjoint range can be locked")
        holder.send("")
        #expect(holder.waitForExit() == 0)
        range.l_start = 0
        #expect(fcntl(mine, F_SETLK, &range) == 0, "free once the other process is gone")
        let other = open(a, O_RDONLY)
        #expect(flock(mine, LOCK_EX | LOCK_NB) == 0)
        #expect(flock(other, LOCK_EX | LOCK_NB) == -1 && errno == EWOULDBLOCK)
        close(other)
        close(mine)
    }

    @Test("sparse files: a 1 TiB truncate is a hole that costs nothing, past the largest size is EFBIG and changes nothing; fallocate modes 0 and keep-size", arguments: MountTransport.testable)
    func sparseFilesAndAllocation(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let path = mounted.path("Documents/sparse.bin")
        writeRaw(Array("head".utf8), path)
        let stored = try mounted.container.storedPath("Documents/sparse.bin")
        func storedBytes() -> Int64 {
            var info = stat()
            return stat(stored, &info) == 0 ? Int64(info.st_blocks) * 512 : -1
        }
        let before = storedBytes()
        let started = Date()
        #expect(truncate(path, 1 << 40) == 0)
        // Loose, for a loaded machine: writing a tebibyte of zeros would take hours (and the backing file's size shows it).
        #expect(Date().timeIntervalSince(started) < 60, "a 1 TiB truncate returns at once")
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_size == 1 << 40)
        #expect(storedBytes() - before < 1 << 20, "the backing file grew by \(storedBytes() - before) bytes")
        let fd = open(path, O_RDWR)
        var tail = [UInt8](repeating: 0xFF, count: 8)
        #expect(tail.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 8, (1 << 40) - 8) } == 8 && tail == [UInt8](repeating: 0, count: 8))
        var head = [UInt8](repeating: 0, count: 4)
        #expect(head.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 4, 0) } == 4 && head == Array("head".utf8))
        // Past the format's largest size: EFBIG, and the file is as it was.
        #expect(posixError(Int(ftruncate(fd, Int.max))) == EFBIG)
        #expect(pwrite(fd, "x", 1, Int.max - 10) == -1)
        #expect(fstat(fd, &info) == 0 && info.st_size == 1 << 40)
        close(fd)
        // fallocate: mode 0 grows the file, keep-size only reserves; punching holes is not offered.
        let small = mounted.path("Documents/alloc.bin")
        writeRaw(Array("abc".utf8), small)
        #expect(try run("/usr/bin/fallocate", ["-l", "1MiB", small]).status == 0)
        #expect(stat(small, &info) == 0 && info.st_size == 1 << 20)
        #expect(Array(readRaw(small).prefix(4)) == Array("abc".utf8) + [0])
        #expect(try run("/usr/bin/fallocate", ["-n", "-o", "0", "-l", "4MiB", small]).status == 0)
        #expect(stat(small, &info) == 0 && info.st_size == 1 << 20)
        #expect(try CLI.run(executable: URL(fileURLWithPath: "/usr/bin/fallocate"), ["-p", "-o", "0", "-l", "4096", small]).status != 0)
        #expect(readRaw(small).count == 1 << 20)
    }

    @Test("symlinks stay inside: absolute and climbing targets are refused, a chain that would climb out is not followed")
    func symlinkConfinement() throws {
        let mounted = try MountedDevice()
        writeRaw(Array("target".utf8), mounted.path("Documents/target.txt"))
        #expect(symlink("target.txt", mounted.path("Documents/good")) == 0)
        #expect(String(decoding: readRaw(mounted.path("Documents/good")), as: UTF8.self) == "target")
        #expect(symlink("../tmp", mounted.path("Documents/tmp-link")) == 0)
        #expect(posixError(Int(symlink("/etc/passwd", mounted.path("Documents/absolute")))) == EPERM)
        #expect(posixError(Int(symlink("../../..", mounted.path("Documents/climb")))) == EPERM)
        #expect(posixError(Int(symlink("good/../../.sandboxctl-class", mounted.path("Documents/own")))) == EPERM)
        // ".." only leading: "up" → ".." then "x" → "up/.." would climb out through the first link.
        #expect(symlink("..", mounted.path("Documents/up")) == 0)
        #expect(posixError(Int(symlink("up/..", mounted.path("Documents/out")))) == EPERM)
        #expect(posixError(Int(symlink("../tmp/../..", mounted.path("Documents/zigzag")))) == EPERM)
        // A link made beside the mount (the library stores any target, as FileManager does) is not followed out either.
        try mounted.container.createSymbolicLink(atPath: "Documents/planted", withDestinationPath: "../../../../../etc")
        #expect(posixError(Int(open(mounted.path("Documents/planted/passwd"), O_RDONLY))) == EPERM)
        #expect(eventually { mounted.log.contains("following it could leave the container") }, "\(mounted.log)")
    }

    @Test("many threads writing and reading their own files at once through the mount", arguments: MountTransport.testable)
    func concurrentFiles(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let failures = Counter()
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            let path = mounted.path("Documents/worker-\(worker).bin")
            let contents = pattern(1 << 20 + worker * 4099, seed: UInt8(worker))
            for round in 0..<3 {
                writeRaw(contents, path)
                if readRaw(path) != contents { failures.increment() }
                if round == 2 { unlink(path) }
            }
        }
        #expect(failures.value == 0)
    }

    // MARK: Lifecycle

    @Test("mount in the background, busy and stale mount points, SIGTERM and fusermount3 -u unmount, no daemon is exit 69")
    func lifecycle() throws {
        let test = try TestDevice()
        _ = try test.makeContainer()
        let mountPoint = test.path("mnt")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
        let withoutDaemon = try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint])
        #expect(withoutDaemon.status == 69, "\(withoutDaemon)")

        let daemon = try DaemonProcess(test, grace: 1)
        defer { withExtendedLifetime(daemon) {} }
        try MountedDevice.unlock(test)
        let started = try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint])
        #expect(started.status == 0 && started.stdout.contains("Mounted \(TestDevice.bundleIdentifier) at \(mountPoint)"), "\(started)")
        #expect(MountPoint.mountedFileSystem(at: mountPoint) == "fuse.sandboxctl")
        let busy = try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint])
        #expect(busy.status == 1 && busy.stderr.contains("already mounted there (busy)"), "\(busy)")

        let pid = try #require(backgroundMountPID(mountPoint))
        kill(pid, SIGTERM)
        #expect(eventually { MountPoint.mountedFileSystem(at: mountPoint) == nil }, "SIGTERM unmounts")

        #expect(try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint]).status == 0)
        #expect(try run(FUSEAvailability.executable("fusermount3") ?? "fusermount3", ["-u", mountPoint]).status == 0)
        #expect(eventually { backgroundMountPID(mountPoint) == nil }, "the mount's process ends after fusermount3 -u")

        #expect(try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint]).status == 0)
        kill(try #require(backgroundMountPID(mountPoint)), SIGKILL)
        #expect(eventually { backgroundMountPID(mountPoint) == nil })
        let stale = try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint])
        #expect(stale.status == 1 && stale.stderr.contains("stale mount") && stale.stderr.contains("fusermount3 -u"), "\(stale)")
        #expect(try run(FUSEAvailability.executable("fusermount3") ?? "fusermount3", ["-u", mountPoint]).status == 0)

        writeRaw([1], test.path("mnt/occupied"))
        let nonEmpty = try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, mountPoint])
        #expect(nonEmpty.status == 64 && nonEmpty.stderr.contains("not empty"), "\(nonEmpty)")
        let missing = try sandboxctl(test, ["mount", TestDevice.bundleIdentifier, test.path("nowhere")])
        #expect(missing.status == 1 && missing.stderr.contains("mkdir -p"), "\(missing)")
    }

    @Test("over io_uring, SIGTERM while a file is held open: the lazy unmount still ends the mount's process, and the descriptor then fails",
          arguments: MountTransport.testable.filter { $0 == .ioUring })
    func terminateWhileBusy(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let path = mounted.path("Documents/held.txt")
        writeRaw(Array("held open".utf8), path)
        let fd = open(path, O_RDWR)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(readString(fd) == "held open")
        mounted.mount.signal(SIGTERM)
        // The rings carry every request, so nothing wakes libfuse's /dev/fuse loop: the mount's own unmount must.
        #expect(mounted.mount.waitForExit(timeout: 30) != nil, "the mount kept running after SIGTERM: \(mounted.log)")
        // Cached pages may still be read; anything that reaches the file system fails.
        #expect(posixError(Int(fsync(fd))) == ENOTCONN)
    }

    /// The pid of the background mount serving `mountPoint`, from /proc.
    private func backgroundMountPID(_ mountPoint: String) -> Int32? {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        for entry in entries {
            guard let pid = Int32(entry),
                  let command = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline"),
                  let status = try? String(contentsOfFile: "/proc/\(entry)/status", encoding: .utf8), !status.contains("State:\tZ") else { continue }
            let arguments = command.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            if arguments.contains("--background-child") && arguments.contains(mountPoint) { return pid }
        }
        return nil
    }

    // MARK: Helpers

    func run(_ executable: String, _ arguments: [String]) throws -> CLI.Result {
        let result = try CLI.run(executable: URL(fileURLWithPath: executable), arguments)
        if result.status != 0 { Issue.record("\(executable) \(arguments.joined(separator: " ")) failed: \(result.stderr)") }
        return result
    }

    func xattr(_ path: String) throws -> String {
        var buffer = [UInt8](repeating: 0, count: 128)
        let length = getxattr(path, ContainerFileSystem.protectionAttribute, &buffer, buffer.count)
        guard length >= 0 else { throw Errno(rawValue: errno) }
        return String(decoding: buffer[0..<length], as: UTF8.self)
    }

    private func attributeNames(_ path: String) throws -> [String] {
        var buffer = [CChar](repeating: 0, count: 256)
        let length = listxattr(path, &buffer, buffer.count)
        guard length >= 0 else { throw Errno(rawValue: errno) }
        return buffer[0..<length].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    }

    func readString(_ fd: Int32) -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = pread(fd, &buffer, buffer.count, 0)
        return count < 0 ? nil : String(decoding: buffer[0..<count], as: UTF8.self)
    }
}

extension Container {
    /// A file's class as the library sees it, for checking what the mount changed.
    func protection(of path: String) -> FileProtectionType? { try? itemInfo(atPath: path).protection }
}
