import Foundation

/// One note. Its `id` makes every write idempotent: replaying a change already applied changes nothing.
public struct Note: Codable, Equatable, Sendable, Identifiable {
    public let id: UUID
    public var title: String
    public var body: String
    /// When the note was accepted by the store; for an import, when it was imported.
    public let created: Date
    /// Where it came from: nil when written by the app, the Inbox item's name when imported.
    public let importedFrom: String?

    public init(id: UUID = UUID(), title: String, body: String, created: Date = Date(), importedFrom: String? = nil) {
        self.id = id
        self.title = title
        self.body = body
        self.created = created
        self.importedFrom = importedFrom
    }
}

/// A change the store accepted: what is written to the database, or to the pending journal while it is closed.
enum NoteChange: Codable, Equatable, Sendable {
    case save(Note)
    case delete(UUID)
}

/// A failure of the notes store that is not a data-protection denial (those are the container's `CocoaError`s):
/// what went wrong, which file, and what to do.
public struct NotesStoreError: Error, CustomStringConvertible, Sendable {
    public let problem: String
    /// The container path concerned, if any.
    public let path: String?
    public let remedy: String

    public var description: String { "\(path.map { "\($0): " } ?? "")\(problem). \(remedy)." }
}
