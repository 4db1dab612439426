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

MANIFEST=$PREFIX/share/sandboxctl/installed-files

# The Debian package that owns a path, if any: such files are the package manager's to replace or remove.
package_of() {
    [ -z "$DESTDIR" ] && command -v dpkg-query >/dev/null || return 1
    local owner
    owner=$(dpkg-query -S "$1" 2>/dev/null) || return 1
    printf '%s\n' "${owner%%:*}"
}

if [ "${1:-}" = "--uninstall" ]; then
    # The manifest names exactly what the install put in place, wherever the folders were computed to be then.
    if [ ! -f "$DESTDIR$MANIFEST" ]; then
        echo "error: nothing to remove: $DESTDIR$MANIFEST, the list an install leaves, is missing (installed with another PREFIX or DESTDIR?)" >&2
        exit 1
    fi
    mapfile -t files < "$DESTDIR$MANIFEST"
    files+=("$MANIFEST")
    for file in "${files[@]}"; do
        if owner=$(package_of "$file"); then
            echo "error: $file belongs to the Debian package $owner; remove it with apt remove $owner (nothing was removed)" >&2
            exit 1
        fi
    done
    for file in "${files[@]}"; do
        rm -f -- "$DESTDIR$file"
    done
    rmdir "$DESTDIR$(dirname "$MANIFEST")" 2>/dev/null || true
    echo "Removed sandboxctl from $DESTDIR$PREFIX"
    exit 0
fi

if [ $# -ne 1 ] || [ ! -f "$1/VERSION" ]; then
    echo "usage: $0 DIST_DIR (made by scripts/dist.sh; make install does both) | $0 --uninstall" >&2
    exit 64
fi
dist=$1
work=$(mktemp -d)

# Every file goes first beside its target as NAME.sandboxctl-new; only when all are written are they renamed into
# place. A failure removes the new files and leaves an earlier installation as it was.
sources=() targets=() staged=()
plan() {
    sources+=("$1:$2")
    targets+=("$3")
}
plan 755 "$dist/bin/sandboxctl" "$BINDIR/sandboxctl"
for page in "$dist"/man/man1/*.1; do
    plan 644 "$page" "$MANDIR/man1/$(basename "$page")"
done
plan 644 "$dist/completions/sandboxctl.bash" "$BASHCOMPDIR/sandboxctl"
plan 644 "$dist/completions/_sandboxctl" "$ZSHCOMPDIR/_sandboxctl"
plan 644 "$dist/completions/sandboxctl.fish" "$FISHCOMPDIR/sandboxctl.fish"
plan 644 "$dist/pam/pam_sandboxctl.so" "$PAMDIR/pam_sandboxctl.so"
for unit in "${UNITS[@]}"; do
    plan 644 "$work/$unit" "$SYSTEMDUSERUNITDIR/$unit"
done
printf '%s\n' "${targets[@]}" > "$work/installed-files"
plan 644 "$work/installed-files" "$MANIFEST"

for target in "${targets[@]}"; do
    if owner=$(package_of "$target"); then
        echo "error: $target belongs to the Debian package $owner; use apt for it, or another PREFIX (nothing was installed)" >&2
        rm -rf "$work"
        exit 1
    fi
done

rollback() {
    [ "$BASHPID" = "$$" ] || return 0
    for file in "${staged[@]}"; do rm -f -- "$file"; done
    rm -rf "$work"
    echo "error: installing into $DESTDIR$PREFIX failed (above); nothing was changed" >&2
}
trap rollback ERR
trap 'rollback; exit 130' INT TERM
trap 'rm -rf "$work"' EXIT

env -u SANDBOXCTL_ROOT -u SANDBOXCTL_DEVICE_SECRET "$dist/bin/sandboxctl" setup systemd --user \
    --unit-directory "$work" --executable "$BINDIR/sandboxctl" >/dev/null
for index in "${!targets[@]}"; do
    target=$DESTDIR${targets[$index]}
    source=${sources[$index]#*:} mode=${sources[$index]%%:*}
    install -d "$(dirname "$target")"
    staged+=("$target.sandboxctl-new")
    install -m "$mode" "$source" "$target.sandboxctl-new"
done
for target in "${targets[@]}"; do
    mv -f -- "$DESTDIR$target.sandboxctl-new" "$DESTDIR$target"
done
trap - ERR INT TERM
echo "Installed sandboxctl $(cat "$dist/VERSION") into $DESTDIR$PREFIX"
