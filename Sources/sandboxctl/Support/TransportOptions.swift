import ArgumentParser

/// How a FUSE mount takes its requests: the option `mount`, `inbox mount` and `launch` share.
struct TransportOptions: ParsableArguments {
    @Flag(name: .customLong("no-io-uring"), help: "Take requests over /dev/fuse even where FUSE over io_uring is on.")
    var noIOUring = false

    /// Whether the mount may take FUSE's io_uring transport (where root has turned it on).
    var overIOUring: Bool { !noIOUring }

    /// The same choice, for the background copy of the command.
    var arguments: [String] { noIOUring ? ["--no-io-uring"] : [] }
}
