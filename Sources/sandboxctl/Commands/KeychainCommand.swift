import ArgumentParser
import Foundation
import ProtectedStore
import SystemPackage

struct KeychainCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keychain",
        abstract: "Add, find, update, delete and list an app's keychain items, under iOS's accessibility rules.",
        discussion: """
            BUNDLE is the app whose access group holds the items. The lock applies as on iOS: while locked, items \
            --accessible when-unlocked (the default) and the other when-… values can be neither read nor written \
            (errSecInteractionNotAllowed (-25308), exit 77); after-first-unlock items can, until a reboot. Secrets are read \
            from standard input (everything, one trailing newline dropped) or asked on the terminal, never from the \
            command line. Each error names Security.framework's OSStatus.

            Inside a sandbox of `sandboxctl launch` (SANDBOXCTL_APP_SOCKET set, no --root) the commands use the app's own \
            keychain through its socket: BUNDLE must be the app's bundle identifier or a group given with --keychain-group \
            (else errSecMissingEntitlement (-34018)); nothing else of the device is seen.

            Exit status: 0 success; 1 errSecItemNotFound, errSecDuplicateItem, errSecIO, errSecDiskFull; 64 errSecParam; \
            65 errSecDecode (the keychain store was damaged or tampered with); 77 errSecInteractionNotAllowed, \
            errSecMissingEntitlement.
            """,
        subcommands: [KeychainAddCommand.self, KeychainFindCommand.self, KeychainUpdateCommand.self, KeychainDeleteCommand.self, KeychainListCommand.self]
    )
}

/// Which items a keychain subcommand names: the app's group, the class and the attributes of the primary key.
struct KeychainItemOptions: ParsableArguments {
    @Argument(help: ArgumentHelp("The app whose access group holds the items (its bundle identifier).", valueName: "bundle"))
    var bundleIdentifier: String

    @Option(name: .customLong("class"), help: ArgumentHelp("generic-password (kSecClassGenericPassword) or internet-password (kSecClassInternetPassword).", valueName: "class"))
    var itemClass: KeychainClassName = .genericPassword

    @Option(help: ArgumentHelp("kSecAttrService (generic passwords).", valueName: "service"))
    var service: String?

    @Option(help: ArgumentHelp("kSecAttrAccount.", valueName: "account"))
    var account: String?

    @Option(help: ArgumentHelp("kSecAttrServer (internet passwords).", valueName: "host"))
    var server: String?

    @Option(name: .customLong("protocol"), help: ArgumentHelp("kSecAttrProtocol, a four-letter value such as htps (internet passwords).", valueName: "protocol"))
    var networkProtocol: String?

    @Option(help: ArgumentHelp("kSecAttrPort (internet passwords).", valueName: "port"))
    var port: Int?

    @Option(help: ArgumentHelp("kSecAttrPath (internet passwords).", valueName: "path"))
    var path: String?

    var query: KeychainQuery {
        KeychainQuery(itemClass: itemClass.itemClass, service: service, account: account, server: server, protocol: networkProtocol, port: port, path: path,
                      accessGroup: bundleIdentifier, limit: .all)
    }

    func item(secret: Data, accessible: KeychainAccessibility, label: String?) -> KeychainItem {
        KeychainItem(itemClass: itemClass.itemClass, service: service, account: account, server: server, protocol: networkProtocol, port: port, path: path,
                     label: label, accessGroup: bundleIdentifier, accessible: accessible, secret: secret)
    }
}

enum KeychainClassName: String, ExpressibleByArgument, CaseIterable {
    case genericPassword = "generic-password"
    case internetPassword = "internet-password"

    var itemClass: KeychainItemClass { self == .genericPassword ? .genericPassword : .internetPassword }
}

extension KeychainAccessibility: ExpressibleByArgument {
    public init?(argument: String) { self.init(named: argument) }
    public static var allValueStrings: [String] { allCases.map(\.name) }
}

/// The keychain of one keychain subcommand: the device's, with the key session's passcode handling; or, inside a
/// sandbox of `sandboxctl launch` (SANDBOXCTL_APP_SOCKET set, no --root), the app's own, through its socket.
private struct KeychainSession {
    let keys: KeySession?
    /// Inside a sandbox: the app, whose connection its keychain uses.
    private let application: Application?
    let keychain: Keychain

    init(_ device: DeviceOptions, _ passcode: PasscodeOptions) throws {
        if device.givenRoot == nil, ProcessInfo.processInfo.environment[Application.socketEnvironmentVariable] != nil {
            keys = nil
            let application = try Application.attach(notificationCenter: NotificationCenter())
            self.application = application
            keychain = try application.keychain
            return
        }
        let keys = try KeySession(device, passcode)
        self.keys = keys
        application = nil
        keychain = try Keychain(device: keys.device, accessGroups: .all)
    }

    func run<R>(_ operation: (Keychain) throws -> R) throws -> R {
        guard let keys else { return try operation(keychain) }
        return try keys.withKeys { try operation(keychain) }
    }
}

/// The secret of an add or update: all of standard input (one trailing newline dropped, so `echo` works) when it is
/// not a terminal or the passcode came from it, else one line asked on the terminal with echo off.
private func readSecret(passcodeFromStandardInput: Bool) throws -> Data {
    let limit = 16 * 1024
    func tooLong() -> KeychainError {
        KeychainError(.param, problem: "the secret is longer than \(limit) bytes, the most a keychain item holds", remedy: "Store a shorter secret, or keep the data in a file and its key in the keychain")
    }
    var bytes: [UInt8] = []
    if isatty(STDIN_FILENO) == 0 || passcodeFromStandardInput {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = try buffer.withUnsafeMutableBytes { try FileDescriptor.standardInput.read(into: $0, retryOnInterrupt: true) }
            if count == 0 { break }
            bytes += buffer[0..<count]
            guard bytes.count <= limit + 1 else { throw tooLong() }
        }
        if bytes.last == UInt8(ascii: "\n") { bytes.removeLast() }
    } else {
        bytes = try PasscodeInput.onTerminal(prompt: "Secret: ", asking: "the secret", remedy: "Write the secret on standard input") { tty in
            var line: [UInt8] = []
            var byte: UInt8 = 0
            while try withUnsafeMutableBytes(of: &byte, { try tty.read(into: $0, retryOnInterrupt: true) }) == 1, byte != UInt8(ascii: "\n") {
                line.append(byte)
                guard line.count <= limit else { throw tooLong() }
            }
            return line
        }
    }
    guard bytes.count <= limit else { throw tooLong() }
    return Data(bytes)
}

struct KeychainAddCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Add an item, its secret read from standard input or the terminal (SecItemAdd).",
        discussion: "Fails with errSecDuplicateItem (-25299) if an item of the class with the same primary key (service and account; or server, account, protocol, port and path) is in the group. Prints the item's persistent reference (hex)."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions
    @OptionGroup var item: KeychainItemOptions

    @Option(help: ArgumentHelp("kSecAttrAccessible: \(KeychainAccessibility.allValueStrings.joined(separator: ", ")).", valueName: "when"))
    var accessible: KeychainAccessibility = .whenUnlocked

    @Option(help: ArgumentHelp("kSecAttrLabel.", valueName: "label"))
    var label: String?

    @Flag(help: "Print the added item's attributes as JSON.")
    var json = false

    func run() throws {
        try reportingErrors {
            let session = try KeychainSession(device, passcode)
            let secret = try readSecret(passcodeFromStandardInput: passcode.passcodeStdin)
            let added = try session.run { try $0.add(item.item(secret: secret, accessible: accessible, label: label)) }
            if json { try printJSON(KeychainEntry(added)) } else { print(added.persistentReference.map { $0.map { String(format: "%02x", $0) }.joined() } ?? "") }
        }
    }
}

struct KeychainFindCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "find",
        abstract: "Print the secret of the first matching item (SecItemCopyMatching).",
        discussion: "The secret is written to standard output as stored, with no newline added. Fails with errSecItemNotFound (-25300) when nothing matches, errSecInteractionNotAllowed (-25308) when a match's class key is unavailable now."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions
    @OptionGroup var item: KeychainItemOptions

    @Flag(help: "Print the item's attributes and secret as JSON instead (the secret as UTF-8 text, or base64 in secretBase64).")
    var json = false

    func run() throws {
        try reportingErrors {
            let session = try KeychainSession(device, passcode)
            var query = item.query
            query.limit = .one
            let found = try session.run { try $0.items(matching: query) }[0]
            if json {
                try printJSON(KeychainEntry(found, includingSecret: true))
            } else {
                FileHandle.standardOutput.write(found.secret ?? Data())
            }
        }
    }
}

struct KeychainUpdateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "update",
        abstract: "Change every matching item: its secret, accessibility or label (SecItemUpdate).",
        discussion: "All matches change or none. --secret reads the new secret from standard input or the terminal."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions
    @OptionGroup var item: KeychainItemOptions

    @Flag(help: "Replace the secret with one read from standard input or the terminal.")
    var secret = false

    @Option(help: ArgumentHelp("The new kSecAttrAccessible.", valueName: "when"))
    var accessible: KeychainAccessibility?

    @Option(help: ArgumentHelp("The new kSecAttrLabel.", valueName: "label"))
    var label: String?

    func validate() throws {
        guard secret || accessible != nil || label != nil else { throw ValidationError("Give what to change: --secret, --accessible or --label") }
    }

    func run() throws {
        try reportingErrors {
            let session = try KeychainSession(device, passcode)
            let newSecret = secret ? try readSecret(passcodeFromStandardInput: passcode.passcodeStdin) : nil
            try session.run { try $0.update(matching: item.query, with: KeychainChanges(label: label, accessible: accessible, secret: newSecret)) }
        }
    }
}

struct KeychainDeleteCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete",
        abstract: "Remove every matching item (SecItemDelete).",
        discussion: "Without --service, --account or --server it removes nothing unless --all is given."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions
    @OptionGroup var item: KeychainItemOptions

    @Flag(help: "Remove every item of the class in the group.")
    var all = false

    func validate() throws {
        guard all || item.service != nil || item.account != nil || item.server != nil else {
            throw ValidationError("Name the items (--service, --account, --server), or pass --all to remove every item of the class")
        }
    }

    func run() throws {
        try reportingErrors {
            let session = try KeychainSession(device, passcode)
            try session.run { try $0.delete(matching: item.query) }
        }
    }
}

struct KeychainListCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the matching items' attributes, never their secrets.",
        discussion: "While locked, items whose class key is unavailable are counted, not shown (a line on standard error says how many)."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions
    @OptionGroup var item: KeychainItemOptions

    @Flag(help: "Print JSON for scripts: {items: [...], unavailable: N}.")
    var json = false

    struct Listing: Encodable {
        let items: [KeychainEntry]
        let unavailable: Int
    }

    func run() throws {
        try reportingErrors {
            let session = try KeychainSession(device, passcode)
            let (items, unavailable) = try session.run { try $0.list(matching: item.query) }
            if json {
                try printJSON(Listing(items: items.map { KeychainEntry($0) }, unavailable: unavailable))
                return
            }
            for found in items {
                let name = found.itemClass == .genericPassword ? "\(found.service ?? "")  \(found.account ?? "")" : "\(found.server ?? "")  \(found.account ?? "")"
                print("\(name)  \(found.accessible)\(found.label.map { "  \"\($0)\"" } ?? "")")
            }
            if unavailable > 0 { printWarning("\(unavailable) more item(s) cannot be shown while the device is locked (their class key is unavailable)") }
        }
    }
}

/// An item as the keychain commands print it in JSON.
struct KeychainEntry: Encodable {
    let itemClass: String
    let accessGroup: String?
    let service: String?
    let account: String?
    let server: String?
    let `protocol`: String?
    let port: Int?
    let path: String?
    let label: String?
    let accessible: String
    let thisDeviceOnly: Bool
    let created: Date?
    let modified: Date?
    let persistentReference: String?
    let secret: String?
    let secretBase64: String?

    init(_ item: KeychainItem, includingSecret: Bool = false) {
        itemClass = item.itemClass == .genericPassword ? "generic-password" : "internet-password"
        accessGroup = item.accessGroup
        service = item.service
        account = item.account
        server = item.server
        `protocol` = item.protocol
        port = item.port
        path = item.path
        label = item.label
        accessible = item.accessible.name
        thisDeviceOnly = item.accessible.isThisDeviceOnly
        created = item.creationDate
        modified = item.modificationDate
        persistentReference = item.persistentReference.map { $0.map { String(format: "%02x", $0) }.joined() }
        let text = includingSecret ? item.secret.flatMap { String(data: $0, encoding: .utf8) } : nil
        secret = text
        secretBase64 = includingSecret && text == nil ? item.secret?.base64EncodedString() : nil
    }
}
