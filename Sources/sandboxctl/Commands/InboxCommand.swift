import ArgumentParser
import Foundation
import Logging
import ProtectedStore
import ProtectedStoreMount

struct InboxCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inbox",
        abstract: "Hand files to an app through its Documents/Inbox, and list what is there.",
        discussion: "The app may read and delete Inbox items but not write them; each delivery sends the app an open-URL event (see `sandboxctl watch BUNDLE`).",
        subcommands: [InboxDeliverCommand.self, InboxMountCommand.self, InboxListCommand.self]
    )
}

struct InboxDeliverCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "deliver",
        abstract: "Deliver local files into a container's Documents/Inbox, as AirDrop or another app would.",
        discussion: """
            Each file is streamed (constant memory; a progress bar on a terminal for large files), encrypted and renamed into \
            place whole under a free name (report-1.pdf if report.pdf is taken). Then an open-URL event carrying the item's \
            path, --from and --annotation is recorded for the app, which gets it once protected data is available.

            Unlocked, items take the container's default class. Locked or before first unlock (also in embedded mode without \
            --passcode-stdin), they are sealed for class B and take the default class at their first unlocked open.

            All arguments are checked before anything is delivered. If a delivery fails part-way (a full disk), nothing of \
            that file is left and the files before it stay delivered; the exit status is non-zero.
            """
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var passcode: PasscodeOptions

    @Option(name: .customLong("from"), help: ArgumentHelp("The sending app's bundle identifier.", valueName: "bundle-id"))
    var sourceApplication: String?

    @Option(help: ArgumentHelp("A JSON value for the app (any value a property list can hold: no null).", valueName: "json"))
    var annotation: String?

    @Flag(help: "Print JSON for scripts: one object per delivered item.")
    var json = false

    @Argument(help: ArgumentHelp("The app's container.", valueName: "bundle"))
    var bundleIdentifier: String

    @Argument(help: ArgumentHelp("Local files to deliver, in order.", valueName: "file"))
    var files: [String]

    /// Files at least this large get a progress bar on a terminal.
    static let progressThreshold: UInt64 = 8 << 20

    func validate() throws {
        guard !files.isEmpty else { throw ValidationError("Give at least one file to deliver") }
    }

    func run() throws {
        try reportingErrors {
            let session = try KeySession(device, passcode)
            let container = try session.device.container(bundleIdentifier: bundleIdentifier)
            try checkArguments()
            var delivered: [InboxListCommand.Entry] = []
            defer { if json && !delivered.isEmpty { try? printJSON(delivered) } }
            for file in files {
                let progress = ProgressBar(label: (file as NSString).lastPathComponent, threshold: Self.progressThreshold)
                let item: InboxItem
                do {
                    item = try container.deliverToInbox(fileAtPath: file, sourceApplication: sourceApplication, annotationJSON: annotation,
                                                        progress: progress.update)
                    progress.finish()
                } catch {
                    progress.finish()
                    if !delivered.isEmpty {
                        printWarning("delivered before the failure: \(delivered.map(\.path).joined(separator: ", "))")
                    }
                    throw error
                }
                delivered.append(InboxListCommand.Entry(item))
                if !json {
                    let sealing = item.awaitsDefaultClass ? "sealed for class B while locked" : item.protectionClass?.name ?? "?"
                    print("\(file) -> \(bundleIdentifier):\(item.path)  (\(item.size) bytes, \(sealing), open-URL event #\(item.sequenceNumber ?? 0) queued)")
                }
            }
        }
    }

    /// Every source must be a readable regular file with a usable name before the first is delivered.
    private func checkArguments() throws {
        for file in files {
            try Container.checkInboxDelivery(fileAtPath: file, sourceApplication: sourceApplication, annotationJSON: annotation)
        }
    }
}

struct InboxListCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List a container's Inbox items: state of their open-URL event, source, size and class.",
        discussion: "States: pending-event (delivered, the app has not handled its event yet), delivered, unrecorded (no delivery record). Needs no passcode. Damage to the delivery records (a record that does not open, one restored from before its event was handled, a removed record or queue state) is named on standard error, and the command exits 65."
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Print JSON for scripts.")
    var json = false

    @Argument(help: ArgumentHelp("The app's container.", valueName: "bundle"))
    var bundleIdentifier: String

    struct Entry: Codable {
        var name: String
        var path: String
        var state: String
        var sourceApplication: String?
        var annotation: String?
        var size: UInt64
        var protection: String?
        var awaitsDefaultClass: Bool
        var sequence: UInt64?
        var delivered: Date?
        var problem: String?

        init(_ item: InboxItem) {
            name = item.name
            path = item.path
            state = item.state.rawValue
            sourceApplication = item.sourceApplication
            annotation = item.annotationJSON
            size = item.size
            protection = item.protectionClass?.name
            awaitsDefaultClass = item.awaitsDefaultClass
            sequence = item.sequenceNumber
            delivered = item.deliveryDate
            problem = item.problem
        }
    }

    func run() throws {
        try reportingErrors {
            let container = try device.open().container(bundleIdentifier: bundleIdentifier)
            let (items, damaged) = try container.inboxListing()
            let damage = damaged.map { (path: "\(bundleIdentifier) inbox-queue/\($0.file)", problem: $0.problem) }
            if json {
                try printJSON(items.map(Entry.init))
                try failIfDamaged(damage)
                return
            }
            guard !items.isEmpty else {
                print("(the Inbox of \(bundleIdentifier) is empty)")
                try failIfDamaged(damage)
                return
            }
            for item in items {
                let number = item.sequenceNumber.map { "#\($0)" } ?? "-"
                let protection = (item.protectionClass?.name ?? "?") + (item.awaitsDefaultClass ? "*" : "")
                let columns = [number.padding(toLength: 6, withPad: " ", startingAt: 0), item.state.rawValue.padding(toLength: 14, withPad: " ", startingAt: 0),
                               String(item.size).padding(toLength: 12, withPad: " ", startingAt: 0),
                               protection.padding(toLength: 42, withPad: " ", startingAt: 0), item.name]
                print(columns.joined(separator: " ") + (item.sourceApplication.map { "  from \($0)" } ?? "") + (item.problem.map { "  (\($0))" } ?? ""))
            }
            if items.contains(where: \.awaitsDefaultClass) {
                print("* sealed for class B while locked; takes the container's default class at its first unlocked open")
            }
            try failIfDamaged(damage)
        }
    }
}

/// A progress bar on standard error for one large file, drawn only on a terminal.
final class ProgressBar {
    private let label: String
    private let threshold: UInt64
    private let enabled = isatty(STDERR_FILENO) == 1
    private var lastPercent = -1
    private var drawn = false

    init(label: String, threshold: UInt64) {
        self.label = label
        self.threshold = threshold
    }

    func update(_ done: UInt64, _ total: UInt64) {
        guard enabled, total >= threshold else { return }
        let percent = Int(done * 100 / max(total, 1))
        guard percent != lastPercent else { return }
        lastPercent = percent
        let width = 30
        let filled = width * percent / 100
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        FileHandle.standardError.write(Data("\r\(label.prefix(30))  [\(bar)] \(String(format: "%3d", percent))%  \(done >> 20)/\(total >> 20) MiB".utf8))
        drawn = true
    }

    func finish() {
        if drawn { FileHandle.standardError.write(Data("\n".utf8)) }
        drawn = false
    }
}

struct InboxMountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Serve a drop folder at DIR (FUSE): every file a program writes there is delivered into BUNDLE's Documents/Inbox.",
        discussion: """
            Point any program's output or download folder at DIR. A file is encrypted as it is written (constant memory) \
            and delivered whole, as `inbox deliver` delivers, once its writer is done: its last descriptor closed and no \
            rename within --settle seconds, or at once when a rename gives a closed file its final name. Names starting \
            with "." or ending in .part, .partial, .crdownload, .tmp or ~ are temporary (browsers, rsync, curl, editors): \
            such a file is delivered only after a rename to a final name. A file removed before that, or whose writer \
            is killed by a signal while writing, is never delivered; nor is anything still open or temporary when the \
            drop folder stops (unfinished files are swept from the Inbox at the next start).

            The folder is write-only and flat: opening a file for reading gives EACCES, a listing shows only files not \
            yet delivered, subfolders, links and special files are refused (EPERM). Each delivery records an open-URL \
            event whose source is --from, else `local.<executable>` of the writing program, and whose annotation is the \
            file's user.inbox.annotation extended attribute (setfattr), else --annotation. Locked or before first \
            unlock, drops still work: items are sealed for class B and take the default class at their first unlocked \
            open. With a running `sandboxctl daemon` the mount follows its lock state; without one it works before \
            first unlock.

            By default the drop folder runs in the background and this command returns once it is ready; its log goes \
            to $XDG_STATE_HOME/sandboxctl/logs/<keybag id>/inbox-<container id>.log. Stop it with `fusermount3 -u DIR` or \
            SIGTERM. Exit status: 64 for a bad --from, --annotation or DIR (not empty, not a directory, inside the \
            device root); 1 for an unknown bundle, a missing DIR or one already mounted (busy).

            Like `sandboxctl mount`, it takes its requests over FUSE's io_uring transport where root has turned it on \
            (/sys/module/fuse/parameters/enable_uring) before it starts; --no-io-uring keeps them on /dev/fuse.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Option(name: .customLong("from"), help: ArgumentHelp("The source application of every delivery (a bundle identifier); default: local.<writing program>.", valueName: "bundle-id"))
    var sourceApplication: String?

    @Option(help: ArgumentHelp("A JSON value for every delivery's event (no null); a file's user.inbox.annotation attribute overrides it.", valueName: "json"))
    var annotation: String?

    @Option(help: ArgumentHelp("Seconds a closed file waits for a rename before it is delivered.", valueName: "seconds"))
    var settle: Double = 1

    @Flag(help: "Stay in the foreground and log to standard error until unmounted or interrupted.")
    var foreground = false

    @Flag(help: "Also log every name and annotation refused.")
    var verbose = false

    @OptionGroup var transport: TransportOptions

    @Flag(help: .private)
    var backgroundChild = false

    @Argument(help: ArgumentHelp("The app's container.", valueName: "bundle"))
    var bundleIdentifier: String

    @Argument(help: ArgumentHelp("An empty directory outside the device root.", valueName: "dir"))
    var directory: String

    func validate() throws {
        guard settle >= 0 && settle <= 3600 else { throw ValidationError("--settle must be between 0 and 3600 seconds") }
    }

    func run() throws {
        try reportingErrors {
            let root = device.resolvedRoot
            if let sourceApplication { try Container.checkSourceApplication(sourceApplication) }
            let checkedAnnotation = try annotation.map(Container.checkedAnnotation)
            let mountPoint = try MountPoint.check(directory, deviceRoot: root)
            let container = try device.open().container(bundleIdentifier: bundleIdentifier)
            guard foreground || backgroundChild else {
                var arguments = ["inbox", "mount", bundleIdentifier, mountPoint, "--background-child", "--root", root, "--settle", "\(settle)"]
                if let secret = device.resolvedDeviceSecret { arguments += ["--device-secret", secret] }
                if let sourceApplication { arguments += ["--from", sourceApplication] }
                if let checkedAnnotation { arguments += ["--annotation", checkedAnnotation] }
                if verbose { arguments.append("--verbose") }
                arguments += transport.arguments
                let started = try MountCommand.startDetached(arguments: arguments, root: root, logName: "inbox-\(container.storageIdentifier).log")
                print("Drop folder for \(bundleIdentifier)'s Inbox at \(mountPoint) (pid \(started.process), log \(started.log)).")
                print("Stop it with: fusermount3 -u \(mountPoint)")
                return
            }
            if backgroundChild { setsid() }
            try PlaintextHygiene.hardenProcess()
            MountCommand.bootstrapLogging(verbose: verbose)
            let logger = Logger(label: "sandboxctl.inbox-mount")
            let fileSystem = InboxDropFileSystem(container: container, sourceApplication: sourceApplication, annotation: checkedAnnotation,
                                                 settleTime: settle, logger: logger)
            try InboxDropMount(fileSystem: fileSystem, mountPoint: mountPoint, logger: logger).run(overIOUring: transport.overIOUring) {
                guard backgroundChild else {
                    FileHandle.standardError.write(Data("Drop folder for \(bundleIdentifier)'s Inbox at \(mountPoint); Ctrl-C or `fusermount3 -u \(mountPoint)` to stop\n".utf8))
                    return
                }
                MountCommand.announceReady()
            }
        }
    }
}
