#!/usr/bin/env bash
# Builds sandboxctl_<version>_<arch>.deb from what scripts/dist.sh assembled (make deb does both):
#   usage: scripts/build-deb.sh DIST_DIR OUT_DIR
# Prints the package's path. The files are those `make install PREFIX=/usr` installs; the version is the binary's
# own (`sandboxctl --version`); Depends is computed: dpkg-shlibdeps for the libraries the binary and the PAM module
# link, and dpkg's own record of which package owns each program sandboxctl runs (fusermount3 to mount; bwrap to
# launch, recommended; systemd-creds to seal the device secret, suggested).
set -euo pipefail

if [ $# -ne 2 ] || [ ! -f "$1/VERSION" ]; then
    echo "usage: $0 DIST_DIR OUT_DIR (DIST_DIR made by scripts/dist.sh; make deb does both)" >&2
    exit 64
fi
dist=$(cd "$1" && pwd)
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
for tool in dpkg-deb dpkg-shlibdeps dpkg-query gzip; do
    command -v "$tool" >/dev/null || { echo "error: $tool is missing (apt-get install dpkg-dev)" >&2; exit 1; }
done

version=$(cat "$dist/VERSION")
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/sandboxctl_${version}_${arch}

DESTDIR=$stage PREFIX=/usr ZSHCOMPDIR=/usr/share/zsh/vendor-completions "$root/scripts/install.sh" "$dist" >/dev/null
gzip -9n "$stage"/usr/share/man/man1/*.1

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
    local path
    path=$(command -v "$1") || { echo "error: $1 is not installed, so its package can't be named (make deps installs it)" >&2; return 1; }
    for candidate in "$path" "${path#/usr}" "$(readlink -f "$path")"; do
        dpkg-query -S "$candidate" 2>/dev/null | sed -n '1s/:.*//p' | sed 's/,.*//' | grep . && return 0
    done
    echo "error: no installed package owns $path" >&2
    return 1
}
# dpkg-shlibdeps reads debian/control from its working folder; a minimal one names the package.
mkdir -p "$work/shlibs/debian"
printf 'Source: sandboxctl\n\nPackage: sandboxctl\nArchitecture: any\n' > "$work/shlibs/debian/control"
shlibs=$(cd "$work/shlibs" && dpkg-shlibdeps -O "$stage/usr/bin/sandboxctl" "$(find "$stage" -name pam_sandboxctl.so)" 2>/dev/null \
    | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || { echo "error: dpkg-shlibdeps found no libraries for $stage/usr/bin/sandboxctl" >&2; exit 1; }
depends="$shlibs, $(owner_of fusermount3)"
recommends=$(owner_of bwrap)
suggests=$(owner_of systemd-creds)

installed_size=$(du -sk --apparent-size "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_size/" \
    -e "s/@DEPENDS@/$depends/" -e "s/@RECOMMENDS@/$recommends/" -e "s/@SUGGESTS@/$suggests/" \
    "$root/packaging/debian/control.in" > "$stage/DEBIAN/control"
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$stage/DEBIAN/md5sums"
chmod 644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"

mkdir -p "$out"
package=$out/sandboxctl_${version}_${arch}.deb
# gzip rather than xz: the binary holds Foundation and ICU, and xz would take most of a minute on it.
dpkg-deb --root-owner-group -Zgzip --build "$stage" "$package" >/dev/null
echo "$package"
