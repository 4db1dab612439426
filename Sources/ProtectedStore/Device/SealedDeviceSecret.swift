import Foundation
import ProtectedStoreCore

/// Where a device secret is kept: a plain file (mode 0600, outside the root), or sealed by the system with
/// `systemd-creds` (TPM2 where present, else the host's credential key), so a copy of it is useless on another
/// machine: the analog of iOS's UID key, which never leaves the device.
public enum DeviceSecretStorage: String, Sendable, CaseIterable {
    /// A plain file, mode 0600, outside the device root.
    case file
    /// Sealed by `systemd-creds encrypt`, stored as `<secret path>.cred`; never written in clear.
    case systemdCredential = "systemd-creds"
}

/// Sealing and unsealing the device secret through `systemd-creds` (the `.cred` file beside where the plain one
/// would be), and reading it from systemd's credentials directory when a unit loads it (`LoadCredentialEncrypted=`).
enum SealedDeviceSecret {
    /// The credential's name, bound into the sealed file (a file sealed under another name does not decrypt as this).
    static let credentialName = "sandboxctl-device-secret"

    static func sealedPath(for path: String) -> String { path + ".cred" }

    /// `systemd-creds`, to which the plain secret is piped.
    static var tool: String? { FileSystem.executable(named: "systemd-creds") }

    static func requireTool() throws -> String {
        guard let tool else {
            throw ProtectedStoreError(.notFound, path: "systemd-creds", problem: "systemd-creds is not installed, so the device secret can't be sealed by the system",
                                      remedy: "Install systemd (apt-get install systemd), or keep the secret as a plain file (leave out --seal-secret)")
        }
        return tool
    }

    /// Seals `plain` into `path` (mode 0600; its folder exists: `DeviceSecret.create` made it). The plain bytes go
    /// through a pipe, never to a file.
    static func seal(_ plain: [UInt8], to path: String) throws {
        let tool = try requireTool()
        let (status, _, errors) = try run(tool, ["encrypt", "--name=\(credentialName)", "--with-key=auto", "-", path], input: plain)
        guard status == 0 else {
            unlink(path)
            throw ProtectedStoreError(.io, path: path, problem: "systemd-creds could not seal the device secret: \(errors)",
                                      remedy: "Seal as root (the host key, /var/lib/systemd/credential.secret, is root's; `systemd-creds setup` makes it) or with access to the TPM (the tss group), or keep the secret as a plain file")
        }
        chmod(path, 0o600)
    }

    /// The stored bytes of the sealed secret at `path`; the caller zeroes them.
    static func unseal(_ path: String) throws -> [UInt8] {
        let tool = try requireTool()
        let (status, output, errors) = try run(tool, ["decrypt", "--name=\(credentialName)", path, "-"], input: nil)
        guard status == 0 else {
            var discarded = output
            zeroize(&discarded)
            throw ProtectedStoreError(.integrity, path: path, problem: "systemd-creds could not unseal the device secret: \(errors)",
                                      remedy: "On the machine that sealed it, run as a user who can use its host key (root) or TPM (the tss group); a copy of the root and the sealed secret opens on no other machine, by design")
        }
        return output
    }

    /// The plain secret systemd put in this service's credentials directory (`LoadCredentialEncrypted=`), if any.
    static var fromCredentialsDirectory: String? {
        guard let directory = ProcessInfo.processInfo.environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty else { return nil }
        let path = (directory as NSString).appendingPathComponent(credentialName)
        return FileManager.default.fileExists(atPath: path) ? path : nil
    }

    private static func run(_ tool: String, _ arguments: [String], input: [UInt8]?) throws -> (Int32, [UInt8], String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        try process.run()
        // Straight from and into our own buffers, which the callers zero: no Data copy of the secret is left behind.
        if let input {
            let fd = stdin.fileHandleForWriting.fileDescriptor
            var offset = 0
            while offset < input.count {
                let written = input.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, input.count - offset) }
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { break }
                offset += written
            }
        }
        try stdin.fileHandleForWriting.close()
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(stdout.fileHandleForReading.fileDescriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            output += chunk[0..<count]
        }
        zeroize(&chunk)
        let errors = String(decoding: stderr.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            .split(separator: "\n").filter { !$0.contains("not located on encrypted media") }.joined(separator: "; ")
        process.waitUntilExit()
        if process.terminationStatus != 0 { zeroize(&output) }
        return (process.terminationStatus, output, errors)
    }
}
