import Foundation
import Logging
import ProtectedStore
import SystemPackage

/// The rules of an Inbox drop folder (`sandboxctl inbox mount`), apart from FUSE: a flat, write-only folder whose files
/// are delivered into one container's `Documents/Inbox/` once their writers are done (docs/DESIGN.md, "The drop folder").
///
/// - A file is *done* when its last descriptor closes and nothing renames it for `settleTime` (a program that writes a
///   temporary file and renames it, as Python's `tempfile` + `os.replace` does, renames within that time), or at once
///   when a rename gives a closed file a final name.
/// - A *temporary name* (starting with ".", or ending in .part, .partial, .crdownload, .tmp or ~: browsers, rsync,
///   curl, editors) is never delivered: such a file waits for its rename.
/// - A writer killed by a signal with the file open, an unlinked file and a file replaced by another are never
///   delivered; nor is anything still open or temporary when the drop folder stops.
/// - A delivery that fails before its file is synced and recorded (a full disk) leaves the file in the folder, tried
///   again after a wait that doubles up to a minute; one still failing when the drop folder stops is discarded, with
///   an error logged. A failed sync (the writer's or the delivery's) discards the file: its bytes may be lost.
/// - Nothing can be read back: opening for reading is EACCES, and the listing shows only files not yet delivered.
package final class InboxDropFileSystem: @unchecked Sendable {
    package let container: Container
    /// `--from`: the source application of every delivery; else each writer's executable (`local.<name>`).
    let sourceApplication: String?
    /// `--annotation`: every delivery's annotation, unless a file has its own (`user.inbox.annotation`).
    let annotation: String?
    let settleTime: TimeInterval
    private let logger: Logger

    /// One file being written.
    /// Guarded by the file system's mutex.
    private final class DropFile: @unchecked Sendable {
        let drop: InboxDrop
        let inode: UInt64
        /// Its name in the folder; nil once unlinked or replaced by a rename.
        var name: String?
        var openCount = 0
        /// A writer died by a signal while it had the file open, or a write failed: the content may be partial.
        var abandoned = false
        /// Handles written through since their last flush (close). The kernel sends the last close's release after
        /// close(2) has returned, so a rename can arrive first: a file with none left is treated as closed then.
        var unflushed: Set<UInt64> = []
        /// Renamed to a final name while a release was still on its way: delivered at the last release, no settling.
        var deliverAtRelease = false
        var annotation: String?
        let writer: String?
        var modified = timespec()
        /// Bumped by every open, rename and close, so a settle timer fires only if nothing happened since it was set.
        var generation = 0
        /// Deliveries of it that failed, for the wait before the next try.
        var failedDeliveries = 0

        init(drop: InboxDrop, inode: UInt64, name: String, writer: String?) {
            self.drop = drop
            self.inode = inode
            self.name = name
            self.writer = writer
            clock_gettime(CLOCK_REALTIME, &modified)
        }
    }

    private let mutex = NSLock()
    private var visible: [String: DropFile] = [:]
    /// Files whose delivery failed and whose name another file took meanwhile: waiting for their next try, unlisted.
    private var retrying: [ObjectIdentifier: DropFile] = [:]
    private var handles: [UInt64: DropFile] = [:]
    private var nextHandle: UInt64 = 1
    private var nextInode: UInt64 = 2
    private var stopped = false
    /// Deliveries and discards under way, and settle timers not yet fired: `stop()` waits for them, so a file that was
    /// done when the drop folder stopped is delivered before the process ends.
    private let inFlight = DispatchGroup()
    private let mountedAt = Date()

    package init(container: Container, sourceApplication: String?, annotation: String?, settleTime: TimeInterval = 1, logger: Logger) {
        self.container = container
        self.sourceApplication = sourceApplication
        self.annotation = annotation
        self.settleTime = settleTime
        self.logger = logger
    }

    // MARK: Names

    /// Whether `name` is one a program writes before renaming to the real one.
    package static func isTemporaryName(_ name: String) -> Bool {
        let lowered = name.lowercased()
        return name.hasPrefix(".") || name.hasSuffix("~") || [".part", ".partial", ".crdownload", ".tmp"].contains { lowered.hasSuffix($0) }
    }

    /// The one name in a kernel path ("/name"); the folder itself is "/". Subfolders do not exist.
    private func name(in path: String) throws -> String {
        let name = String(path.dropFirst())
        guard path.hasPrefix("/"), !name.isEmpty, !name.contains("/") else { throw Errno.noSuchFileOrDirectory }
        return name
    }

    /// A name a new or renamed file may take: temporary, or one the Inbox accepts (EINVAL otherwise).
    private func checkedName(_ name: String) throws -> String {
        guard !Self.isTemporaryName(name) else { return name }
        do {
            return try Container.checkedInboxName(name, source: name)
        } catch {
            logger.info("refused the name \(name): \(error)")
            throw Errno.invalidArgument
        }
    }

    // MARK: Attributes and listing

    package func attributes(of path: String) throws -> stat {
        if path == "/" { return folderAttributes() }
        let name = try name(in: path)
        // The file's size is read outside the folder's lock: it waits while a large write of that file runs.
        let file = try mutex.withLock {
            guard let file = visible[name] else { throw Errno.noSuchFileOrDirectory }
            return file
        }
        return attributes(of: file)
    }

    package func attributes(ofHandle handle: UInt64) throws -> stat {
        attributes(of: try mutex.withLock { try file(handle) })
    }

    private func folderAttributes() -> stat {
        var info = stat()
        info.st_mode = S_IFDIR | 0o755
        info.st_nlink = 2
        info.st_ino = 1
        info.st_uid = getuid()
        info.st_gid = getgid()
        let seconds = time_t(mountedAt.timeIntervalSince1970)
        info.st_mtim = timespec(tv_sec: seconds, tv_nsec: 0)
        info.st_ctim = info.st_mtim
        info.st_atim = info.st_mtim
        return info
    }

    private func attributes(of file: DropFile) -> stat {
        var info = stat()
        // Write-only: the writer's own tools see that nothing can be read back.
        info.st_mode = S_IFREG | 0o200
        info.st_nlink = 1
        info.st_ino = ino_t(file.inode)
        info.st_uid = getuid()
        info.st_gid = getgid()
        info.st_size = off_t(file.drop.size)
        // Copy tools size their writes by it: 1 MiB requests are encrypted on every core (EncryptedFile's parallel path).
        info.st_blksize = 1 << 20
        info.st_blocks = blkcnt_t((file.drop.size + 511) / 512)
        let modified = mutex.withLock { file.modified }
        info.st_mtim = modified
        info.st_ctim = modified
        info.st_atim = modified
        return info
    }

    /// Fails with ENOENT unless `path` (or `handle`) is a file of the folder or the folder itself: for the calls whose
    /// change is accepted and not kept (chmod, chown, utimens).
    package func checkExists(_ path: String?, handle: UInt64?) throws {
        if let handle {
            _ = try attributes(ofHandle: handle)
        } else if let path {
            _ = try attributes(of: path)
        } else {
            throw Errno.badFileDescriptor
        }
    }

    /// The names of files not yet delivered.
    package func names() -> [String] { mutex.withLock { visible.keys.sorted() } }

    /// The free space of the file system holding the device.
    package func statistics() throws -> statvfs {
        var info = statvfs()
        guard statvfs(container.device.root, &info) == 0 else { throw Errno(rawValue: Foundation.errno) }
        return info
    }

    // MARK: Writing

    /// A new file `path` (a second one if a file of that name is being written: both are delivered, under free names).
    package func create(_ path: String, writer: pid_t) throws -> UInt64 {
        let name = try checkedName(try name(in: path))
        let file = try newFile(named: name, writer: writer)
        let (handle, replaced): (UInt64, (DropFile, Outcome)?) = try mutex.withLock {
            guard !stopped else { throw Errno.noSuchFileOrDirectory }
            let replaced = visible[name]
            visible[name] = file
            // Open from the start, so no other request sees it closed before the writer has its handle.
            file.openCount = 1
            let handle = insertHandle(file)
            // One still open is delivered or dropped at its own last close (closedOutcome); a closed one now: a file
            // that was done goes under a free name, a temporary one was superseded.
            guard let replaced, replaced.openCount == 0 else { return (handle, nil) }
            replaced.generation += 1
            if Self.isTemporaryName(name) { replaced.name = nil }
            return (handle, (replaced, Self.isTemporaryName(name) || replaced.abandoned ? .discard : .deliver))
        }
        if let (replaced, outcome) = replaced { carryOut(outcome, replaced) }
        return handle
    }

    /// Opens `path` for writing: with O_TRUNC a new file under that name (as `create`), else the same file.
    package func open(_ path: String, flags: Int32, writer: pid_t) throws -> UInt64 {
        // Nothing is ever read back, not even by the writer.
        guard flags & O_ACCMODE == O_WRONLY else { throw Errno.permissionDenied }
        let name = try name(in: path)
        if flags & O_TRUNC != 0 {
            guard mutex.withLock({ visible[name] }) != nil else { throw Errno.noSuchFileOrDirectory }
            return try create(path, writer: writer)
        }
        return try mutex.withLock {
            guard let file = visible[name] else { throw Errno.noSuchFileOrDirectory }
            file.openCount += 1
            file.generation += 1
            return insertHandle(file)
        }
    }

    package func write(_ handle: UInt64, from buffer: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        let file = try mutex.withLock {
            let file = try self.file(handle)
            file.unflushed.insert(handle)
            return file
        }
        try failing(file) { try file.drop.write(from: buffer, at: offset) }
        _ = mutex.withLock { clock_gettime(CLOCK_REALTIME, &file.modified) }
        return buffer.count
    }

    /// Runs a change of `file`'s content; if it fails, the writer has a partial file (cp reports the error and closes
    /// it), so the file is never delivered.
    private func failing(_ file: DropFile, _ body: () throws -> Void) throws {
        do {
            try body()
        } catch {
            mutex.withLock { file.abandoned = true }
            logger.info("writing \(file.name ?? "an unnamed file") failed (\(error)): it will not be delivered")
            throw error
        }
    }

    package func truncate(_ path: String?, handle: UInt64?, to size: Int64) throws {
        let file: DropFile = try mutex.withLock {
            if let handle {
                let file = try self.file(handle)
                file.unflushed.insert(handle)
                return file
            }
            guard let name = try path.map(name(in:)), let file = visible[name] else { throw Errno.noSuchFileOrDirectory }
            // A change restarts the settle time.
            file.generation += 1
            return file
        }
        try failing(file) { try file.drop.truncate(to: size) }
        _ = mutex.withLock { clock_gettime(CLOCK_REALTIME, &file.modified) }
    }

    /// The writer's fsync. One that fails makes the file partial, as a failed write does (and a later sync could
    /// succeed over pages Linux dropped).
    package func synchronize(_ handle: UInt64) throws {
        let file = try mutex.withLock { try self.file(handle) }
        try failing(file) { try file.drop.synchronize() }
    }

    /// A descriptor is being closed by `pid`: if that process is dying of a signal, the file it was writing is abandoned.
    package func flush(_ handle: UInt64, by pid: pid_t) {
        let killed = Self.wasKilledBySignal(pid)
        mutex.withLock {
            guard let file = handles[handle] else { return }
            guard killed else {
                file.unflushed.remove(handle)
                return
            }
            file.abandoned = true
            logger.info("the writer of \(file.name ?? "an unnamed file") (pid \(pid)) was killed: it will not be delivered")
        }
    }

    /// The last close of a descriptor: a file no one has open any more is delivered after the settle time, or discarded.
    package func release(_ handle: UInt64) {
        let (file, outcome): (DropFile?, Outcome) = mutex.withLock {
            guard let file = handles.removeValue(forKey: handle) else { return (nil, .wait) }
            file.openCount -= 1
            file.unflushed.remove(handle)
            file.generation += 1
            if file.openCount == 0 && file.deliverAtRelease && !file.abandoned, let name = file.name, visible[name] === file {
                return (file, takeForDelivery(file))
            }
            return (file, closedOutcome(file))
        }
        if let file { carryOut(outcome, file) }
    }

    // MARK: Names changing

    package func rename(_ source: String, to target: String, flags: UInt32) throws {
        // renameat2's RENAME_NOREPLACE (1) and RENAME_EXCHANGE (2); exchanging two drops has no meaning here.
        let noReplace: UInt32 = 1
        guard flags & ~noReplace == 0 else { throw Errno.invalidArgument }
        let from = try name(in: source), to = try checkedName(try name(in: target))
        let (replaced, file, outcome): (DropFile?, DropFile, Outcome) = try mutex.withLock {
            guard let file = visible[from] else { throw Errno.noSuchFileOrDirectory }
            if flags & noReplace != 0 && visible[to] != nil { throw Errno.fileExists }
            guard from != to else { return (nil, file, .wait) }
            var replaced = visible[to]
            replaced?.name = nil
            if replaced?.openCount != 0 { replaced = nil }
            visible[from] = nil
            visible[to] = file
            file.name = to
            file.generation += 1
            // A rename is the writer saying it is done: a closed file with a final name goes now, one whose last
            // release is still on its way (everything flushed) goes at that release.
            guard !Self.isTemporaryName(to), !file.abandoned else { return (replaced, file, .wait) }
            if file.openCount == 0 { return (replaced, file, takeForDelivery(file)) }
            if file.unflushed.isEmpty { file.deliverAtRelease = true }
            return (replaced, file, .wait)
        }
        replaced?.drop.discard()
        if case .deliver = outcome { deliver(file, named: to) }
    }

    package func unlink(_ path: String) throws {
        let name = try name(in: path)
        let discarded: DropFile? = try mutex.withLock {
            guard let file = visible.removeValue(forKey: name) else { throw Errno.noSuchFileOrDirectory }
            file.name = nil
            file.generation += 1
            return file.openCount == 0 ? file : nil
        }
        discarded?.drop.discard()
    }

    /// `user.inbox.annotation`: the file's own annotation (JSON, checked as `inbox deliver` checks it).
    package func setAnnotation(_ path: String, json: [UInt8]) throws {
        let name = try name(in: path)
        let checked: String
        do {
            checked = try Container.checkedAnnotation(String(decoding: json, as: UTF8.self))
        } catch {
            logger.info("refused the annotation of \(name): \(error)")
            throw Errno.invalidArgument
        }
        try mutex.withLock {
            guard let file = visible[name] else { throw Errno.noSuchFileOrDirectory }
            file.annotation = checked
            file.generation += 1
        }
    }

    /// Stops taking files: closed files with final names are delivered now, everything else is discarded.
    package func stop() {
        let files: [(DropFile, Outcome)] = mutex.withLock {
            stopped = true
            var all: [ObjectIdentifier: DropFile] = [:]
            for file in Array(visible.values) + Array(handles.values) + Array(retrying.values) { all[ObjectIdentifier(file)] = file }
            visible.removeAll()
            handles.removeAll()
            retrying.removeAll()
            return all.values.map { file in
                // Releases still on their way when the session ends never arrive: a file flushed by every writer is closed.
                let closed = file.openCount == 0 || file.unflushed.isEmpty
                let done = closed && !file.abandoned && file.name.map { !Self.isTemporaryName($0) } == true
                return (file, done ? .deliver : .discard)
            }
        }
        for (file, outcome) in files { carryOut(outcome, file) }
        inFlight.wait()
    }

    // MARK: Delivering

    private enum Outcome { case wait, deliver, discard, settle(Int) }

    /// What becomes of a file no descriptor holds any more (under the mutex).
    private func closedOutcome(_ file: DropFile) -> Outcome {
        guard file.openCount == 0 else { return .wait }
        guard !file.abandoned, let name = file.name else {
            if let name = file.name, visible[name] === file { visible[name] = nil }
            return .discard
        }
        // Replaced under its name by a later writer of the same name: delivered under a free variant, at once.
        guard visible[name] === file else { return Self.isTemporaryName(name) ? .discard : .deliver }
        return Self.isTemporaryName(name) ? .wait : .settle(file.generation)
    }

    /// Takes a file out of the folder for delivery (under the mutex).
    private func takeForDelivery(_ file: DropFile) -> Outcome {
        if let name = file.name, visible[name] === file { visible[name] = nil }
        return .deliver
    }

    private func carryOut(_ outcome: Outcome, _ file: DropFile) {
        inFlight.enter()
        defer { inFlight.leave() }
        switch outcome {
        case .wait:
            return
        case .discard:
            file.drop.discard()
        case .deliver:
            guard let name = file.name else { return file.drop.discard() }
            deliver(file, named: name)
        case .settle(let generation):
            later(settleTime, file) {
                guard file.generation == generation, file.openCount == 0, let name = file.name, self.visible[name] === file else { return .wait }
                return self.takeForDelivery(file)
            }
        }
    }

    /// After `delay`, carries out what `due` (run under the mutex) decides for `file` then. The in-flight group is
    /// entered when the timer fires, not now: stop() must not wait out the delay (it decides about the file itself).
    private func later(_ delay: TimeInterval, _ file: DropFile, _ due: @escaping @Sendable () -> Outcome) {
        DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
            self.inFlight.enter()
            defer { self.inFlight.leave() }
            self.carryOut(self.mutex.withLock(due), file)
        }
    }

    /// Delivers `file` as `name`, logged. A delivery that fails leaves the file in the folder, tried again later.
    private func deliver(_ file: DropFile, named name: String) {
        do {
            let item = try file.drop.deliver(named: name, sourceApplication: sourceApplication ?? file.writer, annotationJSON: file.annotation ?? annotation)
            logger.info("delivered \(name) as \(item.path) (\(item.size) bytes, event #\(item.sequenceNumber ?? 0))")
        } catch {
            guard file.drop.isDeliverable else {
                if file.drop.isDelivered {
                    return logger.error("delivered \(name), but the Inbox could not be made durable: \(Self.describe(error))")
                }
                return logger.error("could not deliver \(name): \(Self.describe(error)); it was discarded: \(file.drop.discardReason ?? "see above")")
            }
            deliveryFailed(file, named: name, error: error)
        }
    }

    /// The library's own words for a failure (what, which file, what to do), not Foundation's wrapping of them.
    private static func describe(_ error: any Error) -> String {
        (error as? CocoaError)?.protectedStoreError.map(String.init(describing:)) ?? String(describing: error)
    }

    /// Puts a file whose delivery failed back in the folder (a rename that sent it has taken effect: its writer is
    /// done) and tries again after a wait that doubles, up to a minute. Only a stop loses it, if the last try fails too.
    private func deliveryFailed(_ file: DropFile, named name: String, error: any Error) {
        let retry: (after: TimeInterval, generation: Int)? = mutex.withLock {
            guard !stopped else { return nil }
            file.failedDeliveries += 1
            file.generation += 1
            // Reopened, it settles again before it goes.
            file.deliverAtRelease = false
            if visible[name] == nil { visible[name] = file } else { retrying[ObjectIdentifier(file)] = file }
            return (min(60, max(settleTime, 0.1) * pow(2, Double(file.failedDeliveries - 1))), file.generation)
        }
        guard let retry else {
            logger.error("could not deliver \(name): \(Self.describe(error)); the drop folder is stopping, so it is discarded")
            return file.drop.discard()
        }
        logger.error("could not deliver \(name): \(Self.describe(error)); it stays in the drop folder and is tried again in \(retry.after) s")
        later(retry.after, file) {
            // Opened, renamed or removed since: what happens to it follows from that instead.
            guard !self.stopped, file.generation == retry.generation, file.openCount == 0, !file.abandoned, file.name != nil else { return .wait }
            self.retrying[ObjectIdentifier(file)] = nil
            return self.takeForDelivery(file)
        }
    }

    // MARK: Handles and writers

    private func newFile(named name: String, writer: pid_t) throws -> DropFile {
        let drop: InboxDrop
        do {
            drop = try container.beginInboxDrop()
        } catch {
            logger.error("could not start \(name) in the Inbox: \(error)")
            throw Errno.ioError
        }
        let source = Self.sourceApplication(of: writer)
        return mutex.withLock {
            defer { nextInode += 1 }
            return DropFile(drop: drop, inode: nextInode, name: name, writer: source)
        }
    }

    /// Under the mutex.
    private func insertHandle(_ file: DropFile) -> UInt64 {
        defer { nextHandle += 1 }
        handles[nextHandle] = file
        return nextHandle
    }

    /// Under the mutex.
    private func file(_ handle: UInt64) throws -> DropFile {
        guard let file = handles[handle] else { throw Errno.badFileDescriptor }
        return file
    }

    /// The writing program as a source application: `local.<executable name>`, with characters a bundle identifier
    /// can't hold made hyphens; nil if there is no such process any more.
    static func sourceApplication(of pid: pid_t) -> String? {
        var name = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")).map { ($0 as NSString).lastPathComponent }
        if name == nil || name!.isEmpty {
            name = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        guard let name, !name.isEmpty else { return nil }
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
        let cleaned = String(name.prefix(100).map { allowed.contains($0) ? $0 : "-" })
            .split(separator: ".").map { $0.drop { $0 == "-" } }.filter { !$0.isEmpty }.joined(separator: ".")
        guard !cleaned.isEmpty else { return nil }
        let identifier = "local.\(cleaned)"
        return (try? Container.checkSourceApplication(identifier)) != nil ? identifier : nil
    }

    /// Whether process `pid` is exiting because a signal killed it: the kernel's PF_EXITING flag (field 9 of
    /// /proc/PID/stat) and an exit code (field 52) whose low bits name a signal. Its descriptors are being closed for
    /// it, so what it was writing is unfinished. (PF_SIGNALED alone is not enough: the other threads of a process that
    /// calls exit() get it too.)
    static func wasKilledBySignal(_ pid: pid_t) -> Bool {
        guard pid > 0, let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let end = stat.range(of: ")", options: .backwards) else { return false }
        // After "pid (comm)": field 3 is the first.
        let fields = stat[end.upperBound...].split(separator: " ")
        guard fields.count > 49, let flags = UInt64(fields[6]), let exitCode = Int32(fields[49].trimmingCharacters(in: .whitespacesAndNewlines)) else { return false }
        let exiting: UInt64 = 0x4
        return flags & exiting != 0 && exitCode & 0x7f != 0
    }
}
