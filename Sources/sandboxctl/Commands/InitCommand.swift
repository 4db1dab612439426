import ArgumentParser
import ProtectedStore

extension KDFPreset: ExpressibleByArgument {}
extension DeviceSecretStorage: ExpressibleByArgument {}

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a device: a keybag in the root and a device secret outside it.",
        discussion: "The passcode is asked twice on the terminal, or read as one line from standard input with --passcode-stdin. The device secret is needed for every later use of the device: back it up separately from the root."
    )

    @OptionGroup var device: DeviceOptions

    @Option(help: ArgumentHelp("Passcode key derivation cost: interactive (default, 64 MiB), moderate (256 MiB), sensitive (1 GiB), or fast (INSECURE, tests only).", valueName: "preset"))
    var kdf: KDFPreset = .interactive

    @Option(help: ArgumentHelp("Erase the device after this many wrong passcodes in a row (default: never). Delays grow after 5 failures: 1, 5, 15, 15, 60 minutes.", valueName: "count"))
    var eraseAfter: Int?

    @Flag(help: "Read the passcode as one line from standard input instead of the terminal.")
    var passcodeStdin = false

    @Option(name: .customLong("seal-secret"),
            help: ArgumentHelp("How the device secret is kept: file (default, a plain file, mode 0600) or systemd-creds (sealed by `systemd-creds encrypt`, with the TPM2 where present, else the host key, as <secret path>.cred: a copy of it can't be opened on another machine).",
                               valueName: "storage"))
    var secretStorage: DeviceSecretStorage = .file

    func validate() throws {
        if let eraseAfter, eraseAfter < 1 { throw ValidationError("--erase-after must be at least 1") }
    }

    func run() throws {
        try reportingErrors {
            try Device.checkCreatable(root: device.resolvedRoot, deviceSecretPath: device.resolvedDeviceSecret)
            let passcode = try PasscodeInput.readNew(fromStandardInput: passcodeStdin)
            var policy = PasscodePolicy.default
            policy.eraseAfterFailedAttempts = eraseAfter
            let created = try Device.create(root: device.resolvedRoot, deviceSecretPath: device.resolvedDeviceSecret, passcode: passcode,
                                            kdf: kdf, passcodePolicy: policy, secretStorage: secretStorage)
            print("Created a device in \(created.root)")
            print("  keybag:        \(created.keybagPath)")
            print("  device secret: \(created.deviceSecretPath)  " + (secretStorage == .systemdCredential
                ? "(sealed by systemd-creds: it opens on this machine only; keep the machine's TPM or host key)"
                : "(keep it; without it the data cannot be decrypted)"))
            if let eraseAfter { print("  erases itself after \(eraseAfter) wrong passcodes in a row") }
            if kdf == .fast { print("  warning: --kdf fast is for tests only; this passcode is cheap to brute-force") }
        }
    }
}
