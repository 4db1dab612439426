#!/usr/bin/env bash
# Installs what scripts/dist.sh assembled, or removes it again:
#   usage: scripts/install.sh DIST_DIR        (make install)
#          scripts/install.sh --uninstall     (make uninstall)
# Places (each overridable from the environment, as make passes them): PREFIX (default /usr/local), DESTDIR (a staging
# root for packages), BINDIR, MANDIR, BASHCOMPDIR, ZSHCOMPDIR, FISHCOMPDIR, SYSTEMDUSERUNITDIR, PAMDIR.
# The systemd user units name PREFIX's sandboxctl (`sandboxctl setup systemd --user`, the units of docs/systemd).
set -euo pipefail

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BINDIR=${BINDIR:-$PREFIX/bin}
MANDIR=${MANDIR:-$PREFIX/share/man}
BASHCOMPDIR=${BASHCOMPDIR:-$PREFIX/share/bash-completion/completions}
ZSHCOMPDIR=${ZSHCOMPDIR:-$PREFIX/share/zsh/site-functions}
FISHCOMPDIR=${FISHCOMPDIR:-$PREFIX/share/fish/vendor_completions.d}
SYSTEMDUSERUNITDIR=${SYSTEMDUSERUNITDIR:-$PREFIX/lib/systemd/user}
# libpam loads modules from its own folder: with PREFIX=/usr, the one holding the system's pam_unix.so; elsewhere the
# multiarch folder under PREFIX, which a PAM line then names by its full path.
if [ -z "${PAMDIR:-}" ]; then
    system_pam_unix=$(find /lib /usr/lib -name pam_unix.so -path '*/security/*' 2>/dev/null | head -n 1 || true)
    multiarch=$(${CC:-cc} -print-multiarch 2>/dev/null || true)
    if [ "$PREFIX" = /usr ] && [ -n "$system_pam_unix" ]; then
        PAMDIR=$(dirname "$system_pam_unix")
    else
        PAMDIR=$PREFIX/lib/${multiarch:+$multiarch/}security
    fi
fi
UNITS=(sandboxctl.socket sandboxctl.service sandboxctl-mount@.service)

installed_files() {
    echo "$BINDIR/sandboxctl"
    echo "$BASHCOMPDIR/sandboxctl" "$ZSHCOMPDIR/_sandboxctl" "$FISHCOMPDIR/sandboxctl.fish"
    for unit in "${UNITS[@]}"; do echo "$SYSTEMDUSERUNITDIR/$unit"; done
    echo "$PAMDIR/pam_sandboxctl.so"
}

if [ "${1:-}" = "--uninstall" ]; then
    for file in $(installed_files); do
        rm -f "$DESTDIR$file"
    done
    rm -f "$DESTDIR$MANDIR/man1/sandboxctl.1" "$DESTDIR$MANDIR"/man1/sandboxctl-*.1
    echo "Removed sandboxctl from $DESTDIR$PREFIX"
    exit 0
fi

if [ $# -ne 1 ] || [ ! -x "$1/bin/sandboxctl" ]; then
    echo "usage: $0 DIST_DIR (made by scripts/dist.sh; make install does both) | $0 --uninstall" >&2
    exit 64
fi
dist=$1
case $PREFIX in
    /*) ;;
    *) echo "error: PREFIX must be an absolute path (the systemd units name PREFIX/bin/sandboxctl), not '$PREFIX'" >&2; exit 64 ;;
esac

install -d "$DESTDIR$BINDIR" "$DESTDIR$MANDIR/man1" "$DESTDIR$BASHCOMPDIR" "$DESTDIR$ZSHCOMPDIR" "$DESTDIR$FISHCOMPDIR" \
    "$DESTDIR$SYSTEMDUSERUNITDIR" "$DESTDIR$PAMDIR"
install -m 755 "$dist/bin/sandboxctl" "$DESTDIR$BINDIR/sandboxctl"
install -m 644 "$dist"/man/man1/*.1 "$DESTDIR$MANDIR/man1/"
install -m 644 "$dist/completions/sandboxctl.bash" "$DESTDIR$BASHCOMPDIR/sandboxctl"
install -m 644 "$dist/completions/_sandboxctl" "$DESTDIR$ZSHCOMPDIR/_sandboxctl"
install -m 644 "$dist/completions/sandboxctl.fish" "$DESTDIR$FISHCOMPDIR/sandboxctl.fish"
install -m 644 "$dist/pam/pam_sandboxctl.so" "$DESTDIR$PAMDIR/pam_sandboxctl.so"
env -u SANDBOXCTL_ROOT -u SANDBOXCTL_DEVICE_SECRET "$dist/bin/sandboxctl" setup systemd --user \
    --unit-directory "$DESTDIR$SYSTEMDUSERUNITDIR" --executable "$BINDIR/sandboxctl" >/dev/null
chmod 644 "${UNITS[@]/#/$DESTDIR$SYSTEMDUSERUNITDIR/}"
echo "Installed sandboxctl $(cat "$dist/VERSION") into $DESTDIR$PREFIX"
