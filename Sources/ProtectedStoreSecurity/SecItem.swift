import Foundation
import ProtectedStore
import ProtectedStoreCore

/// Which keychain the SecItem functions use: one bound for a task (`withKeychain`, for tests running side by side),
/// else the process's (`use`), else, in an app `sandboxctl launch` started, the app's own through its socket.
public enum SecItemKeychain {
    @TaskLocal private static var bound: Keychain?
    private static let process = Locked<(keychain: Keychain?, application: Application?)>((nil, nil))

    /// Makes `keychain` the one SecItem calls of this process use.
    public static func use(_ keychain: Keychain) {
        process.withLock { $0.keychain = keychain }
    }

    /// Runs `body` with SecItem calls of this task (and its child tasks) going to `keychain`.
    public static func withKeychain<R>(_ keychain: Keychain, _ body: () throws -> R) rethrows -> R {
        try $bound.withValue(keychain, operation: body)
    }

    /// Runs `body` with SecItem calls of this task (and its child tasks) going to `keychain`.
    public static func withKeychain<R>(_ keychain: Keychain, isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> R) async rethrows -> R {
        try await $bound.withValue(keychain, operation: body, isolation: isolation)
    }

    static func current() throws -> Keychain {
        if let bound { return bound }
        return try process.withLock { state in
            if let keychain = state.keychain { return keychain }
            guard ProcessInfo.processInfo.environment[Application.socketEnvironmentVariable] != nil else {
                throw KeychainError(.notAvailable, problem: "no keychain is set for SecItem calls, and this program was not started by `sandboxctl launch`",
                                    remedy: "Call SecItemKeychain.use(Keychain(device:)) first, or run the program with `sandboxctl launch`")
            }
            let application = try Application.attach(notificationCenter: NotificationCenter())
            let keychain = try application.keychain
            state = (keychain, application)
            return keychain
        }
    }

    private static let lastFailure = Locked<KeychainError?>(nil)

    /// Runs a SecItem call: its status, the error kept for `SecCopyErrorMessageString`.
    static func run(_ body: () throws -> Void) -> OSStatus {
        do {
            try body()
            return errSecSuccess
        } catch {
            let failure = KeychainError(error, path: nil)
            lastFailure.withLock { $0 = failure }
            return failure.status
        }
    }

    static func message(for status: OSStatus) -> String? {
        if let failure = lastFailure.withLock({ $0 }), failure.status == status { return failure.description }
        return KeychainError.Code(rawValue: status).map { "\($0.name) (\(status))" } ?? (status == errSecSuccess ? "No error." : nil)
    }
}

/// Adds the item `attributes` describes (`SecItemAdd`); with a `kSecReturn…` key, `result` receives it as
/// Security.framework returns it.
@discardableResult
public func SecItemAdd(_ attributes: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    SecItemKeychain.run {
        var dictionary = try SecItemDictionary(attributes, call: "SecItemAdd")
        let returns = try SecItemReturns(&dictionary)
        let item = try dictionary.item()
        try dictionary.checkAllUsed()
        var added = try SecItemKeychain.current().add(item)
        added.secret = item.secret
        if returns.any { result?.pointee = returns.value(of: added) }
    }
}

/// Finds the items `query` matches (`SecItemCopyMatching`) and returns what its `kSecReturn…` keys ask for: one value
/// for `kSecMatchLimitOne` (the default), an array for `kSecMatchLimitAll`.
@discardableResult
public func SecItemCopyMatching(_ query: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    SecItemKeychain.run {
        var dictionary = try SecItemDictionary(query, call: "SecItemCopyMatching")
        let returns = try SecItemReturns(&dictionary)
        let keychainQuery = try dictionary.query()
        try dictionary.checkAllUsed()
        let items = try SecItemKeychain.current().items(matching: keychainQuery, includingSecrets: returns.data)
        guard returns.any else { return }
        result?.pointee = keychainQuery.limit == .all ? items.map { returns.value(of: $0) } as NSArray : returns.value(of: items[0])
    }
}

/// Changes every item `query` matches (`SecItemUpdate`) to `attributesToUpdate`.
@discardableResult
public func SecItemUpdate(_ query: CFDictionary, _ attributesToUpdate: CFDictionary) -> OSStatus {
    SecItemKeychain.run {
        var dictionary = try SecItemDictionary(query, call: "SecItemUpdate")
        var keychainQuery = try dictionary.query()
        try dictionary.checkAllUsed()
        var changes = try SecItemDictionary(attributesToUpdate, call: "SecItemUpdate's attributes to update")
        let update = try changes.changes()
        try changes.checkAllUsed()
        keychainQuery.limit = .all
        try SecItemKeychain.current().update(matching: keychainQuery, with: update)
    }
}

/// Removes every item `query` matches (`SecItemDelete`).
@discardableResult
public func SecItemDelete(_ query: CFDictionary) -> OSStatus {
    SecItemKeychain.run {
        var dictionary = try SecItemDictionary(query, call: "SecItemDelete")
        var keychainQuery = try dictionary.query()
        try dictionary.checkAllUsed()
        keychainQuery.limit = .all
        try SecItemKeychain.current().delete(matching: keychainQuery)
    }
}

/// What `status` means (`SecCopyErrorMessageString`): the last failed call's whole message when it had that
/// status, else the status's name.
public func SecCopyErrorMessageString(_ status: OSStatus, _ reserved: UnsafeMutableRawPointer?) -> CFString? {
    SecItemKeychain.message(for: status).map { $0 as NSString }
}
