import Foundation
import ProtectedStoreCore
import SystemPackage

/// An open directory descriptor, closed when released.
package final class OpenDirectory: @unchecked Sendable {
    package let descriptor: FileDescriptor
    /// Its path inside the container, after symlinks.
    let path: ContainerPath

    package init(descriptor: FileDescriptor, path: ContainerPath) {
        self.descriptor = descriptor
        self.path = path
    }

    deinit { try? descriptor.close() }

    /// `name` in this directory, named in errors as `displayPath`.
    func location(_ name: String, displayPath: String) -> FileLocation {
        FileLocation(directory: descriptor, name: name, displayPath: displayPath)
    }

    /// Opens the subdirectory `name` relative to this descriptor, refusing a symlink: what was checked is what is opened.
    package func subdirectory(_ name: String, displayPath: String) throws -> OpenDirectory {
        let fd = try location(name, displayPath: displayPath).open(.readOnly, options: [.directory], doing: "open the directory")
        return OpenDirectory(descriptor: fd, path: path.appending(name))
    }

    /// A new open file description of this directory, so a listing has its own read position.
    func reopened() throws -> FileDescriptor {
        try location(".", displayPath: path.description).open(.readOnly, options: [.directory], doing: "open the directory")
    }
}

/// Where a container path leads: the opened parent directory and the final name in it.
package struct ResolvedItem {
    package let parent: OpenDirectory
    package let name: String
    /// The path as the caller wrote it, prefixed with the container, for errors.
    package let displayPath: String

    package init(parent: OpenDirectory, name: String, displayPath: String) {
        self.parent = parent
        self.name = name
        self.displayPath = displayPath
    }

    package var location: FileLocation { parent.location(name, displayPath: displayPath) }
    var path: ContainerPath { parent.path.appending(name) }
}

/// A container's data directory, through which every path is resolved one component at a time with
/// `openat(O_NOFOLLOW)`. Symlinks found on the way are followed only while they stay inside the container;
/// absolute targets, targets climbing above the root, and loops are refused.
package final class ConfinedDirectory: @unchecked Sendable {
    /// Same bound as the kernel's (MAXSYMLINKS).
    static let maximumSymlinks = 40

    package let root: FileDescriptor
    /// Names the container in errors ("com.example.app:Documents/x").
    let containerName: String

    init(path: String, containerName: String) throws {
        // No-follow: a Data symlink would move the whole container elsewhere.
        root = try FileLocation(path: path).open(.readOnly, options: [.directory, .noFollow], doing: "open the container")
        self.containerName = containerName
    }

    deinit { try? root.close() }

    package func displayPath(_ path: ContainerPath) -> String { "\(containerName):\(path)" }

    /// The parent of `path`, opened, and its final name. With `followingFinalSymlink`, a symlink in the last place
    /// is resolved (inside the container) too, so the item reached is the link's target.
    func resolve(_ path: ContainerPath, followingFinalSymlink: Bool) throws -> ResolvedItem {
        let display = displayPath(path)
        guard !path.isRoot else {
            throw ProtectedStoreError(.invalidArgument, path: display, problem: "the container root is not a file", remedy: "Give a path inside the container")
        }
        let rootDirectory = OpenDirectory(descriptor: try duplicateRoot(), path: .root)
        var opened: [(directory: OpenDirectory, name: String)] = []
        var current: OpenDirectory { opened.last?.directory ?? rootDirectory }
        var remaining = Array(path.components.reversed())
        var symlinks = 0
        // ".." can only come from a symlink target: user paths may not contain it.
        var lastLink = ContainerPath.root

        func error(_ problem: String, _ remedy: String) -> ProtectedStoreError {
            ProtectedStoreError(.invalidArgument, path: display, problem: problem, remedy: remedy)
        }

        while let component = remaining.popLast() {
            switch component {
            case "", ".":
                continue
            case "..":
                guard opened.popLast() != nil else {
                    throw error("the symbolic link \(lastLink) leads outside the container",
                                "Symbolic links may point only inside the container; remove or fix the link")
                }
                continue
            default:
                break
            }
            let parent = current
            let isFinal = remaining.isEmpty
            let here = parent.location(component, displayPath: display)
            guard let info = try here.status() else {
                if isFinal { return ResolvedItem(parent: parent, name: component, displayPath: display) }
                throw ProtectedStoreError(.notFound, path: display, problem: "the directory \(parent.path.appending(component)) does not exist",
                                          remedy: "Create it first, or check the path")
            }
            if info.st_mode & S_IFMT == S_IFLNK, !isFinal || followingFinalSymlink {
                symlinks += 1
                guard symlinks <= Self.maximumSymlinks else {
                    throw error("more than \(Self.maximumSymlinks) symbolic links on the way (a loop?)", "Remove the symbolic link loop")
                }
                lastLink = parent.path.appending(component)
                let target = try here.readLink()
                guard !target.hasPrefix("/") else {
                    throw error("the symbolic link \(parent.path.appending(component)) points to the absolute path \(target), outside the container",
                                "Symbolic links may point only inside the container, with a relative target; remove or fix the link")
                }
                let targetComponents = target.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
                if let bad = targetComponents.first(where: { $0.hasPrefix(ContainerPath.reservedPrefix) || $0.utf8.count > ContainerPath.maximumNameBytes }) {
                    throw error("the symbolic link \(lastLink) points to \"\(bad.prefix(60))\", a reserved or over-long name",
                                "Remove or fix the link")
                }
                remaining.append(contentsOf: targetComponents.reversed())
                continue
            }
            if isFinal {
                guard !path.mustBeDirectory || info.st_mode & S_IFMT == S_IFDIR else {
                    throw ProtectedStoreError(.invalidArgument, path: display, problem: "it is not a directory, but the path ends with \"/\"",
                                              remedy: "Write the path without the trailing slash")
                }
                return ResolvedItem(parent: parent, name: component, displayPath: display)
            }
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw ProtectedStoreError(.invalidArgument, path: display, problem: "\(parent.path.appending(component)) is not a directory",
                                          remedy: "Check the path")
            }
            let descriptor = try here.open(.readOnly, options: [.directory], doing: "open the directory")
            opened.append((OpenDirectory(descriptor: descriptor, path: parent.path.appending(component)), component))
        }
        // Every component was used up by "." or ".." from a symlink: the item is the directory reached.
        guard let last = opened.popLast() else {
            throw error("the path leads to the container root through a symbolic link", "Give a path inside the container")
        }
        return ResolvedItem(parent: current, name: last.name, displayPath: display)
    }

    /// Opens the directory at `path` (the root for an empty path), following symlinks inside the container.
    package func openDirectory(_ path: ContainerPath) throws -> OpenDirectory {
        guard !path.isRoot else { return OpenDirectory(descriptor: try duplicateRoot(), path: .root) }
        let item = try resolve(path, followingFinalSymlink: true)
        guard let info = try item.location.status() else {
            throw ProtectedStoreError(.notFound, path: item.displayPath, problem: "no such directory", remedy: "Check the path, or create the directory first")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw ProtectedStoreError(.invalidArgument, path: item.displayPath, problem: "it is a file, not a directory", remedy: "Give the path of a directory")
        }
        return try item.parent.subdirectory(item.name, displayPath: item.displayPath)
    }

    private func duplicateRoot() throws -> FileDescriptor {
        let copy = fcntl(root.rawValue, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: displayPath(.root), doing: "duplicate the container descriptor") }
        return FileDescriptor(rawValue: copy)
    }
}
