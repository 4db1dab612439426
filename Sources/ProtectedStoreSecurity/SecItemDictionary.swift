import Foundation
import ProtectedStore

/// A SecItem dictionary read into the typed API's values; every key checked, so an unknown key or a value of the
/// wrong type is `errSecParam` naming it, never ignored.
struct SecItemDictionary {
    private let entries: [String: Any]
    private var used: Set<String> = []

    init(_ dictionary: CFDictionary, call: String) throws {
        guard let entries = dictionary as? [String: Any] else {
            throw KeychainError(.param, problem: "\(call): the dictionary's keys are not all strings", remedy: "Use the kSec… constants as keys")
        }
        self.entries = entries
        self.call = call
    }

    private let call: String

    /// Security.framework's constant names of the keys, for messages.
    private static let names: [String: String] = [
        kSecClass: "kSecClass", kSecAttrService: "kSecAttrService", kSecAttrAccount: "kSecAttrAccount", kSecAttrServer: "kSecAttrServer",
        kSecAttrProtocol: "kSecAttrProtocol", kSecAttrPort: "kSecAttrPort", kSecAttrPath: "kSecAttrPath", kSecAttrLabel: "kSecAttrLabel",
        kSecAttrGeneric: "kSecAttrGeneric", kSecAttrAccessGroup: "kSecAttrAccessGroup", kSecAttrAccessible: "kSecAttrAccessible",
        kSecAttrCreationDate: "kSecAttrCreationDate", kSecAttrModificationDate: "kSecAttrModificationDate", kSecAttrSynchronizable: "kSecAttrSynchronizable",
        kSecValueData: "kSecValueData", kSecValuePersistentRef: "kSecValuePersistentRef", kSecReturnData: "kSecReturnData",
        kSecReturnAttributes: "kSecReturnAttributes", kSecReturnPersistentRef: "kSecReturnPersistentRef", kSecMatchLimit: "kSecMatchLimit",
    ]

    private func refuse(_ key: String, _ problem: String) -> KeychainError {
        let name = Self.names[key].map { "\($0) (\"\(key)\")" } ?? "key \"\(key)\""
        return KeychainError(.param, problem: "\(call): \(name) \(problem)", remedy: "Use the kSec… keys and value types Security.framework documents for this call")
    }

    mutating func string(_ key: String) throws -> String? {
        used.insert(key)
        guard let value = entries[key] else { return nil }
        if let text = value as? String { return text }
        throw refuse(key, "must be a string, not \(type(of: value))")
    }

    mutating func data(_ key: String) throws -> Data? {
        used.insert(key)
        guard let value = entries[key] else { return nil }
        if let data = value as? Data { return data }
        throw refuse(key, "must be Data, not \(type(of: value))")
    }

    mutating func integer(_ key: String) throws -> Int? {
        used.insert(key)
        guard let value = entries[key] else { return nil }
        if let number = value as? Int { return number }
        throw refuse(key, "must be a number, not \(type(of: value))")
    }

    mutating func flag(_ key: String) throws -> Bool {
        used.insert(key)
        guard let value = entries[key] else { return false }
        if let flag = value as? Bool { return flag }
        throw refuse(key, "must be a boolean (kCFBooleanTrue), not \(type(of: value))")
    }

    mutating func itemClass() throws -> KeychainItemClass {
        switch try string(kSecClass) {
        case kSecClassGenericPassword: return .genericPassword
        case kSecClassInternetPassword: return .internetPassword
        case nil: throw refuse(kSecClass, "is missing")
        case let other?: throw refuse(kSecClass, "\(other) is not a class this keychain stores (kSecClassGenericPassword, kSecClassInternetPassword)")
        }
    }

    mutating func accessibility() throws -> KeychainAccessibility? {
        guard let value = try string(kSecAttrAccessible) else { return nil }
        guard let accessibility = KeychainAccessibility(named: value) else {
            let deprecated = value == "dk" || value == "dku"
            throw refuse(kSecAttrAccessible, deprecated ? "kSecAttrAccessibleAlways… is deprecated and not offered: use kSecAttrAccessibleAfterFirstUnlock" : "\(value) is not an accessibility value")
        }
        return accessibility
    }

    mutating func limit() throws -> KeychainQuery.Limit {
        switch try string(kSecMatchLimit) {
        case nil, kSecMatchLimitOne: return .one
        case kSecMatchLimitAll: return .all
        case let other?: throw refuse(kSecMatchLimit, "\(other) is not kSecMatchLimitOne or kSecMatchLimitAll")
        }
    }

    mutating func rejectSynchronizable() throws {
        used.insert(kSecAttrSynchronizable)
        guard let value = entries[kSecAttrSynchronizable] else { return }
        guard let flag = value as? Bool, !flag else { throw refuse(kSecAttrSynchronizable, "cannot be true: items here never leave the device's keychain") }
    }

    /// Throws for any key not read: an unknown key, or one this call does not take.
    func checkAllUsed() throws {
        if let unknown = entries.keys.filter({ !used.contains($0) }).sorted().first {
            throw refuse(unknown, "is not a key \(call) takes here")
        }
    }

    /// The attributes every call shares, as a query.
    mutating func query() throws -> KeychainQuery {
        let itemClass = try itemClass()
        try rejectSynchronizable()
        return KeychainQuery(itemClass: itemClass, service: try string(kSecAttrService), account: try string(kSecAttrAccount), server: try string(kSecAttrServer),
                             protocol: try string(kSecAttrProtocol), port: try integer(kSecAttrPort), path: try string(kSecAttrPath), label: try string(kSecAttrLabel),
                             accessGroup: try string(kSecAttrAccessGroup), accessible: try accessibility(),
                             persistentReference: try data(kSecValuePersistentRef), limit: try limit())
    }

    /// The attributes and value of an item to add.
    mutating func item() throws -> KeychainItem {
        let itemClass = try itemClass()
        try rejectSynchronizable()
        return KeychainItem(itemClass: itemClass, service: try string(kSecAttrService), account: try string(kSecAttrAccount), server: try string(kSecAttrServer),
                            protocol: try string(kSecAttrProtocol), port: try integer(kSecAttrPort), path: try string(kSecAttrPath), label: try string(kSecAttrLabel),
                            generic: try data(kSecAttrGeneric), accessGroup: try string(kSecAttrAccessGroup), accessible: try accessibility() ?? .whenUnlocked,
                            secret: try data(kSecValueData))
    }

    /// An update's attributes to change.
    mutating func changes() throws -> KeychainChanges {
        KeychainChanges(service: try string(kSecAttrService), account: try string(kSecAttrAccount), server: try string(kSecAttrServer),
                        protocol: try string(kSecAttrProtocol), port: try integer(kSecAttrPort), path: try string(kSecAttrPath), label: try string(kSecAttrLabel),
                        generic: try data(kSecAttrGeneric), accessGroup: try string(kSecAttrAccessGroup), accessible: try accessibility(),
                        secret: try data(kSecValueData))
    }
}

/// What a SecItem call returns into its result: Security.framework's shapes.
struct SecItemReturns {
    var data = false
    var attributes = false
    var persistentReference = false

    init(_ dictionary: inout SecItemDictionary) throws {
        data = try dictionary.flag(kSecReturnData)
        attributes = try dictionary.flag(kSecReturnAttributes)
        persistentReference = try dictionary.flag(kSecReturnPersistentRef)
    }

    var any: Bool { data || attributes || persistentReference }

    /// One item as returned: its data or reference alone when only that was asked, else a dictionary.
    func value(of item: KeychainItem) -> AnyObject {
        switch (data, attributes, persistentReference) {
        case (true, false, false): return (item.secret ?? Data()) as NSData
        case (false, false, true): return (item.persistentReference ?? Data()) as NSData
        default:
            var result: [String: Any] = [:]
            if attributes {
                result[kSecClass] = item.itemClass.securityValue
                let texts: [(String, String?)] = [(kSecAttrService, item.service), (kSecAttrAccount, item.account), (kSecAttrServer, item.server),
                                                   (kSecAttrProtocol, item.protocol), (kSecAttrPath, item.path), (kSecAttrLabel, item.label),
                                                   (kSecAttrAccessGroup, item.accessGroup)]
                for (key, value) in texts { if let value { result[key] = value } }
                if let port = item.port { result[kSecAttrPort] = port }
                if let generic = item.generic { result[kSecAttrGeneric] = generic }
                result[kSecAttrAccessible] = item.accessible.securityValue
                if let created = item.creationDate { result[kSecAttrCreationDate] = created }
                if let modified = item.modificationDate { result[kSecAttrModificationDate] = modified }
            }
            if data { result[kSecValueData] = item.secret ?? Data() }
            if persistentReference { result[kSecValuePersistentRef] = item.persistentReference ?? Data() }
            return result as NSDictionary
        }
    }
}
