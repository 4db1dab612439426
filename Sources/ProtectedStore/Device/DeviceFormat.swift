import Foundation
import ProtectedStoreCore
import SystemPackage

/// The on-disk format of a device root as a whole, and the conversion of a format version 1 device to version 2 in
/// place (`sandboxctl migrate`, docs/FORMAT.md §8).
///
/// Version 1 named container folders by bundle identifier (`containers/<bundle id>/container.json`), stored names and
/// Inbox records in clear and used the file layout whose growth a power cut could tear. The keybag and the device
/// secret did not change, so the passcode and the class keys carry over.
package enum DeviceFormat {
    package enum State: Equatable, Sendable {
        /// Format version 2, as this version writes.
        case current
        /// Format version 1: at least one container in that layout.
        case version1
        /// A migration stopped part-way (`<root>/.sandboxctl-migration` exists): the device is version 1 or 2 underneath.
        case migrationInterrupted
    }

    /// Where a migration builds the new containers, and keeps the old ones once replaced until they are removed.
    static let migrationFolderName = ".sandboxctl-migration"
    static let replacedFolderName = "version-1-containers"
    static let version1MetadataName = "container.json"

    package static func state(root: String) throws -> State {
        let root = Device.absolute(root)
        if try FileSystem.exists((root as NSString).appendingPathComponent(migrationFolderName)) { return .migrationInterrupted }
        let containers = (root as NSString).appendingPathComponent("containers")
        guard try FileSystem.exists(containers) else { return .current }
        // Run at every open: version 2 folders are named by a UUID-shaped id, so only another name costs a stat.
        for folder in try listing(containers) where !folder.hasPrefix(".") && UUID(uuidString: folder) == nil {
            let metadata = ((containers as NSString).appendingPathComponent(folder) as NSString).appendingPathComponent(version1MetadataName)
            if try FileSystem.exists(metadata) { return .version1 }
        }
        return .current
    }

    /// Throws `.unsupportedFormat`, naming the version and the command that converts it, unless `root` is current.
    package static func requireCurrent(root: String) throws {
        switch try state(root: root) {
        case .current:
            return
        case .version1:
            throw ProtectedStoreError(.unsupportedFormat, path: root,
                                      problem: "this device is in on-disk format version 1 (names in clear, files a power cut can damage); this version of ProtectedStore reads format version 2 only",
                                      remedy: "Convert it in place with `sandboxctl migrate --root \(root)` (crash-safe; it asks for the passcode; no daemon may serve the device meanwhile)")
        case .migrationInterrupted:
            throw ProtectedStoreError(.unsupportedFormat, path: root,
                                      problem: "a migration of this device from format version 1 to 2 was interrupted (\(migrationFolderName) is still there)",
                                      remedy: "Finish it with `sandboxctl migrate --root \(root)`; nothing is lost meanwhile")
        }
    }

    // MARK: Migrating

    /// What a migration did.
    package struct MigrationSummary: Sendable, Equatable {
        package enum Outcome: String, Sendable, Encodable {
            /// Converted now.
            case migrated
            /// An interrupted migration's switch was finished (no passcode needed).
            case finished
            /// The device was format version 2 already: nothing was done.
            case alreadyCurrent = "already-current"
        }
        package var outcome = Outcome.migrated
        package var containers = 0
        package var directories = 0
        package var files = 0
        package var bytes: Int64 = 0
        package var inboxRecords = 0
        /// Files a version 1 write left half-made under a temporary name, which no version 1 reader showed: not carried over.
        package var skipped: [String] = []
    }

    /// Converts the version 1 device in `root` to version 2 in place. The new containers are built beside the old ones
    /// (every file decrypted, re-encrypted in the new layout under a new key of the same class, and read back and
    /// compared), made durable, and switched in by two renames; then the old ones are removed. A power cut at any
    /// instant leaves a device that is version 1 (with a partial new tree that the next run discards) or version 2 (with
    /// the old tree that the next run removes): running this again finishes the job. `passcode` is asked for only when
    /// there is something to convert (wrong ones count as for an unlock). No daemon may serve the device; this holds
    /// the daemon lock so none starts meanwhile.
    package static func migrate(root: String, deviceSecretPath: String?, passcode: () throws -> Passcode) throws -> MigrationSummary {
        let root = Device.absolute(root)
        guard try FileSystem.exists(Device.keybagPath(root: root)) else {
            throw ProtectedStoreError(.notFound, path: root, problem: "no device here (no keybag)", remedy: "Pass the root of the device to migrate with --root")
        }
        let daemonLock = try DaemonInfo.takeLock(root: root, remedy: "Stop it first: a migration holds the keys itself")
        defer { close(daemonLock) }
        let containers = (root as NSString).appendingPathComponent("containers")
        let migration = (root as NSString).appendingPathComponent(migrationFolderName)
        let staged = (migration as NSString).appendingPathComponent("containers")
        let replaced = (migration as NSString).appendingPathComponent(replacedFolderName)
        var summary = MigrationSummary()

        if try FileSystem.exists(replaced) {
            // The switch began: the new containers are complete and durable. Finish it, then drop the old ones.
            if try !FileSystem.exists(containers) {
                try FileLocation(path: staged).rename(to: FileLocation(path: containers), replacing: false)
                try FileSystem.synchronizeDirectory(root)
            }
            try removeTree(migration)
            try FileSystem.synchronizeDirectory(root)
            summary.outcome = .finished
            return summary
        }
        if try FileSystem.exists(migration) {
            // An earlier run stopped while building: its partial tree is discarded, the old one was never touched.
            try removeTree(migration)
            try FileSystem.synchronizeDirectory(root)
        }
        guard try state(root: root) == .version1 else {
            summary.outcome = .alreadyCurrent
            return summary
        }

        let device = try Device.openForMigration(root: root, deviceSecretPath: deviceSecretPath, containersPath: staged)
        defer { device.shutDown() }
        try device.unlock(passcode: try passcode())
        do {
            try FileSystem.createDirectories(staged)
            try FileSystem.synchronizeDirectory(root)
            for folder in try listing(containers).sorted() {
                let path = (containers as NSString).appendingPathComponent(folder)
                guard try FileSystem.exists((path as NSString).appendingPathComponent(version1MetadataName)) else {
                    // Half-built containers (`.sandboxctl-new-…`) were never listed by version 1 either.
                    summary.skipped.append(path)
                    continue
                }
                try migrateContainer(at: path, folder: folder, to: device, summary: &summary)
            }
            try synchronizeTree(staged)
            try FileSystem.synchronizeDirectory(migration)
            try FileSystem.synchronizeDirectory(root)
        } catch {
            // Nothing was switched: the version 1 device is as it was once the partial new tree is gone.
            try? removeTree(migration)
            try? FileSystem.synchronizeDirectory(root)
            throw error
        }

        // The switch: after the first rename the device reads as an interrupted migration until the second is done.
        try FileLocation(path: containers).rename(to: FileLocation(path: replaced), replacing: false)
        try FileSystem.synchronizeDirectory(migration)
        try FileLocation(path: staged).rename(to: FileLocation(path: containers), replacing: false)
        try FileSystem.synchronizeDirectory(root)
        try removeTree(migration)
        try FileSystem.synchronizeDirectory(root)
        return summary
    }

    private static func migrateContainer(at path: String, folder: String, to device: Device, summary: inout MigrationSummary) throws {
        let metadataPath = (path as NSString).appendingPathComponent(version1MetadataName)
        guard let metadata = try FileLocation(path: metadataPath).readJSON(Container.Metadata.self, what: "version 1 container description"),
              metadata.bundleIdentifier == folder, let defaultClass = ProtectionClass(name: metadata.defaultProtection) else {
            throw ProtectedStoreError(.integrity, path: metadataPath, problem: "the version 1 container description is unreadable or names another container",
                                      remedy: "Restore it from a backup, then run `sandboxctl migrate` again (nothing has been changed)")
        }
        let container = try device.createContainer(bundleIdentifier: metadata.bundleIdentifier, defaultProtection: defaultClass.fileProtectionType)
        summary.containers += 1
        let data = (path as NSString).appendingPathComponent(Container.dataName)
        let root = try container.directory.openRoot()
        if let marker = try version1DirectoryClass(in: data) { try container.writeDirectoryClass(marker, in: root, displayPath: "\(folder):") }
        try migrateDirectory(data, into: root, of: container, summary: &summary)
        try migrateInboxQueue((path as NSString).appendingPathComponent(InboxQueue.directoryName), into: container, summary: &summary)
    }

    private static func migrateDirectory(_ source: String, into target: OpenDirectory, of container: Container, summary: inout MigrationSummary) throws {
        for name in try listing(source).sorted() where name != Container.directoryClassName {
            let sourcePath = (source as NSString).appendingPathComponent(name)
            let path = target.path.appending(name)
            let displayPath = container.directory.displayPath(path)
            var status = stat()
            guard lstat(sourcePath, &status) == 0 else {
                throw ProtectedStoreError.io(Errno(rawValue: errno), path: sourcePath, doing: "read the version 1 item")
            }
            let isReserved = name.hasPrefix(ContainerPath.reservedPrefix)
            switch status.st_mode & S_IFMT {
            case S_IFDIR where isReserved:
                summary.skipped.append(sourcePath)
            case S_IFDIR:
                let marker = try version1DirectoryClass(in: sourcePath)
                if container.layoutPaths.contains(path) {
                    if let marker { try container.writeDirectoryClass(marker, in: try container.directory.openDirectory(path), displayPath: displayPath) }
                } else {
                    try target.makeSubdirectory(name, mode: status.st_mode & 0o7777, displayPath: displayPath) { created in
                        if let marker { try container.writeDirectoryClass(marker, in: created, displayPath: displayPath) }
                    }
                }
                summary.directories += 1
                try migrateDirectory(sourcePath, into: try target.subdirectory(name, displayPath: displayPath), of: container, summary: &summary)
            case S_IFREG:
                let old: Version1File
                do {
                    old = try Version1File.open(at: FileLocation(path: sourcePath), keys: container.device)
                } catch let error as ProtectedStoreError where isReserved && error.kind == .integrity {
                    summary.skipped.append(sourcePath)
                    continue
                }
                let protectionClass = old.awaitsDefaultClass ? try container.inheritedClass(in: target) : old.protectionClass
                try copy(old, from: sourcePath, status: status, to: path, protection: protectionClass, in: container)
                summary.files += 1
                summary.bytes += old.size
            default:
                throw ProtectedStoreError(.unsupportedFormat, path: sourcePath,
                                          problem: "not a regular file or directory: version 1 never made one, so it can't be converted",
                                          remedy: "Move it out of the device root, then run `sandboxctl migrate` again (nothing has been changed)")
            }
        }
    }

    /// Writes `old`'s plaintext to a new version 2 file at `path`, syncs it, reads it back against a second pass over
    /// the old file before anything may replace the old one, and gives it the old file's modification time.
    private static func copy(_ old: Version1File, from sourcePath: String, status: stat, to path: ContainerPath, protection protectionClass: ProtectionClass,
                             in container: Container) throws {
        let item = try container.directory.resolve(path, followingFinalSymlink: false)
        try item.prepareEntry()
        let file = try EncryptedFile.create(at: item.location, protectionClass: protectionClass, keys: container.device)
        do {
            var offset: Int64 = 0
            try old.forEachBlock { plaintext in
                try file.write(plaintext, at: offset)
                offset += Int64(plaintext.count)
            }
            try file.synchronize()
            let reread = try Version1File.open(at: FileLocation(path: sourcePath), keys: container.device)
            var position: Int64 = 0
            var identical = file.size == reread.size
            try reread.forEachBlock { plaintext in
                if identical, try file.read(at: position, count: plaintext.count) != plaintext { identical = false }
                position += Int64(plaintext.count)
            }
            guard identical else {
                throw ProtectedStoreError(.integrity, path: item.displayPath, problem: "the converted file does not read back as the version 1 file \(sourcePath)",
                                          remedy: "Check the disk; nothing has been replaced, so run `sandboxctl migrate` again")
            }
            try file.close()
        } catch {
            try? file.close()
            throw error
        }
        // Last, since closing may still write the length record; synced, so the time survives a power cut too.
        let reopened = try item.location.open(.readOnly, doing: "reopen the converted file")
        try reopened.closeAfter {
            guard futimens(reopened.rawValue, [status.st_atim, status.st_mtim]) == 0 else {
                throw ProtectedStoreError.io(Errno(rawValue: errno), path: item.displayPath, doing: "set the modification time")
            }
            try DurableIO.synchronize(reopened, path: item.displayPath)
        }
        try item.location.synchronizeDirectory()
    }

    /// Carries each Inbox record over, sealed, under its own number, and the number counter, so pending open-URL
    /// events are still delivered and delivered ones are not delivered again.
    private static func migrateInboxQueue(_ source: String, into container: Container, summary: inout MigrationSummary) throws {
        guard try FileSystem.exists(source) else { return }
        try container.inboxQueue.prepare()
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        for name in try listing(source).sorted() {
            let path = (source as NSString).appendingPathComponent(name)
            if name == InboxQueue.legacyCounterName {
                let counter = try FileLocation(path: path).readPrefix(count: 32, what: "version 1 Inbox sequence counter")
                try FileSystem.writeAtomically(counter, to: FileLocation(path: (container.inboxQueue.path as NSString).appendingPathComponent(name)), replacing: true)
                continue
            }
            guard name.hasSuffix(".json"), !name.hasPrefix(".") else { continue }
            // Version 1 ignored records that do not decode, and so does this.
            guard let entry = try? FileLocation(path: path).readJSON(InboxQueue.Entry.self, what: "version 1 Inbox record", decoder: decoder),
                  name == String(format: "%020llu", entry.sequence) + ".json" else {
                summary.skipped.append(path)
                continue
            }
            try container.inboxQueue.record(entry)
            summary.inboxRecords += 1
        }
        try container.inboxQueue.withLock { try container.inboxQueue.adoptMigratedRecords() }
    }

    /// A version 1 directory's class marker, if it has one.
    private static func version1DirectoryClass(in directory: String) throws -> ProtectionClass? {
        let marker = FileLocation(path: (directory as NSString).appendingPathComponent(Container.directoryClassName))
        guard try marker.status() != nil else { return nil }
        let name = String(decoding: try marker.readPrefix(count: 128, what: "version 1 directory class"), as: UTF8.self)
        guard let protectionClass = ProtectionClass(name: name.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw ProtectedStoreError(.integrity, path: marker.displayPath, problem: "the version 1 directory's class marker is unreadable",
                                      remedy: "Write the class name into it (e.g. complete), then run `sandboxctl migrate` again (nothing has been changed)")
        }
        return protectionClass
    }

    // MARK: Helpers

    private static func listing(_ path: String) throws -> [String] {
        do {
            return try FileManager.default.contentsOfDirectory(atPath: path)
        } catch {
            throw ProtectedStoreError(.io, path: path, problem: "cannot list the directory (\(error.localizedDescription))", remedy: "Check the permissions of the device root")
        }
    }

    /// fsync of every directory under `path`, deepest first, so each one's entries are durable before its parent's.
    private static func synchronizeTree(_ path: String) throws {
        for name in try listing(path) {
            let child = (path as NSString).appendingPathComponent(name)
            var status = stat()
            if lstat(child, &status) == 0, status.st_mode & S_IFMT == S_IFDIR { try synchronizeTree(child) }
        }
        try FileSystem.synchronizeDirectory(path)
    }

    /// Removes `path` and everything below it, each directory's entries made durably gone before the directory itself.
    private static func removeTree(_ path: String) throws {
        let directory = try FileLocation(path: path).open(.readOnly, options: [.directory, .noFollow], doing: "open the folder to remove")
        try directory.closeAfter {
            for name in try listing(path) {
                let child = (path as NSString).appendingPathComponent(name)
                var status = stat()
                guard lstat(child, &status) == 0 else { continue }
                if status.st_mode & S_IFMT == S_IFDIR {
                    // A directory made read-only (a version 1 item's mode) must still be emptied.
                    chmod(child, 0o700)
                    try removeTree(child)
                } else if DurableIO.unlink(name, relativeTo: directory.rawValue) != 0, errno != ENOENT {
                    throw ProtectedStoreError.io(Errno(rawValue: errno), path: child, doing: "remove")
                }
            }
            try DurableIO.synchronize(directory, path: path)
        }
        let parent = try FileLocation(path: (path as NSString).deletingLastPathComponent).open(.readOnly, options: [.directory], doing: "open the folder to remove from")
        try parent.closeAfter {
            guard DurableIO.unlink((path as NSString).lastPathComponent, relativeTo: parent.rawValue, flags: AT_REMOVEDIR) == 0 || errno == ENOENT else {
                throw ProtectedStoreError.io(Errno(rawValue: errno), path: path, doing: "remove the folder")
            }
        }
    }
}
