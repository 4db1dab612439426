#!/usr/bin/env bash
# Installs what scripts/dist.sh assembled, or removes it again:
#   usage: scripts/install.sh DIST_DIR        (make install)
#          scripts/install.sh --uninstall     (make uninstall)
# Places (each overridable from the environment, as make passes them): PREFIX (default /usr/local), DESTDIR (a staging
# root for packages), BINDIR, MANDIR, BASHCOMPDIR, ZSHCOMPDIR, FISHCOMPDIR, SYSTEMDUSERUNITDIR, PAMDIR.
# The systemd user units name PREFIX's sandboxctl (`sandboxctl setup systemd --user`; systemd/ holds them for /usr).
# A failed install removes what it had put in place, so it changes nothing.
set -Eeuo pipefail
umask 022

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
case $PREFIX in
    /*) ;;
    *) echo "error: PREFIX must be an absolute path (the systemd units name PREFIX/bin/sandboxctl), not '$PREFIX'; use \$HOME, not ~" >&2
       exit 64 ;;
esac
BINDIR=${BINDIR:-$PREFIX/bin}
MANDIR=${MANDIR:-$PREFIX/share/man}
BASHCOMPDIR=${BASHCOMPDIR:-$PREFIX/share/bash-completion/completions}
FISHCOMPDIR=${FISHCOMPDIR:-$PREFIX/share/fish/vendor_completions.d}
# Where each reader looks: Debian's zsh reads vendor-completions under /usr (site-functions elsewhere); a user's
# systemd reads ~/.local/share/systemd/user, the system's PREFIX/lib/systemd/user.
if [ -z "${ZSHCOMPDIR:-}" ]; then
    ZSHCOMPDIR=$PREFIX/share/zsh/site-functions
    [ "$PREFIX" = /usr ] && [ -d /usr/share/zsh/vendor-completions ] && ZSHCOMPDIR=/usr/share/zsh/vendor-completions
fi
if [ -z "${SYSTEMDUSERUNITDIR:-}" ]; then
    SYSTEMDUSERUNITDIR=$PREFIX/lib/systemd/user
    [ -n "${HOME:-}" ] && [ "$PREFIX" = "$HOME/.local" ] && SYSTEMDUSERUNITDIR=$PREFIX/share/systemd/user
fi
# libpam loads modules from its own folder: with PREFIX=/usr, the one holding this architecture's pam_unix.so;
# elsewhere the multiarch folder under PREFIX, which a PAM line then names by its full path.
if [ -z "${PAMDIR:-}" ]; then
    multiarch=$(${CC:-cc} -print-multiarch 2>/dev/null || true)
    PAMDIR=$PREFIX/lib/${multiarch:+$multiarch/}security
    if [ "$PREFIX" = /usr ]; then
        for folder in /usr/lib/${multiarch:+$multiarch/}security /lib/${multiarch:+$multiarch/}security /usr/lib/security /lib/security; do
            if [ -f "$folder/pam_unix.so" ]; then PAMDIR=$folder; break; fi
        done
    fi
fi
UNITS=(sandboxctl.socket sandboxctl.service sandboxctl-mount@.service)

installed_files() {
    printf '%s\n' "$BINDIR/sandboxctl" "$BASHCOMPDIR/sandboxctl" "$ZSHCOMPDIR/_sandboxctl" "$FISHCOMPDIR/sandboxctl.fish" \
        "$PAMDIR/pam_sandboxctl.so"
    for unit in "${UNITS[@]}"; do printf '%s\n' "$SYSTEMDUSERUNITDIR/$unit"; done
    for page in "$DESTDIR$MANDIR"/man1/sandboxctl.1 "$DESTDIR$MANDIR"/man1/sandboxctl-*.1; do
        [ -e "$page" ] && printf '%s\n' "${page#"$DESTDIR"}"
    done
    return 0
}

# Files a Debian package owns are the package manager's to remove or replace.
refuse_packaged() {
    [ -z "$DESTDIR" ] && command -v dpkg-query >/dev/null || return 0
    local owner
    if owner=$(dpkg-query -S "$BINDIR/sandboxctl" 2>/dev/null); then
        echo "error: $BINDIR/sandboxctl belongs to the Debian package ${owner%%:*}; use apt remove ${owner%%:*}, or another PREFIX" >&2
        exit 1
    fi
}

if [ "${1:-}" = "--uninstall" ]; then
    refuse_packaged
    mapfile -t files < <(installed_files)
    for file in "${files[@]}"; do
        rm -f -- "$DESTDIR$file"
    done
    echo "Removed sandboxctl from $DESTDIR$PREFIX"
    exit 0
fi

if [ $# -ne 1 ] || [ ! -f "$1/VERSION" ]; then
    echo "usage: $0 DIST_DIR (made by scripts/dist.sh; make install does both) | $0 --uninstall" >&2
    exit 64
fi
dist=$1
refuse_packaged

placed=()
rollback() {
    for file in "${placed[@]}"; do rm -f -- "$file"; done
    echo "error: installing into $DESTDIR$PREFIX failed (above); the files installed so far were removed again" >&2
}
trap rollback ERR
put() {
    local mode=$1 source=$2 target=$DESTDIR$3
    install -d "$(dirname "$target")"
    install -m "$mode" "$source" "$target"
    placed+=("$target")
}

put 755 "$dist/bin/sandboxctl" "$BINDIR/sandboxctl"
for page in "$dist"/man/man1/*.1; do
    put 644 "$page" "$MANDIR/man1/$(basename "$page")"
done
put 644 "$dist/completions/sandboxctl.bash" "$BASHCOMPDIR/sandboxctl"
put 644 "$dist/completions/_sandboxctl" "$ZSHCOMPDIR/_sandboxctl"
put 644 "$dist/completions/sandboxctl.fish" "$FISHCOMPDIR/sandboxctl.fish"
put 644 "$dist/pam/pam_sandboxctl.so" "$PAMDIR/pam_sandboxctl.so"
units=$(mktemp -d)
trap 'rm -rf "$units"' EXIT
env -u SANDBOXCTL_ROOT -u SANDBOXCTL_DEVICE_SECRET "$dist/bin/sandboxctl" setup systemd --user \
    --unit-directory "$units" --executable "$BINDIR/sandboxctl" >/dev/null
for unit in "${UNITS[@]}"; do
    put 644 "$units/$unit" "$SYSTEMDUSERUNITDIR/$unit"
done
echo "Installed sandboxctl $(cat "$dist/VERSION") into $DESTDIR$PREFIX"
