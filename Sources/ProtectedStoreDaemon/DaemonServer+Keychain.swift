import Foundation
import ProtectedStore

// The keychain requests (docs/PROTOCOL.md §7): an app's connection is answered for its own access groups, the
// owner's for every group. Each runs on `keychainCalls`, off the loop, and replies through it.
extension DaemonServer {
    /// Keychain requests one connection may have in flight: the queue is shared, so one program's flood waits on
    /// itself, not on every other program's keychain.
    static let maximumKeychainCallsPerConnection = 8

    func handleKeychain(_ operation: DaemonRequest.Operation, _ request: DaemonRequest, attachment: SecureBytes?, on connection: Connection) {
        guard connection.keychainCallsPending < Self.maximumKeychainCallsPerConnection else {
            attachment?.discard()
            return send(.failure(id: request.id, KeychainError(.notAvailable, problem: "\(Self.maximumKeychainCallsPerConnection) keychain requests of this connection are waiting for their replies",
                                                               remedy: "Wait for a reply before sending more")), to: connection)
        }
        let store: KeychainStore
        do {
            if let bundle = connection.appBundle {
                guard let app = apps[bundle] else {
                    return send(.failure(id: request.id, KeychainError(.notAvailable, problem: "\(bundle) is no longer running", remedy: "Launch it again")), to: connection)
                }
                store = try app.keychain ?? KeychainStore(device: device, accessGroups: .only([bundle] + app.keychainGroups))
                app.keychain = store
            } else {
                store = try ownerKeychain ?? KeychainStore(device: device, accessGroups: .all)
                ownerKeychain = store
            }
        } catch {
            return send(.failure(id: request.id, KeychainError(error, path: nil)), to: connection)
        }
        let connectionID = connection.id
        connection.keychainCallsPending += 1
        keychainCalls.async { [self] in
            let (reply, secrets) = Self.answer(operation, request, attachment: attachment, store: store)
            attachment?.discard()
            let posted = execute {
                self.connections[connectionID]?.keychainCallsPending -= 1
                self.send(reply, attachment: secrets, toConnection: connectionID)
                secrets?.discard()
            }
            // The loop has stopped: nobody will send it.
            if !posted { secrets?.discard() }
        }
    }

    /// The reply to one keychain request, and the secrets it carries; secrets passed through ordinary memory on the way
    /// are zeroed before it returns.
    private static func answer(_ operation: DaemonRequest.Operation, _ request: DaemonRequest, attachment: SecureBytes?,
                               store: KeychainStore) -> (DaemonReply, SecureBytes?) {
        var reply = DaemonReply(id: request.id)
        do {
            guard var secrets = try KeychainSecrets.unpack(attachment), secrets.count <= 1 else { throw malformed("the attachment is not one secret") }
            // The item or changes made below share these bytes; they are released at the end of their case, before
            // this runs, so the one copy is zeroed in place.
            defer { for index in secrets.indices { secrets[index].resetBytes(in: 0..<secrets[index].count) } }
            switch operation {
            case .keychainAdd:
                guard var item = request.keychainItem?.item() else { throw malformed("keychain-add needs an item") }
                item.secret = secrets.first
                let added = try store.add(item)
                reply.keychainItems = [KeychainItemMessage(added)]
            case .keychainFind:
                guard let query = request.keychainQuery?.query() else { throw malformed("keychain-find needs a query") }
                let withSecrets = request.returnSecrets == true
                var found = try store.items(matching: query, includingSecrets: withSecrets)
                defer { for index in found.indices { found[index].scrubSecret() } }
                reply.keychainItems = found.map { KeychainItemMessage($0) }
                guard withSecrets else { return (reply, nil) }
                try checkFits(reply)
                let packed = KeychainSecrets.pack(found.map { $0.secret ?? Data() })
                guard packed.count <= Frame.maximumPayload / 2 else {
                    packed.discard()
                    throw KeychainError(.param, problem: "the \(found.count) matching items' secrets are \(packed.count) bytes, more than one reply carries (\(Frame.maximumPayload / 2))",
                                        remedy: "Ask for the attributes of all matches, then for each one's data")
                }
                return (reply, packed)
            case .keychainUpdate:
                guard let query = request.keychainQuery?.query(), let changes = request.keychainChanges?.changes(secret: secrets.first) else {
                    throw malformed("keychain-update needs a query and changes")
                }
                try store.update(matching: query, with: changes)
            case .keychainDelete:
                guard let query = request.keychainQuery?.query() else { throw malformed("keychain-delete needs a query") }
                try store.delete(matching: query)
            case .keychainList:
                guard let query = request.keychainQuery?.query() else { throw malformed("keychain-list needs a query") }
                let (items, unavailable) = try store.list(matching: query)
                reply.keychainItems = items.map { KeychainItemMessage($0) }
                reply.unavailable = unavailable
            default:
                throw malformed("\(operation.rawValue) is not a keychain request")
            }
            try checkFits(reply)
            return (reply, nil)
        } catch {
            return (.failure(id: request.id, KeychainError(error, path: nil).withoutPath), nil)
        }
    }

    /// A reply too long for a frame (many matches) is refused here, not by closing the connection.
    private static func checkFits(_ reply: DaemonReply) throws {
        // Half the frame is kept for a search's secrets.
        guard let encoded = try? Frame.encode(reply), encoded.count <= Frame.maximumPayload / 2 else {
            throw KeychainError(.param, problem: "the \(reply.keychainItems?.count ?? 0) matching items do not fit one reply (\(Frame.maximumPayload / 2048) KiB of attributes)",
                                remedy: "Narrow the query (a service, an account)")
        }
    }

    private static func malformed(_ problem: String) -> KeychainError {
        KeychainError(.param, problem: problem, remedy: "See docs/PROTOCOL.md §7")
    }
}

private extension KeychainError {
    /// As sent to a client: the daemon's own paths are not an app's business.
    var withoutPath: KeychainError { KeychainError(code, problem: problem, remedy: remedy) }
}
