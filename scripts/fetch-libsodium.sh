#!/usr/bin/env bash
# Fetches Debian unstable's libsodium 1.0.22 (headers and static library, checked against a pinned SHA-256) into
# .build-deps/libsodium, for a build with AEGIS-256 where the system's libsodium predates 1.0.19 (Debian 12 ships
# 1.0.18). Nothing is installed: a build uses it only with the PKG_CONFIG_PATH this prints, and links it statically.
#   usage: scripts/fetch-libsodium.sh
# Read README, "A faster cipher", first: files such a build creates open only in builds that have AEGIS-256 too.
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.0.22-2
pool=https://deb.debian.org/debian/pool/main/libs/libsodium
# The -dev package (headers, static archive) and the shared library, which only the independent decryptor's test
# loads (tools/independent_decrypt.py, through ctypes: Python can't use an archive).
packages=(
    "libsodium-dev_${version}_amd64.deb 0ef6551671d78e5f5f9baca7ce545ae6a5f328e57b8be2d249b52f144fbcb8f9"
    "libsodium26_${version}_amd64.deb 18d593b1aaab48f126bd3636f009fc5294f948c4960c171b7e73eab9f814f198"
)
target=$PWD/.build-deps/libsodium

architecture=$(dpkg --print-architecture 2>/dev/null || uname -m)
if [ "$architecture" != amd64 ] && [ "$architecture" != x86_64 ]; then
    echo "error: only the amd64 package is pinned here; install libsodium 1.0.19 or later from your distribution instead" >&2
    exit 1
fi
if [ "$(cat "$target/VERSION" 2>/dev/null)" = "$version" ]; then
    echo "libsodium $version is in $target already (checked when it was fetched). Build with it after:"
    echo "    export PKG_CONFIG_PATH=$target/pkgconfig"
    exit 0
fi
for tool in curl dpkg-deb sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is missing (apt-get install curl dpkg coreutils)" >&2; exit 1; }
done

# Staged beside the target, so the last step is a rename on one file system.
mkdir -p "$(dirname "$target")"
work=$(mktemp -d "$(dirname "$target")/.libsodium.XXXXXX")
trap 'rm -rf "$work"' EXIT
for entry in "${packages[@]}"; do
    read -r package sha256 <<< "$entry"
    if ! curl -fsSL --retry 2 -o "$work/$package" "$pool/$package"; then
        echo "error: could not download $pool/$package; Debian removes a version from its pool once unstable moves on," >&2
        echo "so look for the current libsodium-dev and libsodium26 in $pool/ and update this script's version and sha256 sums" >&2
        exit 1
    fi
    if ! echo "$sha256  $work/$package" | sha256sum --check --status; then
        echo "error: $package does not have the pinned SHA-256 $sha256; nothing was changed" >&2
        exit 1
    fi
    dpkg-deb -x "$work/$package" "$work/root"
done

# Headers and the static archive only, under a name no shared library has: other packages' -L/usr/lib/... come
# first on the link line, where -lsodium would find the system's libsodium.so. The programs built need nothing of
# this at run time.
mkdir -p "$work/staged/lib" "$work/staged/pkgconfig" "$work/staged/shared"
cp -r "$work/root/usr/include" "$work/staged/include"
cp "$work/root/usr/lib/x86_64-linux-gnu/libsodium.a" "$work/staged/lib/libsodium-static.a"
cp "$work/root/usr/lib/x86_64-linux-gnu/libsodium.so.26" "$work/staged/shared/libsodium.so"
# pcfiledir: the folder of this file, so the checkout can move.
cat > "$work/staged/pkgconfig/libsodium.pc" <<EOF
prefix=\${pcfiledir}/..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: libsodium
Version: ${version%-*}
Description: libsodium $version from Debian unstable, static, for ProtectedStore's AEGIS-256
Libs: -L\${libdir} -lsodium-static
Cflags: -I\${includedir}
EOF
echo "$version" > "$work/staged/VERSION"
# An earlier copy goes only once the new one is complete; a build that used it needs nothing of it at run time.
[ -e "$target" ] && mv "$target" "$work/previous"
mv "$work/staged" "$target"

echo "libsodium ${version%-*} is in $target. Build with it (swift build, make) after:"
echo "    export PKG_CONFIG_PATH=$target/pkgconfig"
