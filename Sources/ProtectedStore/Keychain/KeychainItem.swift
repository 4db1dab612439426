import Foundation

/// The item classes the keychain stores: Security.framework's `kSecClassGenericPassword` and `kSecClassInternetPassword`.
public enum KeychainItemClass: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// `kSecClassGenericPassword`: a secret named by service and account.
    case genericPassword = 1
    /// `kSecClassInternetPassword`: a secret named by server, account, protocol, port and path.
    case internetPassword = 2

    /// Security.framework's value of `kSecClass` ("genp", "inet").
    public var securityValue: String { self == .genericPassword ? "genp" : "inet" }

    public var description: String { self == .genericPassword ? "generic password" : "internet password" }
}

/// One keychain item: its attributes and, when asked for or being added, its secret.
///
/// Two items of one class and access group with the same primary key cannot both exist: service and account for a
/// generic password; server, account, protocol, port and path for an internet password (absent values count as empty).
public struct KeychainItem: Sendable, Equatable {
    /// `kSecClass`.
    public var itemClass: KeychainItemClass
    /// `kSecAttrService` (generic passwords only).
    public var service: String?
    /// `kSecAttrAccount`.
    public var account: String?
    /// `kSecAttrServer` (internet passwords only).
    public var server: String?
    /// `kSecAttrProtocol`, Security.framework's four-letter value such as "htps" (internet passwords only).
    public var `protocol`: String?
    /// `kSecAttrPort` (internet passwords only).
    public var port: Int?
    /// `kSecAttrPath` (internet passwords only).
    public var path: String?
    /// `kSecAttrLabel`.
    public var label: String?
    /// `kSecAttrGeneric`: the app's own bytes beside the secret (generic passwords only).
    public var generic: Data?
    /// `kSecAttrAccessGroup`; nil when adding means the caller's first group.
    public var accessGroup: String?
    /// `kSecAttrAccessible`.
    public var accessible: KeychainAccessibility
    /// `kSecValueData`: the secret. Returned only when a query asks for it.
    public var secret: Data?
    /// `kSecAttrCreationDate`, set by the keychain.
    public internal(set) var creationDate: Date?
    /// `kSecAttrModificationDate`, set by the keychain.
    public internal(set) var modificationDate: Date?
    /// `kSecValuePersistentRef`: 16 bytes naming this item for as long as it exists, set by the keychain.
    public internal(set) var persistentReference: Data?

    /// A generic password (`kSecClassGenericPassword`) for `service` and `account`.
    public static func genericPassword(service: String, account: String, secret: Data, accessible: KeychainAccessibility = .whenUnlocked,
                                       accessGroup: String? = nil, label: String? = nil, generic: Data? = nil) -> KeychainItem {
        KeychainItem(itemClass: .genericPassword, service: service, account: account, label: label, generic: generic,
                     accessGroup: accessGroup, accessible: accessible, secret: secret)
    }

    /// An internet password (`kSecClassInternetPassword`) for `account` at `server`.
    public static func internetPassword(server: String, account: String, secret: Data, protocol: String? = nil, port: Int? = nil, path: String? = nil,
                                        accessible: KeychainAccessibility = .whenUnlocked, accessGroup: String? = nil, label: String? = nil) -> KeychainItem {
        KeychainItem(itemClass: .internetPassword, account: account, server: server, protocol: `protocol`, port: port, path: path, label: label,
                     accessGroup: accessGroup, accessible: accessible, secret: secret)
    }

    /// An item of `itemClass` with the attributes given; `secret` is what an add stores.
    public init(itemClass: KeychainItemClass, service: String? = nil, account: String? = nil, server: String? = nil, protocol: String? = nil,
                port: Int? = nil, path: String? = nil, label: String? = nil, generic: Data? = nil, accessGroup: String? = nil,
                accessible: KeychainAccessibility = .whenUnlocked, secret: Data? = nil) {
        self.itemClass = itemClass
        self.service = service
        self.account = account
        self.server = server
        self.protocol = `protocol`
        self.port = port
        self.path = path
        self.label = label
        self.generic = generic
        self.accessGroup = accessGroup
        self.accessible = accessible
        self.secret = secret
    }
}

/// What a keychain call looks for: every attribute given must match exactly (`kSecMatch…` and the attribute keys of a
/// SecItem query dictionary).
public struct KeychainQuery: Sendable, Equatable {
    /// `kSecMatchLimit`.
    public enum Limit: Sendable, Equatable {
        /// `kSecMatchLimitOne`: the first match.
        case one
        /// `kSecMatchLimitAll`: every match.
        case all
    }

    /// `kSecClass`: the one class searched.
    public var itemClass: KeychainItemClass
    /// `kSecAttrService`, matched exactly when given.
    public var service: String?
    /// `kSecAttrAccount`, matched exactly when given.
    public var account: String?
    /// `kSecAttrServer`, matched exactly when given.
    public var server: String?
    /// `kSecAttrProtocol`, matched exactly when given.
    public var `protocol`: String?
    /// `kSecAttrPort`, matched exactly when given.
    public var port: Int?
    /// `kSecAttrPath`, matched exactly when given.
    public var path: String?
    /// `kSecAttrLabel`, matched exactly when given.
    public var label: String?
    /// Only items of this group; nil for every group the caller is entitled to.
    public var accessGroup: String?
    /// `kSecAttrAccessible`: only items of this accessibility.
    public var accessible: KeychainAccessibility?
    /// `kSecValuePersistentRef`: the one item it names.
    public var persistentReference: Data?
    /// How many items a search returns; updates and deletes change every match, as Security.framework's do.
    public var limit: Limit

    /// A query for items of `itemClass` whose given attributes match.
    public init(itemClass: KeychainItemClass, service: String? = nil, account: String? = nil, server: String? = nil, protocol: String? = nil,
                port: Int? = nil, path: String? = nil, label: String? = nil, accessGroup: String? = nil, accessible: KeychainAccessibility? = nil,
                persistentReference: Data? = nil, limit: Limit = .one) {
        self.itemClass = itemClass
        self.service = service
        self.account = account
        self.server = server
        self.protocol = `protocol`
        self.port = port
        self.path = path
        self.label = label
        self.accessGroup = accessGroup
        self.accessible = accessible
        self.persistentReference = persistentReference
        self.limit = limit
    }

    /// Generic passwords of `service` (and `account`, if given).
    public static func genericPassword(service: String, account: String? = nil, accessGroup: String? = nil, limit: Limit = .one) -> KeychainQuery {
        KeychainQuery(itemClass: .genericPassword, service: service, account: account, accessGroup: accessGroup, limit: limit)
    }

    /// Whether `item` (its attributes decrypted) has every attribute this query gives.
    func matches(_ item: KeychainItem) -> Bool {
        func same<T: Equatable>(_ wanted: T?, _ found: T?) -> Bool { wanted == nil || wanted == found }
        // An absent text attribute and an empty one are one value, as the primary key counts them.
        func sameText(_ wanted: String?, _ found: String?) -> Bool { wanted == nil || wanted == (found ?? "") }
        return item.itemClass == itemClass && sameText(service, item.service) && sameText(account, item.account) && sameText(server, item.server)
            && sameText(`protocol`, item.protocol) && same(port, item.port) && sameText(path, item.path) && same(label, item.label)
            && same(accessGroup, item.accessGroup) && same(accessible, item.accessible) && same(persistentReference, item.persistentReference)
    }
}

/// What an update changes (`SecItemUpdate`'s attributes to update): each attribute given replaces the item's; those
/// left nil stay. The class, dates and persistent reference are the keychain's.
public struct KeychainChanges: Sendable, Equatable {
    /// The new `kSecAttrService`.
    public var service: String?
    /// The new `kSecAttrAccount`.
    public var account: String?
    /// The new `kSecAttrServer`.
    public var server: String?
    /// The new `kSecAttrProtocol`.
    public var `protocol`: String?
    /// The new `kSecAttrPort`.
    public var port: Int?
    /// The new `kSecAttrPath`.
    public var path: String?
    /// The new `kSecAttrLabel`.
    public var label: String?
    /// The new `kSecAttrGeneric`.
    public var generic: Data?
    /// Moves the item to another of the caller's groups.
    public var accessGroup: String?
    /// Re-seals the item under the class this names.
    public var accessible: KeychainAccessibility?
    /// `kSecValueData`: the new secret.
    public var secret: Data?

    /// Changes to the attributes given.
    public init(service: String? = nil, account: String? = nil, server: String? = nil, protocol: String? = nil, port: Int? = nil, path: String? = nil,
                label: String? = nil, generic: Data? = nil, accessGroup: String? = nil, accessible: KeychainAccessibility? = nil, secret: Data? = nil) {
        self.service = service
        self.account = account
        self.server = server
        self.protocol = `protocol`
        self.port = port
        self.path = path
        self.label = label
        self.generic = generic
        self.accessGroup = accessGroup
        self.accessible = accessible
        self.secret = secret
    }

    /// Whether it changes nothing (`SecItemUpdate` with an empty dictionary is `errSecParam`).
    public var isEmpty: Bool { self == KeychainChanges() }

    func apply(to item: inout KeychainItem) {
        if let service { item.service = service }
        if let account { item.account = account }
        if let server { item.server = server }
        if let `protocol` { item.protocol = `protocol` }
        if let port { item.port = port }
        if let path { item.path = path }
        if let label { item.label = label }
        if let generic { item.generic = generic }
        if let accessGroup { item.accessGroup = accessGroup }
        if let accessible { item.accessible = accessible }
        if let secret { item.secret = secret }
    }
}
