import CSupport
import Dispatch
import Foundation
import SystemPackage

/// A random-access handle on one encrypted file: plaintext reads and writes at any offset,
/// each write re-encrypting only the blocks it touches, each block under a nonce never used before with its key.
///
/// A handle runs reads concurrently and serialises writes; several handles on one file are not coordinated.
/// Opened directly, a handle keeps its key until `close()` or `discardKey()`; files opened through a `Container`
/// are registered with the device, whose lock discards class A keys.
public final class EncryptedFile: @unchecked Sendable {
    /// Plaintext bytes per block in new files, chosen by measurement (docs/FORMAT.md §4, docs/PERFORMANCE.md).
    public static let defaultBlockSize = 4096
    /// Calls spanning at least this many bytes spread their blocks over all cores.
    static let parallelThresholdBytes: Int64 = 256 * 1024
    /// Upper bound on plaintext handled in one pass, so huge calls run in bounded memory whatever the block size.
    package static let maximumBytesPerPass = 4 << 20
    /// Read once: Foundation reads /proc and cgroup files each time it is asked.
    private static let cores = ProcessInfo.processInfo.activeProcessorCount

    /// The file on disk, as given when opened.
    public let path: String
    /// Whether the handle was opened for writing.
    public let isWritable: Bool

    private let descriptor: FileDescriptor
    private var header: FileHeader
    private var fileKey: SecureBytes
    private let layout: BlockLayout
    /// The length record: as on disk, or about to be (a data write is followed by its record).
    private var record: LengthRecord
    /// Blocks below this were durable at the last completed fsync (written into the next record, or at close).
    private var synchronizedExtent: Int64 = 0
    private var isClosed = false
    /// Writes to the stored file since the current mutation began (under the write lock; a parallel store counts once).
    private var storedWrites = 0
    /// Whether some block below the extent may be a hole of the stored file, which a write must allocate. Until one
    /// is, writes inside the extent only overwrite allocated blocks and need no space reserved first.
    private var mayHaveInteriorHoles = false
    /// Set when a write failed part-way: the blocks on disk may no longer match the record.
    private var failedWrite: ProtectedStoreError?
    /// Reads share it, so several threads decrypt one file at once; writes, truncation, class changes and closing take it alone.
    private let lock = ReadWriteLock()
    /// Writes accepted by `writeBehind` and not yet stored. Every other operation first waits for those before it,
    /// outside `lock`, which their storing takes.
    private let behind = WritesBehind()
    /// Whether `writeBehind` may accept a write: the handle is writable, open, unbroken and has its key. Accepting
    /// takes only `acceptance`, not `lock`, so a write is accepted while the one before it is being stored.
    /// `discardKey()` and `close()` clear it before they wait for the queue, a write failing part-way clears it, and
    /// `restoreKey` sets it again.
    private var acceptsWritesBehind: Bool
    private let acceptance = NSLock()
    private var storedScratch: [UInt8] = []

    private init(path: String, descriptor: FileDescriptor, header: FileHeader, fileKey: SecureBytes, record: LengthRecord, isWritable: Bool) {
        self.path = path
        self.descriptor = descriptor
        self.header = header
        self.fileKey = fileKey
        self.layout = header.layout
        self.record = record
        self.isWritable = isWritable
        self.acceptsWritesBehind = isWritable
    }

    deinit {
        if !isClosed { try? descriptor.close() }
        fileKey.discard()
    }

    // MARK: Opening

    /// Creates a new, empty encrypted file (it must not exist) with a fresh per-file key wrapped for `protectionClass`.
    /// Class B needs only the public class key, so this works while the device is locked.
    public static func create(at path: String, protectionClass: ProtectionClass, keys: any ClassKeyProviding,
                              blockSize: Int = defaultBlockSize) throws -> EncryptedFile {
        try create(at: FileLocation(path: path), protectionClass: protectionClass, keys: keys, blockSize: blockSize)
    }

    /// `permissions` are open(2)'s: the process's umask, or the folder's default ACL, applies.
    package static func create(at location: FileLocation, protectionClass: ProtectionClass, flags: FileHeader.Flags = [], keys: any ClassKeyProviding,
                               blockSize: Int = defaultBlockSize, cipher: FileHeader.Cipher = .preferred,
                               permissions: FilePermissions = .ownerReadWrite) throws -> EncryptedFile {
        precondition(blockSize >= FileHeader.minimumBlockSize && blockSize <= FileHeader.maximumBlockSize && blockSize & (blockSize - 1) == 0)
        precondition(cipher.isAvailable)
        let path = location.displayPath
        let (header, fileKey) = try attributingKeyErrors(to: path) {
            try FileHeader.new(protectionClass: protectionClass, flags: flags, cipher: cipher, blockSize: blockSize, keys: keys)
        }
        let descriptor: FileDescriptor
        do {
            descriptor = try location.open(.readWrite, options: [.create, .exclusiveCreate], permissions: permissions,
                                           doing: "create the encrypted file")
        } catch {
            fileKey.discard()
            throw error
        }
        // Until its first write the new file is empty under its name, which an opener takes for a power cut's leftover
        // and gives a header of its own, under this lock (`open`). Taking the lock first, the creator writes before
        // any opener looks, or finds the opener's header and uses that file.
        let headerWrittenMeanwhile: Bool
        do {
            headerWrittenMeanwhile = try lockExclusively(descriptor, path: path) && FileSystem.fileSize(descriptor, path: path) > 0
        } catch {
            fileKey.discard()
            try? descriptor.close()
            location.unlink()
            throw error
        }
        if headerWrittenMeanwhile {
            fileKey.discard()
            try? descriptor.close()
            let adopted = try open(at: location, keys: keys, writable: true)
            guard adopted.protectionClass == protectionClass, adopted.header.flags == flags, adopted.size == 0 else {
                try? adopted.close()
                throw ProtectedStoreError(.alreadyExists, path: path,
                                          problem: "another program opened the file as it was being created and made it a file of its own",
                                          remedy: "Open it, or remove it and create it again")
            }
            return adopted
        }
        let file = EncryptedFile(path: path, descriptor: descriptor, header: header, fileKey: fileKey, record: .empty, isWritable: true)
        do {
            try file.writeFirstSectors()
            _ = flock(descriptor.rawValue, LOCK_UN)
        } catch {
            // Removed before the lock goes with the close: a waiting opener then finds it gone, not part of a header.
            location.unlink()
            // The handle owns the descriptor now: close through it, so nothing closes the number twice.
            try? file.close()
            throw error
        }
        return file
    }

    /// flock(LOCK_EX), waiting; only files found empty are locked this way (`create`, `writeHeader(intoEmpty:)`).
    /// False where the file system has no flock (ENOLCK, EOPNOTSUPP): there the two go on unlocked, as before it.
    private static func lockExclusively(_ descriptor: FileDescriptor, path: String) throws -> Bool {
        while flock(descriptor.rawValue, LOCK_EX) != 0 {
            switch errno {
            case EINTR: continue
            case ENOLCK, EOPNOTSUPP: return false
            default: throw ProtectedStoreError.io(Errno(rawValue: errno), path: path, doing: "lock the file while it is empty")
            }
        }
        return true
    }

    /// The header sector and the length record's sector, in one write.
    private func writeFirstSectors() throws {
        let sealed = try withKey { record.sealed(fileID: header.fileID, key: $0) }
        try writeStored(header.serialized + sealed + [UInt8](repeating: 0, count: Int(BlockLayout.sectorSize) - sealed.count), at: 0)
    }

    /// Opens an existing encrypted file, unwrapping its per-file key with the class key.
    public static func open(at path: String, keys: any ClassKeyProviding, writable: Bool) throws -> EncryptedFile {
        try open(at: FileLocation(path: path), keys: keys, writable: writable)
    }

    /// Opens an existing encrypted file. A stored file with no bytes at all is one whose creation a power cut undid
    /// before its header was durable (ext4 can keep the name of a file created and never synced, and none of its
    /// bytes); with `classIfEmpty` it is given a fresh header of that class and opens as the empty file ext4 would show.
    package static func open(at location: FileLocation, keys: any ClassKeyProviding, writable: Bool,
                             classIfEmpty: (() throws -> ProtectionClass)? = nil) throws -> EncryptedFile {
        let path = location.displayPath
        let descriptor = try location.openRegularFile(writable ? .readWrite : .readOnly, doing: "open the encrypted file")
        let file: EncryptedFile
        do {
            let prefix = try readPrefix(descriptor, path: path)
            if prefix.isEmpty, classIfEmpty != nil { throw FoundEmpty() }
            let header = try FileHeader.parse(prefix, path: path)
            // Before the unwrap: a file of a cipher this build can't use can't be opened here whatever its wrap says,
            // as the format specifies (a tampered cipher byte shows as damage where the cipher is available).
            if let reason = header.cipher.unavailability {
                throw ProtectedStoreError(.unsupportedFormat, path: path, problem: "the file is sealed with \(header.cipher.name) (cipher \(header.cipher.rawValue)), but \(reason.problem)",
                                          remedy: reason.remedy)
            }
            let fileKey = try attributingKeyErrors(to: path) { try header.unwrapFileKey(keys: keys, path: path) }
            let sector = recordSector(prefix)
            let authentic = try attributingKeyErrors(to: path) {
                try fileKey.withUnsafeBytes { LengthRecord.authenticates(sector, fileID: header.fileID, key: $0) }
            }
            guard authentic, let record = LengthRecord.parse(sector, layout: header.layout) else {
                fileKey.discard()
                throw damagedRecordError(path: path)
            }
            file = EncryptedFile(path: path, descriptor: descriptor, header: header, fileKey: fileKey, record: record, isWritable: writable)
        } catch is FoundEmpty {
            try? descriptor.close()
            try writeHeader(intoEmpty: location, protectionClass: classIfEmpty!, keys: keys)
            // Without `classIfEmpty`: found empty again, it is damage.
            return try open(at: location, keys: keys, writable: writable)
        } catch {
            try? descriptor.close()
            throw error
        }
        do {
            try file.checkStoredBlocks()
        } catch {
            // The handle owns the descriptor now: close through it, so nothing closes the number twice.
            try? file.close()
            throw error
        }
        return file
    }

    private struct FoundEmpty: Error {}

    /// Gives a stored file that is still empty the header and length record of a new empty file of the class
    /// `protectionClass` gives. Under an exclusive `flock`, which `create` takes too, so that only one header is ever
    /// written (each would carry a key of its own); whoever comes second finds the bytes there and leaves them. Not
    /// synced: a power cut now only leaves the empty file again.
    private static func writeHeader(intoEmpty location: FileLocation, protectionClass: () throws -> ProtectionClass,
                                    keys: any ClassKeyProviding) throws {
        let path = location.displayPath
        let descriptor = try location.openRegularFile(.readWrite, doing: "give the empty file a header (a power cut undid its creation before its first sync)")
        let file: EncryptedFile
        do {
            _ = try lockExclusively(descriptor, path: path)
            var info = stat()
            guard fstat(descriptor.rawValue, &info) == 0, info.st_size == 0, info.st_nlink > 0 else {
                // Written meanwhile (by its creator, or another opener), or removed: nothing to do here.
                try? descriptor.close()
                return
            }
            let (header, fileKey) = try attributingKeyErrors(to: path) {
                let made = try FileHeader.new(protectionClass: try protectionClass(), flags: [], cipher: .preferred, blockSize: defaultBlockSize, keys: keys)
                // Class B's header needs only the public key, its opening the private one: locked, leave the file empty
                // (a creator may be about to write its own) and report the denial, as for any class B file.
                do {
                    try made.header.unwrapFileKey(keys: keys, path: path).discard()
                } catch {
                    made.fileKey.discard()
                    throw error
                }
                return made
            }
            file = EncryptedFile(path: path, descriptor: descriptor, header: header, fileKey: fileKey, record: .empty, isWritable: true)
        } catch {
            try? descriptor.close()
            throw error
        }
        do {
            try file.writeFirstSectors()
        } catch {
            // Part of a header would read as damage; empty, it opens as before.
            _ = ftruncate(descriptor.rawValue, 0)
            try? file.close()
            throw error
        }
        // Closing releases the lock and zeroes the key.
        try file.close()
    }

    /// Reads only the header, to learn a file's class without any key.
    public static func protectionClass(ofFileAt path: String) throws -> ProtectionClass {
        try header(at: FileLocation(path: path)).protectionClass
    }

    /// The parsed header, read without any key.
    package static func header(at location: FileLocation) throws -> FileHeader {
        let bytes = try location.readPrefix(count: FileHeader.size, what: "file header")
        return try FileHeader.parse(bytes, path: location.displayPath)
    }

    /// The header and the plaintext size, read without any key (for listings before first unlock): the length record's
    /// checksum is checked here, its tag when the file is opened. No header for a stored file with no bytes, which
    /// opens as an empty file (see `open`).
    package static func details(at location: FileLocation) throws -> (header: FileHeader?, size: Int64) {
        let prefix = try location.readPrefix(count: Int(BlockLayout.bodyOffset), what: "file header")
        if prefix.isEmpty { return (nil, 0) }
        let header = try FileHeader.parse(prefix, path: location.displayPath)
        guard let record = LengthRecord.parse(recordSector(prefix), layout: header.layout) else {
            throw damagedRecordError(path: location.displayPath)
        }
        return (header, record.length)
    }

    private static func damagedRecordError(path: String) -> ProtectedStoreError {
        ProtectedStoreError(.integrity, path: path, problem: "the file's length record is damaged: it was modified or corrupted",
                            remedy: "Restore the file from a backup")
    }

    /// The header sector and the length record's sector (fewer bytes if the file is shorter).
    private static func readPrefix(_ descriptor: FileDescriptor, path: String) throws -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Int(BlockLayout.bodyOffset))
        let read = try bytes.withUnsafeMutableBytes { buffer in
            try FileSystem.mappingErrno(path: path, doing: "read the file header") { try descriptor.read(fromAbsoluteOffset: 0, into: buffer) }
        }
        return Array(bytes[0..<read])
    }

    private static func recordSector(_ prefix: [UInt8]) -> ArraySlice<UInt8> {
        prefix.count > Int(BlockLayout.recordOffset) ? prefix[Int(BlockLayout.recordOffset)...] : []
    }

    /// Fails if blocks that were durable at the last fsync are missing (the file was cut), and cuts off stored blocks
    /// past the extent that a power cut left behind (a lost shrink or a lost append), before anything can reuse them.
    private func checkStoredBlocks() throws {
        let storedSize = Int64(try FileSystem.fileSize(descriptor, path: path))
        // A record never claims more synced blocks than its extent (LengthRecord.parse checks it).
        synchronizedExtent = record.synchronizedExtent
        guard storedSize >= layout.storedOffset(ofBlock: synchronizedExtent) else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the file is \(storedSize) bytes, shorter than the \(synchronizedExtent) blocks it had stored: it was truncated",
                                      remedy: "Restore the file from a backup")
        }
        if isWritable && storedSize > layout.storedOffset(ofBlock: record.extent) {
            try DurableIO.truncate(descriptor, to: layout.storedOffset(ofBlock: record.extent), path: path)
            try DurableIO.synchronizeContents(descriptor, path: path)
        }
        if isWritable {
            let firstHole = ps_seek_hole(descriptor.rawValue, BlockLayout.bodyOffset)
            // A stored file shorter than its extent (an append a power cut lost) counts: its end is a hole below it.
            mayHaveInteriorHoles = firstHole < 0 || firstHole < layout.storedOffset(ofBlock: record.extent)
        }
    }

    // MARK: Properties

    /// Plaintext size in bytes.
    public var size: Int64 {
        behind.waitUntilStored()
        return lock.withReadLock { record.length }
    }

    /// The largest plaintext size this file can have.
    public var maximumSize: Int64 { layout.maximumPlaintextSize }

    /// The file's random id (in every block's associated data).
    package var fileID: [UInt8] { lock.withReadLock { header.fileID } }

    /// The class whose key wraps this file's key.
    public var protectionClass: ProtectionClass { lock.withReadLock { header.protectionClass } }

    /// Sealed for class B while locked by an Inbox delivery: takes its directory's class at the first unlocked open.
    package var awaitsDefaultClass: Bool { lock.withReadLock { header.flags.contains(.awaitsDefaultClass) } }

    /// The stored file's descriptor, for metadata calls on an open file (fstat, fchmod, futimens); never for its bytes.
    package var metadataDescriptor: FileDescriptor { descriptor }

    /// Plaintext bytes per block of this file.
    public var blockSize: Int { Int(layout.blockSize) }

    private var blocksPerPass: Int64 { max(1, Int64(Self.maximumBytesPerPass) / layout.blockSize) }

    // MARK: Reading

    /// Reads up to `count` bytes at `offset`; fewer at the end of the file.
    public func read(at offset: Int64, count: Int) throws -> [UInt8] {
        let available = max(0, min(Int64(count), size - offset))
        var bytes = [UInt8](repeating: 0, count: Int(available))
        let read = try bytes.withUnsafeMutableBytes { try self.read(into: $0, at: offset) }
        return read == bytes.count ? bytes : Array(bytes[0..<read])
    }

    /// Reads the whole plaintext.
    public func readAll() throws -> [UInt8] { try read(at: 0, count: Int(size)) }

    /// Reads into `buffer` at `offset`; returns the number of bytes read (0 at or past the end).
    /// Fails with an integrity error naming the block if any block does not authenticate; nothing unauthenticated is returned.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        precondition(offset >= 0, "negative offset")
        behind.waitUntilStored()
        return try lock.withReadLock {
            try checkOpen()
            let end = min(record.length, offset + Int64(buffer.count))
            guard offset < end else { return 0 }
            try withKey { key in
                var position = offset
                while position < end {
                    let first = layout.blockIndex(containing: position)
                    let last = min(layout.blockIndex(containing: end - 1), first + blocksPerPass - 1)
                    let passEnd = min(end, (last + 1) * layout.blockSize)
                    let destination = UnsafeMutableRawBufferPointer(rebasing: buffer[Int(position - offset)..<Int(passEnd - offset)])
                    try decryptRange(firstBlock: first, lastBlock: last, plaintextStart: position, into: destination, key: key)
                    position = passEnd
                }
            }
            return Int(end - offset)
        }
    }

    // MARK: Writing

    /// Writes `bytes` at `offset`, extending the file (zero-filled) if `offset` is past the end.
    public func write(_ bytes: [UInt8], at offset: Int64) throws {
        try bytes.withUnsafeBytes { try write(from: $0, at: offset) }
    }

    /// Writes the contents of `buffer` at `offset`, extending the file (with a hole, which costs no storage) if
    /// `offset` is past the end. Only the blocks the write covers are written, then the length record if it changed.
    /// A full disk (ENOSPC, EDQUOT) fails the call with the file unchanged: its space is reserved first, or, for an
    /// append, what it stored is cut off again.
    public func write(from buffer: UnsafeRawBufferPointer, at offset: Int64) throws {
        precondition(offset >= 0, "negative offset")
        behind.waitUntilStored()
        try store(buffer, at: offset)
    }

    private func store(_ buffer: UnsafeRawBufferPointer, at offset: Int64) throws {
        try lock.withWriteLock {
            try checkWritable()
            guard buffer.count > 0 else { return }
            let end = offset + Int64(buffer.count)
            try checkSize(end)
            try withKey { key in
                let first = layout.blockIndex(containing: offset), last = layout.blockIndex(containing: end - 1)
                // An injected full disk (testing kit) fails here too, before anything changed; with a length record per pass.
                let passes = (last - first) / blocksPerPass + 1
                try FaultInjection.checkWrite(descriptor, count: storedBytes(first: first, last: last), path: path, consuming: false)
                // A small one-pass write with no holes below the extent stores its blocks past the extent first (they
                // show nothing until the length record), then the ones it overwrites, which need no new space: a full
                // disk under it is undone by cutting the stored file back. Any other write that needs new space (holes
                // below the extent, large or multi-pass writes) reserves it first. Either way a full disk fails the
                // call before anything a reader sees changed. (fallocate is not free: a reservation before every
                // journal write cost SQLite's inserts 10 %.)
                let isAppend = passes == 1 && !mayHaveInteriorHoles && Int64(buffer.count) < Self.parallelThresholdBytes
                if !isAppend && (last >= record.extent || mayHaveInteriorHoles) {
                    _ = try reserveSpace(plaintext: offset..<end)
                }
                // A gap between the extent and this write stays a hole of the stored file.
                if first > record.extent { mayHaveInteriorHoles = true }
                let undo = isAppend ? (extent: record.extent, what: "write \(buffer.count) bytes at offset \(offset) (the file is unchanged)") : nil
                try mutating(undoingAppend: undo) {
                    var position = offset
                    while position < end {
                        let first = layout.blockIndex(containing: position)
                        let passEnd = min(end, (first + blocksPerPass) * layout.blockSize)
                        let source = UnsafeRawBufferPointer(rebasing: buffer[Int(position - offset)..<Int(passEnd - offset)])
                        try writePass(source, at: position, key: key)
                        position = passEnd
                    }
                }
            }
        }
    }

    /// Stored bytes a write over blocks `first...last` may take: the blocks, and a length record per pass.
    private func storedBytes(first: Int64, last: Int64) -> Int64 {
        layout.storedOffset(ofBlock: last + 1) - layout.storedOffset(ofBlock: first) + ((last - first) / blocksPerPass + 1) * BlockLayout.sectorSize
    }

    // MARK: Writing behind

    /// Writes at least this large are worth storing behind the caller's back (`writeBehind`): below it the copy and
    /// the hand-over to another thread cost about what the overlap saves.
    package static let writeBehindThreshold = 64 * 1024

    /// Accepts a write to be stored in the background after this file's earlier ones, and returns once `buffer` is
    /// copied, so the caller's next write overlaps this one's encryption (the mount uses it for large writes).
    /// Whatever would fail the write later fails it now, changing nothing: a size past the format's limit, and (by
    /// storing the write before this returns, which fails it with the precise error) a closed, read-only or broken
    /// handle, a discarded key, an injected full disk, or a disk with less than `roomBehind` free besides what the
    /// accepted writes will take, so that a full disk fails the write that meets it. Storing can still fail (an
    /// I/O error, a damaged neighbour block, another program taking the last free `roomBehind`, a user quota, which
    /// free space doesn't show); `failureOfWritesBehind(after:)` reports that once to each reader that counts its own
    /// (the mount's descriptors).
    /// Every other operation waits for the writes accepted before it, and `discardKey()` stores them first.
    package func writeBehind(from buffer: UnsafeRawBufferPointer, at offset: Int64) throws {
        precondition(offset >= 0, "negative offset")
        guard buffer.count > 0 else { return }
        let end = offset + Int64(buffer.count)
        try checkSize(end)
        let first = layout.blockIndex(containing: offset), last = layout.blockIndex(containing: end - 1)
        let storedBytes = storedBytes(first: first, last: last)
        // Checked before the copy too, so a refused write neither copies plaintext nor waits for room in the budget.
        guard acceptance.withLock({ acceptsWritesBehind }), !FaultInjection.limitsWrites(descriptor), hasRoomBehind(for: storedBytes) else {
            return try write(from: buffer, at: offset)
        }
        let write = WritesBehind.copy(buffer, at: offset, storedBytes: storedBytes)
        let accepted = acceptance.withLock {
            guard acceptsWritesBehind else { return false }
            if behind.accept(write) { DispatchQueue.global().async { self.storeWritesBehind() } }
            return true
        }
        if !accepted {
            WritesBehind.discard(write)
            try self.write(from: buffer, at: offset)
        }
    }

    /// Whether a write behind of any file of this process is still to be stored: when none is, calls by path need
    /// not look for an open file to wait for.
    package static var hasWritesBehindAnywhere: Bool { WritesBehind.outstandingEverywhere > 0 }

    /// How many writes `writeBehind` has queued on this handle (tests check that their writes went behind).
    package var writesQueuedBehind: UInt64 { behind.acceptedCount }

    /// Free space a write behind leaves at least, besides what all accepted writes will take. Reserving each write's
    /// space (fallocate) instead cost more than the overlap saved: 66 µs per 128 KiB on tmpfs, which zeroes the pages.
    private static let roomBehind: Int64 = 256 << 20

    private func hasRoomBehind(for storedBytes: Int64) -> Bool {
        var info = statvfs()
        guard fstatvfs(descriptor.rawValue, &info) == 0 else { return false }
        let free = Int64(info.f_bavail) * Int64(info.f_frsize)
        return free - WritesBehind.outstandingEverywhere - storedBytes >= Self.roomBehind
    }

    /// Waits until the writes accepted so far are stored, for calls on the stored file itself (fstat, futimens, fchmod)
    /// that would otherwise see it before them, or be undone by them (a later write sets the modification time).
    package func waitForWritesBehind() {
        behind.waitUntilStored()
    }

    /// How many writes behind could not be stored so far; a reader samples it when it starts to count.
    package var failuresOfWritesBehind: Int { behind.failureCount }

    /// The latest write behind that could not be stored, if the reader has heard of only `seen` failures (then
    /// updated); it does not wait for queued writes (`waitForWritesBehind()` first, for a flush or an fsync).
    package func failureOfWritesBehind(after seen: inout Int) -> ProtectedStoreError? {
        behind.failure(after: &seen)
    }

    /// The background job: stores the accepted writes in order until none is left.
    private func storeWritesBehind() {
        while let (write, drop) = behind.next() {
            var failure: (any Error)?
            if !drop {
                do { try store(UnsafeRawBufferPointer(write.bytes), at: write.offset) } catch { failure = error }
            }
            behind.finish(write, failedWith: failure, path: path)
        }
    }

    /// Shrinks or grows (with zeros) the plaintext to `newSize` bytes. Growing writes only the length record (the
    /// new bytes are a hole); a size beyond `maximumSize` fails with EFBIG and changes nothing.
    public func truncate(to newSize: Int64) throws {
        precondition(newSize >= 0, "negative size")
        behind.waitUntilStored()
        try lock.withWriteLock {
            try checkWritable()
            try checkSize(newSize)
            try mutating { try withKey { key in
                if newSize > record.length {
                    try storeLength(newSize, key: key)
                } else if newSize < record.length {
                    try shrink(to: newSize, key: key)
                }
            } }
        }
    }

    /// fallocate: reserves disk space for the ciphertext of plaintext bytes `offset..<offset + length`, so later writes
    /// there cannot fail for lack of space; unless `keepSize`, the file grows to cover the range. Reserved space reads as
    /// zeros (a hole) until written. A call that fails (ENOSPC, EFBIG, EOPNOTSUPP) leaves size and content as they were.
    public func allocate(from offset: Int64, length: Int64, keepSize: Bool) throws {
        precondition(offset >= 0 && length > 0, "negative offset or empty range")
        behind.waitUntilStored()
        try lock.withWriteLock {
            try checkWritable()
            let (end, overflow) = offset.addingReportingOverflow(length)
            try checkSize(overflow ? Int64.max : end)
            guard try reserveSpace(plaintext: offset..<end) else {
                throw ProtectedStoreError.io(.notSupported, path: path, doing: "reserve space (the backing file system has no fallocate)")
            }
            guard !keepSize && end > record.length else { return }
            try mutating { try withKey { key in try storeLength(end, key: key) } }
        }
    }

    /// What `seek(to:from:)` looks for.
    package enum Region: Sendable { case data, hole }

    /// lseek's SEEK_DATA and SEEK_HOLE on the plaintext: where the next data or hole starts at or after `offset`; nil
    /// (ENXIO) when `offset` is at or past the end, or when no data follows it. A block is a hole when its stored
    /// bytes include a hole of the stored file (it was never written); every block past the stored ones is a hole,
    /// and so is the end of the file. SEEK_HOLE at a data offset always lands past it, so copy tools make progress.
    package func seek(to region: Region, from offset: Int64) throws -> Int64? {
        behind.waitUntilStored()
        return try lock.withReadLock {
            try checkOpen()
            guard offset >= 0, offset < record.length else { return nil }
            let first = layout.blockIndex(containing: offset)
            let storedEnd = min(record.extent, layout.blockCount(plaintextSize: record.length))
            switch region {
            case .data:
                guard let block = try firstDataBlock(from: first, before: storedEnd) else { return nil }
                return max(offset, block * layout.blockSize)
            case .hole:
                let block = first < storedEnd ? min(storedEnd, try firstHoleBlock(from: first)) : first
                return min(record.length, max(offset, block * layout.blockSize))
            }
        }
    }

    /// The first block at or after `block` whose stored bytes include a hole (the stored file's end counts as one).
    private func firstHoleBlock(from block: Int64) throws -> Int64 {
        let hole = ps_seek_hole(descriptor.rawValue, layout.storedOffset(ofBlock: block))
        if hole < 0 {
            guard Foundation.errno == ENXIO else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "seek to a hole") }
            return block  // at or past the stored file's end
        }
        return max(block, layout.blockIndex(atStoredOffset: hole))
    }

    /// The first block in `block..<end` with no hole in its stored bytes.
    private func firstDataBlock(from block: Int64, before end: Int64) throws -> Int64? {
        var candidate = block
        while candidate < end {
            let hole = try firstHoleBlock(from: candidate)
            if hole > candidate { return candidate }
            let data = ps_seek_data(descriptor.rawValue, layout.storedOffset(ofBlock: candidate))
            if data < 0 {
                guard Foundation.errno == ENXIO else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: path, doing: "seek to data") }
                return nil
            }
            // A block whose stored bytes start inside the data found has a hole before it, so it is a hole too.
            let containing = layout.blockIndex(atStoredOffset: data)
            candidate = max(candidate + 1, data == layout.storedOffset(ofBlock: containing) ? containing : containing + 1)
        }
        return nil
    }

    /// Flushes data and metadata to stable storage (fsync).
    public func synchronize() throws {
        behind.waitUntilStored()
        try lock.withWriteLock {
            try checkOpen()
            try DurableIO.synchronizeContents(descriptor, path: path)
            synchronizedExtent = record.extent
        }
    }

    /// Re-wraps the per-file key for `newClass` and rewrites the header sector only (clearing its flags); the body is untouched.
    public func changeProtectionClass(to newClass: ProtectionClass, keys: any ClassKeyProviding) throws {
        behind.waitUntilStored()
        try lock.withWriteLock {
            try checkWritable()
            let newHeader = try Self.attributingKeyErrors(to: path) {
                try FileHeader.sealing(fileKey: fileKey, fileID: header.fileID, protectionClass: newClass, cipher: header.cipher, blockSize: header.blockSize, keys: keys)
            }
            try writeStored(newHeader.serialized, at: 0)
            // What is stored now, synced or not: a retry after a failed sync must not take the old class for the file's.
            header = newHeader
            try DurableIO.synchronizeContents(descriptor, path: path)
        }
    }

    /// Brings the stored length record up to what the last `synchronize()` made durable, as `close()` would, without
    /// closing: for a file about to change hands (a drop renamed into the Inbox), so nothing is written to it after.
    package func storeSynchronizedRecord() throws {
        try withWritesBehindStopped(exclusively: true) {
            try checkWritable()
            // Without the key (a lock discarded it) close writes nothing either.
            if !fileKey.isDiscarded, record.synchronizedExtent < min(synchronizedExtent, record.extent) {
                try withKey { key in try store(record, key: key) }
            }
        }
    }

    /// Closes the descriptor and zeroes the per-file key. If an fsync made more blocks durable than the length record
    /// says, the record is brought up to date first (no fsync needed: it only claims what is already durable).
    public func close() throws {
        try withWritesBehindStopped(exclusively: true) {
            guard !isClosed else { return }
            if isWritable, failedWrite == nil, !fileKey.isDiscarded, record.synchronizedExtent < min(synchronizedExtent, record.extent) {
                try? withKey { key in try store(record, key: key) }
            }
            isClosed = true
            fileKey.discard()
            try FileSystem.mappingErrno(path: path, doing: "close") { try descriptor.close() }
        }
    }

    /// Zeroes the per-file key now (the device is locking); the handle then fails every operation with a data-protection error.
    public func discardKey() {
        // Writes accepted while the key was there are stored first. Under the lock (shared, so a stream of reads
        // can't hold it off), so a key being restored is either discarded too or installed after this returns.
        withWritesBehindStopped(exclusively: false) { fileKey.discard() }
    }

    /// Runs `body` under the lock once every accepted write is stored, with `writeBehind` accepting none. It stops
    /// accepting first: a writer faster than the job would otherwise keep the queue from ever emptying. Shared is
    /// enough to exclude the job, which stores under the exclusive lock.
    private func withWritesBehindStopped(exclusively: Bool, _ body: () throws -> Void) rethrows {
        while true {
            // On every pass: `restoreKey` may have let writes in again, and a fast writer would keep the queue full.
            acceptance.withLock { acceptsWritesBehind = false }
            behind.waitUntilStored()
            let stopped = exclusively ? try lock.withWriteLock { try runIfSettled(body) } : try lock.withReadLock { try runIfSettled(body) }
            if stopped { return }
        }
    }

    /// Runs `body` if no accepted write is left to store; false if one came after `restoreKey` let writes in again
    /// (a close racing another descriptor's key restore).
    private func runIfSettled(_ body: () throws -> Void) rethrows -> Bool {
        let settled = acceptance.withLock {
            guard behind.isSettled else { return false }
            acceptsWritesBehind = false
            return true
        }
        if settled { try body() }
        return settled
    }

    /// Whether the per-file key is still in memory (not discarded by a lock).
    package var hasKey: Bool { lock.withReadLock { !fileKey.isDiscarded } }

    /// Unwraps the per-file key again after `discardKey()`, once its class key is back, so a descriptor held across a
    /// lock works again after the unlock, as an open file does under XNU's content protection. `admit` (given the
    /// file's class and id) registers the file with the lock before the key is installed, under this file's lock, so
    /// no operation can use a key that a lock racing with the restore would not discard. Does nothing if the key is there.
    package func restoreKey(keys: any ClassKeyProviding, admit: (ProtectionClass, [UInt8]) throws -> Void) throws {
        try lock.withWriteLock {
            try checkOpen()
            guard fileKey.isDiscarded else { return }
            let restored = try Self.attributingKeyErrors(to: path) { try header.unwrapFileKey(keys: keys, path: path) }
            do {
                try admit(header.protectionClass, header.fileID)
            } catch {
                restored.discard()
                throw error
            }
            fileKey = restored
            acceptance.withLock { acceptsWritesBehind = isWritable }
        }
    }

    // MARK: Block machinery

    private func checkOpen() throws {
        guard !isClosed else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "the file handle is closed", remedy: "Open the file again")
        }
        if let failedWrite {
            throw ProtectedStoreError(failedWrite.kind, path: path, problem: "an earlier write on this handle failed part-way (\(failedWrite.problem))",
                                      remedy: "Close the handle and open the file again")
        }
    }

    /// Runs a mutation; if it fails after touching the disk, the handle refuses further use instead of trusting stale
    /// state. A failure before any write (a damaged block it had to read first, say) leaves the handle usable.
    /// An append (`undoingAppend`) that meets a full disk before its length record is undone instead: the stored file
    /// is cut back to the extent it had, and the handle stays usable.
    private func mutating(undoingAppend append: (extent: Int64, what: String)? = nil, _ body: () throws -> Void) throws {
        storedWrites = 0
        do {
            try body()
        } catch let error as ProtectedStoreError where (error.kind == .io || error.kind == .integrity) && storedWrites > 0 {
            if let append, let errno = error.errno, errno == .noSpace || errno == .diskQuotaExceeded, record.extent == append.extent,
               (try? DurableIO.truncate(descriptor, to: layout.storedOffset(ofBlock: append.extent), path: path)) != nil {
                throw ProtectedStoreError.io(errno, path: path, doing: append.what)
            }
            failedWrite = error
            acceptance.withLock { acceptsWritesBehind = false }
            throw error
        }
    }

    /// Reserves disk space (fallocate, keeping the stored size) for the stored blocks of the plaintext `range`.
    /// False when the backing file system cannot reserve space; throws ENOSPC, EDQUOT and the like, having changed nothing.
    private func reserveSpace(plaintext range: Range<Int64>) throws -> Bool {
        let start = layout.storedOffset(ofBlock: layout.blockIndex(containing: range.lowerBound))
        let end = layout.storedOffset(ofBlock: layout.blockCount(plaintextSize: range.upperBound))
        guard ps_reserve_space(descriptor.rawValue, start, end - start) != 0 else { return true }
        let failure = Errno(rawValue: Foundation.errno)
        guard failure != .notSupported && failure != .noFunction else { return false }
        // ext4 and XFS keep what a failed fallocate managed to take past the end; setting the same size gives it back,
        // so a failed write leaves the disk's free space as it found it. (Size and content are unchanged either way.)
        if let size = try? FileSystem.fileSize(descriptor, path: path) { _ = try? descriptor.resize(to: Int64(size), retryOnInterrupt: true) }
        throw ProtectedStoreError.io(failure, path: path, doing: "reserve space for \(range.count) bytes at offset \(range.lowerBound) (the file is unchanged)")
    }

    private func checkWritable() throws {
        try checkOpen()
        guard isWritable else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "the file was opened read-only", remedy: "Open it with writable: true")
        }
    }

    /// EFBIG, before anything is touched, for a size the format cannot hold.
    private func checkSize(_ size: Int64) throws {
        guard size <= layout.maximumPlaintextSize else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "\(size) bytes is beyond the largest size an encrypted file can have (\(layout.maximumPlaintextSize) bytes)",
                                      remedy: "Use a smaller size", errno: .fileTooLarge)
        }
    }

    private func withKey<R>(_ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        do {
            return try fileKey.withUnsafeBytes(body)
        } catch is SecureBytes.Discarded {
            throw Self.keyDiscardedError(path: path)
        }
    }

    private static func keyDiscardedError(path: String) -> ProtectedStoreError {
        ProtectedStoreError(.protectedDataUnavailable, path: path, problem: "the key was discarded when the device locked",
                            remedy: "Open the file again after unlocking")
    }

    /// Runs a key operation, naming `path` in its errors and turning a key discarded mid-way (a lock) into a data-protection error.
    static func attributingKeyErrors<R>(to path: String, _ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch is SecureBytes.Discarded {
            throw keyDiscardedError(path: path)
        } catch let error as ProtectedStoreError {
            throw error.naming(path)
        }
    }

    /// Associated data of block `index`: file id ‖ index (u64 LE), so a block can't move to another place or file.
    private func blockAssociatedData(index: Int64) -> [UInt8] {
        var writer = ByteWriter(capacity: FileHeader.idBytes + 8)
        writer.append(header.fileID)
        writer.append(UInt64(index))
        return writer.bytes
    }

    /// Writes `newRecord` over the length record (one sector, so a power cut leaves the old one or this one). It
    /// claims no more durable blocks than the last fsync made durable.
    private func store(_ newRecord: LengthRecord, key: UnsafeRawBufferPointer) throws {
        var next = newRecord
        next.synchronizedExtent = min(synchronizedExtent, next.extent)
        try writeStored(next.sealed(fileID: header.fileID, key: key), at: BlockLayout.recordOffset)
        record = next
    }

    /// Grows the file to `length` by the record alone: the new bytes are a hole.
    private func storeLength(_ length: Int64, key: UnsafeRawBufferPointer) throws {
        var grown = record
        grown.length = length
        try store(grown, key: key)
    }

    /// Decrypts blocks `first...last` into `destination`, which starts at plaintext offset `plaintextStart`
    /// (inside block `first`) and ends inside block `last`. Blocks at or past the extent, and holes (a stored block
    /// of zeros, or one past the end of the file that no fsync had made durable), read as zeros.
    private func decryptRange(firstBlock first: Int64, lastBlock last: Int64, plaintextStart: Int64,
                              into destination: UnsafeMutableRawBufferPointer, key: UnsafeRawBufferPointer) throws {
        let blockCount = Int(last - first + 1)
        let storedStart = layout.storedOffset(ofBlock: first)
        let storedCount = Int(layout.storedOffset(ofBlock: min(last + 1, max(first, record.extent))) - storedStart)
        // Its own buffer, not the write scratch: reads run concurrently under the shared lock.
        let storedBytes = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, storedCount), alignment: 16)
        defer { storedBytes.deallocate() }
        let storedBlock = Int(layout.storedBlockSize), plainBlock = Int(layout.blockSize)
        // Blocks an fsync had made durable (never fewer than the record claims): one of them missing means the file was
        // cut, not that a power cut lost it.
        let durable = min(record.extent, synchronizedExtent)
        let failures = try forEachBlockInParallel(count: blockCount) { range in
            let rangeStart = range.lowerBound * storedBlock
            let rangeEnd = min(storedCount, range.upperBound * storedBlock)
            let available = rangeEnd > rangeStart
                ? try readStored(into: UnsafeMutableRawBufferPointer(rebasing: storedBytes[rangeStart..<rangeEnd]), at: storedStart + Int64(rangeStart))
                : 0
            let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: plainBlock, alignment: 16)
            defer {
                zeroize(scratch.baseAddress!, count: scratch.count)
                scratch.deallocate()
            }
            return BlockCipher.with(header.cipher, fileKey: key) { opener in
                for offsetInRange in range {
                    let index = first + Int64(offsetInRange)
                    let blockStart = index * layout.blockSize
                    // The slice of this block the caller wants, in destination coordinates.
                    let wantedStart = max(blockStart, plaintextStart)
                    let wantedEnd = min(blockStart + layout.blockSize, plaintextStart + Int64(destination.count))
                    let target = UnsafeMutableRawBufferPointer(rebasing: destination[Int(wantedStart - plaintextStart)..<Int(wantedEnd - plaintextStart)])
                    let start = offsetInRange * storedBlock
                    if index >= record.extent || start + storedBlock > rangeStart + available {
                        // Past the extent, or not (wholly) stored: zeros, unless an fsync had made the block durable.
                        if index < record.extent && index < durable { return index }
                        target.initializeMemory(as: UInt8.self, repeating: 0)
                        continue
                    }
                    let block = UnsafeRawBufferPointer(rebasing: storedBytes[start..<start + storedBlock])
                    // A whole wanted block is decrypted in place; a partly wanted one aside, so only wanted bytes reach the caller.
                    let whole = target.count == plainBlock
                    let opened = whole ? target : scratch
                    if openBlock(block, with: opener, associatedData: blockAssociatedData(index: index), into: opened) {
                        if let tail = record.staleTails.first(where: { $0.block == index }) {
                            UnsafeMutableRawBufferPointer(rebasing: opened[tail.validBytes...]).initializeMemory(as: UInt8.self, repeating: 0)
                        }
                    } else if block.allSatisfy({ $0 == 0 }) {
                        // A hole: the stored block was never written.
                        opened.initializeMemory(as: UInt8.self, repeating: 0)
                    } else {
                        return index
                    }
                    if !whole {
                        let from = Int(wantedStart - blockStart)
                        target.copyMemory(from: UnsafeRawBufferPointer(rebasing: opened[from..<from + target.count]))
                    }
                }
                return nil
            }
        }
        if let failed = failures.min() {
            destination.initializeMemory(as: UInt8.self, repeating: 0)
            throw ProtectedStoreError(.integrity, path: path, problem: "block \(failed) (plaintext bytes \(failed * layout.blockSize)…) failed authentication or is missing: the file was modified or corrupted",
                                      remedy: "Restore the file from a backup")
        }
    }

    private func openBlock(_ block: UnsafeRawBufferPointer, with opener: BlockCipher, associatedData: [UInt8],
                           into target: UnsafeMutableRawBufferPointer) -> Bool {
        associatedData.withUnsafeBytes { ad in
            opener.open(UnsafeRawBufferPointer(rebasing: block[BlockLayout.nonceBytes...]),
                        nonceField: UnsafeRawBufferPointer(rebasing: block[0..<BlockLayout.nonceBytes]), associatedData: ad, into: target)
        }
    }

    /// One pass of a write spanning at most `blocksPerPass` blocks: the blocks it covers are sealed and stored with
    /// one pwrite, then the length record follows if the size or the extent changed. Blocks it does not cover are never
    /// touched, so a power cut that tears this write cannot damage them.
    private func writePass(_ source: UnsafeRawBufferPointer, at offset: Int64, key: UnsafeRawBufferPointer) throws {
        let end = offset + Int64(source.count)
        let first = layout.blockIndex(containing: offset)
        let last = layout.blockIndex(containing: end - 1)
        // Edge blocks that keep some old bytes are assembled aside: old plaintext, then the new bytes over it.
        var edges: [Int64: UnsafeMutableRawBufferPointer] = [:]
        defer { edges.values.forEach { $0.deallocate() } }
        for index in Set([first, last]) {
            let blockStart = index * layout.blockSize
            let coveredStart = max(blockStart, offset), coveredEnd = min(blockStart + layout.blockSize, end)
            guard coveredStart != blockStart || coveredEnd != blockStart + layout.blockSize else { continue }
            let assembled = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(layout.blockSize), alignment: 16)
            assembled.initializeMemory(as: UInt8.self, repeating: 0)
            edges[index] = assembled
            if index < record.extent && blockStart < record.length {
                try decryptRange(firstBlock: index, lastBlock: index, plaintextStart: blockStart, into: assembled, key: key)
                // Bytes past the end of the file are zeros in every stored block (a stale tail reads as zeros too).
                let live = Int(max(0, min(layout.blockSize, record.length - blockStart)))
                UnsafeMutableRawBufferPointer(rebasing: assembled[live...]).initializeMemory(as: UInt8.self, repeating: 0)
            }
            UnsafeMutableRawBufferPointer(rebasing: assembled[Int(coveredStart - blockStart)..<Int(coveredEnd - blockStart)])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[Int(coveredStart - offset)..<Int(coveredEnd - offset)]))
        }
        try encryptAndStore(firstBlock: first, blockCount: Int(last - first + 1), key: key, newBlocksFrom: record.extent) { index in
            if let edge = edges[index] { return UnsafeRawBufferPointer(edge) }
            let blockStart = index * layout.blockSize
            return UnsafeRawBufferPointer(rebasing: source[Int(blockStart - offset)..<Int(blockStart - offset + layout.blockSize)])
        }
        var next = record
        next.length = max(record.length, end)
        next.extent = max(record.extent, last + 1)
        // A stale tail this write covered is zero in the new block; the record may forget it only once that block is
        // durable, or a power cut could pair the old block with a record that no longer hides its stale bytes.
        let rewritten = next.staleTails.filter { (first...last).contains($0.block) }
        if !rewritten.isEmpty {
            try DurableIO.synchronizeContents(descriptor, path: path)
            synchronizedExtent = next.extent
            next.staleTails.removeAll { (first...last).contains($0.block) }
        }
        if next != record { try store(next, key: key) }
    }

    /// Cuts the file to `newSize` without rewriting any block: the record takes the new length, the block cut mid-way
    /// gets a stale tail, and once that record is durable the blocks past the new extent are cut off the stored file.
    private func shrink(to newSize: Int64, key: UnsafeRawBufferPointer) throws {
        var next = record
        next.length = newSize
        next.extent = min(record.extent, layout.blockCount(plaintextSize: newSize))
        next.staleTails.removeAll { $0.block >= next.extent }
        let cut = layout.blockIndex(containing: newSize)
        if newSize % layout.blockSize != 0 && cut < next.extent {
            let valid = Int(newSize - cut * layout.blockSize)
            if let existing = next.staleTails.firstIndex(where: { $0.block == cut }) {
                next.staleTails[existing].validBytes = min(next.staleTails[existing].validBytes, valid)
            } else {
                if next.staleTails.count == LengthRecord.maximumStaleTails {
                    try rewriteOldestStaleTail(&next, key: key)
                }
                next.staleTails.append(LengthRecord.StaleTail(block: cut, validBytes: valid))
            }
        }
        try store(next, key: key)
        try DurableIO.synchronizeContents(descriptor, path: path)
        synchronizedExtent = next.extent
        if try Int64(FileSystem.fileSize(descriptor, path: path)) > layout.storedOffset(ofBlock: next.extent) {
            // Durably cut before anything can extend the file over those blocks again, which would bring them back.
            try DurableIO.truncate(descriptor, to: layout.storedOffset(ofBlock: next.extent), path: path)
            try DurableIO.synchronizeContents(descriptor, path: path)
        }
    }

    /// Makes room in a full stale-tail table (many shrinks, each followed by growth past the block it cut): the oldest
    /// stale block is rewritten with its stale bytes zeroed and made durable before the record forgets it.
    private func rewriteOldestStaleTail(_ next: inout LengthRecord, key: UnsafeRawBufferPointer) throws {
        let oldest = next.staleTails[0]
        var plaintext = [UInt8](repeating: 0, count: Int(layout.blockSize))
        defer { zeroize(&plaintext) }
        try plaintext.withUnsafeMutableBytes { buffer in
            try decryptRange(firstBlock: oldest.block, lastBlock: oldest.block, plaintextStart: oldest.block * layout.blockSize, into: buffer, key: key)
        }
        try plaintext.withUnsafeBytes { buffer in
            try encryptAndStore(firstBlock: oldest.block, blockCount: 1, key: key) { _ in buffer }
        }
        try DurableIO.synchronizeContents(descriptor, path: path)
        next.staleTails.removeFirst()
    }

    /// Seals blocks `first..<first+count` (each exactly one block of plaintext, from `plaintextOfBlock`) and writes
    /// them, those from `newBlocksFrom` on (new space) before the ones below it.
    private func encryptAndStore(firstBlock first: Int64, blockCount: Int, key: UnsafeRawBufferPointer,
                                 newBlocksFrom newBlocks: Int64? = nil, plaintextOfBlock: (Int64) -> UnsafeRawBufferPointer) throws {
        let storedStart = layout.storedOffset(ofBlock: first)
        let storedBlock = Int(layout.storedBlockSize)
        let storedCount = blockCount * storedBlock
        reserveScratch(storedCount)
        // Counted here, not in the workers' writes, which run in parallel.
        storedWrites += 1
        var nonces = [UInt8](repeating: 0, count: blockCount * BlockLayout.nonceBytes)
        nonces.withUnsafeMutableBytes { BlockCipher.makeNonceFields(header.cipher, count: blockCount, into: $0) }
        try storedScratch.withUnsafeMutableBytes { stored in
            _ = try nonces.withUnsafeBytes { nonceBytes in
                try forEachBlockInParallel(count: blockCount) { range in
                    BlockCipher.with(header.cipher, fileKey: key) { sealer in
                        for offsetInRange in range {
                            let index = first + Int64(offsetInRange)
                            let plaintext = plaintextOfBlock(index)
                            let start = offsetInRange * storedBlock
                            let nonce = UnsafeRawBufferPointer(rebasing: nonceBytes[offsetInRange * BlockLayout.nonceBytes..<(offsetInRange + 1) * BlockLayout.nonceBytes])
                            UnsafeMutableRawBufferPointer(rebasing: stored[start..<start + BlockLayout.nonceBytes]).copyMemory(from: nonce)
                            let ad = blockAssociatedData(index: index)
                            ad.withUnsafeBytes { adBytes in
                                sealer.seal(plaintext, nonceField: nonce, associatedData: adBytes,
                                            into: UnsafeMutableRawBufferPointer(rebasing: stored[start + BlockLayout.nonceBytes..<start + storedBlock]))
                            }
                        }
                    }
                    // Each range writes its own bytes, so one range's pwrite overlaps another's encryption.
                    let rangeStart = range.lowerBound * storedBlock
                    let rangeEnd = range.upperBound * storedBlock
                    // Blocks past the extent (new space) go first: if the disk is full, nothing stored has changed yet.
                    let split = newBlocks.map { min(rangeEnd, max(rangeStart, Int($0 - first) * storedBlock)) } ?? rangeStart
                    for part in [split..<rangeEnd, rangeStart..<split] where !part.isEmpty {
                        try writeStored(UnsafeRawBufferPointer(rebasing: stored[part]), at: storedStart + Int64(part.lowerBound))
                    }
                    return nil
                }
            }
        }
    }

    /// Runs `body` over `0..<count` in contiguous ranges: one range for small calls, several per core for large ones
    /// (so I/O of one range overlaps crypto of another). Returns the block indices the ranges reported (failed blocks).
    private func forEachBlockInParallel(count: Int, _ body: (Range<Int>) throws -> Int64?) throws -> [Int64] {
        let cores = Self.cores
        guard cores > 1, Int64(count) * layout.blockSize >= Self.parallelThresholdBytes else {
            return try body(0..<count).map { [$0] } ?? []
        }
        let workers = min(count, cores * 4)
        // Each worker writes only its own slot, so the shared state needs no lock beyond the error's.
        final class Outcome: @unchecked Sendable {
            var failedBlocks: [Int64?]
            var error: (any Error)?
            let lock = NSLock()
            init(workers: Int) { failedBlocks = Array(repeating: nil, count: workers) }
        }
        let outcome = Outcome(workers: workers)
        try withoutActuallyEscaping(body) { body in
            nonisolated(unsafe) let body = body
            outcome.failedBlocks.withUnsafeMutableBufferPointer { slots in
                nonisolated(unsafe) let slots = slots
                DispatchQueue.concurrentPerform(iterations: workers) { worker in
                    let range = worker * count / workers..<(worker + 1) * count / workers
                    do {
                        slots[worker] = try body(range)
                    } catch {
                        outcome.lock.withLock { if outcome.error == nil { outcome.error = error } }
                    }
                }
            }
            if let error = outcome.error { throw error }
        }
        return outcome.failedBlocks.compactMap { $0 }
    }

    private func reserveScratch(_ count: Int) {
        if storedScratch.count < count { storedScratch = [UInt8](repeating: 0, count: count) }
    }

    /// Fills `buffer` from the stored bytes at `offset` as far as the file goes; returns the bytes read.
    private func readStored(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        try FaultInjection.checkRead(descriptor, path: path)
        return try FileSystem.mappingErrno(path: path, doing: "read") {
            var total = 0
            while total < buffer.count {
                let n = try descriptor.read(fromAbsoluteOffset: offset + Int64(total),
                                            into: UnsafeMutableRawBufferPointer(rebasing: buffer[total...]), retryOnInterrupt: true)
                if n == 0 { break }
                total += n
            }
            return total
        }
    }

    private func writeStored(_ bytes: [UInt8], at offset: Int64) throws {
        // An injected failure writes nothing, so it does not count as touching the disk.
        try FaultInjection.checkWrite(descriptor, count: Int64(bytes.count), path: path, consuming: false)
        storedWrites += 1
        try bytes.withUnsafeBytes { try writeStored($0, at: offset) }
    }

    private func writeStored(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        try DurableIO.write(bytes, at: offset, to: descriptor, path: path)
    }
}
