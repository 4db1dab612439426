import Foundation
import ProtectedStoreCore
import SystemPackage

/// An app container on a device: the iOS layout, every path confined to it, every file encrypted under its class.
///
/// File operations throw `CocoaError` as Foundation's would (data-protection denials are `.fileReadNoPermission`
/// or `.fileWriteNoPermission` over `POSIXError(.EPERM)`); `error.protectedStoreError` has the details.
public final class Container: @unchecked Sendable {
    /// The app's bundle identifier, which names the container.
    public let bundleIdentifier: String
    /// The class of new items when neither the caller nor the parent directory chose one (the entitlement's role).
    public let defaultProtection: FileProtectionType
    /// The device whose keys protect this container.
    public let device: Device
    /// The data directory on disk; every path the API takes is relative to it.
    public let dataPath: String
    /// The container's folder name on disk (docs/FORMAT.md §7): derived from the bundle identifier under the device
    /// secret, so it names the container without showing the identifier.
    public var storageIdentifier: String { ((dataPath as NSString).deletingLastPathComponent as NSString).lastPathComponent }

    package let directory: ConfinedDirectory
    let defaultClass: ProtectionClass

    /// The container's own folders, created with it and never removed or moved.
    public static func layout(bundleIdentifier: String) -> [String] {
        ["Documents", documentsInbox, "Library", "Library/Application Support", applicationSupport(bundleIdentifier),
         "Library/Caches", "Library/Preferences", "tmp"]
    }

    /// Where other programs deliver files: the app may read and delete them.
    public static let documentsInbox = "Documents/Inbox"

    /// Where the app keeps its own data files.
    public static func applicationSupport(_ bundleIdentifier: String) -> String { "Library/Application Support/\(bundleIdentifier)" }

    /// The app's data folder in this container, `Library/Application Support/<bundle id>`.
    public var applicationSupportPath: String { Self.applicationSupport(bundleIdentifier) }

    package let layoutPaths: Set<ContainerPath>
    package let inboxPath: ContainerPath
    /// The record of Inbox deliveries and their events, beside the data directory.
    package let inboxQueue: InboxQueue
    let receiverLock = NSLock()
    var receiver: InboxReceiver?

    /// `cipher` is the container's name cipher (`nameCipher(device:bundleIdentifier:)`), made once by the caller.
    init(device: Device, bundleIdentifier: String, containerPath: String, deviceNames: NameCipher, cipher: NameCipher) throws {
        let metadataPath = (containerPath as NSString).appendingPathComponent(Self.metadataName)
        guard let metadata = try Self.readMetadata(at: metadataPath, deviceNames: deviceNames), metadata.bundleIdentifier == bundleIdentifier,
              let defaultClass = ProtectionClass(name: metadata.defaultProtection) else {
            throw ProtectedStoreError(.integrity, path: metadataPath, problem: "the container description does not open or names another container",
                                      remedy: "Restore it from a backup")
        }
        self.device = device
        self.bundleIdentifier = bundleIdentifier
        self.defaultClass = defaultClass
        self.defaultProtection = defaultClass.fileProtectionType
        self.dataPath = (containerPath as NSString).appendingPathComponent(Self.dataName)
        let layoutPaths = Set(try Self.layout(bundleIdentifier: bundleIdentifier).map { try ContainerPath($0, container: bundleIdentifier) })
        self.layoutPaths = layoutPaths
        self.directory = try ConfinedDirectory(path: dataPath, containerName: bundleIdentifier, cipher: cipher, layoutPaths: layoutPaths)
        self.inboxPath = try ContainerPath(Self.documentsInbox, container: bundleIdentifier)
        self.inboxQueue = InboxQueue(containerPath: containerPath, bundleIdentifier: bundleIdentifier, cipher: cipher)
    }

    /// The cipher of the container's names, from the name key the device's key holder derives.
    static func nameCipher(device: Device, bundleIdentifier: String) throws -> NameCipher {
        let nameKey = try device.nameKey(forContainer: bundleIdentifier)
        defer { nameKey.discard() }
        return try NameCipher(nameKey: nameKey)
    }

    /// Where `path` is stored on disk: below `dataPath`, with every name encrypted. For tools and tests that
    /// look at the bytes at rest; a symlink in the last place is not followed.
    package func storedPath(_ path: String) throws -> String {
        let parsed = try self.path(path)
        return parsed.isRoot ? dataPath : (dataPath as NSString).appendingPathComponent(try directory.storedPath(of: parsed))
    }

    static let metadataName = "container.sealed"
    /// The sealed description's JSON is padded to this many bytes, so its size is the same for every container.
    static let metadataPadding = 256
    static let dataName = "Data"

    /// The container's description, sealed under the device's name key (docs/FORMAT.md §7), bound to its folder's id.
    struct Metadata: Codable {
        var bundleIdentifier: String
        var defaultProtection: String
    }

    static func metadataContext(folder: String) -> [UInt8] { Array("container".utf8) + Array(folder.utf8) }

    /// The description at `path` (…/<id>/container.sealed); nil if it is missing or does not open for that folder.
    static func readMetadata(at path: String, deviceNames: NameCipher) throws -> Metadata? {
        let location = FileLocation(path: path)
        guard try location.status() != nil else { return nil }
        let folder = ((path as NSString).deletingLastPathComponent as NSString).lastPathComponent
        guard let json = deviceNames.record(fromSealed: try location.readPrefix(count: 4096, what: "container description"),
                                            context: metadataContext(folder: folder)) else { return nil }
        return try? JSONDecoder().decode(Metadata.self, from: Data(json))
    }

    /// Checks a bundle identifier: reverse-DNS, letters, digits, hyphens and dots, at least two non-empty parts.
    static func validate(bundleIdentifier: String) throws {
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
        let parts = bundleIdentifier.split(separator: ".", omittingEmptySubsequences: false)
        let problem: String? =
            bundleIdentifier.isEmpty ? "the bundle identifier is empty"
            : bundleIdentifier.utf8.count > 155 ? "the bundle identifier is longer than 155 characters"
            : !bundleIdentifier.allSatisfy(allowed.contains) ? "the bundle identifier may contain only letters, digits, hyphens and dots"
            : parts.count < 2 ? "the bundle identifier needs at least two parts separated by dots"
            : parts.contains(where: \.isEmpty) ? "the bundle identifier has an empty part (leading, trailing or double dot)"
            : parts.contains(where: { $0.hasPrefix("-") }) ? "a part of the bundle identifier starts with a hyphen"
            : nil
        if let problem {
            throw ProtectedStoreError(.invalidArgument, path: bundleIdentifier.isEmpty ? nil : bundleIdentifier, problem: problem,
                                      remedy: "Use reverse-DNS form, such as com.example.notes")
        }
    }

    func path(_ raw: String) throws -> ContainerPath { try ContainerPath(raw, container: bundleIdentifier) }
}

extension Device {
    /// Creates an app container with the iOS layout. `defaultProtection` plays the data-protection entitlement's role:
    /// the class of new items whose directory sets none (`.complete` unless chosen).
    public func createContainer(bundleIdentifier: String, defaultProtection: FileProtectionType = .complete) throws -> Container {
        try Container.validate(bundleIdentifier: bundleIdentifier)
        guard let defaultClass = ProtectionClass(defaultProtection) else {
            throw ProtectedStoreError(.invalidArgument, problem: "unknown protection type \(defaultProtection.rawValue)", remedy: "Use one of \(ProtectionClass.acceptedNames)")
        }
        let deviceNames = try self.deviceNames()
        let folder = try deviceNames.identifier(for: bundleIdentifier)
        let destination = (containersPath as NSString).appendingPathComponent(folder)
        let cipher = try Container.nameCipher(device: self, bundleIdentifier: bundleIdentifier)
        let alreadyExists = ProtectedStoreError(.alreadyExists, path: bundleIdentifier, problem: "the container already exists",
                                                remedy: "Choose another bundle identifier, or use the existing container")
        if try FileSystem.exists(destination) { throw alreadyExists }
        try FileSystem.createDirectories(containersPath)
        // Built aside and renamed into place, so a container is either complete or absent.
        let staging = (containersPath as NSString).appendingPathComponent("\(ContainerPath.reservedPrefix)-new-\(Random.bytes(6).hex)")
        do {
            let data = (staging as NSString).appendingPathComponent(Container.dataName)
            try FileSystem.createDirectories(data)
            let dataDirectory = try FileLocation(path: data).open(.readOnly, options: [.directory, .noFollow], doing: "open the new container")
            try dataDirectory.closeAfter { try DirectoryNames.writeNewIV(in: dataDirectory, displayPath: "\(bundleIdentifier):") }
            let layout = try ConfinedDirectory(path: data, containerName: bundleIdentifier, cipher: cipher, layoutPaths: [])
            for folder in Container.layout(bundleIdentifier: bundleIdentifier) {
                let path = try ContainerPath(folder, container: bundleIdentifier)
                try layout.openDirectory(path.parent).makeSubdirectory(path.name!, mode: 0o700, displayPath: layout.displayPath(path))
            }
            let metadata = Container.Metadata(bundleIdentifier: bundleIdentifier, defaultProtection: defaultClass.name)
            // Padded to one size for every bundle identifier (at most 155 bytes) and class.
            let sealed = try deviceNames.sealedRecord(Array(try JSONEncoder().encode(metadata)), context: Container.metadataContext(folder: folder),
                                                      padding: Container.metadataPadding)
            try FileSystem.writeAtomically(sealed, to: FileLocation(path: (staging as NSString).appendingPathComponent(Container.metadataName)), replacing: false)
            do {
                try FileLocation(path: staging).rename(to: FileLocation(path: destination), replacing: false)
            } catch let error as ProtectedStoreError where error.kind == .alreadyExists {
                throw alreadyExists
            }
            try FileSystem.synchronizeDirectory(containersPath)
        } catch {
            try? FileManager.default.removeItem(atPath: staging)
            throw error
        }
        return try Container(device: self, bundleIdentifier: bundleIdentifier, containerPath: destination, deviceNames: deviceNames, cipher: cipher)
    }

    /// The name key of a container, or with nil the device's own (docs/FORMAT.md §7), from this device's key holder:
    /// usable in every lock state.
    package func nameKey(forContainer bundleIdentifier: String?) throws -> SecureBytes {
        if let bundleIdentifier { try Container.validate(bundleIdentifier: bundleIdentifier) }
        return try holder.nameKey(forContainer: bundleIdentifier, device: self)
    }

    /// The cipher of the device's own names: container folders and descriptions.
    func deviceNames() throws -> NameCipher {
        let key = try nameKey(forContainer: nil)
        defer { key.discard() }
        return try NameCipher(nameKey: key)
    }

    /// Opens an existing container.
    public func container(bundleIdentifier: String) throws -> Container {
        try Container.validate(bundleIdentifier: bundleIdentifier)
        let deviceNames = try self.deviceNames()
        let path = (containersPath as NSString).appendingPathComponent(try deviceNames.identifier(for: bundleIdentifier))
        guard try FileSystem.exists(path) else {
            throw ProtectedStoreError(.notFound, path: bundleIdentifier, problem: "no such container on the device in \(root)",
                                      remedy: "Create it with `sandboxctl create \(bundleIdentifier)`, or check the bundle identifier")
        }
        return try Container(device: self, bundleIdentifier: bundleIdentifier, containerPath: path, deviceNames: deviceNames,
                             cipher: try Container.nameCipher(device: self, bundleIdentifier: bundleIdentifier))
    }

    /// The bundle identifiers of the device's containers, sorted: read from each container's sealed description.
    /// Damaged containers are left out here; `containerListing()` names them.
    public func containerIdentifiers() throws -> [String] { try containerListing().identifiers }

    /// A container folder whose description is missing, does not open for that folder, or names another container.
    public struct DamagedContainer: Sendable, Equatable {
        /// The folder's name in `<root>/containers/`.
        public let folder: String
        /// What is wrong with it.
        public let problem: String
    }

    /// The device's containers (bundle identifiers, sorted) and the folders that look like containers but are damaged,
    /// so a listing reports them instead of leaving them out.
    public func containerListing() throws -> (identifiers: [String], damaged: [DamagedContainer]) {
        guard try FileSystem.exists(containersPath) else { return ([], []) }
        let folders: [String]
        do {
            folders = try FileManager.default.contentsOfDirectory(atPath: containersPath)
        } catch {
            throw ProtectedStoreError(.io, path: containersPath, problem: "cannot list the containers (\(error.localizedDescription))", remedy: "Check the permissions of the device root")
        }
        let deviceNames = try self.deviceNames()
        var identifiers: [String] = []
        var damaged: [DamagedContainer] = []
        // Folders starting with ".sandboxctl" are containers being built or removed, never listed.
        for folder in folders.sorted() where !folder.hasPrefix(ContainerPath.reservedPrefix) {
            let path = (containersPath as NSString).appendingPathComponent(folder)
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
                damaged.append(DamagedContainer(folder: folder, problem: "not a container folder (a file or link was put among the containers)"))
                continue
            }
            let description = (path as NSString).appendingPathComponent(Container.metadataName)
            guard try FileLocation(path: description).status() != nil else {
                damaged.append(DamagedContainer(folder: folder, problem: "its description (\(Container.metadataName)) is missing: it was removed, or the folder was made outside ProtectedStore"))
                continue
            }
            guard let metadata = try Container.readMetadata(at: description, deviceNames: deviceNames) else {
                damaged.append(DamagedContainer(folder: folder, problem: "its description (\(Container.metadataName)) does not open for this folder: it was modified, corrupted or moved from another folder"))
                continue
            }
            guard (try? Container.validate(bundleIdentifier: metadata.bundleIdentifier)) != nil,
                  try deviceNames.identifier(for: metadata.bundleIdentifier) == folder else {
                damaged.append(DamagedContainer(folder: folder, problem: "its description names a bundle identifier that does not belong to this folder"))
                continue
            }
            identifiers.append(metadata.bundleIdentifier)
        }
        return (identifiers.sorted(), damaged)
    }
}
