import ProtectedStoreCore

/// A path relative to a container, checked lexically: no `..`, no absolute path, no NUL, no empty or over-long
/// component, and none of the names ProtectedStore reserves for its own files. Symlinks are checked when resolving.
package struct ContainerPath: Sendable, Hashable, CustomStringConvertible {
    /// Longest component, in UTF-8 bytes (Linux's NAME_MAX).
    package static let maximumNameBytes = 255
    /// Longest path, in UTF-8 bytes; leaves room under PATH_MAX for the root above the container.
    static let maximumPathBytes = 1024
    /// Names starting with this are ProtectedStore's own (directory classes, files being written), hidden from listings.
    package static let reservedPrefix = ".sandboxctl"

    /// The components; empty for the container's root.
    package let components: [String]
    /// The path was written with a trailing "/": it must name a directory.
    let mustBeDirectory: Bool

    package static let root = ContainerPath(components: [])

    private init(components: [String], mustBeDirectory: Bool = false) {
        self.components = components
        self.mustBeDirectory = mustBeDirectory
    }

    /// Checks `raw` (e.g. "Documents/notes.txt"); "" names the container root, and one trailing "/" is allowed.
    /// `container` only names the container in errors.
    init(_ raw: String, container: String) throws {
        func reject(_ problem: String, _ remedy: String = "Give a path relative to the container, such as Documents/notes.txt") -> ProtectedStoreError {
            ProtectedStoreError(.invalidArgument, path: "\(container):\(raw)", problem: problem, remedy: remedy)
        }
        guard !raw.utf8.contains(0) else { throw reject("the path contains a NUL byte") }
        guard !raw.startsWithSlash else { throw reject("the path is absolute; container paths are relative to the container") }
        guard raw.utf8.count <= Self.maximumPathBytes else {
            throw reject("the path is \(raw.utf8.count) bytes long; the limit is \(Self.maximumPathBytes)", "Use a shorter path")
        }
        var trimmed = Substring(raw)
        if trimmed.endsWithSlash { trimmed = Substring(String(decoding: trimmed.utf8.dropLast(), as: UTF8.self)) }
        guard !trimmed.isEmpty else {
            guard raw.isEmpty else { throw reject("the path is only \"/\"") }
            self.components = []
            self.mustBeDirectory = false
            return
        }
        var components: [String] = []
        for component in trimmed.splitAtSlashes() {
            switch component {
            case "": throw reject("the path has an empty component (\"//\")")
            case "..": throw reject("the path contains \"..\", which could leave the container", "Write the path without \"..\"")
            case ".": throw reject("the path contains \".\"", "Write the path without \".\" components")
            default: break
            }
            guard component.utf8.count <= Self.maximumNameBytes else {
                throw reject("the name \"\(component.prefix(40))…\" is \(component.utf8.count) bytes long; the limit is \(Self.maximumNameBytes)", "Use a shorter name")
            }
            guard !component.hasPrefix(Self.reservedPrefix) else {
                throw reject("names starting with \"\(Self.reservedPrefix)\" are reserved for ProtectedStore's own files", "Choose another name")
            }
            components.append(String(component))
        }
        self.components = components
        self.mustBeDirectory = trimmed.utf8.count < raw.utf8.count
    }

    /// Whether `name` can be one component as written: not empty, `.` or `..`, no `/` or NUL, within the length
    /// limit, not reserved. For names read back from ProtectedStore's own records, which are not authenticated.
    static func isPlainName(_ name: String) -> Bool {
        !name.isEmpty && name != "." && name != ".." && !name.containsSlash && !name.utf8.contains(0)
            && name.utf8.count <= maximumNameBytes && !name.hasPrefix(reservedPrefix)
    }

    package var isRoot: Bool { components.isEmpty }
    package var name: String? { components.last }
    package var parent: ContainerPath { ContainerPath(components: Array(components.dropLast())) }
    package var description: String { components.joined(separator: "/") }

    package func appending(_ name: String) -> ContainerPath { ContainerPath(components: components + [name]) }

    // Identity is the components: a trailing slash is a constraint on what the path names, not another path.
    package static func == (lhs: ContainerPath, rhs: ContainerPath) -> Bool { lhs.components == rhs.components }
    package func hash(into hasher: inout Hasher) { hasher.combine(components) }

    /// Whether `self` is `other` or lies inside it.
    package func isWithin(_ other: ContainerPath) -> Bool { components.starts(with: other.components) }
}
