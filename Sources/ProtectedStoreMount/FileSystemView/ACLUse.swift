import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Whether any item of a container may carry a POSIX ACL. `ls -l` asks every item for its ACL and a create asks its
/// folder for a default one; while no item can have any, both are answered without a look at the store. An ACL reaches
/// a stored item only through a mount's setxattr, which records the first one in the data directory
/// (`.sandboxctl-acls`, docs/FORMAT.md §7) before setting it, or by inheritance from a default ACL on the data
/// directory itself. Other mounts of the container see the record within a second, as they see other changes made
/// beside them (`DirectoryCache`).
final class ACLUse: @unchecked Sendable {
    static let recordName = ContainerPath.reservedPrefix + "-acls"
    private static let recheckAfter: Duration = .seconds(1)
    private let root: FileDescriptor
    private let mutex = NSLock()
    private var mayExistNow = false
    private var checked: ContinuousClock.Instant?

    init(root: FileDescriptor) { self.root = root }

    /// True once any item may have an ACL; while none may, the store is looked at again at most once a second.
    var mayExist: Bool {
        let now = ContinuousClock.now
        return mutex.withLock {
            if mayExistNow { return true }
            if let checked, now - checked < Self.recheckAfter { return false }
            checked = now
            mayExistNow = isRecorded || OpenDirectory.hasDefaultACL(root)
            return mayExistNow
        }
    }

    /// Call before setting an ACL: records, durably, that items may have one, so this and every later mount asks the
    /// store again.
    func recordBeforeSetting() throws {
        try mutex.withLock {
            if !isRecorded {
                let record = FileLocation(directory: root, name: Self.recordName, displayPath: Self.recordName)
                try FileSystem.writeAtomically(Array("POSIX ACLs are set on items of this container\n".utf8), to: record, replacing: true)
            }
            mayExistNow = true
        }
    }

    private var isRecorded: Bool { faccessat(root.rawValue, Self.recordName, F_OK, AT_SYMLINK_NOFOLLOW) == 0 }
}
