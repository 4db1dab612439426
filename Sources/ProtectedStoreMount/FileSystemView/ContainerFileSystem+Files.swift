import CSupport
import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Files: opening and creating them, reading and writing plaintext, sizes, space, syncs and the last close.
extension ContainerFileSystem {
    /// open(2) of an existing file. Writing or truncating in the Inbox is refused (EACCES); a file whose class key is
    /// unavailable fails with EPERM.
    package func open(_ kernelPath: String, flags: Int32) throws -> UInt64 {
        let path = try containerPath(kernelPath)
        let writes = flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0
        if writes { try container.refuseInboxChange(path, displayPath: display(path), doing: "opened for writing") }
        let item = try resolve(path)
        defer { withExtendedLifetime(item) {} }
        // execve opens with __FMODE_EXEC; without default_permissions the kernel checks only that some x bit is set.
        let opensToRun: Int32 = 0o40
        if flags & opensToRun != 0 { try Self.check(faccessat(item.parent.descriptor.rawValue, item.entry, X_OK, AT_EACCESS | AT_SYMLINK_NOFOLLOW)) }
        let number = try openHandle(item, kernelPath: kernelPath, writable: writes)
        if flags & O_TRUNC != 0 {
            do {
                try table.handle(number).file.file.truncate(to: 0)
            } catch {
                release(number)
                throw error
            }
        }
        return number
    }

    /// open(2) with O_CREAT of a new file, of its directory's class. Class A can't be created while locked, B can.
    package func create(_ kernelPath: String, mode: mode_t, by creator: Creator = .thisProcess) throws -> UInt64 {
        let (item, permissions, fromACL) = try newEntry(kernelPath, mode: mode, by: creator)
        defer { withExtendedLifetime(item) {} }
        let file = try EncryptedFile.create(at: item.location, protectionClass: try container.inheritedClass(in: item.parent), keys: device,
                                            permissions: FilePermissions(rawValue: permissions))
        do {
            try giveToCreator(file.metadataDescriptor.rawValue, nil, in: item.parent, by: creator)
            // open(2) took this process's umask out; under a default ACL the stored file system gave it ext4's mode.
            if !fromACL { try Self.check(fchmod(file.metadataDescriptor.rawValue, permissions)) }
            try device.track(file)
            let identity = FileIdentity(try Self.status(of: file.metadataDescriptor))
            return table.handle(forCreated: file, identity: identity, path: kernelPath)
        } catch {
            device.forget(file)
            try? file.close()
            item.location.unlink()
            throw error
        }
    }

    /// Reads plaintext; a descriptor held across a lock works again once its class key is back.
    package func read(_ number: UInt64, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        let file = try table.handle(number).file.file
        return try withKeyBroughtBack(file) { try file.read(into: buffer, at: offset) }
    }

    /// Writes plaintext at `offset`, re-encrypting the blocks it touches. A large write is answered once it is
    /// copied and checked (key present, room on the disk) and stored in the background, so a program writing a big
    /// file overlaps its next write with this one's encryption; `flush` and `fsync` wait for it, and they and the next
    /// write report a failure to store it.
    package func write(_ number: UInt64, from buffer: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        let handle = try table.handle(number)
        guard handle.isWritable else { throw Errno.badFileDescriptor }
        let file = handle.file.file
        try reportFailureOfWritesBehind(number)
        try withKeyBroughtBack(file) {
            if buffer.count >= EncryptedFile.writeBehindThreshold {
                try file.writeBehind(from: buffer, at: offset)
            } else {
                try file.write(from: buffer, at: offset)
            }
        }
        if !linkNames.isEmpty { refreshOtherNames(of: handle.file) }
        return buffer.count
    }

    /// truncate and ftruncate; refused in the Inbox (EACCES).
    package func truncate(_ kernelPath: String?, handle: UInt64?, to size: Int64) throws {
        guard size >= 0 else { throw Errno.invalidArgument }
        if let handle {
            let open = try table.handle(handle)
            guard open.isWritable else { throw Errno.badFileDescriptor }
            try withKeyBroughtBack(open.file.file) { try open.file.file.truncate(to: size) }
            return refreshOtherNames(of: open.file)
        }
        guard let kernelPath else { throw Errno.badFileDescriptor }
        let path = try containerPath(kernelPath)
        try container.refuseInboxChange(path, displayPath: display(path), doing: "truncated")
        let number = try openHandle(try resolve(path), kernelPath: kernelPath, writable: true)
        defer { release(number) }
        let open = try table.handle(number).file
        try open.file.truncate(to: size)
        // By path, no file of the kernel's waits on this answer: the other names go before it, so a stat (or an
        // O_APPEND write) through one of them next sees the new size.
        if !linkNames.isEmpty { forget(linkNames.names(of: open.identity.inode, except: [kernelPath])) }
    }

    /// fallocate: modes 0 and FALLOC_FL_KEEP_SIZE reserve space for the range's ciphertext (mode 0 also grows the
    /// file); every other mode is EOPNOTSUPP, as on a file system that lacks it.
    package func allocate(_ number: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        let keepSize: Int32 = 1
        guard mode == 0 || mode == keepSize else { throw Errno.notSupported }
        guard offset >= 0, length > 0 else { throw Errno.invalidArgument }
        let handle = try table.handle(number)
        guard handle.isWritable else { throw Errno.badFileDescriptor }
        try withKeyBroughtBack(handle.file.file) { try handle.file.file.allocate(from: offset, length: length, keepSize: mode == keepSize) }
    }

    /// lseek's SEEK_DATA and SEEK_HOLE (the kernel answers the other kinds itself): ENXIO at or past the end, or
    /// when no data follows.
    package func seek(_ number: UInt64, from offset: Int64, whence: Int32) throws -> Int {
        let (seekData, seekHole): (Int32, Int32) = (3, 4)
        guard whence == seekData || whence == seekHole else { throw Errno.invalidArgument }
        let file = try table.handle(number).file.file
        guard let found = try file.seek(to: whence == seekData ? .data : .hole, from: offset) else { throw Errno.noSuchAddressOrDevice }
        return Int(found)
    }

    /// flush, at every close(2) of a descriptor: the file's writes are stored, and a failure among them is reported.
    package func finishWrites(_ number: UInt64) throws {
        try table.handle(number).file.file.waitForWritesBehind()
        try reportFailureOfWritesBehind(number)
    }

    /// Throws the failure of the latest write of the file the mount answered and could not store, if descriptor
    /// `number` has not been told of it yet: each descriptor open when it failed hears of it once (at its next
    /// write, flush or fsync).
    private func reportFailureOfWritesBehind(_ number: UInt64) throws {
        if let failure = table.failureToReport(number) { throw failure }
    }

    /// Closes the files still open when the session ends (a lazy unmount with descriptors open, a signal), storing
    /// the writes they accepted; a failure can no longer reach a program, so it is logged with the file's name.
    package func closeOpenFiles() {
        for (file, paths, heard) in table.removeAll() {
            file.waitForWritesBehind()
            var seen = heard
            if let failure = file.failureOfWritesBehind(after: &seen) { logUnheard(failure, of: file, shownAs: paths) }
            closeReleased(file, shownAs: paths)
        }
    }

    /// fsync and fdatasync.
    package func synchronize(_ number: UInt64) throws {
        let file = try table.handle(number).file.file
        file.waitForWritesBehind()
        try reportFailureOfWritesBehind(number)
        try file.synchronize()
    }

    /// The last close of a descriptor; the file's key is zeroed when no descriptor has it any more.
    package func release(_ number: UInt64) {
        if let handle = try? table.handle(number) {
            // A write the descriptor could not hear of any more (stored after its last flush: a shared mapping's).
            handle.file.file.waitForWritesBehind()
            if let failure = table.failureToReport(number) { logUnheard(failure, of: handle.file.file, shownAs: table.paths(of: handle.file)) }
        }
        table.release(number) { file, paths in closeReleased(file, shownAs: paths) }
    }

    /// Closes a file no descriptor has any more. The callers have waited for its queued writes, so they were stored
    /// while a lock could still reach it (a lock discards the keys of the files it knows).
    private func closeReleased(_ file: EncryptedFile, shownAs paths: [String]) {
        device.forget(file)
        do { try file.close() } catch { logUnheard(error, of: file, shownAs: paths) }
    }

    private func logUnheard(_ failure: any Error, of file: EncryptedFile, shownAs paths: [String]) {
        logger.error("\(paths.sorted().first ?? file.path), after its last flush: \(failure.localizedDescription)")
    }
}
