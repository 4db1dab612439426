import Foundation
import Testing

/// The mount makes no permission checks through the kernel (no `default_permissions`): the stored items' own file
/// system makes them, as the mounting user. These tests run the same operations as an ordinary user in a plain
/// directory and through the mount, and expect the same answers.
extension MountTests {
    /// Why this machine can't run a program as an ordinary user against a mount of that user's, or nil.
    private static let ordinaryUserProblem: String? = {
        guard getuid() == 0 else { return "needs root to start the mount as another user (uid \(getuid()))" }
        for tool in ["/usr/bin/unshare", "/usr/bin/setpriv", "/usr/bin/python3", "/bin/mknod", "/usr/bin/stat", "/usr/bin/timeout", "/bin/fusermount3"] where !FileManager.default.isExecutableFile(atPath: tool) {
            return "\(tool) is missing"
        }
        guard getpwnam("nobody") != nil, getgrnam("nogroup") != nil else { return "there is no user nobody and group nogroup" }
        return nil
    }()

    @Test("as an ordinary user, the mount allows and refuses what a plain directory does: opens, access, creation and removal in read-only folders, listing, search and running")
    func permissionsAsOrdinaryUser() throws {
        guard canRun("the ordinary user's permission test", unless: Self.ordinaryUserProblem) else { return }
        let work = TemporaryDirectory()
        try Self.probe.write(toFile: work.file("probe.py"), atomically: true, encoding: .utf8)
        try Self.asUser.write(toFile: work.file("as-user.sh"), atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: work.file("dev"), withIntermediateDirectories: false)
        let owned = try CLI.run(executable: URL(fileURLWithPath: "/bin/chown"), ["-R", "nobody:nogroup", work.path])
        #expect(owned.status == 0, "\(owned.stderr)")
        // /dev/fuse is root's alone on some machines: a node anyone may open, seen only in a mount namespace of its own.
        let inNamespace = """
            set -e
            mount -t tmpfs -o mode=0755 fuse-device "$1/dev"
            mknod -m 0666 "$1/dev/fuse" c $((0x$(stat -c %t /dev/fuse))) $((0x$(stat -c %T /dev/fuse)))
            mount --bind "$1/dev/fuse" /dev/fuse
            exec setpriv --reuid=nobody --regid=nogroup --clear-groups /bin/sh "$1/as-user.sh" "$1" "$2"
            """
        // A hung step fails the test instead of hanging it; the script's trap then stops the mount and the daemon.
        let run = try CLI.run(executable: URL(fileURLWithPath: "/usr/bin/timeout"),
                              ["120", "/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", inNamespace, "sh", work.path, CLI.executable.path])
        #expect(run.status == 0, "\(run.stdout)\n\(run.stderr)")
        let plain = (try? String(contentsOfFile: work.file("plain.out"), encoding: .utf8)) ?? ""
        let mounted = (try? String(contentsOfFile: work.file("mount.out"), encoding: .utf8)) ?? ""
        let plainLines = plain.split(separator: "\n"), mountedLines = mounted.split(separator: "\n")
        #expect(plainLines.count == Self.probeSteps, "the probe did not finish in the plain directory:\n\(plain)\n\(run.stderr)")
        #expect(mountedLines.count == Self.probeSteps, "the probe did not finish in the mount:\n\(mounted)\n\(run.stderr)")
        for (expected, got) in zip(plainLines, mountedLines) {
            #expect(got == expected, "a plain directory answers \(expected)")
        }
        // The probe must have met refusals, or the comparison shows nothing.
        #expect(plainLines.filter { $0.hasSuffix(" EACCES") || $0.hasSuffix(" False") }.count >= 15, "\(plain)")
    }

    private static let probeSteps = 40

    /// Runs as nobody: a device, its daemon and the mount, all that user's, then the probe in a plain directory and
    /// in the mount, in the app's data folder (two of the container's own folders above it, which the mount holds open).
    private static let asUser = #"""
        set -e
        work=$1; sandboxctl=$2
        export HOME="$work/home" SANDBOXCTL_ROOT="$work/root" SANDBOXCTL_DEVICE_SECRET="$work/device.secret"
        export XDG_RUNTIME_DIR="$work/run" XDG_STATE_HOME="$work/state" XDG_CONFIG_HOME="$work/config"
        app="Library/Application Support/com.example.permissions"
        mkdir -p "$HOME" "$work/plain/$app" "$work/mnt"
        mkdir -m 0700 "$XDG_RUNTIME_DIR"
        printf '1234-test\n' | "$sandboxctl" init --kdf fast --passcode-stdin >/dev/null
        "$sandboxctl" create com.example.permissions >/dev/null
        "$sandboxctl" daemon --grace 1 >/dev/null 2>"$work/daemon.log" &
        daemon=$!
        mount=""
        trap 'fusermount3 -u -z "$work/mnt" 2>/dev/null || true; kill $daemon $mount 2>/dev/null || true; wait' EXIT
        tries=0
        until "$sandboxctl" status >/dev/null 2>&1; do
            tries=$((tries + 1)); [ $tries -lt 400 ] || { echo "the daemon did not start:" >&2; cat "$work/daemon.log" >&2; exit 1; }
            sleep 0.05
        done
        printf '1234-test\n' | "$sandboxctl" unlock --passcode-stdin >/dev/null
        "$sandboxctl" mount com.example.permissions "$work/mnt" --foreground >/dev/null 2>"$work/mount.log" &
        mount=$!
        tries=0
        until grep -q " $work/mnt fuse" /proc/self/mounts; do
            tries=$((tries + 1)); [ $tries -lt 400 ] || { echo "the mount did not come up:" >&2; cat "$work/mount.log" >&2; exit 1; }
            sleep 0.05
        done
        /usr/bin/python3 "$work/probe.py" "$work/plain/$app" >"$work/plain.out"
        /usr/bin/python3 "$work/probe.py" "$work/mnt/$app" >"$work/mount.out"
        """#

    /// One line per step: what was tried, then "ok", the errno's name, or access(2)'s True or False.
    private static let probe = #"""
        import errno, os, sys, time
        base = sys.argv[1]
        os.umask(0o022)
        def at(*names): return os.path.join(base, *names)
        def step(what, call):
            try:
                result = call()
                print(what, result if isinstance(result, bool) else "ok")
            except OSError as error:
                print(what, errno.errorcode[error.errno])
            sys.stdout.flush()
        def make(path, mode=0o644):
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode)
            os.write(fd, b"#!/bin/sh\nexit 0\n")
            os.close(fd)
        def opened(path, flags): os.close(os.open(path, flags))
        def run(path):
            pid = os.fork()
            if pid == 0:
                try: os.execv(path, [path])
                except OSError as error: os._exit(100 + error.errno)
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            if status >= 100: raise OSError(status - 100, os.strerror(status - 100))

        make(at("read-only")); os.chmod(at("read-only"), 0o444)
        step("open a 0444 file for writing", lambda: opened(at("read-only"), os.O_WRONLY))
        step("open a 0444 file for reading", lambda: opened(at("read-only"), os.O_RDONLY))
        step("open a 0444 file with O_TRUNC", lambda: opened(at("read-only"), os.O_RDONLY | os.O_TRUNC))
        step("truncate a 0444 file", lambda: os.truncate(at("read-only"), 0))
        step("access W_OK of a 0444 file", lambda: os.access(at("read-only"), os.W_OK))
        step("access R_OK of a 0444 file", lambda: os.access(at("read-only"), os.R_OK))
        step("access X_OK of a 0444 file", lambda: os.access(at("read-only"), os.X_OK))
        step("set a 0444 file's times to now", lambda: os.utime(at("read-only")))
        step("set a 0444 file's times", lambda: os.utime(at("read-only"), (1, 1)))
        os.chmod(at("read-only"), 0o000)
        step("open a 0000 file for reading", lambda: opened(at("read-only"), os.O_RDONLY))
        step("access F_OK of a 0000 file", lambda: os.access(at("read-only"), os.F_OK))

        make(at("held"))
        holder = os.open(at("held"), os.O_RDWR)
        os.chmod(at("held"), 0o400)
        step("open for writing a file made 0400 while open", lambda: opened(at("held"), os.O_RDWR))
        step("open for reading a file made 0400 while open", lambda: opened(at("held"), os.O_RDONLY))
        os.chmod(at("held"), 0o000)
        step("open for reading a file made 0000 while open", lambda: opened(at("held"), os.O_RDONLY))
        step("write through a descriptor opened before", lambda: os.pwrite(holder, b"still", 0))
        os.close(holder)

        make(at("runnable"), 0o755)
        step("run a 0755 script", lambda: run(at("runnable")))
        os.chmod(at("runnable"), 0o675)
        step("run a 0675 script (no x for its owner)", lambda: run(at("runnable")))
        step("access X_OK of a 0675 file", lambda: os.access(at("runnable"), os.X_OK))

        os.mkdir(at("read-only-folder")); make(at("read-only-folder", "inside"))
        os.chmod(at("read-only-folder"), 0o555)
        step("create in a 0555 folder", lambda: make(at("read-only-folder", "new")))
        step("mkdir in a 0555 folder", lambda: os.mkdir(at("read-only-folder", "sub")))
        step("symlink in a 0555 folder", lambda: os.symlink("inside", at("read-only-folder", "link")))
        step("unlink in a 0555 folder", lambda: os.unlink(at("read-only-folder", "inside")))
        step("rename within a 0555 folder", lambda: os.rename(at("read-only-folder", "inside"), at("read-only-folder", "moved")))
        step("rename out of a 0555 folder", lambda: os.rename(at("read-only-folder", "inside"), at("moved")))
        step("rename into a 0555 folder", lambda: os.rename(at("runnable"), at("read-only-folder", "runnable")))
        step("list a 0555 folder", lambda: sorted(os.listdir(at("read-only-folder"))) == ["inside"] or os.abort())
        step("write a file in a 0555 folder", lambda: opened(at("read-only-folder", "inside"), os.O_WRONLY))
        step("access W_OK of a 0555 folder", lambda: os.access(at("read-only-folder"), os.W_OK))

        os.mkdir(at("hidden")); make(at("hidden", "inside"))
        os.chmod(at("hidden"), 0o311)
        step("list a 0311 folder", lambda: os.listdir(at("hidden")))
        step("access R_OK of a 0311 folder", lambda: os.access(at("hidden"), os.R_OK))
        os.chmod(at("hidden"), 0o755)

        os.mkdir(at("closed")); make(at("closed", "inside"))
        os.chmod(at("closed"), 0o600)
        # The kernel keeps what it learnt of "inside" for libfuse's default attribute timeout (1 s), which the mount
        # keeps; after it, a stat asks again.
        time.sleep(1.2)
        step("stat in a 0600 folder", lambda: os.stat(at("closed", "inside")))
        step("open in a 0600 folder", lambda: opened(at("closed", "inside"), os.O_RDONLY))
        step("create in a 0600 folder", lambda: make(at("closed", "new")))
        step("unlink in a 0600 folder", lambda: os.unlink(at("closed", "inside")))
        step("chdir into a 0600 folder", lambda: os.chdir(at("closed")))
        step("access X_OK of a 0600 folder", lambda: os.access(at("closed"), os.X_OK))
        os.chmod(at("closed"), 0o700)
        step("unlink in the folder made 0700 again", lambda: os.unlink(at("closed", "inside")))

        # Two folders up (in the mount, the container's own Library, held open) loses its search permission: what the
        # kernel does not answer from its cache is refused at once.
        library = os.path.dirname(os.path.dirname(base))
        make(at("deep"))
        os.chmod(library, 0o600)
        step("open below a folder made 0600 two levels up", lambda: opened(at("deep"), os.O_RDONLY))
        step("create below a folder made 0600 two levels up", lambda: make(at("deep-new")))
        step("list below a folder made 0600 two levels up", lambda: os.listdir(base))
        os.chmod(library, 0o755)
        """#
}
