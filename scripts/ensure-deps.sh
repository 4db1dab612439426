#!/usr/bin/env bash
# Installs the system packages the build needs (as root), or prints the exact command to run.
#   usage: scripts/ensure-deps.sh [build|all]
# build: what building, `make install` and `make deb` need; all (the default): also what the demo and the tests run.
set -euo pipefail
mode=${1:-all}
case $mode in
    build|all) ;;
    *) echo "usage: $0 [build|all]" >&2; exit 64 ;;
esac

packages=()
# Building: libsodium, libfuse3, libsystemd (sd-bus, for the lock triggers), libpam (the PAM module) and libsqlite3
# (the reference notes store) through pkg-config or their headers; python3 shapes the man pages.
command -v pkg-config >/dev/null 2>&1 || packages+=(pkg-config)
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists libsodium; then
    packages+=(libsodium-dev)
fi
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists fuse3; then
    packages+=(libfuse3-dev)
fi
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists sqlite3; then
    packages+=(libsqlite3-dev)
fi
[ -f /usr/include/systemd/sd-bus.h ] || packages+=(libsystemd-dev)
[ -f /usr/include/security/pam_modules.h ] || packages+=(libpam0g-dev)
command -v python3 >/dev/null 2>&1 || packages+=(python3)
# dist.sh compiles the PAM module with cc and strips with binutils.
command -v cc >/dev/null 2>&1 || packages+=(gcc)
command -v strip >/dev/null 2>&1 || packages+=(binutils)
# sandboxctl mount runs fusermount3 (and make deb names its package in Depends); make deb needs dpkg-shlibdeps.
command -v fusermount3 >/dev/null 2>&1 || packages+=(fuse3)
command -v dpkg-shlibdeps >/dev/null 2>&1 || packages+=(dpkg-dev)

if [ "$mode" = all ]; then
    # The mount tests drive sqlite3; the Inbox drop folder's write through rsync and set an annotation with setfattr.
    command -v sqlite3 >/dev/null 2>&1 || packages+=(sqlite3)
    command -v rsync >/dev/null 2>&1 || packages+=(rsync)
    command -v setfattr >/dev/null 2>&1 || packages+=(attr)
    # The mount's round-trip tests compare ACLs with getfacl and set them with setfacl.
    command -v setfacl >/dev/null 2>&1 || packages+=(acl)
    # sandboxctl launch runs apps in a bubblewrap sandbox.
    command -v bwrap >/dev/null 2>&1 || packages+=(bubblewrap)
    # The lock triggers' tests run a private dbus-daemon and a stand-in logind in Debian's Python.
    command -v dbus-daemon >/dev/null 2>&1 || packages+=(dbus)
    /usr/bin/python3 -c 'import dbus' >/dev/null 2>&1 || packages+=(python3-dbus)
    /usr/bin/python3 -c 'import gi' >/dev/null 2>&1 || packages+=(python3-gi)
    # The PAM module's tests drive it with pamtester.
    command -v pamtester >/dev/null 2>&1 || packages+=(pamtester)
    # The packaging tests check the man pages with man and the Debian package with lintian.
    command -v man >/dev/null 2>&1 || packages+=(man-db)
    command -v lintian >/dev/null 2>&1 || packages+=(lintian)
fi

if ! command -v swift >/dev/null 2>&1; then
    echo "error: swift is not on PATH. Install Swift 6 (https://www.swift.org/install/linux/) and run this again." >&2
    exit 1
fi

# Optional: the independent decryptor test (tools/independent_decrypt.py) needs PyNaCl; it is skipped without it.
if [ "$mode" = all ] && command -v python3 >/dev/null 2>&1 && ! python3 -c 'import nacl.bindings' >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        # pip for a pip-managed Python; Debian's own Python refuses pip (PEP 668) and takes the apt package.
        python3 -m pip install --quiet pynacl >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq python3-nacl >/dev/null 2>&1 && python3 -c 'import nacl.bindings' >/dev/null 2>&1; } \
            || echo "note: could not install PyNaCl; the independent decryptor test will be skipped"
    else
        echo "note: PyNaCl is missing; the independent decryptor test will be skipped (python3 -m pip install --user pynacl)"
    fi
fi

[ ${#packages[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    echo "Installing missing system packages: ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${packages[@]}" >/dev/null
else
    echo "error: missing system packages: ${packages[*]}" >&2
    echo "Install them with:" >&2
    echo "    sudo apt-get install -y ${packages[*]}" >&2
    exit 1
fi
