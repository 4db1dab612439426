import CSupport
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import ProtectedStoreTesting
import SystemPackage
import Testing

/// What a native file system does and the mount must too: holes that SEEK_DATA and SEEK_HOLE see, a full disk that
/// damages nothing, hard links, FIFOs and sockets, and a long random workload checked against a model.
extension MountTests {
    private static let block = EncryptedFile.defaultBlockSize
    private static let (seekData, seekHole): (Int32, Int32) = (3, 4)

    @Test("SEEK_DATA and SEEK_HOLE see a sparse file's holes; at or past the end they fail with ENXIO")
    func seekDataAndHole() throws {
        let mounted = try MountedDevice()
        let fd = open(mounted.path("Documents/holes.bin"), O_RDWR | O_CREAT, 0o600)
        #expect(fd >= 0)
        defer { close(fd) }
        let block = Self.block
        #expect(pwrite(fd, pattern(100), 100, 0) == 100)
        #expect(pwrite(fd, pattern(5000, seed: 3), 5000, off_t(10 * block + 100)) == 5000)
        #expect(ftruncate(fd, off_t(40 * block)) == 0)
        /// The offset found, or the negated errno.
        func seek(_ offset: Int, _ whence: Int32) -> Int {
            let found = lseek(fd, off_t(offset), whence)
            return found < 0 ? -Int(errno) : Int(found)
        }
        #expect(seek(0, Self.seekData) == 0)
        #expect(seek(50, Self.seekData) == 50)
        #expect(seek(0, Self.seekHole) == block, "block 1 was never written")
        #expect(seek(block, Self.seekData) == 10 * block)
        #expect(seek(10 * block + 7, Self.seekHole) == 12 * block, "blocks 10 and 11 hold data")
        #expect(seek(12 * block, Self.seekData) == -Int(ENXIO), "no data after block 11")
        #expect(seek(39 * block, Self.seekHole) == 39 * block)
        #expect(seek(40 * block, Self.seekData) == -Int(ENXIO))
        #expect(seek(40 * block, Self.seekHole) == -Int(ENXIO))
        // A copy tool walking data and holes makes progress and copies the data.
        var copied = 0, position = 0
        while true {
            let data = seek(position, Self.seekData)
            guard data >= 0 else { break }
            let hole = seek(data, Self.seekHole)
            #expect(hole > data, "SEEK_HOLE at data \(data) must land past it")
            guard hole > data else { break }
            copied += hole - data
            position = hole
        }
        #expect(copied == 3 * block, "data extents: block 0 and blocks 10–11")
    }

    @Test("a full disk: appends fail with ENOSPC leaving the old bytes plus exactly those reported written; a failed fallocate changes nothing; the descriptor works once space is freed", arguments: MountTransport.testable)
    func fullDisk(transport: MountTransport) throws {
        guard let disk = SmallDisk(megabytes: 6, purpose: "the mount's full-disk test") else { return }
        withExtendedLifetime(try MountedDevice(in: disk.directory, transport: transport)) { mounted in
            let path = mounted.path("Documents/full.bin")
            var model = pattern(10_000)
            writeRaw(model, path)
            let fd = open(path, O_RDWR)
            #expect(fd >= 0)
            defer { close(fd) }
            var failure: Int32 = 0
            for round in 0..<400 {
                let chunk = pattern(65_536, seed: UInt8(truncatingIfNeeded: round))
                let written = pwrite(fd, chunk, chunk.count, off_t(model.count))
                if written < 0 {
                    failure = errno
                    break
                }
                model += chunk[0..<written]
            }
            #expect(failure == ENOSPC, "appending to a full disk: \(String(cString: strerror(failure)))")
            var info = stat()
            #expect(fstat(fd, &info) == 0 && Int(info.st_size) == model.count, "the size is what was reported written")
            #expect(readRaw(path) == model, "old bytes intact, plus exactly the bytes reported written")
            #expect(posixError(Int(ps_fallocate(fd, 0, Int64(model.count), 64 << 20))) == ENOSPC)
            #expect(fstat(fd, &info) == 0 && Int(info.st_size) == model.count, "a failed fallocate leaves the size")
            // Growing by truncate costs no space: a hole.
            #expect(ftruncate(fd, off_t(model.count + (1 << 30))) == 0)
            #expect(ftruncate(fd, off_t(model.count)) == 0)
            #expect(readRaw(path) == model)
            // Freeing space (cutting the file in half) lets the same descriptor write again.
            model.removeLast(model.count / 2)
            #expect(ftruncate(fd, off_t(model.count)) == 0)
            let more = pattern(65_536, seed: 200)
            #expect(pwrite(fd, more, more.count, off_t(model.count)) == more.count, "the descriptor works again: \(String(cString: strerror(errno)))")
            model += more
            #expect(readRaw(path) == model)
            #expect(eventually { mounted.log.contains("No space left on device") }, "the refusal is logged")
        }
    }

    @Test("hard links: one file under two names, its class and the lock apply to both, removing one keeps the other, nlink is right; the Inbox rule holds", arguments: MountTransport.testable)
    func hardLinks(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let first = (mounted.applicationSupport as NSString).appendingPathComponent("secret.txt")
        let second = mounted.path("Documents/secret-link.txt")
        writeRaw(Array("linked secret".utf8), first)
        #expect(link(first, second) == 0, "link: \(String(cString: strerror(errno)))")
        var one = stat(), two = stat()
        #expect(stat(first, &one) == 0 && stat(second, &two) == 0)
        #expect(one.st_ino == two.st_ino && one.st_nlink == 2 && two.st_nlink == 2)
        #expect(try xattr(second) == "complete")
        let writer = open(second, O_RDWR)
        #expect(pwrite(writer, "LINKED", 6, 0) == 6)
        let reader = open(first, O_RDONLY)
        #expect(readString(reader) == "LINKED secret", "a write through one name is read through the other")

        try mounted.lock()
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(posixError(pread(reader, &buffer, 64, 0)) == EPERM, "a descriptor opened through the first name")
        #expect(posixError(pread(writer, &buffer, 64, 0)) == EPERM, "a descriptor opened through the second name")
        #expect(posixError(Int(open(first, O_RDONLY))) == EPERM)
        #expect(posixError(Int(open(second, O_RDONLY))) == EPERM)
        try mounted.unlock()
        #expect(eventually { readString(reader) == "LINKED secret" })

        #expect(unlink(first) == 0)
        #expect(readRaw(second) == Array("LINKED secret".utf8), "the other name keeps the file")
        #expect(stat(second, &two) == 0 && (two.st_nlink == 1 || two.st_nlink == 2), "nlink \(two.st_nlink)")
        close(reader)
        close(writer)
        #expect(eventually { stat(second, &two) == 0 && two.st_nlink == 1 }, "once closed, one name is left")

        // Into the Inbox: EACCES; an Inbox item given a name outside, through which it could be written: EACCES.
        #expect(posixError(Int(link(second, mounted.path("Documents/Inbox/link.txt")))) == EACCES)
        let source = mounted.test.path("report.txt")
        writeRaw(Array("delivered".utf8), source)
        #expect(try sandboxctl(mounted.test, ["inbox", "deliver", TestDevice.bundleIdentifier, source]).status == 0)
        #expect(posixError(Int(link(mounted.path("Documents/Inbox/report.txt"), mounted.path("Documents/report-link.txt")))) == EACCES)
        #expect(!FileManager.default.fileExists(atPath: mounted.path("Documents/report-link.txt")))
    }

    @Test("FIFOs and Unix sockets work anywhere writable (mkfifo passes bytes, a socket in tmp/ accepts a connection); device nodes are EPERM")
    func specialFiles() throws {
        let mounted = try MountedDevice()
        let fifo = mounted.path("tmp/pipe")
        #expect(mkfifo(fifo, 0o600) == 0, "mkfifo: \(String(cString: strerror(errno)))")
        var info = stat()
        #expect(stat(fifo, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)
        let pipeScript = """
            import os, sys
            path = sys.argv[1]
            if os.fork() == 0:
                with open(path, "wb") as writer: writer.write(b"through the fifo")
                os._exit(0)
            with open(path, "rb") as reader: print(reader.read().decode())
            os.wait()
            """
        #expect(try python(pipeScript, [fifo]).output == "through the fifo\n")
        let socketPath = mounted.path("tmp/app.sock")
        let socketScript = """
            import socket, sys
            path = sys.argv[1]
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen(1)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(path)
            connection, _ = server.accept()
            client.sendall(b"hello over the socket")
            print(connection.recv(100).decode())
            """
        #expect(try python(socketScript, [socketPath]).output == "hello over the socket\n")
        #expect(stat(socketPath, &info) == 0 && info.st_mode & S_IFMT == S_IFSOCK)
        // No class applies to a name without data.
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(posixError(getxattr(fifo, ContainerFileSystem.protectionAttribute, &buffer, buffer.count)) == ENODATA)
        let listing = try sandboxctl(mounted.test, ["ls", TestDevice.bundleIdentifier + ":tmp", "--json"])
        #expect(listing.status == 0 && listing.stdout.contains("pipe") && listing.stdout.contains("\"socket\""), "\(listing.stdout)\(listing.stderr)")

        #expect(posixError(Int(mknod(mounted.path("tmp/null"), S_IFCHR | 0o600, 0x103))) == EPERM)
        let mountOptions = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8))?
            .split(separator: "\n").first { $0.split(separator: " ").dropFirst(4).first.map(String.init) == mounted.mountPoint }?
            .split(separator: " ").dropFirst(5).first.map(String.init) ?? ""
        #expect(mountOptions.split(separator: ",").contains("nodev"), "mount options \(mountOptions)")
        #expect(posixError(Int(mknod(mounted.path("tmp/disk"), S_IFBLK | 0o600, 0x800))) == EPERM)
        // The kernel may refuse first (no CAP_MKNOD, a device cgroup): ask the file system view itself too.
        let view = ContainerFileSystem(container: mounted.container)
        #expect(throws: Errno.notPermitted) { try view.createSpecialFile("/tmp/null", mode: S_IFCHR | 0o600) }
        #expect(throws: Errno.notPermitted) { try view.createSpecialFile("/tmp/disk", mode: S_IFBLK | 0o600) }
        try view.createSpecialFile("/tmp/direct-pipe", mode: S_IFIFO | 0o600)
        #expect(stat(mounted.path("tmp/direct-pipe"), &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)
        #expect(posixError(Int(mkfifo(mounted.path("Documents/Inbox/pipe"), 0o600))) == EACCES)
        #expect(unlink(fifo) == 0 && unlink(socketPath) == 0)
    }

    @Test("a listing shows a file's new size after a change that keeps its stored size (sizes read from length records are kept only while the stored file is unchanged)")
    func listedSizeFollowsChanges() throws {
        let mounted = try MountedDevice()
        let folder = mounted.path("Documents/sizes")
        #expect(mkdir(folder, 0o700) == 0)
        let file = (folder as NSString).appendingPathComponent("note.txt")
        writeRaw([UInt8](repeating: 1, count: 100), file)
        func listedSizes() throws -> String { try run("/usr/bin/find", [folder, "-type", "f", "-printf", "%s\n"]).stdout }
        // Long enough after its last change for its size to be kept.
        usleep(200_000)
        #expect(try listedSizes() == "100\n")
        // Written in place (the same inode) within its block, so the same stored size: only its change and
        // modification times tell.
        let fd = open(file, O_WRONLY)
        #expect(fd >= 0)
        #expect(pwrite(fd, [UInt8](repeating: 2, count: 100), 100, 100) == 100)
        close(fd)
        #expect(try listedSizes() == "200\n")
        usleep(200_000)
        #expect(try listedSizes() == "200\n")
        #expect(truncate(file, 50) == 0)
        #expect(try listedSizes() == "50\n")
    }

    @Test("random operations through the mount match an in-memory model: write, read, truncate up and down, fallocate, mmap read and write, fsync, close and reopen (PS_RANDOM_OPS_SEED replays a run)", arguments: MountTransport.testable)
    func randomOperations(transport: MountTransport) throws {
        let environment = ProcessInfo.processInfo.environment
        let seed = environment["PS_RANDOM_OPS_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 0...UInt64.max)
        // Under the sanitizers (make verify) a tenth: the same checks, in a fraction of the time.
        let operations = environment["PS_RANDOM_OPS_COUNT"].flatMap { Int($0) } ?? (runsUnderSanitizer ? 2_000 : 20_000)
        print("random mount operations: \(operations), seed \(seed) (replay: PS_RANDOM_OPS_SEED=\(seed) swift test --filter randomOperations)")
        let mounted = try MountedDevice(transport: transport)
        var checker = RandomOperationChecker(path: mounted.path("Documents/random.bin"), seed: seed)
        let failure = checker.run(operations)
        #expect(failure == nil, "seed \(seed): \(failure ?? "")")
        print("random mount operations: \(checker.summary)")
    }
}

/// Drives one file through the mount with random calls and checks every answer against a model of its bytes.
struct RandomOperationChecker {
    static let largestSize = 3 << 20
    static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))

    let path: String
    let seed: UInt64
    private var random: SplitMix64
    private var model: [UInt8] = []
    private var fd: Int32 = -1
    private var counts: [String: Int] = [:]
    /// Random bytes that writes take slices of (drawing every byte from the generator is slow in a debug build).
    private let pool: [UInt8]

    init(path: String, seed: UInt64) {
        self.path = path
        self.seed = seed
        random = SplitMix64(seed: seed)
        var bytes = [UInt8](repeating: 0, count: 1 << 20)
        for index in stride(from: 0, to: bytes.count, by: 8) {
            withUnsafeBytes(of: random.next()) { bytes.replaceSubrange(index..<index + 8, with: $0) }
        }
        pool = bytes
    }

    var summary: String { counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ") + "; final size \(model.count)" }

    /// Runs `count` operations; the first mismatch or failed call, described, or nil.
    mutating func run(_ count: Int) -> String? {
        fd = open(path, O_RDWR | O_CREAT, 0o600)
        guard fd >= 0 else { return "open: \(String(cString: strerror(errno)))" }
        defer { close(fd) }
        for index in 0..<count {
            if let problem = step() { return "operation \(index): \(problem)" }
        }
        close(fd)
        fd = open(path, O_RDONLY)
        guard fd >= 0 else { return "final open: \(String(cString: strerror(errno)))" }
        return read(at: 0, count: model.count + 1, kind: "final read")
    }

    private mutating func number(_ range: ClosedRange<Int>) -> Int { Int.random(in: range, using: &random) }

    private mutating func step() -> String? {
        let roll = number(0...99)
        switch roll {
        case 0..<28:
            let offset = number(0...min(Self.largestSize - 1, model.count + 3 * EncryptedFile.defaultBlockSize))
            let length = min(Self.largestSize - offset, number(0...3) == 0 ? number(1...200_000) : number(1...9000))
            return write(at: offset, count: length)
        case 28..<52:
            return read(at: number(0...model.count + 100), count: number(1...40_000), kind: "read")
        case 52..<60:
            let size = number(0...3) == 0 ? number(0...Self.largestSize) : number(max(0, model.count - 20_000)...min(Self.largestSize, model.count + 20_000))
            counts["truncate", default: 0] += 1
            guard ftruncate(fd, off_t(size)) == 0 else { return "ftruncate to \(size): \(String(cString: strerror(errno)))" }
            resize(to: size)
        case 60..<65:
            let keepSize = number(0...1) == 1
            let offset = number(0...min(Self.largestSize - 1, model.count + 10_000))
            let length = number(1...min(100_000, Self.largestSize - offset))
            counts[keepSize ? "fallocate keep-size" : "fallocate", default: 0] += 1
            guard ps_fallocate(fd, keepSize ? 1 : 0, Int64(offset), Int64(length)) == 0 else {
                return "fallocate \(keepSize ? "keep-size " : "")\(offset)+\(length): \(String(cString: strerror(errno)))"
            }
            if !keepSize && offset + length > model.count { resize(to: offset + length) }
        case 65..<80:
            return mapped(writing: roll >= 72)
        case 80..<88:
            counts["fsync", default: 0] += 1
            guard fsync(fd) == 0 else { return "fsync: \(String(cString: strerror(errno)))" }
        case 88..<94:
            counts["close and reopen", default: 0] += 1
            close(fd)
            fd = open(path, O_RDWR)
            guard fd >= 0 else { return "reopen: \(String(cString: strerror(errno)))" }
        default:
            counts["fstat", default: 0] += 1
            var info = stat()
            guard fstat(fd, &info) == 0 else { return "fstat: \(String(cString: strerror(errno)))" }
            guard Int(info.st_size) == model.count else { return "fstat says \(info.st_size) bytes, the model \(model.count)" }
        }
        return nil
    }

    private mutating func write(at offset: Int, count: Int) -> String? {
        counts["write", default: 0] += 1
        let start = number(0...pool.count - 1)
        var bytes = Array(pool[start..<min(pool.count, start + count)])
        while bytes.count < count { bytes += pool.prefix(count - bytes.count) }
        let written = pwrite(fd, bytes, count, off_t(offset))
        guard written == count else { return "pwrite \(count) at \(offset) returned \(written): \(String(cString: strerror(errno)))" }
        if offset + count > model.count { resize(to: offset + count) }
        model.replaceSubrange(offset..<offset + count, with: bytes)
        return nil
    }

    private mutating func read(at offset: Int, count: Int, kind: String) -> String? {
        counts[kind, default: 0] += 1
        var buffer = [UInt8](repeating: 0, count: count)
        var total = 0
        while total < count {
            let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + total, count - total, off_t(offset + total)) }
            guard got >= 0 else { return "pread \(count) at \(offset): \(String(cString: strerror(errno)))" }
            if got == 0 { break }
            total += got
        }
        let expected = offset < model.count ? Array(model[offset..<min(model.count, offset + count)]) : []
        guard total == expected.count else { return "\(kind) of \(count) at \(offset) returned \(total) bytes, the model has \(expected.count)" }
        if let first = (0..<total).first(where: { buffer[$0] != expected[$0] }) {
            return "\(kind) at \(offset): byte \(offset + first) is \(buffer[first]), the model says \(expected[first])"
        }
        return nil
    }

    /// Maps a page-aligned range inside the file (shared), checks it, and when `writing` changes some bytes in it
    /// and msyncs them back through the mount.
    private mutating func mapped(writing: Bool) -> String? {
        guard model.count > 0 else { return nil }
        counts[writing ? "mmap write" : "mmap read", default: 0] += 1
        let offset = number(0...(model.count - 1) / Self.pageSize) * Self.pageSize
        let length = number(1...min(model.count - offset, 256 * 1024))
        let protection = writing ? PROT_READ | PROT_WRITE : PROT_READ
        guard let mapping = mmap(nil, length, protection, MAP_SHARED, fd, off_t(offset)), mapping != UnsafeMutableRawPointer(bitPattern: -1) else {
            return "mmap \(length) at \(offset): \(String(cString: strerror(errno)))"
        }
        defer { munmap(mapping, length) }
        let bytes = UnsafeMutableRawBufferPointer(start: mapping, count: length)
        if let first = (0..<length).first(where: { bytes[$0] != model[offset + $0] }) {
            return "mapping at \(offset): byte \(offset + first) is \(bytes[first]), the model says \(model[offset + first])"
        }
        guard writing else { return nil }
        let start = number(0...length - 1)
        let count = number(1...length - start)
        let source = number(0...pool.count - count)
        for index in 0..<count { bytes[start + index] = pool[source + index] }
        model.replaceSubrange(offset + start..<offset + start + count, with: pool[source..<source + count])
        guard msync(mapping, length, MS_SYNC) == 0 else { return "msync: \(String(cString: strerror(errno)))" }
        return nil
    }

    private mutating func resize(to size: Int) {
        if size < model.count { model.removeLast(model.count - size) } else { model += [UInt8](repeating: 0, count: size - model.count) }
    }
}
