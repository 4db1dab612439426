#!/usr/bin/env bash
# Builds sandboxctl_<version>_<arch>.deb from what scripts/dist.sh assembled (make deb does both):
#   usage: scripts/build-deb.sh DIST_DIR OUT_DIR
# Prints the package's path. The files are those `make install PREFIX=/usr` installs, in Debian's folders; the version
# is the binary's own (`sandboxctl --version`); Depends is computed: dpkg-shlibdeps for the libraries the binary and
# the PAM module link, and dpkg's own record of which package owns each program sandboxctl runs (fusermount3 to mount;
# bwrap to launch, recommended; systemd-creds to seal the device secret, suggested). A program missing on this machine
# can't be attributed: a missing fusermount3 stops the build; for the optional ones Debian's names stand in.
set -euo pipefail
umask 022

if [ $# -ne 2 ] || [ ! -f "$1/VERSION" ]; then
    echo "usage: $0 DIST_DIR OUT_DIR (DIST_DIR made by scripts/dist.sh; make deb does both)" >&2
    exit 64
fi
dist=$(cd "$1" && pwd)
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
for tool in dpkg-deb dpkg-shlibdeps dpkg-query dpkg-architecture gzip; do
    command -v "$tool" >/dev/null || { echo "error: $tool is missing (apt-get install dpkg-dev)" >&2; exit 1; }
done

version=$(cat "$dist/VERSION")
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/sandboxctl_${version}_${arch}

# Every folder named, so nothing from the caller's environment (make deb MANDIR=...) moves a file.
DESTDIR=$stage PREFIX=/usr BINDIR=/usr/bin MANDIR=/usr/share/man BASHCOMPDIR=/usr/share/bash-completion/completions \
    ZSHCOMPDIR=/usr/share/zsh/vendor-completions FISHCOMPDIR=/usr/share/fish/vendor_completions.d \
    SYSTEMDUSERUNITDIR=/usr/lib/systemd/user PAMDIR=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/security \
    "$root/scripts/install.sh" "$dist" >/dev/null
gzip -9n "$stage"/usr/share/man/man1/*.1
# dpkg keeps its own list of the package's files; install.sh's manifest is for make uninstall.
rm "$stage/usr/share/sandboxctl/installed-files"
rmdir "$stage/usr/share/sandboxctl"

# Debian policy: a copyright file and, for a package that is its own upstream, changelog.gz.
doc=$stage/usr/share/doc/sandboxctl
install -d "$doc"
install -m 644 "$root/packaging/debian/copyright" "$doc/copyright"
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    released=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
else
    released=$(date -u -R -d "$(git -C "$root" log -1 --format=%cI 2>/dev/null || date -u -Iseconds)")
fi
maintainer=$(sed -n 's/^Maintainer: //p' "$root/packaging/debian/control.in")
printf 'sandboxctl (%s) unstable; urgency=medium\n\n  * Release %s.\n\n -- %s  %s\n' \
    "$version" "$version" "$maintainer" "$released" | gzip -9n > "$doc/changelog.gz"
chmod 644 "$doc/changelog.gz"

# The package that installed a program, from dpkg's own database. Merged /usr means dpkg may know it as /bin/NAME.
owner_of() {
    local path candidate
    path=$(command -v "$1") || return 1
    for candidate in "$path" "${path#/usr}" "$(readlink -f "$path")"; do
        dpkg-query -S "$candidate" 2>/dev/null | sed -n '1s/:.*//p' | sed 's/,.*//' | grep . && return 0
    done
    return 1
}
# dpkg-shlibdeps reads debian/control from its working folder; a minimal one names the package.
mkdir -p "$work/shlibs/debian"
printf 'Source: sandboxctl\n\nPackage: sandboxctl\nArchitecture: any\n' > "$work/shlibs/debian/control"
if ! shlibs=$(cd "$work/shlibs" && dpkg-shlibdeps -O "$stage/usr/bin/sandboxctl" "$(find "$stage" -name pam_sandboxctl.so)" 2>"$work/shlibs.log"); then
    cat "$work/shlibs.log" >&2
    echo "error: dpkg-shlibdeps could not name the packages of the libraries $stage/usr/bin/sandboxctl links (above); each must come from a Debian package" >&2
    exit 1
fi
shlibs=$(sed -n 's/^shlibs:Depends=//p' <<< "$shlibs")
[ -n "$shlibs" ] || { echo "error: dpkg-shlibdeps found no libraries for $stage/usr/bin/sandboxctl" >&2; exit 1; }
fuse=$(owner_of fusermount3) || { echo "error: no installed package provides fusermount3, which sandboxctl mount runs (apt-get install fuse3)" >&2; exit 1; }
depends="$shlibs, $fuse"
# A program not installed here can't be attributed by dpkg: Debian's name for its package stands in, with a warning.
optional_field() {
    local field=$1 program=$2 fallback=$3 package
    if ! package=$(owner_of "$program"); then
        package=$fallback
        echo "warning: $program is not installed here; $field names Debian's $fallback without checking it" >&2
    fi
    printf '%s: %s\n' "$field" "$package"
}
installed_size=$(du -sk --apparent-size "$stage" | cut -f1)
install -d -m 755 "$stage/DEBIAN"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_size/" -e "s/@DEPENDS@/$depends/" \
    "$root/packaging/debian/control.in" > "$stage/DEBIAN/control"
# The optional relations go after Depends, where Debian's field order has them.
{ optional_field Recommends bwrap bubblewrap; optional_field Suggests systemd-creds systemd; } > "$work/relations"
sed -i "/^Depends:/r $work/relations" "$stage/DEBIAN/control"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$stage/DEBIAN/md5sums"
chmod 644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"

mkdir -p "$out"
package=$out/sandboxctl_${version}_${arch}.deb
# gzip rather than xz: the binary holds Foundation and ICU, and xz would take most of a minute on it.
dpkg-deb --root-owner-group -Zgzip --build "$stage" "$package" >/dev/null
echo "$package"
