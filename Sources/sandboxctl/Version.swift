/// The one place the release's version is set. `sandboxctl --version` prints it, and `make install`, the man pages and
/// `make deb` read it from the built binary, so the package and the command never disagree.
let sandboxctlVersion = "0.9.0"
