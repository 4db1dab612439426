import Foundation
import ProtectedStore
import ProtectedStoreCore
import SystemPackage

/// Whether any item of a container may carry a POSIX ACL. `ls -l` asks every item for its ACL; while no item can have
/// one, the answer is given without a look at the store. An ACL reaches a stored item only through a mount's setxattr,
/// which writes the record (`.sandboxctl-acls` in the data directory, docs/FORMAT.md §7) before it tries, or by
/// inheritance from a default ACL on the data directory, which is recorded as soon as it is seen, since what it gave
/// items outlives its removal. Other mounts of the container see the record within a second, as they see other changes
/// made beside them (`DirectoryCache`).
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
        let known: Bool? = mutex.withLock {
            if mayExistNow { return true }
            if let checked, now - checked < Self.recheckAfter { return false }
            checked = now
            return nil
        }
        if let known { return known }
        let recorded = isRecorded
        guard recorded || OpenDirectory.hasDefaultACL(root) else { return false }
        // Unrecorded, a store that refuses the record (full, read-only) still answers rightly in this process.
        if !recorded { try? writeRecord() }
        mutex.withLock { mayExistNow = true }
        return true
    }

    /// Call before setting an ACL: records, durably, that items may have one, so this and every later mount asks the
    /// store. Throws if the record can't be written; the ACL is then not to be set.
    func recordBeforeSetting() throws {
        if !isRecorded { try writeRecord() }
        mutex.withLock { mayExistNow = true }
    }

    private var isRecorded: Bool { faccessat(root.rawValue, Self.recordName, F_OK, AT_SYMLINK_NOFOLLOW) == 0 }

    private func writeRecord() throws {
        let record = FileLocation(directory: root, name: Self.recordName, displayPath: Self.recordName)
        try FileSystem.writeAtomically(Array("POSIX ACLs are set on items of this container\n".utf8), to: record, replacing: true)
    }
}
