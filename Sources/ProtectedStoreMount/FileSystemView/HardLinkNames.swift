import Foundation

/// The names under which the kernel has been shown each item that has more than one (hard links), by inode number.
///
/// libfuse's high-level API gives every name a node of its own, so the kernel keeps an item's attributes once per
/// name, for the attribute timeout (1 s). A change made through one name (a link made or removed, chmod, a write)
/// must drop what it holds for the others, or they show it stale, where ext4 shows one inode through every name.
/// Only items with a link count above 1 are kept, so the table holds nothing for the common case.
final class HardLinkNames: @unchecked Sendable {
    private let lock = NSLock()
    private var namesByInode: [UInt64: Set<String>] = [:]
    private var inodeByName: [String: UInt64] = [:]

    /// The kernel was shown `path` (a kernel path, "/a/b") with these attributes. The path is made only for an item
    /// with links or while some are known: a listing shows thousands of items with none.
    func shown(_ path: @autoclosure () -> String, _ info: stat) {
        guard info.st_mode & S_IFMT != S_IFDIR else { return }
        let inode = UInt64(info.st_ino)
        lock.withLock {
            guard info.st_nlink > 1 || !inodeByName.isEmpty else { return }
            let path = path()
            guard info.st_nlink > 1 || inodeByName[path] != nil else { return }
            forget(path)
            guard info.st_nlink > 1 else { return }
            namesByInode[inode, default: []].insert(path)
            inodeByName[path] = inode
        }
    }

    /// The other names the kernel was shown of the item with `inode`.
    func names(of inode: UInt64, except excluded: Set<String>) -> [String] {
        lock.withLock { namesByInode[inode].map { $0.subtracting(excluded).sorted() } ?? [] }
    }

    /// `path` is gone, and with it every name below it.
    func removed(_ path: String) {
        lock.withLock {
            guard !inodeByName.isEmpty else { return }
            for name in inodeByName.keys where name == path || name.hasPrefix(path + "/") { forget(name) }
        }
    }

    /// `source` is now `target` (and every name below it has moved along); what `target` was is gone.
    func renamed(_ source: String, to target: String) {
        lock.withLock {
            guard !inodeByName.isEmpty else { return }
            for name in inodeByName.keys where name == target || name.hasPrefix(target + "/") { forget(name) }
            for (name, inode) in inodeByName where name == source || name.hasPrefix(source + "/") {
                forget(name)
                let moved = target + name.dropFirst(source.count)
                namesByInode[inode, default: []].insert(moved)
                inodeByName[moved] = inode
            }
        }
    }

    /// Whether no hard-linked item is known: most mounts, so a write asks no more.
    var isEmpty: Bool { lock.withLock { inodeByName.isEmpty } }

    private func forget(_ path: String) {
        guard let inode = inodeByName.removeValue(forKey: path) else { return }
        namesByInode[inode]?.remove(path)
        if namesByInode[inode]?.isEmpty == true { namesByInode[inode] = nil }
    }
}
