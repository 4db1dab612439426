import Foundation
import ProtectedStoreCore

/// One item of a container listing: what `ls -l` shows, read without any key.
public struct ContainerItem: Sendable {
    /// The item's name.
    public let name: String
    /// Its path relative to the container.
    public let path: String
    /// `.typeRegular`, `.typeDirectory`, `.typeSymbolicLink`, or another kind found on disk.
    public let type: FileAttributeType
    /// A file's class; a directory's class for new items in it (nil: none set, so the container default applies).
    public let protection: FileProtectionType?
    /// Plaintext size of a file, in bytes (from the encrypted length; authenticated when the file is read).
    public let size: UInt64
    /// When the item was last changed, from the file system.
    public let modificationDate: Date
    /// Where a symbolic link points.
    public let symbolicLinkTarget: String?
    /// Why a file's class or size could not be read (not a ProtectedStore file, or damaged header).
    public let problem: String?

    /// `protection` as the library's class enum.
    public var protectionClass: ProtectionClass? { protection.flatMap(ProtectionClass.init) }

    /// The same information as `FileManager.attributesOfItem(atPath:)` keys.
    public var attributes: [FileAttributeKey: Any] {
        var attributes: [FileAttributeKey: Any] = [.type: type, .size: NSNumber(value: size), .modificationDate: modificationDate]
        if let protection { attributes[.protectionKey] = protection }
        return attributes
    }
}
