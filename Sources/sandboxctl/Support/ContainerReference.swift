import ArgumentParser
import ProtectedStore

/// `BUNDLE[:PATH]` on the command line: a container and a path inside it ("" for its root).
struct ContainerReference: ExpressibleByArgument, CustomStringConvertible {
    let bundleIdentifier: String
    let path: String

    init?(argument: String) {
        guard let colon = argument.firstIndex(of: ":") else {
            bundleIdentifier = argument
            path = ""
            return
        }
        bundleIdentifier = String(argument[..<colon])
        path = String(argument[argument.index(after: colon)...])
        guard !bundleIdentifier.isEmpty else { return nil }
    }

    init(bundleIdentifier: String, path: String) {
        self.bundleIdentifier = bundleIdentifier
        self.path = path
    }

    var description: String { path.isEmpty ? bundleIdentifier : "\(bundleIdentifier):\(path)" }

    /// The path, which must name an item rather than the container's root.
    func requireItemPath() throws -> String {
        guard !path.isEmpty else {
            throw ValidationError("\(bundleIdentifier) names a container; give BUNDLE:PATH, e.g. \(bundleIdentifier):Documents/notes.txt")
        }
        return path
    }

    /// `name` appended to this reference's path, for "copy into a directory" forms.
    func appending(_ name: String) -> ContainerReference {
        ContainerReference(bundleIdentifier: bundleIdentifier, path: path.isEmpty ? name : (path.hasSuffix("/") ? path + name : "\(path)/\(name)"))
    }
}

extension ProtectionClass: ExpressibleByArgument {
    public init?(argument: String) { self.init(name: argument) }

    public static var allValueStrings: [String] { allCases.map(\.name) }
}
