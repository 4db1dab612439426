import Foundation
import ProtectedStoreCore
import SystemPackage

/// The file API, shaped after FileManager and Data so iOS code ports with few changes.
extension Container {
    // MARK: Whole files

    /// Writes `data` to `path` atomically (a reader sees the old file or the new one, even after a crash).
    /// The class comes from the protection option in `options` (`.completeFileProtection`…), else the replaced file's
    /// class, else the parent directory's, else the container default. `.withoutOverwriting` refuses an existing file.
    public func write(_ data: Data, toPath path: String, options: Data.WritingOptions = []) throws {
        try replaceWholeFile(atPath: path, options: options) { file in try data.withUnsafeBytes { try file.write(from: $0, at: 0) } }
    }

    /// Writes everything `source` reads (a local file, a pipe) to `path` atomically, as `write(_:toPath:options:)`
    /// does, in bounded memory whatever its size; a regular file's holes stay holes. `sourceName` names it in errors.
    /// Returns the bytes written.
    @discardableResult
    public func write(contentsOf source: FileHandle, named sourceName: String, toPath path: String, options: Data.WritingOptions = []) throws -> UInt64 {
        var written: UInt64 = 0
        try replaceWholeFile(atPath: path, options: options) { file in
            written = try PlaintextCopy(source: FileDescriptor(rawValue: source.fileDescriptor), sourcePath: sourceName).copy(to: file)
        }
        return written
    }

    private func replaceWholeFile(atPath path: String, options: Data.WritingOptions, fill: (EncryptedFile) throws -> Void) throws {
        try foundationErrors(writing: true) {
            let item = try directory.resolve(try filePath(path), followingFinalSymlink: true)
            try refuseInboxChange(item.path, displayPath: item.displayPath, doing: "written")
            let existing = try item.location.status()
            if let existing, existing.st_mode & S_IFMT == S_IFDIR {
                throw ProtectedStoreError(.invalidArgument, path: item.displayPath, problem: "it is a directory", remedy: "Give the path of a file")
            }
            let keepExisting = options.contains(.withoutOverwriting)
            if keepExisting, existing != nil {
                throw ProtectedStoreError(.alreadyExists, path: item.displayPath, problem: "the file exists and .withoutOverwriting was given", remedy: "Remove it first, or write without .withoutOverwriting")
            }
            let protectionClass = try Self.protectionClass(in: options) ?? (existing != nil ? try? EncryptedFile.header(at: item.location).protectionClass : nil)
                ?? (try inheritedClass(in: item.parent))
            try writeWholeFile(to: item, protectionClass: protectionClass, replacing: !keepExisting, fill: fill)
        }
    }

    /// Reads and authenticates the whole plaintext of the file at `path`.
    public func contents(atPath path: String) throws -> Data {
        try foundationErrors(writing: false) {
            let item = try directory.resolve(try self.path(path), followingFinalSymlink: true)
            let handle = try ProtectedFileHandle(opening: item, writable: false, container: self)
            defer { try? handle.close() }
            return Data(try handle.file.readAll())
        }
    }

    // MARK: Handles

    /// Creates a new, empty file (it must not exist) and returns a read-write handle. The class is the
    /// `.protectionKey` attribute, else the parent directory's, else the container default (as FileManager's
    /// `createFile(atPath:contents:attributes:)`). Class B files can be created and written while locked.
    public func createFile(atPath path: String, attributes: [FileAttributeKey: Any] = [:]) throws -> ProtectedFileHandle {
        try foundationErrors(writing: true) {
            let item = try directory.resolve(try filePath(path), followingFinalSymlink: false)
            try refuseInboxChange(item.path, displayPath: item.displayPath, doing: "created")
            let protectionClass = try Self.protectionClass(in: attributes, path: item.displayPath) ?? inheritedClass(in: item.parent)
            try item.prepareEntry()
            let file = try EncryptedFile.create(at: item.location, protectionClass: protectionClass, keys: device)
            do {
                let handle = try ProtectedFileHandle(file: file, path: item.displayPath, container: self)
                try item.location.synchronizeDirectory()
                return handle
            } catch {
                item.location.unlink()
                item.entryRemoved()
                throw error
            }
        }
    }

    /// Opens an existing file for reading at any offset.
    public func fileHandle(forReadingAtPath path: String) throws -> ProtectedFileHandle {
        try foundationErrors(writing: false) {
            try ProtectedFileHandle(opening: try directory.resolve(try self.path(path), followingFinalSymlink: true), writable: false, container: self)
        }
    }

    /// Opens an existing file for reading and writing at any offset.
    public func fileHandle(forUpdatingAtPath path: String) throws -> ProtectedFileHandle {
        try foundationErrors(writing: true) {
            let item = try directory.resolve(try self.path(path), followingFinalSymlink: true)
            try refuseInboxChange(item.path, displayPath: item.displayPath, doing: "opened for writing")
            return try ProtectedFileHandle(opening: item, writable: true, container: self)
        }
    }

    // MARK: Directories and items

    /// The items of the directory at `path` ("" for the container root), sorted by name; needs no key.
    public func contentsOfDirectory(atPath path: String) throws -> [ContainerItem] {
        try foundationErrors(writing: false) {
            let opened = try directory.openDirectory(try self.path(path))
            // An entry removed between readdir and lstat is simply no longer there.
            return try names(in: opened).sorted().compactMap { try item(named: $0, in: opened) }
        }
    }

    /// The item at `path` (a symlink itself, not its target; "" for the container root), with its class and
    /// plaintext size; needs no key.
    public func itemInfo(atPath path: String) throws -> ContainerItem {
        try foundationErrors(writing: false) {
            let parsed = try self.path(path)
            if parsed.isRoot {
                var info = stat()
                guard fstat(directory.root.rawValue, &info) == 0 else {
                    throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: directory.displayPath(.root), doing: "stat")
                }
                let root = try directory.openDirectory(.root)
                return ContainerItem(name: "", path: "", type: .typeDirectory, protection: try directoryClass(of: root)?.fileProtectionType,
                                     size: 0, modificationDate: Self.modificationDate(info), symbolicLinkTarget: nil, problem: nil)
            }
            let resolved = try directory.resolve(parsed, followingFinalSymlink: false)
            guard let found = try item(named: resolved.name, in: resolved.parent, displayPath: resolved.displayPath) else {
                throw ProtectedStoreError(.notFound, path: resolved.displayPath, problem: "no such file or directory", remedy: "Check the path")
            }
            return found
        }
    }

    /// Like `FileManager.attributesOfItem(atPath:)`: type, plaintext size, modification date and `.protectionKey`.
    public func attributesOfItem(atPath path: String) throws -> [FileAttributeKey: Any] { try itemInfo(atPath: path).attributes }

    /// Like `FileManager.setAttributes(_:ofItemAtPath:)`; only `.protectionKey` can be set.
    public func setAttributes(_ attributes: [FileAttributeKey: Any], ofItemAtPath path: String) throws {
        let protectionClass = try foundationErrors(writing: true) {
            try Self.protectionClass(in: attributes, path: "\(bundleIdentifier):\(path)")
        }
        guard let protectionClass else { return }
        try setProtection(protectionClass.fileProtectionType, ofItemAtPath: path)
    }

    /// Whether anything is at `path` (following symlinks inside the container).
    public func fileExists(atPath path: String) -> Bool {
        guard let parsed = try? self.path(path) else { return false }
        if parsed.isRoot { return true }
        guard let item = try? directory.resolve(parsed, followingFinalSymlink: true) else { return false }
        return (try? item.location.status()) != nil
    }

    /// Changes a file's class (re-wraps its key; the body is untouched), or sets a directory's class for new items
    /// in it. Changing a file's class needs its current class available and, unless the new class is B, the new one too.
    public func setProtection(_ protection: FileProtectionType, ofItemAtPath path: String) throws {
        try foundationErrors(writing: true) {
            let newClass = try Self.protectionClass(of: protection)
            let parsed = try self.path(path)
            guard !parsed.isRoot else {
                throw ProtectedStoreError(.invalidArgument, path: "\(bundleIdentifier):", problem: "the container root's class is the container default, chosen when the container is created",
                                          remedy: "Set the class of a directory or file inside the container")
            }
            let item = try directory.resolve(parsed, followingFinalSymlink: true)
            guard let info = try item.location.status() else {
                throw ProtectedStoreError(.notFound, path: item.displayPath, problem: "no such file or directory", remedy: "Check the path")
            }
            try refuseInboxChange(item.path, displayPath: item.displayPath, doing: "given another class")
            if info.st_mode & S_IFMT == S_IFDIR {
                let opened = try item.parent.subdirectory(item.name, displayPath: item.displayPath)
                try writeDirectoryClass(newClass, in: opened, displayPath: item.displayPath)
                return
            }
            let handle = try ProtectedFileHandle(opening: item, writable: true, container: self)
            defer { try? handle.close() }
            try changeClass(of: handle.file, to: newClass)
        }
    }

    /// Creates a directory (mode 0700), as FileManager's method of the same name. A `.protectionKey` attribute sets its
    /// class for new items; without it, the directory takes its parent's class if one is set. With intermediates,
    /// missing parents are created too (with the same attributes) and an existing directory is fine.
    public func createDirectory(atPath path: String, withIntermediateDirectories: Bool = false, attributes: [FileAttributeKey: Any] = [:]) throws {
        try foundationErrors(writing: true) {
            let target = try self.path(path)
            guard !target.isRoot else {
                if withIntermediateDirectories { return }
                throw ProtectedStoreError(.alreadyExists, path: "\(bundleIdentifier):", problem: "the container root exists", remedy: "Give the path of a new directory")
            }
            let explicitClass = try Self.protectionClass(in: attributes, path: "\(bundleIdentifier):\(path)")
            for depth in 1...target.components.count {
                let prefix = ContainerPath.root.appendingComponents(target.components.prefix(depth))
                let isTarget = depth == target.components.count
                let item = try directory.resolve(prefix, followingFinalSymlink: true)
                if let info = try item.location.status() {
                    guard info.st_mode & S_IFMT == S_IFDIR else {
                        throw ProtectedStoreError(.alreadyExists, path: item.displayPath, problem: "\(prefix) exists and is not a directory", remedy: "Choose another path")
                    }
                    if isTarget && !withIntermediateDirectories {
                        throw ProtectedStoreError(.alreadyExists, path: item.displayPath, problem: "the directory already exists", remedy: "Choose another name")
                    }
                    continue
                }
                guard isTarget || withIntermediateDirectories else {
                    throw ProtectedStoreError(.notFound, path: item.displayPath, problem: "the parent directory \(prefix) does not exist",
                                              remedy: "Create it first, or create intermediate directories (mkdir -p)")
                }
                try refuseInboxChange(item.path, displayPath: item.displayPath, doing: "created")
                let directoryClass = try explicitClass ?? directoryClass(of: item.parent)
                try item.parent.makeSubdirectory(item.name, mode: 0o700, displayPath: item.displayPath) { created in
                    if let directoryClass { try writeDirectoryClass(directoryClass, in: created, displayPath: item.displayPath) }
                }
                try item.location.synchronizeDirectory()
            }
        }
    }

    /// Removes a file, a symlink, or a directory with everything in it. The container's own folders can't be removed.
    public func removeItem(atPath path: String) throws {
        try foundationErrors(writing: true) {
            let item = try directory.resolve(try self.path(path), followingFinalSymlink: false)
            try refuseLayoutChange(item, doing: "removed")
            guard let info = try item.location.status() else {
                throw ProtectedStoreError(.notFound, path: item.displayPath, problem: "no such file or directory", remedy: "Check the path")
            }
            if info.st_mode & S_IFMT == S_IFDIR {
                try removeTree(named: item.name, in: item.parent, displayPath: item.displayPath)
            } else {
                guard DurableIO.unlink(item.entry, relativeTo: item.parent.descriptor.rawValue) == 0 else {
                    throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: item.displayPath, doing: "remove the file")
                }
            }
            item.entryRemoved()
            try item.location.synchronizeDirectory()
        }
    }

    /// Moves an item inside the container; the destination must not exist. Files keep their class.
    public func moveItem(atPath source: String, toPath destination: String) throws {
        try foundationErrors(writing: true) {
            let from = try directory.resolve(try self.path(source), followingFinalSymlink: false)
            let to = try directory.resolve(try self.path(destination), followingFinalSymlink: false)
            try refuseLayoutChange(from, doing: "moved")
            try refuseInboxChange(to.path, displayPath: to.displayPath, doing: "created by moving an item there")
            guard try from.location.status() != nil else {
                throw ProtectedStoreError(.notFound, path: from.displayPath, problem: "no such file or directory", remedy: "Check the path")
            }
            try to.prepareEntry()
            if from.parent.path != to.parent.path { try from.parent.names.unbindLinkTarget(at: from.location) }
            do {
                try from.location.rename(to: to.location, replacing: false)
                from.entryRemoved()
            } catch let error as ProtectedStoreError where error.errno == .invalidArgument {
                if to.path.isWithin(from.path) {
                    throw ProtectedStoreError(.invalidArgument, path: to.displayPath, problem: "a directory can't be moved into itself", remedy: "Choose a destination outside \(source)")
                }
                throw ProtectedStoreError(.io, path: from.displayPath, problem: "the file system does not support renames that refuse to overwrite (renameat2 RENAME_NOREPLACE)",
                                          remedy: "Keep the device root on a local file system such as ext4, xfs, btrfs or tmpfs", errno: error.errno)
            }
            try to.location.synchronizeDirectory()
            try from.location.synchronizeDirectory()
        }
    }

    /// Creates a symbolic link at `path` to `destination`, as FileManager's method of the same name; the target is
    /// stored encrypted (docs/FORMAT.md §7). Following a link never leaves the container: one whose target would
    /// (absolute, or climbing above the root) is refused when a path leads through it.
    public func createSymbolicLink(atPath path: String, withDestinationPath destination: String) throws {
        try foundationErrors(writing: true) {
            let item = try directory.resolve(try filePath(path), followingFinalSymlink: false)
            try refuseInboxChange(item.path, displayPath: item.displayPath, doing: "created")
            guard !destination.isEmpty, !destination.utf8.contains(0), destination.utf8.count <= ContainerPath.maximumPathBytes else {
                throw ProtectedStoreError(.invalidArgument, path: item.displayPath, problem: "the link's destination is empty, contains a NUL byte or is longer than \(ContainerPath.maximumPathBytes) bytes",
                                          remedy: "Give a relative path inside the container, such as ../Library/Caches/x")
            }
            guard try item.location.status() == nil else {
                throw ProtectedStoreError(.alreadyExists, path: item.displayPath, problem: "an item with this name exists", remedy: "Remove it first, or choose another name")
            }
            try item.prepareEntry()
            guard symlinkat(try item.parent.names.sealedLinkTarget(destination), item.parent.descriptor.rawValue, item.entry) == 0 else {
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: item.displayPath, doing: "create the symbolic link")
            }
            try item.location.synchronizeDirectory()
        }
    }

    /// A path that must name a file: a trailing "/" is refused rather than ignored.
    private func filePath(_ raw: String) throws -> ContainerPath {
        let parsed = try path(raw)
        guard !parsed.mustBeDirectory else {
            throw ProtectedStoreError(.invalidArgument, path: "\(bundleIdentifier):\(raw)", problem: "the path ends with \"/\", so it names a directory",
                                      remedy: "Give the file's path without the trailing slash")
        }
        return parsed
    }

    // MARK: Classes

    /// Marks a directory's class for new items in it: a small file with the class name, hidden from listings.
    package static let directoryClassName = "\(ContainerPath.reservedPrefix)-class"

    static func protectionClass(of protection: FileProtectionType) throws -> ProtectionClass {
        guard let protectionClass = ProtectionClass(protection) else {
            throw ProtectedStoreError(.invalidArgument, problem: "unknown protection type \(protection.rawValue)", remedy: "Use one of \(ProtectionClass.acceptedNames)")
        }
        return protectionClass
    }

    /// The class an attribute dictionary asks for, if any; attributes other than `.protectionKey` are refused
    /// rather than silently ignored.
    static func protectionClass(in attributes: [FileAttributeKey: Any], path: String) throws -> ProtectionClass? {
        let unsupported = attributes.keys.filter { $0 != .protectionKey }
        guard unsupported.isEmpty else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "unsupported attributes \(unsupported.map(\.rawValue).sorted().joined(separator: ", "))",
                                      remedy: "Only FileAttributeKey.protectionKey can be set")
        }
        guard let value = attributes[.protectionKey] else { return nil }
        guard let protection = value as? FileProtectionType else {
            throw ProtectedStoreError(.invalidArgument, path: path, problem: "the .protectionKey attribute is a \(type(of: value)), not a FileProtectionType",
                                      remedy: "Pass a FileProtectionType such as .complete")
        }
        return try protectionClass(of: protection)
    }

    /// The class a protection option of `Data.WritingOptions` asks for, if any.
    static func protectionClass(in options: Data.WritingOptions) throws -> ProtectionClass? {
        let chosen = options.rawValue & Data.WritingOptions.fileProtectionMask.rawValue
        guard chosen != 0 else { return nil }
        guard let match = ProtectionClass.allCases.first(where: { $0.writingOption.rawValue == chosen }) else {
            throw ProtectedStoreError(.invalidArgument, problem: "unknown file protection option 0x\(String(chosen, radix: 16))", remedy: "Use one of the fileProtection options of Data.WritingOptions")
        }
        return match
    }

    /// Re-wraps a file's key for `newClass`; handles opened before a change to class A lose their key at the next lock too.
    package func changeClass(of file: EncryptedFile, to newClass: ProtectionClass) throws {
        if newClass == .complete { device.fileBecomesComplete(fileID: file.fileID) }
        try file.changeProtectionClass(to: newClass, keys: device)
    }

    /// The class set on a directory, if any.
    package func directoryClass(of opened: OpenDirectory) throws -> ProtectionClass? {
        let marker = try opened.location(Self.directoryClassName, displayPath: directory.displayPath(opened.path))
        guard try marker.status() != nil else { return nil }
        let bytes = try marker.readPrefix(count: 128, what: "directory class")
        let name = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard let protectionClass = ProtectionClass(name: name) else {
            throw ProtectedStoreError(.integrity, path: directory.displayPath(opened.path), problem: "the directory's class marker is unreadable",
                                      remedy: "Set the directory's class again (sandboxctl protection --set CLASS)")
        }
        return protectionClass
    }

    /// The class of a new item in `parent`: the directory's if set, else the container default.
    package func inheritedClass(in parent: OpenDirectory) throws -> ProtectionClass { try directoryClass(of: parent) ?? defaultClass }

    /// Whether a stored file at `path` with no bytes is one a power cut left (created, never synced), which opens as an
    /// empty file of the class a new file there would take, as ext4 shows it empty. Not in the Inbox, which only
    /// deliveries write, each synced before it is named: there it is damage.
    package func emptyFileTakesFolderClass(_ path: ContainerPath) -> Bool { !path.isWithin(inboxPath) }

    /// Opens the stored file of `item`; an empty one as `emptyFileTakesFolderClass` says.
    package func openStoredFile(_ item: ResolvedItem, writable: Bool) throws -> EncryptedFile {
        let classIfEmpty: (() throws -> ProtectionClass)? = emptyFileTakesFolderClass(item.path) ? { try self.inheritedClass(in: item.parent) } : nil
        return try EncryptedFile.open(at: item.location, keys: device, writable: writable, classIfEmpty: classIfEmpty)
    }

    // MARK: Helpers

    /// A new file of `protectionClass`, filled by `fill`, synced and renamed over `item`: a reader sees the old file
    /// or the new one, even after a crash.
    private func writeWholeFile(to item: ResolvedItem, protectionClass: ProtectionClass, replacing: Bool, fill: (EncryptedFile) throws -> Void) throws {
        let temporary = item.location.temporarySibling()
        let file = try EncryptedFile.create(at: temporary, protectionClass: protectionClass, keys: device)
        do {
            let handle = try ProtectedFileHandle(file: file, path: item.displayPath, container: self)
            defer { handle.forget() }
            try fill(file)
            try file.synchronize()
            try file.close()
            try item.prepareEntry()
            try temporary.rename(to: item.location, replacing: replacing)
        } catch {
            try? file.close()
            temporary.unlink()
            throw error
        }
        try item.location.synchronizeDirectory()
    }

    package func writeDirectoryClass(_ protectionClass: ProtectionClass, in opened: OpenDirectory, displayPath: String) throws {
        try FileSystem.writeAtomically(Array("\(protectionClass.name)\n".utf8), to: try opened.location(Self.directoryClassName, displayPath: displayPath), replacing: true)
    }

    private func refuseLayoutChange(_ item: ResolvedItem, doing action: String) throws {
        guard !layoutPaths.contains(item.path) else {
            throw ProtectedStoreError(.invalidArgument, path: item.displayPath, problem: "\(item.path) is one of the container's own folders and can't be \(action)",
                                      remedy: "Work on the items inside it instead")
        }
    }

    /// Every name in a directory, in plaintext; with `includingReserved`, ProtectedStore's own files too (as stored).
    package func names(in opened: OpenDirectory, includingReserved: Bool = false) throws -> [String] {
        try opened.plaintextNames(includingReserved: includingReserved, displayPath: directory.displayPath(opened.path))
    }

    /// The item `name` in `opened`; nil if nothing is there.
    private func item(named name: String, in opened: OpenDirectory, displayPath: String? = nil) throws -> ContainerItem? {
        let path = opened.path.appending(name)
        let location = try opened.location(name, displayPath: displayPath ?? directory.displayPath(path))
        guard let info = try location.status() else { return nil }
        let modified = Self.modificationDate(info)
        var type = FileAttributeType.typeUnknown
        var protection: FileProtectionType?
        var size: UInt64 = 0
        var target: String?
        var problem: String?
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            type = .typeRegular
            let file = Self.fileDetails(at: location)
            // Removed since the lstat: gone, as above; one this process may not read (its mode) is listed without
            // details, not as damage.
            if file.kind == .notFound { return nil }
            size = file.size
            problem = file.kind == .integrity || file.kind == .unsupportedFormat ? file.problem : nil
            if let header = file.header {
                protection = header.protectionClass.fileProtectionType
            } else if problem == nil {
                // No bytes at all (emptyFileTakesFolderClass).
                if emptyFileTakesFolderClass(path) {
                    protection = (try? inheritedClass(in: opened))?.fileProtectionType
                } else {
                    problem = "the file is empty: it was truncated"
                }
            }
        case S_IFDIR:
            type = .typeDirectory
            do {
                protection = try directoryClass(of: try opened.subdirectory(name, displayPath: location.displayPath))?.fileProtectionType
            } catch let error as ProtectedStoreError where error.kind == .notFound || error.errno == .notDirectory {
                return nil  // removed or replaced since the lstat: gone as far as this listing goes
            } catch let error as ProtectedStoreError where error.kind == .integrity || error.kind == .unsupportedFormat {
                // A folder whose IV or class marker is damaged is listed as damaged, never left out.
                problem = error.problem
            } catch {
                // One this process may not open (its mode): listed, without a class.
            }
        case S_IFLNK:
            type = .typeSymbolicLink
            do {
                target = try opened.names.linkTarget(at: location)
            } catch let error as ProtectedStoreError where error.kind == .notFound {
                return nil
            } catch let error as ProtectedStoreError where error.kind == .integrity {
                problem = error.problem
            }
        case S_IFSOCK, S_IFIFO:
            // Made through the mount; a name with no data at rest, so no class. Foundation has no type for a FIFO.
            type = info.st_mode & S_IFMT == S_IFSOCK ? .typeSocket : .typeUnknown
        default:
            problem = "not a regular file, directory or symbolic link"
        }
        return ContainerItem(name: name, path: path.description, type: type, protection: protection, size: size,
                             modificationDate: modified, symbolicLinkTarget: target, problem: problem)
    }

    /// A regular file's header and plaintext size, read without any key; or why they can't be read.
    package static func fileDetails(at location: FileLocation) -> (header: FileHeader?, size: UInt64, problem: String?, kind: ProtectedStoreError.Kind?) {
        do {
            let (header, size) = try EncryptedFile.details(at: location)
            return (header, UInt64(size), nil, nil)
        } catch let error as ProtectedStoreError {
            return (nil, 0, error.problem, error.kind)
        } catch {
            return (nil, 0, "\(error)", .io)
        }
    }

    static func modificationDate(_ info: stat) -> Date {
        Date(timeIntervalSince1970: TimeInterval(info.st_mtim.tv_sec) + TimeInterval(info.st_mtim.tv_nsec) / 1e9)
    }

    /// Removes a directory and everything in it: the items first, then (once their removal is durable, so a power cut
    /// never leaves an item without its long name or its directory's IV) ProtectedStore's own files, the IV last.
    private func removeTree(named name: String, in parent: OpenDirectory, displayPath: String) throws {
        let opened = try parent.subdirectory(name, displayPath: displayPath)
        let children = try names(in: opened, includingReserved: true)
        for child in children where !child.hasPrefix(ContainerPath.reservedPrefix) {
            let location = try opened.location(child, displayPath: displayPath)
            guard let info = try location.status() else { continue }
            if info.st_mode & S_IFMT == S_IFDIR {
                try removeTree(named: child, in: opened, displayPath: directory.displayPath(opened.path.appending(child)))
            } else if DurableIO.unlink(location.name, relativeTo: opened.descriptor.rawValue) != 0 && Foundation.errno != ENOENT {
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: directory.displayPath(opened.path.appending(child)), doing: "remove")
            }
        }
        try DurableIO.synchronize(opened.descriptor, path: displayPath)
        let own = children.filter { $0.hasPrefix(ContainerPath.reservedPrefix) && $0 != DirectoryNames.ivName } + [DirectoryNames.ivName]
        for child in own {
            // Own files, or a directory a crash left half-built: no IV to open it by.
            guard OpenDirectory.removeOwnEntry(child, in: opened.descriptor) else {
                throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: directory.displayPath(opened.path.appending(child)), doing: "remove")
            }
        }
        guard DurableIO.unlink(try parent.entry(for: name), relativeTo: parent.descriptor.rawValue, flags: AT_REMOVEDIR) == 0 else {
            throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath, doing: "remove the directory")
        }
    }
}

extension ContainerPath {
    package func appendingComponents(_ names: some Sequence<String>) -> ContainerPath { names.reduce(self) { $0.appending($1) } }
}
