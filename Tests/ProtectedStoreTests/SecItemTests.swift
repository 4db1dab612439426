import Foundation
import ProtectedStore
import ProtectedStoreSecurity
import ProtectedStoreTesting
import Testing
import SuiteThreads

/// A token store as iOS code writes it against Security.framework, unchanged but for `import ProtectedStoreSecurity`.
private struct SecItemTokenStore {
    let service = "com.example.api"
    let account = "signed-in-user"

    private var base: [String: Any] {
        [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service, kSecAttrAccount as String: account]
    }

    func save(_ token: String, accessible: String = kSecAttrAccessibleAfterFirstUnlock as String) -> OSStatus {
        let attributes: [String: Any] = [kSecValueData as String: Data(token.utf8)]
        var status = SecItemUpdate(base as CFDictionary, attributes as CFDictionary)
        if status == errSecItemNotFound {
            var add = base
            add[kSecValueData as String] = Data(token.utf8)
            add[kSecAttrAccessible as String] = accessible
            status = SecItemAdd(add as CFDictionary, nil)
        }
        return status
    }

    func token() -> (String?, OSStatus) {
        var query = base
        query[kSecReturnData as String] = kCFBooleanTrue
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        guard status == errSecSuccess, let data = result as? Data else { return (nil, status) }
        return (String(data: data, encoding: .utf8), status)
    }

    func delete() -> OSStatus { SecItemDelete(base as CFDictionary) }
}

@Suite("SecItem", .ownThread)
struct SecItemTests {
    @Test("SecItemAdd, CopyMatching, Update and Delete with kSec… dictionaries: the statuses iOS code checks, the lock included")
    func tokenStore() async throws {
        let device = try ProtectedStoreTesting.TestDevice()
        let keychain = try device.keychain
        try await SecItemKeychain.withKeychain(keychain) {
            let store = SecItemTokenStore()
            #expect(store.token().1 == errSecItemNotFound, "\(SecCopyErrorMessageString(store.token().1, nil) ?? "")")
            let saved = store.save("first", accessible: kSecAttrAccessibleWhenUnlocked as String)
            #expect(saved == errSecSuccess, "\(SecCopyErrorMessageString(saved, nil) ?? "")")
            #expect(store.token() == ("first", errSecSuccess))
            #expect(store.save("second", accessible: kSecAttrAccessibleWhenUnlocked as String) == errSecSuccess, "an update of the existing item")
            #expect(store.token() == ("second", errSecSuccess))
            await device.lock()
            #expect(store.token() == (nil, errSecInteractionNotAllowed))
            #expect(store.save("while locked") == errSecInteractionNotAllowed, "an update of a when-unlocked item while locked")
            let message = try #require(SecCopyErrorMessageString(errSecInteractionNotAllowed, nil) as String?)
            #expect(message.contains("errSecInteractionNotAllowed (-25308)") && message.contains("unlock"), "\(message)")
            try await device.unlock()
            #expect(store.token() == ("second", errSecSuccess))
            #expect(store.delete() == errSecSuccess)
            #expect(store.delete() == errSecItemNotFound)
        }
    }

    @Test("attributes, persistent references and kSecMatchLimitAll come back in Security.framework's shapes")
    func returnShapes() throws {
        let device = try ProtectedStoreTesting.TestDevice()
        let keychain = try device.keychain
        try SecItemKeychain.withKeychain(keychain) {
            for account in ["a", "b"] {
                let item: [String: Any] = [kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: "example.com", kSecAttrAccount as String: account,
                                           kSecAttrProtocol as String: kSecAttrProtocolHTTPS, kSecAttrPort as String: 443, kSecAttrLabel as String: "Example \(account)",
                                           kSecValueData as String: Data("pw-\(account)".utf8)]
                var added: CFTypeRef?
                var addQuery = item
                addQuery[kSecReturnPersistentRef as String] = true
                #expect(SecItemAdd(addQuery as CFDictionary, &added) == errSecSuccess)
                #expect((added as? Data)?.count == 16)
            }
            let all: [String: Any] = [kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: "example.com",
                                      kSecMatchLimit as String: kSecMatchLimitAll, kSecReturnAttributes as String: kCFBooleanTrue!, kSecReturnData as String: true]
            var result: CFTypeRef?
            #expect(SecItemCopyMatching(all as CFDictionary, &result) == errSecSuccess)
            let items = try #require(result as? [[String: Any]])
            #expect(items.compactMap { $0[kSecAttrAccount as String] as? String } == ["a", "b"])
            #expect(items.compactMap { $0[kSecValueData as String] as? Data } == [Data("pw-a".utf8), Data("pw-b".utf8)])
            #expect(items.first?[kSecAttrPort as String] as? Int == 443 && items.first?[kSecAttrAccessible as String] as? String == kSecAttrAccessibleWhenUnlocked)
            #expect(items.first?[kSecAttrAccessGroup as String] as? String == ProtectedStoreTesting.TestDevice.defaultBundleIdentifier)
            #expect(items.first?[kSecAttrCreationDate as String] is Date)
        }
    }

    @Test("an unknown key, a value of the wrong type, the deprecated Always and kSecAttrSynchronizable are errSecParam, naming the key; nothing changes")
    func badDictionaries() throws {
        let device = try ProtectedStoreTesting.TestDevice()
        let keychain = try device.keychain
        SecItemKeychain.withKeychain(keychain) {
            let base: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "s", kSecValueData as String: Data("x".utf8)]
            func expectParam(_ dictionary: [String: Any], mentioning key: String) {
                #expect(SecItemAdd(dictionary as CFDictionary, nil) == errSecParam)
                let message = SecCopyErrorMessageString(errSecParam, nil) as String? ?? ""
                #expect(message.contains(key), "\(message)")
            }
            expectParam(base.merging(["nonsense": 1]) { $1 }, mentioning: "nonsense")
            expectParam(base.merging([kSecAttrAccount as String: 42]) { $1 }, mentioning: kSecAttrAccount)
            expectParam(base.merging([kSecValueData as String: "not data"]) { $1 }, mentioning: kSecValueData)
            expectParam(base.merging([kSecAttrAccessible as String: "dk"]) { $1 }, mentioning: "deprecated")
            expectParam(base.merging([kSecAttrSynchronizable as String: true]) { $1 }, mentioning: kSecAttrSynchronizable)
            expectParam(base.merging([kSecClass as String: "keys"]) { $1 }, mentioning: kSecClass)
            expectParam([kSecAttrService as String: "s"], mentioning: "kSecClass")
            var result: CFTypeRef?
            let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "s", kSecReturnData as String: true]
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecItemNotFound, "no failed add stored anything")
            #expect(SecItemUpdate(query as CFDictionary, [kSecValueData as String: Data()] as CFDictionary) == errSecParam, "kSecReturnData is not an update's key")
        }
    }
}
