import CSupport
import Foundation
import Synchronization
import SystemPackage

/// Failures injected at the store's I/O layer for a test (the testing kit's `failingWrites` and friends): a full
/// disk after so many bytes, I/O errors on reads or writes, fsync failing. Each rule applies to files under one
/// folder (a test device's root), optionally only to paths matching a glob relative to it, so tests running beside
/// it are not touched. Nothing is checked while no rule is installed.
package enum FaultInjection {
    /// Which calls a rule fails.
    package enum Operation: Sendable {
        /// pwrite (and the space a write reserves first), after `allowedBytes` more bytes.
        case write(allowedBytes: Int64)
        case read
        case synchronize
    }

    package struct Rule: Sendable {
        package let operation: Operation
        /// Absolute folder the rule covers; files elsewhere are never failed.
        package let folder: String
        /// fnmatch(3) glob against the path relative to `folder` ("*" crosses "/"); nil for every file.
        package let pattern: String?
        /// Turns a stored path relative to `folder` into the one `pattern` is written against (a container's
        /// plaintext path, since names are encrypted at rest); nil if it has none.
        package let plaintextPath: (@Sendable (String) -> String?)?
        package let errno: Errno

        package init(_ operation: Operation, folder: String, pattern: String? = nil, plaintextPath: (@Sendable (String) -> String?)? = nil, errno: Errno) {
            self.operation = operation
            self.folder = folder
            self.pattern = pattern
            self.plaintextPath = plaintextPath
            self.errno = errno
        }
    }

    private struct Installed {
        var rule: Rule
        var token: Int
    }

    private static let rules = Locked<(installed: [Installed], next: Int)>(([], 0))
    private static let active = Atomic<Bool>(false)

    /// Installs `rule` until `remove(_:)` is given the returned token.
    package static func install(_ rule: Rule) -> Int {
        rules.withLock { state in
            state.next += 1
            state.installed.append(Installed(rule: Rule(rule.operation, folder: canonical(rule.folder), pattern: rule.pattern, plaintextPath: rule.plaintextPath, errno: rule.errno), token: state.next))
            active.store(true, ordering: .releasing)
            return state.next
        }
    }

    package static func remove(_ token: Int) {
        rules.withLock { state in
            state.installed.removeAll { $0.token == token }
            active.store(!state.installed.isEmpty, ordering: .releasing)
        }
    }

    /// Throws the injected error if a rule fails writing `count` bytes to `descriptor` now; otherwise counts them
    /// against the write rules' allowances (unless `consuming` is false: space reserved, not yet written).
    package static func checkWrite(_ descriptor: FileDescriptor, count: Int64, path: String, consuming: Bool = true) throws {
        guard active.load(ordering: .acquiring), let file = location(of: descriptor) else { return }
        try rules.withLock { state in
            for index in state.installed.indices where state.installed[index].rule.covers(file) {
                guard case .write(let allowed) = state.installed[index].rule.operation else { continue }
                if count > allowed {
                    // Full is full: smaller writes after this one fail too.
                    state.installed[index].rule = state.installed[index].rule.allowing(0)
                    throw ProtectedStoreError.io(state.installed[index].rule.errno, path: path, doing: "write \(count) bytes (injected failure)")
                }
                if consuming { state.installed[index].rule = state.installed[index].rule.allowing(allowed - count) }
            }
        }
    }

    /// Whether a write rule covers `descriptor`'s file: its writes are then stored before they are answered, so an
    /// injected full disk fails the write that meets it, as a real one does.
    package static func limitsWrites(_ descriptor: FileDescriptor) -> Bool {
        guard active.load(ordering: .acquiring), let file = location(of: descriptor) else { return false }
        return rules.withLock { state in
            state.installed.contains { installed in
                guard case .write = installed.rule.operation else { return false }
                return installed.rule.covers(file)
            }
        }
    }

    /// Throws the injected error if a rule fails reads of `descriptor`.
    package static func checkRead(_ descriptor: FileDescriptor, path: String) throws {
        try check(.read, descriptor, path: path, doing: "read (injected failure)")
    }

    /// Throws the injected error if a rule fails fsync of `descriptor`.
    package static func checkSynchronize(_ descriptor: FileDescriptor, path: String) throws {
        try check(.synchronize, descriptor, path: path, doing: "fsync (injected failure)")
    }

    private static func check(_ operation: Operation, _ descriptor: FileDescriptor, path: String, doing action: String) throws {
        guard active.load(ordering: .acquiring), let file = location(of: descriptor) else { return }
        let failing = rules.withLock { state in
            state.installed.first { $0.rule.covers(file) && $0.rule.operation.isSameKind(as: operation) }?.rule.errno
        }
        if let failing { throw ProtectedStoreError.io(failing, path: path, doing: action) }
    }

    /// Where an open descriptor's file is now, as the kernel names it.
    private static func location(of descriptor: FileDescriptor) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/fd/\(descriptor.rawValue)", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The folder as the kernel names it (symlinks such as /tmp resolved), to compare with descriptors' paths.
    private static func canonical(_ folder: String) -> String {
        guard let resolved = realpath(folder, nil) else { return folder }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}

extension FaultInjection.Rule {
    func covers(_ file: String) -> Bool {
        guard file.hasPrefix(folder + "/") else { return false }
        guard let pattern else { return true }
        let stored = String(file.dropFirst(folder.count + 1))
        guard let path = plaintextPath.map({ $0(stored) }) ?? stored else { return false }
        return fnmatch(pattern, path, 0) == 0
    }

    func allowing(_ bytes: Int64) -> Self {
        Self(.write(allowedBytes: bytes), folder: folder, pattern: pattern, plaintextPath: plaintextPath, errno: errno)
    }
}

extension FaultInjection.Operation {
    func isSameKind(as other: Self) -> Bool {
        switch (self, other) {
        case (.write, .write), (.read, .read), (.synchronize, .synchronize): true
        default: false
        }
    }
}
