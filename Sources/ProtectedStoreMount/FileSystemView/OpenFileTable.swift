import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// One stored file open through the file system, shared by every descriptor on it: one plaintext size and one block
/// cache of truth, however many programs have it open (separate `EncryptedFile`s on one file would not see each other's writes).
final class OpenFile: @unchecked Sendable {
    let identity: FileIdentity
    let file: EncryptedFile
    /// The names it was opened by that still show it, for dropping the kernel's cached pages at a lock: the kernel
    /// keeps a page cache per name of a hard-linked file. Empty once unlinked. Guarded by the table's lock.
    var paths: Set<String>
    var openCount = 1

    init(identity: FileIdentity, file: EncryptedFile, path: String) {
        self.identity = identity
        self.file = file
        self.paths = [path]
    }
}

/// What a descriptor of the mount refers to.
struct OpenHandle {
    let file: OpenFile
    let isWritable: Bool
    /// How many of its file's failures of writes behind this descriptor has been told of (or predate it), so each
    /// descriptor open when one happens hears of it once, as Linux tells every descriptor of a write-back error.
    var failuresReported: Int
}

/// The files open through the file system and the handles on them, under one lock.
final class OpenFileTable: @unchecked Sendable {
    private let mutex = NSCondition()
    private var files: [FileIdentity: OpenFile] = [:]
    /// Files whose last close is running, with how many closes of each; an open of one waits for them.
    private var closing: [FileIdentity: Int] = [:]
    private var handles: [UInt64: OpenHandle] = [:]
    private var directories: [UInt64: ListedDirectory] = [:]
    private var nextHandle: UInt64 = 1

    /// Returns the open file for `identity`, opening it with `open` if no descriptor has it yet; adds a handle to it.
    /// `reuse` runs on a file already open (to bring its key back after a lock) and may refuse.
    func handle(for identity: FileIdentity, path: String, writable: Bool,
                reuse: (OpenFile) throws -> Void, open: () throws -> EncryptedFile) throws -> UInt64 {
        try mutex.withLock {
            while closing[identity] != nil { mutex.wait() }
            let openFile: OpenFile
            if let existing = files[identity] {
                try reuse(existing)
                existing.openCount += 1
                existing.paths.insert(path)
                openFile = existing
            } else {
                openFile = OpenFile(identity: identity, file: try open(), path: path)
                files[identity] = openFile
            }
            return addHandle(OpenHandle(file: openFile, isWritable: writable, failuresReported: openFile.file.failuresOfWritesBehind))
        }
    }

    /// Registers a file just created (no descriptor can have it yet) and returns a handle on it.
    func handle(forCreated file: EncryptedFile, identity: FileIdentity, path: String) -> UInt64 {
        mutex.withLock {
            let openFile = OpenFile(identity: identity, file: file, path: path)
            files[identity] = openFile
            return addHandle(OpenHandle(file: openFile, isWritable: true, failuresReported: 0))
        }
    }

    private func addHandle(_ handle: OpenHandle) -> UInt64 {
        let number = takeNumber()
        handles[number] = handle
        return number
    }

    /// A number no open file or directory has. Caller holds `mutex`.
    private func takeNumber() -> UInt64 {
        defer { nextHandle += 1 }
        return nextHandle
    }

    func handle(_ number: UInt64) throws -> OpenHandle {
        guard let handle = mutex.withLock({ handles[number] }) else { throw Errno.badFileDescriptor }
        return handle
    }

    /// The latest write behind of its file that could not be stored, if descriptor `number` has not been told of it
    /// (it is then).
    func failureToReport(_ number: UInt64) -> ProtectedStoreError? {
        mutex.withLock {
            guard var handle = handles[number] else { return nil }
            let failure = handle.file.file.failureOfWritesBehind(after: &handle.failuresReported)
            handles[number] = handle
            return failure
        }
    }

    /// The open file for `identity`, if a descriptor has it.
    func openFile(_ identity: FileIdentity) -> OpenFile? { mutex.withLock { files[identity] } }

    /// Forgets every open file (the session has ended, no request runs) and returns them with their names and the
    /// fewest failures of writes behind any of their descriptors had heard of.
    func removeAll() -> [(file: EncryptedFile, paths: [String], failuresReported: Int)] {
        mutex.withLock {
            defer {
                files.removeAll()
                handles.removeAll()
            }
            let heard = Dictionary(handles.values.map { ($0.file.identity, $0.failuresReported) }, uniquingKeysWith: min)
            return files.values.map { ($0.file, Array($0.paths), heard[$0.identity] ?? 0) }
        }
    }

    /// Drops a handle; when it was the last one on its file, runs `close` on the file. The kernel sends the release
    /// after close(2) has returned, so a program's next open of the file can race with it: that open waits until the
    /// close is done, and never reads a length record being written (which reads as damaged). Other files don't wait.
    func release(_ number: UInt64, close: (EncryptedFile, [String]) -> Void) {
        let closed: (file: OpenFile, paths: [String])? = mutex.withLock {
            guard let handle = handles.removeValue(forKey: number) else { return nil }
            handle.file.openCount -= 1
            guard handle.file.openCount == 0 else { return nil }
            files.removeValue(forKey: handle.file.identity)
            closing[handle.file.identity, default: 0] += 1
            return (handle.file, Array(handle.file.paths))
        }
        guard let (last, paths) = closed else { return }
        close(last.file, paths)
        mutex.withLock {
            closing[last.identity] = closing[last.identity].flatMap { $0 > 1 ? $0 - 1 : nil }
            mutex.broadcast()
        }
    }

    /// Follows a rename in the paths of open files (a directory's rename moves everything under it).
    func renamed(_ from: String, to: String) {
        mutex.withLock {
            for file in files.values {
                file.paths = Set(file.paths.map { Self.moved($0, from: from, to: to) ?? $0 })
            }
        }
    }

    /// Two names swapped (RENAME_EXCHANGE), with everything under them.
    func exchanged(_ first: String, _ second: String) {
        mutex.withLock {
            for file in files.values {
                file.paths = Set(file.paths.map { Self.moved($0, from: first, to: second) ?? Self.moved($0, from: second, to: first) ?? $0 })
            }
        }
    }

    /// `path` after `from` became `to`, if it is `from` or lies under it.
    private static func moved(_ path: String, from: String, to: String) -> String? {
        if path == from { return to }
        return path.hasPrefix(from + "/") ? to + path.dropFirst(from.count) : nil
    }

    /// The name is gone (unlinked, or replaced by a rename); a descriptor on the file still works.
    func unlinked(_ path: String) {
        mutex.withLock { for file in files.values { file.paths.remove(path) } }
    }

    /// Where the open files among `encrypted` are shown now, every name of each.
    func paths(of encrypted: [EncryptedFile]) -> [String] {
        let wanted = Set(encrypted.map(ObjectIdentifier.init))
        return mutex.withLock { files.values.filter { wanted.contains(ObjectIdentifier($0.file)) }.flatMap(\.paths) }
    }

    /// Where `file` is shown now (read under the table's lock, which guards it); empty once unlinked.
    func paths(of file: OpenFile) -> [String] { mutex.withLock { Array(file.paths) } }

    // MARK: Directories

    /// Keeps an open directory for listing, with the path it was opened at and what decrypts its names; its
    /// descriptor is closed by `releaseDirectory`.
    func addDirectory(_ descriptor: FileDescriptor, path: ContainerPath, names: DirectoryNames) -> UInt64 {
        mutex.withLock {
            let number = takeNumber()
            directories[number] = ListedDirectory(descriptor: descriptor, path: path, names: names)
            return number
        }
    }

    func directory(_ number: UInt64) throws -> FileDescriptor {
        try openDirectory(number).descriptor
    }

    func openDirectory(_ number: UInt64) throws -> ListedDirectory {
        guard let directory = mutex.withLock({ directories[number] }) else { throw Errno.badFileDescriptor }
        return directory
    }

    func releaseDirectory(_ number: UInt64) {
        if let directory = mutex.withLock({ directories.removeValue(forKey: number) }) { try? directory.descriptor.close() }
    }
}

/// Recently used directories, kept open: most operations name an item in a directory the previous one used, and
/// opening it again (a path walk in the kernel) is a large part of a small operation. A descriptor follows its
/// directory across renames, so the mount's renames and removals empty the cache; changes made beside the mount
/// (the library, `sandboxctl mv`) are seen within a second, as the kernel's own cached lookups are.
final class DirectoryCache: @unchecked Sendable {
    private typealias Entry = (directory: OpenDirectory, opened: ContinuousClock.Instant)
    private static let capacity = 256
    private static let lifetime: Duration = .seconds(1)
    private let mutex = NSLock()
    private var entries: [ContainerPath: Entry] = [:]
    /// Counts `removeAll`s, so a directory opened while one happened is not kept.
    private var generation = 0

    /// The directory at `path`: from the cache, else the one `held` gives (the root and the container's own folders),
    /// else opened in its parent, itself taken from here, so a miss costs one level; it then expires with that parent,
    /// so what it shows is never older than a second. Users hold the returned object while using its descriptor, so
    /// an eviction never closes it under them. The kernel's paths name no symlink on the way, and `subdirectory`
    /// refuses one.
    func directory(_ path: ContainerPath, held: (ContainerPath) throws -> OpenDirectory?, displayPath: (ContainerPath) -> String) throws -> OpenDirectory {
        try entry(path, held: held, displayPath: displayPath).directory
    }

    private func entry(_ path: ContainerPath, held: (ContainerPath) throws -> OpenDirectory?, displayPath: (ContainerPath) -> String) throws -> Entry {
        let now = ContinuousClock.now
        let (cached, generation) = mutex.withLock { (entries[path], self.generation) }
        if let cached, now - cached.opened < Self.lifetime { return cached }
        let fresh: Entry
        if let directory = try held(path) {
            fresh = (directory, now)
        } else {
            guard let name = path.name else { throw Errno.invalidArgument }
            let parent = try entry(path.parent, held: held, displayPath: displayPath)
            fresh = (try parent.directory.subdirectory(name, displayPath: displayPath(path)), parent.opened)
        }
        mutex.withLock {
            guard self.generation == generation else { return }
            if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
            entries[path] = fresh
        }
        return fresh
    }

    func removeAll() {
        mutex.withLock {
            entries.removeAll()
            generation += 1
        }
    }
}

/// A directory open for listing: its descriptor, the path it was opened at, its names' cipher and IV, and its last
/// listing, which the kernel reads in several requests (libfuse serves one handle's requests one at a time).
final class ListedDirectory: @unchecked Sendable {
    let descriptor: FileDescriptor
    let path: ContainerPath
    let names: DirectoryNames
    private let mutex = NSLock()
    private var entries: ContainerFileSystem.Listing?

    init(descriptor: FileDescriptor, path: ContainerPath, names: DirectoryNames) {
        self.descriptor = descriptor
        self.path = path
        self.names = names
    }

    var listing: ContainerFileSystem.Listing? {
        get { mutex.withLock { entries } }
        set { mutex.withLock { entries = newValue } }
    }
}
