// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "ProtectedStore",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "ProtectedStore", targets: ["ProtectedStore"]),
        .library(name: "ProtectedStoreTesting", targets: ["ProtectedStoreTesting"]),
        .library(name: "ProtectedStoreSecurity", targets: ["ProtectedStoreSecurity"]),
        // Only for the fuzz package beside this one (Fuzz/); the leading underscore marks it as no API.
        .library(name: "_ProtectedStoreFuzzing", targets: ["ProtectedStoreFuzzing"]),
        .executable(name: "sandboxctl", targets: ["sandboxctl"]),
        .executable(name: "ps-verify", targets: ["ps-verify"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        // `make docs`: the DocC catalogs of ProtectedStore and ProtectedStoreTesting.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"]), .brew(["libsodium"])]
        ),
        // The keychain's database, and the notes example's.
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CFuse",
            pkgConfig: "fuse3",
            providers: [.apt(["libfuse3-dev"])]
        ),
        // The mount's FUSE-over-io_uring transport beside libfuse's /dev/fuse loop (docs/FUSE-IO-URING.md).
        .target(name: "CFuseRings", dependencies: ["CFuse"]),
        // The few Linux calls Swift's Glibc module does not expose.
        .target(name: "CSupport"),
        // The daemon's lock triggers from systemd-logind over D-Bus (libsystemd's sd-bus; Debian libsystemd-dev).
        .target(name: "CLogind", linkerSettings: [.linkedLibrary("systemd")]),
        // pam_sandboxctl: unlock at login (C, libpam; Debian libpam0g-dev). Built into pam_sandboxctl.so by cc
        // (scripts/dist.sh), not as a SwiftPM product, which would load the Swift runtime into every login.
        .target(name: "PAMSandboxctl", linkerSettings: [.linkedLibrary("pam")]),
        // Layers, lowest first; each imports only those above it (docs/ARCHITECTURE.md).
        // Cryptography, secure memory, the keybag, the device secret and the encrypted file format: nothing about
        // containers, events or processes.
        .target(
            name: "ProtectedStoreCore",
            dependencies: [
                "CSodium",
                "CSupport",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // What an app imports: the device and its lock, containers, events, the Inbox, and the key daemon's client.
        .target(
            name: "ProtectedStore",
            dependencies: [
                "ProtectedStoreCore",
                "CSupport",
                "CSQLite",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Security.framework's SecItem calls and kSec… names over the keychain, so iOS code compiles (docs/DESIGN.md).
        .target(
            name: "ProtectedStoreSecurity",
            dependencies: ["ProtectedStore"]
        ),
        // The key daemon's server (`sandboxctl daemon`).
        .target(
            name: "ProtectedStoreDaemon",
            dependencies: [
                "ProtectedStore",
                "CSupport",
                "CLogind",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Throwaway devices, lock/unlock/reboot, Inbox delivery and an event recorder, for users' own test suites.
        .target(
            name: "ProtectedStoreTesting",
            dependencies: ["ProtectedStore", "ProtectedStoreDaemon"]
        ),
        // `sandboxctl mount`: the errno file-system view of a container and the FUSE front end that serves it.
        .target(
            name: "ProtectedStoreMount",
            dependencies: [
                "CFuse",
                "CFuseRings",
                "ProtectedStore",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // `sandboxctl bench`: throughput and lock-latency measurements, linked by the command only.
        .target(
            name: "ProtectedStoreBenchmarks",
            dependencies: ["ProtectedStore", "ProtectedStoreDaemon", "CSQLite"]
        ),
        // The bodies of the libFuzzer targets in Fuzz/, shared with the suite's regression test. Not for apps.
        .target(
            name: "ProtectedStoreFuzzing",
            dependencies: ["ProtectedStore"]
        ),
        .executableTarget(
            name: "sandboxctl",
            dependencies: [
                "CSupport",
                "ProtectedStore",
                "ProtectedStoreDaemon",
                "ProtectedStoreMount",
                "ProtectedStoreBenchmarks",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // make verify's crash harness, power-cut harness, load test and connection flood (docs/SECURITY.md): kills writers, cuts the power, loads and floods the daemon, prints figures.
        .executableTarget(
            name: "ps-verify",
            dependencies: ["ProtectedStore", "ProtectedStoreTesting", "CSupport", .product(name: "ArgumentParser", package: "swift-argument-parser")]
        ),
        // A second program for the daemon tests: attaches, keeps a file open, reports events.
        .executableTarget(
            name: "ProtectedStoreProbe",
            dependencies: ["ProtectedStore"],
            path: "Tests/ProtectedStoreProbe"
        ),
        // The reference storage layer: a notes store on SQLite inside a container (Examples/Notes/README.md).
        .target(
            name: "Notes",
            dependencies: ["ProtectedStore", "CSQLite", .product(name: "Logging", package: "swift-log")],
            path: "Examples/Notes/Sources/Notes"
        ),
        // notes-bench: the notes store against the same SQL on SQLite's own VFS (make bench).
        .executableTarget(
            name: "notes-bench",
            dependencies: ["Notes", "ProtectedStore", "ProtectedStoreTesting", "CSQLite"],
            path: "Examples/Notes/Sources/NotesBenchmark"
        ),
        // The suites' own scheduling: tests on threads of their own (`.ownThread`), stress work in counted rounds.
        .target(
            name: "SuiteThreads",
            path: "Tests/SuiteThreads"
        ),
        .testTarget(
            name: "NotesTests",
            dependencies: ["Notes", "ProtectedStore", "ProtectedStoreTesting", "SuiteThreads"],
            path: "Examples/Notes/Tests/NotesTests"
        ),
        .testTarget(
            name: "ProtectedStoreTestingTests",
            dependencies: ["ProtectedStore", "ProtectedStoreTesting", "SuiteThreads"]
        ),
        .testTarget(
            name: "ProtectedStoreTests",
            dependencies: [
                "ProtectedStoreCore", "ProtectedStore", "ProtectedStoreDaemon", "ProtectedStoreMount", "ProtectedStoreBenchmarks",
                "ProtectedStoreFuzzing", "ProtectedStoreTesting", "ProtectedStoreSecurity", "CSupport", "CSQLite", "sandboxctl", "ProtectedStoreProbe", "ps-verify", "SuiteThreads",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
