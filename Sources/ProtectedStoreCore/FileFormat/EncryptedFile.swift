import Dispatch
import Foundation
import SystemPackage

/// A random-access handle on one encrypted file: plaintext reads and writes at any offset,
/// each write re-encrypting only the blocks it touches, each block under a fresh random nonce.
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
    private var plaintextSize: Int64
    private var isClosed = false
    /// Set when a write failed part-way: the blocks on disk may no longer match `plaintextSize`.
    private var failedWrite: ProtectedStoreError?
    /// Reads share it, so several threads decrypt one file at once; writes, truncation, class changes and closing take it alone.
    private let lock = ReadWriteLock()
    private var storedScratch: [UInt8] = []

    private init(path: String, descriptor: FileDescriptor, header: FileHeader, fileKey: SecureBytes, plaintextSize: Int64, isWritable: Bool) {
        self.path = path
        self.descriptor = descriptor
        self.header = header
        self.fileKey = fileKey
        self.layout = header.layout
        self.plaintextSize = plaintextSize
        self.isWritable = isWritable
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

    package static func create(at location: FileLocation, protectionClass: ProtectionClass, flags: FileHeader.Flags = [], keys: any ClassKeyProviding,
                       blockSize: Int = defaultBlockSize) throws -> EncryptedFile {
        precondition(blockSize >= FileHeader.minimumBlockSize && blockSize <= FileHeader.maximumBlockSize && blockSize & (blockSize - 1) == 0)
        let path = location.displayPath
        let fileKey = SecureBytes.random(count: FileHeader.fileKeyBytes)
        let header = try attributingKeyErrors(to: path) {
            try FileHeader.sealing(fileKey: fileKey, fileID: Random.bytes(FileHeader.idBytes),
                                   protectionClass: protectionClass, flags: flags, blockSize: blockSize, keys: keys)
        }
        let descriptor = try location.open(.readWrite, options: [.create, .exclusiveCreate], permissions: [.ownerReadWrite],
                                           doing: "create the encrypted file")
        let file = EncryptedFile(path: path, descriptor: descriptor, header: header, fileKey: fileKey, plaintextSize: 0, isWritable: true)
        do {
            try file.writeStored(header.serialized, at: 0)
            try file.withKey { key in
                // The lone empty final block: without it, truncating a file to its header would go unnoticed.
                try file.encryptAndStore(firstBlock: 0, blockCount: 1, newSize: 0, key: key) { _ in UnsafeRawBufferPointer(start: nil, count: 0) }
            }
        } catch {
            // The handle owns the descriptor now: close through it, so nothing closes the number twice.
            try? file.close()
            location.unlink()
            throw error
        }
        return file
    }

    /// Opens an existing encrypted file, unwrapping its per-file key with the class key.
    public static func open(at path: String, keys: any ClassKeyProviding, writable: Bool) throws -> EncryptedFile {
        try open(at: FileLocation(path: path), keys: keys, writable: writable)
    }

    package static func open(at location: FileLocation, keys: any ClassKeyProviding, writable: Bool) throws -> EncryptedFile {
        let path = location.displayPath
        let descriptor = try location.openRegularFile(writable ? .readWrite : .readOnly, doing: "open the encrypted file")
        let file: EncryptedFile
        do {
            var headerBytes = [UInt8](repeating: 0, count: FileHeader.size)
            let read = try headerBytes.withUnsafeMutableBytes { buffer in
                try FileSystem.mappingErrno(path: path, doing: "read the file header") { try descriptor.read(fromAbsoluteOffset: 0, into: buffer) }
            }
            let header = try FileHeader.parse(Array(headerBytes[0..<read]), path: path)
            let storedSize = try FileSystem.fileSize(descriptor, path: path)
            guard let plaintextSize = header.layout.plaintextSize(storedSize: Int64(storedSize)) else {
                throw ProtectedStoreError(.integrity, path: path, problem: "the file's length (\(storedSize) bytes) is not a valid encrypted length: it was truncated or extended",
                                          remedy: "Restore the file from a backup")
            }
            let fileKey = try attributingKeyErrors(to: path) { try header.unwrapFileKey(keys: keys, path: path) }
            file = EncryptedFile(path: path, descriptor: descriptor, header: header, fileKey: fileKey, plaintextSize: plaintextSize, isWritable: writable)
        } catch {
            try? descriptor.close()
            throw error
        }
        do {
            try file.authenticateFinalBlock()
        } catch {
            // The handle owns the descriptor now: close through it, so nothing closes the number twice.
            try? file.close()
            throw error
        }
        return file
    }

    /// Reads only the header, to learn a file's class without any key.
    public static func protectionClass(ofFileAt path: String) throws -> ProtectionClass {
        try header(at: FileLocation(path: path)).protectionClass
    }

    /// The parsed header, read without any key (for listings: class, and size from the stored length).
    package static func header(at location: FileLocation) throws -> FileHeader {
        let bytes = try location.readPrefix(count: FileHeader.size, what: "file header")
        return try FileHeader.parse(bytes, path: location.displayPath)
    }

    /// Opens the final block once, so the size taken from the file length is authenticated (a file cut to any
    /// block boundary, even down to a lone empty block, fails here rather than reading as shorter).
    private func authenticateFinalBlock() throws {
        let last = layout.blockCount(plaintextSize: plaintextSize) - 1
        let length = layout.plaintextLength(ofBlock: last, plaintextSize: plaintextSize)
        var discarded = [UInt8](repeating: 0, count: length)
        defer { zeroize(&discarded) }
        try withKey { key in
            try discarded.withUnsafeMutableBytes { buffer in
                try decryptRange(firstBlock: last, lastBlock: last, plaintextStart: last * layout.blockSize, into: buffer, key: key)
            }
        }
    }

    // MARK: Properties

    /// Plaintext size in bytes.
    public var size: Int64 { lock.withReadLock { plaintextSize } }

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
        return try lock.withReadLock {
            try checkOpen()
            let end = min(plaintextSize, offset + Int64(buffer.count))
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

    /// Writes the contents of `buffer` at `offset`, extending the file (zero-filled) if `offset` is past the end.
    public func write(from buffer: UnsafeRawBufferPointer, at offset: Int64) throws {
        precondition(offset >= 0, "negative offset")
        try lock.withWriteLock {
            try checkWritable()
            guard buffer.count > 0 else { return }
            try mutating { try withKey { key in
                if offset > plaintextSize { try extend(to: offset, key: key) }
                var position = offset
                let end = offset + Int64(buffer.count)
                while position < end {
                    let first = layout.blockIndex(containing: position)
                    let passEnd = min(end, (first + blocksPerPass) * layout.blockSize)
                    let source = UnsafeRawBufferPointer(rebasing: buffer[Int(position - offset)..<Int(passEnd - offset)])
                    try writePass(source, at: position, key: key)
                    position = passEnd
                }
            } }
        }
    }

    /// Shrinks or grows (with zeros) the plaintext to `newSize` bytes.
    public func truncate(to newSize: Int64) throws {
        precondition(newSize >= 0, "negative size")
        try lock.withWriteLock {
            try checkWritable()
            try mutating { try withKey { key in
                if newSize > plaintextSize {
                    try extend(to: newSize, key: key)
                } else if newSize < plaintextSize {
                    try shrink(to: newSize, key: key)
                }
            } }
        }
    }

    /// Flushes data and metadata to stable storage (fsync).
    public func synchronize() throws {
        try lock.withReadLock {
            try checkOpen()
            try FileSystem.synchronize(descriptor, path: path)
        }
    }

    /// Re-wraps the per-file key for `newClass` and rewrites the header only (clearing its flags); the body is untouched.
    public func changeProtectionClass(to newClass: ProtectionClass, keys: any ClassKeyProviding) throws {
        try lock.withWriteLock {
            try checkWritable()
            let newHeader = try Self.attributingKeyErrors(to: path) {
                try FileHeader.sealing(fileKey: fileKey, fileID: header.fileID, protectionClass: newClass, blockSize: header.blockSize, keys: keys)
            }
            try writeStored(newHeader.serialized, at: 0)
            try FileSystem.synchronize(descriptor, path: path)
            header = newHeader
        }
    }

    /// Closes the descriptor and zeroes the per-file key.
    public func close() throws {
        try lock.withWriteLock {
            guard !isClosed else { return }
            isClosed = true
            fileKey.discard()
            try FileSystem.mappingErrno(path: path, doing: "close") { try descriptor.close() }
        }
    }

    /// Zeroes the per-file key now (the device is locking); the handle then fails every operation with a data-protection error.
    public func discardKey() {
        // Under the lock, so a key being restored is either discarded too or installed after this returns.
        lock.withReadLock { fileKey.discard() }
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

    /// Runs a mutation; if it fails after touching the disk, the handle refuses further use instead of trusting stale state.
    private func mutating(_ body: () throws -> Void) throws {
        do {
            try body()
        } catch let error as ProtectedStoreError where error.kind == .io || error.kind == .integrity {
            failedWrite = error
            throw error
        }
    }

    private func checkWritable() throws {
        try checkOpen()
        guard isWritable else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "the file was opened read-only", remedy: "Open it with writable: true")
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
    private static func attributingKeyErrors<R>(to path: String, _ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch is SecureBytes.Discarded {
            throw keyDiscardedError(path: path)
        } catch let error as ProtectedStoreError {
            throw error.naming(path)
        }
    }

    /// Associated data of block `index`: file id ‖ index (u64 LE) ‖ final flag, so blocks can't move, be reordered, or be cut off.
    private func blockAssociatedData(index: Int64, isFinal: Bool) -> [UInt8] {
        var writer = ByteWriter(capacity: FileHeader.idBytes + 9)
        writer.append(header.fileID)
        writer.append(UInt64(index))
        writer.append(UInt8(isFinal ? 1 : 0))
        return writer.bytes
    }

    /// Decrypts blocks `first...last` into `destination`, which starts at plaintext offset `plaintextStart`
    /// (inside block `first`) and ends inside block `last`.
    private func decryptRange(firstBlock first: Int64, lastBlock last: Int64, plaintextStart: Int64,
                              into destination: UnsafeMutableRawBufferPointer, key: UnsafeRawBufferPointer) throws {
        let storedStart = layout.storedOffset(ofBlock: first)
        let storedEnd = layout.storedOffset(ofBlock: last) + Int64(BlockLayout.overhead)
            + Int64(layout.plaintextLength(ofBlock: last, plaintextSize: plaintextSize))
        let finalBlock = layout.blockCount(plaintextSize: plaintextSize) - 1
        let blockCount = Int(last - first + 1)
        // Its own buffer, not the write scratch: reads run concurrently under the shared lock.
        let storedBytes = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(storedEnd - storedStart), alignment: 16)
        defer { storedBytes.deallocate() }
        let failures = try forEachBlockInParallel(count: blockCount) { range in
            let rangeStart = Int(layout.storedOffset(ofBlock: first + Int64(range.lowerBound)) - storedStart)
            let rangeEnd = min(Int(storedEnd - storedStart), Int(layout.storedOffset(ofBlock: first + Int64(range.upperBound)) - storedStart))
            try readStored(into: UnsafeMutableRawBufferPointer(rebasing: storedBytes[rangeStart..<rangeEnd]), at: storedStart + Int64(rangeStart))
            var scratch = [UInt8]()
            for offsetInRange in range {
                let index = first + Int64(offsetInRange)
                let length = layout.plaintextLength(ofBlock: index, plaintextSize: plaintextSize)
                let start = Int(layout.storedOffset(ofBlock: index) - storedStart)
                let block = UnsafeRawBufferPointer(rebasing: storedBytes[start..<start + BlockLayout.overhead + length])
                let blockStart = index * layout.blockSize
                // The slice of this block the caller wants, in destination coordinates.
                let wantedStart = max(blockStart, plaintextStart)
                let wantedEnd = min(blockStart + Int64(length), plaintextStart + Int64(destination.count))
                let ad = blockAssociatedData(index: index, isFinal: index == finalBlock)
                let authentic: Bool
                if wantedStart == blockStart && wantedEnd == blockStart + Int64(length) {
                    let target = UnsafeMutableRawBufferPointer(rebasing: destination[Int(blockStart - plaintextStart)..<Int(wantedEnd - plaintextStart)])
                    authentic = openBlock(block, key: key, associatedData: ad, into: target)
                } else {
                    // Partly wanted: decrypt aside, copy the wanted part, so nothing unauthenticated reaches the caller.
                    if scratch.count < length { scratch = [UInt8](repeating: 0, count: Int(layout.blockSize)) }
                    authentic = scratch.withUnsafeMutableBytes { s in
                        openBlock(block, key: key, associatedData: ad, into: UnsafeMutableRawBufferPointer(rebasing: s[0..<length]))
                    }
                    if authentic {
                        scratch.withUnsafeBytes { s in
                            let from = Int(wantedStart - blockStart)
                            UnsafeMutableRawBufferPointer(rebasing: destination[Int(wantedStart - plaintextStart)..<Int(wantedEnd - plaintextStart)])
                                .copyMemory(from: UnsafeRawBufferPointer(rebasing: s[from..<from + Int(wantedEnd - wantedStart)]))
                        }
                    }
                }
                if !authentic { return index }
            }
            return nil
        }
        if let failed = failures.min() {
            destination.initializeMemory(as: UInt8.self, repeating: 0)
            throw ProtectedStoreError(.integrity, path: path, problem: "block \(failed) (plaintext bytes \(failed * layout.blockSize)…) failed authentication: the file was modified or corrupted",
                                      remedy: "Restore the file from a backup")
        }
    }

    private func openBlock(_ block: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, associatedData: [UInt8],
                           into target: UnsafeMutableRawBufferPointer) -> Bool {
        associatedData.withUnsafeBytes { ad in
            AEAD.open(UnsafeRawBufferPointer(rebasing: block[BlockLayout.nonceBytes...]), key: key,
                      nonce: UnsafeRawBufferPointer(rebasing: block[0..<BlockLayout.nonceBytes]), associatedData: ad, into: target)
        }
    }

    /// One pass of a write that starts at or before the end of the file and spans at most `blocksPerPass` blocks.
    private func writePass(_ source: UnsafeRawBufferPointer, at offset: Int64, key: UnsafeRawBufferPointer) throws {
        let end = offset + Int64(source.count)
        let newSize = max(plaintextSize, end)
        var first = layout.blockIndex(containing: offset)
        if newSize > plaintextSize {
            // The old final block loses its final flag (or gains bytes), so it is re-encrypted too.
            first = min(first, layout.blockCount(plaintextSize: plaintextSize) - 1)
        }
        let last = layout.blockIndex(containing: end - 1)
        // Edge blocks that keep some old bytes are assembled aside: old plaintext, then the new bytes over it.
        var edges: [Int64: UnsafeMutableRawBufferPointer] = [:]
        defer { edges.values.forEach { $0.deallocate() } }
        for index in Set([first, last]) {
            let blockStart = index * layout.blockSize
            let newLength = layout.plaintextLength(ofBlock: index, plaintextSize: newSize)
            let coveredStart = max(blockStart, offset), coveredEnd = min(blockStart + Int64(newLength), end)
            guard coveredStart != blockStart || coveredEnd != blockStart + Int64(newLength) else { continue }
            let assembled = UnsafeMutableRawBufferPointer.allocate(byteCount: newLength, alignment: 16)
            assembled.initializeMemory(as: UInt8.self, repeating: 0)
            edges[index] = assembled
            let oldLength = layout.plaintextLength(ofBlock: index, plaintextSize: plaintextSize)
            if oldLength > 0 {
                try decryptRange(firstBlock: index, lastBlock: index, plaintextStart: blockStart,
                                 into: UnsafeMutableRawBufferPointer(rebasing: assembled[0..<oldLength]), key: key)
            }
            if coveredEnd > coveredStart {
                UnsafeMutableRawBufferPointer(rebasing: assembled[Int(coveredStart - blockStart)..<Int(coveredEnd - blockStart)])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[Int(coveredStart - offset)..<Int(coveredEnd - offset)]))
            }
        }
        try encryptAndStore(firstBlock: first, blockCount: Int(last - first + 1), newSize: newSize, key: key) { index in
            if let edge = edges[index] { return UnsafeRawBufferPointer(edge) }
            let blockStart = index * layout.blockSize
            let length = layout.plaintextLength(ofBlock: index, plaintextSize: newSize)
            return UnsafeRawBufferPointer(rebasing: source[Int(blockStart - offset)..<Int(blockStart - offset) + length])
        }
        plaintextSize = newSize
    }

    /// Grows the file to `newSize` with zeros, in bounded passes.
    private func extend(to newSize: Int64, key: UnsafeRawBufferPointer) throws {
        let zeros = [UInt8](repeating: 0, count: Int(min(newSize - plaintextSize, blocksPerPass * layout.blockSize)))
        try zeros.withUnsafeBytes { zeroBuffer in
            while plaintextSize < newSize {
                let count = Int(min(Int64(zeroBuffer.count), newSize - plaintextSize))
                try writePass(UnsafeRawBufferPointer(rebasing: zeroBuffer[0..<count]), at: plaintextSize, key: key)
            }
        }
    }

    /// Cuts the file to `newSize`: the new final block is re-encrypted with its final flag, then the rest is cut off.
    private func shrink(to newSize: Int64, key: UnsafeRawBufferPointer) throws {
        let last = layout.blockCount(plaintextSize: newSize) - 1
        let length = layout.plaintextLength(ofBlock: last, plaintextSize: newSize)
        var kept = [UInt8](repeating: 0, count: length)
        if length > 0 {
            try kept.withUnsafeMutableBytes { k in
                try decryptRange(firstBlock: last, lastBlock: last, plaintextStart: last * layout.blockSize, into: k, key: key)
            }
        }
        try kept.withUnsafeBytes { k in
            try encryptAndStore(firstBlock: last, blockCount: 1, newSize: newSize, key: key) { _ in k }
        }
        try FileSystem.mappingErrno(path: path, doing: "truncate") {
            try descriptor.resize(to: layout.storedSize(plaintextSize: newSize), retryOnInterrupt: true)
        }
        plaintextSize = newSize
    }

    /// Encrypts blocks `first..<first+count` of a file whose size will be `newSize` (taking each block's plaintext from
    /// `plaintextOfBlock`), and writes them with one pwrite.
    private func encryptAndStore(firstBlock first: Int64, blockCount: Int, newSize: Int64, key: UnsafeRawBufferPointer,
                                 plaintextOfBlock: (Int64) -> UnsafeRawBufferPointer) throws {
        let finalBlock = layout.blockCount(plaintextSize: newSize) - 1
        let storedStart = layout.storedOffset(ofBlock: first)
        let last = first + Int64(blockCount) - 1
        let storedCount = Int(layout.storedOffset(ofBlock: last) - storedStart) + BlockLayout.overhead
            + layout.plaintextLength(ofBlock: last, plaintextSize: newSize)
        reserveScratch(storedCount)
        // One CSPRNG call for all nonces instead of one per block.
        var nonces = [UInt8](repeating: 0, count: blockCount * BlockLayout.nonceBytes)
        nonces.withUnsafeMutableBytes { Random.fill($0) }
        try storedScratch.withUnsafeMutableBytes { stored in
            _ = try nonces.withUnsafeBytes { nonceBytes in
                try forEachBlockInParallel(count: blockCount) { range in
                    for offsetInRange in range {
                        let index = first + Int64(offsetInRange)
                        let plaintext = plaintextOfBlock(index)
                        let start = Int(layout.storedOffset(ofBlock: index) - storedStart)
                        let nonce = UnsafeRawBufferPointer(rebasing: nonceBytes[offsetInRange * BlockLayout.nonceBytes..<(offsetInRange + 1) * BlockLayout.nonceBytes])
                        UnsafeMutableRawBufferPointer(rebasing: stored[start..<start + BlockLayout.nonceBytes]).copyMemory(from: nonce)
                        let ad = blockAssociatedData(index: index, isFinal: index == finalBlock)
                        ad.withUnsafeBytes { adBytes in
                            AEAD.seal(plaintext, key: key, nonce: nonce, associatedData: adBytes,
                                      into: UnsafeMutableRawBufferPointer(rebasing: stored[start + BlockLayout.nonceBytes..<start + BlockLayout.overhead + plaintext.count]))
                        }
                    }
                    // Each range writes its own bytes, so one range's pwrite overlaps another's encryption.
                    let rangeStart = Int(layout.storedOffset(ofBlock: first + Int64(range.lowerBound)) - storedStart)
                    let rangeEnd = min(storedCount, Int(layout.storedOffset(ofBlock: first + Int64(range.upperBound)) - storedStart))
                    try writeStored(UnsafeRawBufferPointer(rebasing: stored[rangeStart..<rangeEnd]), at: storedStart + Int64(rangeStart))
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

    /// Fills `buffer` from the stored bytes at `offset`; a short read means the file was cut while open.
    private func readStored(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws {
        let read = try FileSystem.mappingErrno(path: path, doing: "read") {
            var total = 0
            while total < buffer.count {
                let n = try descriptor.read(fromAbsoluteOffset: offset + Int64(total),
                                            into: UnsafeMutableRawBufferPointer(rebasing: buffer[total...]), retryOnInterrupt: true)
                if n == 0 { break }
                total += n
            }
            return total
        }
        guard read == buffer.count else {
            throw ProtectedStoreError(.integrity, path: path, problem: "the file ended early: it was truncated while open",
                                      remedy: "Restore the file from a backup")
        }
    }

    private func writeStored(_ bytes: [UInt8], at offset: Int64) throws {
        try bytes.withUnsafeBytes { try writeStored($0, at: offset) }
    }

    private func writeStored(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        _ = try FileSystem.mappingErrno(path: path, doing: "write") {
            try descriptor.writeAll(toAbsoluteOffset: offset, bytes)
        }
    }
}
