import Foundation
import ProtectedStore
import ProtectedStoreCore

/// What `sandboxctl launch` records about a running app, for `ps` and `terminate`.
struct AppRecord: Codable {
    var bundle: String
    /// The `sandboxctl launch` process: it holds the container's mount and ends the app.
    var launcherPID: pid_t
    /// The sandbox's first process (bubblewrap's init in the app's PID namespace), as seen from outside.
    var sandboxPID: pid_t
    var command: [String]
}

/// Where launched apps keep their runtime state: outside the device root (like the mount logs), in
/// `$XDG_RUNTIME_DIR/sandboxctl/<keybag id>/apps/<bundle>/` (else `/tmp/sandboxctl-<uid>/…`): the launch lock, the
/// record, and the folder the container is mounted on for the sandbox.
enum AppRuntime {
    static func appsFolder(root: String) throws -> String {
        let base: String
        if let runtime = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            base = (runtime as NSString).appendingPathComponent("sandboxctl")
        } else {
            base = "/tmp/sandboxctl-\(getuid())"
        }
        try createPrivateFolder(base)
        let keybagPath = (root as NSString).appendingPathComponent("keybag")
        let keybagID = try Keybag.peekID(try FileLocation(path: keybagPath).readPrefix(count: Keybag.size, what: "keybag"), path: keybagPath)
        let folder = (base as NSString).appendingPathComponent("\(keybagID.hex)/apps")
        try FileSystem.createDirectories(folder)
        return folder
    }

    /// Creates `path` (mode 0700) or checks that the one there is a directory of ours that nobody else can enter: in a
    /// shared /tmp, another user could have made it first.
    private static func createPrivateFolder(_ path: String) throws {
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw ProtectedStoreError(.io, path: path, problem: "cannot create the runtime folder (\(String(cString: strerror(errno))))",
                                      remedy: "Set XDG_RUNTIME_DIR to a private folder of yours")
        }
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == getuid(), info.st_mode & 0o077 == 0 else {
            throw ProtectedStoreError(.permissionDenied, path: path,
                                      problem: "the runtime folder is not a directory of this user that only it can enter (mode 0700)",
                                      remedy: "Remove it, or set XDG_RUNTIME_DIR to a private folder of yours")
        }
    }

    /// The apps with a live launcher, by bundle identifier.
    static func running(root: String) throws -> [AppRecord] {
        let folder = try appsFolder(root: root)
        let bundles = (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
        return bundles.sorted().compactMap { bundle in
            let appFolder = (folder as NSString).appendingPathComponent(bundle)
            guard LaunchSlot.isHeld(appFolder) else { return nil }
            return try? JSONDecoder().decode(AppRecord.self, from: Data(contentsOf: URL(fileURLWithPath: LaunchSlot.recordPath(appFolder))))
        }
    }

    /// The running app of `bundle`, or an error saying that none runs.
    static func running(_ bundle: String, root: String) throws -> AppRecord {
        guard let record = try running(root: root).first(where: { $0.bundle == bundle }) else {
            throw ProtectedStoreError(.notFound, path: bundle, problem: "no app of this bundle is running",
                                      remedy: "See `sandboxctl ps`; start it with `sandboxctl launch \(bundle) -- COMMAND`")
        }
        return record
    }
}

/// The one launch of a bundle at a time: an exclusive `flock` on `launch.lock` in the app's runtime folder, held by the
/// launcher for its lifetime (the kernel drops it however the launcher ends), with the record beside it.
final class LaunchSlot {
    let folder: String
    private let descriptor: Int32

    static func recordPath(_ folder: String) -> String { (folder as NSString).appendingPathComponent("launch.json") }
    private static func lockPath(_ folder: String) -> String { (folder as NSString).appendingPathComponent("launch.lock") }

    /// Where the sandbox's home mount and socket folder are: `folder`, unless `shareSandboxFolder` moved them.
    private(set) var sandboxFolder: String
    /// The mount point for the sandbox's home.
    var homeMount: String { (sandboxFolder as NSString).appendingPathComponent("home") }
    /// The folder of the app's own daemon socket, bound into the sandbox.
    var socketFolder: String { (sandboxFolder as NSString).appendingPathComponent("socket") }
    var appSocket: String { (socketFolder as NSString).appendingPathComponent("app.sock") }

    /// Where a sandbox running as another user (a root launcher's) finds its mount and socket: root's runtime
    /// folder is closed to that user, and bubblewrap, running as it, must reach both by path.
    static let sharedSandboxesFolder = "/run/sandboxctl-apps"

    private init(folder: String, descriptor: Int32) {
        self.folder = folder
        self.sandboxFolder = folder
        self.descriptor = descriptor
    }

    /// Moves the sandbox's mount point and socket folder to `/run/sandboxctl-apps/<keybag id>/<bundle>`, a folder of
    /// `uid` that only it can enter, in folders only root can change.
    func shareSandboxFolder(uid: uid_t, gid: gid_t) throws {
        // folder is …/<keybag id>/apps/<bundle>.
        let parts = folder.split(separator: "/").suffix(3).map(String.init)
        let keybagFolder = (Self.sharedSandboxesFolder as NSString).appendingPathComponent(parts[0])
        let bundleFolder = (keybagFolder as NSString).appendingPathComponent(parts[2])
        try Self.makeFolder(Self.sharedSandboxesFolder, mode: 0o755, owner: (0, 0))
        try Self.makeFolder(keybagFolder, mode: 0o755, owner: (0, 0))
        try Self.makeFolder(bundleFolder, mode: 0o700, owner: (uid, gid))
        sandboxFolder = bundleFolder
    }

    /// Creates `path` or takes the one there, if it is a directory (not a link) that root made: gives it `owner` and
    /// `mode`.
    private static func makeFolder(_ path: String, mode: mode_t, owner: (uid: uid_t, gid: gid_t)) throws {
        if mkdir(path, mode) != 0 && errno != EEXIST {
            throw ProtectedStoreError(.io, path: path, problem: "cannot create the sandbox's folder (\(String(cString: strerror(errno))))", remedy: "Check /run")
        }
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, [0, owner.uid].contains(info.st_uid),
              lchown(path, owner.uid, owner.gid) == 0, chmod(path, mode) == 0 else {
            throw ProtectedStoreError(.permissionDenied, path: path, problem: "the sandbox's folder is not a directory of root's or the sandbox's",
                                      remedy: "Remove it and launch again")
        }
    }

    /// Takes the bundle's slot, or says which process runs it now.
    static func claim(_ bundle: String, root: String) throws -> LaunchSlot {
        let folder = (try AppRuntime.appsFolder(root: root) as NSString).appendingPathComponent(bundle)
        try FileSystem.createDirectories(folder)
        let descriptor = open(lockPath(folder), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            throw ProtectedStoreError(.io, path: lockPath(folder), problem: "cannot open the launch lock (\(String(cString: strerror(errno))))",
                                      remedy: "Check the permissions of \(folder)")
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            close(descriptor)
            let running = try? JSONDecoder().decode(AppRecord.self, from: Data(contentsOf: URL(fileURLWithPath: recordPath(folder))))
            throw ProtectedStoreError(.alreadyExists, path: bundle,
                                      problem: "the app is already running (pid \(running.map { "\($0.launcherPID)" } ?? "unknown"))",
                                      remedy: "Use that one, or end it first with `sandboxctl terminate \(bundle)`")
        }
        return LaunchSlot(folder: folder, descriptor: descriptor)
    }

    /// Whether a live launcher holds the slot in `folder`.
    static func isHeld(_ folder: String) -> Bool {
        let descriptor = open(lockPath(folder), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return flock(descriptor, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK
    }

    func write(_ record: AppRecord) throws {
        try FileSystem.writeAtomically(Array(try JSONEncoder().encode(record)), to: FileLocation(path: Self.recordPath(folder)), replacing: true)
    }

    /// Removes the record and gives the slot up.
    func release() {
        unlink(Self.recordPath(folder))
        close(descriptor)
    }
}

