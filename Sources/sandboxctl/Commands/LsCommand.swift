import ArgumentParser
import Foundation
import ProtectedStore

struct LsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List a container directory, with each item's class and plaintext size.",
        discussion: "Needs no passcode: names, classes and sizes are readable in every state. A damaged item (a folder whose name IV or class marker was changed, a file or link that does not open) is listed, marked, and named on standard error; the command then exits 65."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(name: .short, help: "Long format: class, plaintext size, modification time, name.")
    var long = false

    @Flag(help: "Print JSON for scripts.")
    var json = false

    @Argument(help: ArgumentHelp("The container, or a directory or file in it.", valueName: "bundle[:path]"))
    var target: ContainerReference

    struct Entry: Codable {
        var name: String
        var path: String
        var type: String
        var protection: String?
        var size: UInt64
        var modified: Date
        var target: String?
        var problem: String?
    }

    func run() throws {
        try reportingErrors {
            let container = try device.open()
                .container(bundleIdentifier: target.bundleIdentifier)
            var items = [try container.itemInfo(atPath: target.path)]
            if target.path.isEmpty || items[0].type == .typeDirectory || items[0].type == .typeSymbolicLink && target.path.hasSuffix("/") {
                items = try container.contentsOfDirectory(atPath: target.path)
            }
            if json {
                let entries = items.map {
                    Entry(name: $0.name, path: $0.path, type: Self.typeName($0.type), protection: $0.protectionClass?.name,
                          size: $0.size, modified: $0.modificationDate, target: $0.symbolicLinkTarget, problem: $0.problem)
                }
                try printJSON(entries)
                try failIfDamaged(damage(in: items))
                return
            }
            let formatter = DateFormatter()
            formatter.dateFormat = "yyyy-MM-dd HH:mm"
            for item in items {
                var name = item.name + (item.type == .typeDirectory ? "/" : "")
                if let link = item.symbolicLinkTarget { name += " -> \(link)" }
                guard long else {
                    print(name + (item.problem == nil ? "" : "  (damaged)"))
                    continue
                }
                let protection = item.protectionClass?.name ?? (item.type == .typeDirectory ? "(inherit)" : "?")
                let size = item.type == .typeRegular && item.problem == nil ? String(item.size) : "-"
                let line = "\(protection.padding(toLength: 40, withPad: " ", startingAt: 0)) \(String(repeating: " ", count: max(0, 12 - size.count)))\(size)  \(formatter.string(from: item.modificationDate))  \(name)"
                print(line + (item.problem.map { "  (damaged: \($0))" } ?? ""))
            }
            try failIfDamaged(damage(in: items))
        }
    }

    private func damage(in items: [ContainerItem]) -> [(path: String, problem: String)] {
        items.compactMap { item in item.problem.map { ("\(target.bundleIdentifier):\(item.path)", $0) } }
    }

    private static func typeName(_ type: FileAttributeType) -> String {
        switch type {
        case .typeRegular: "file"
        case .typeDirectory: "directory"
        case .typeSymbolicLink: "symlink"
        case .typeSocket: "socket"
        default: "other"
        }
    }
}
