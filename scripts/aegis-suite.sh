#!/usr/bin/env bash
# The file format's suites and the mount's data-path tests again, in a build whose new files are sealed with AEGIS-256 (cipher 3, docs/FORMAT.md
# §4.3), so the cipher a default Debian 12 build lacks is tested too: with Debian unstable's libsodium from
# scripts/fetch-libsodium.sh, in its own build folder (.build-aegis). Skips, saying why, when the main suite already ran
# with AEGIS-256 (a libsodium of 1.0.19 or later found first) or when that libsodium can't be fetched.
#   usage: scripts/aegis-suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if pkg-config --atleast-version=1.0.19 libsodium 2>/dev/null; then
    echo "AEGIS-256 suites: skipped, the main suite ran with libsodium $(pkg-config --modversion libsodium), which has it"
    exit 0
fi
if ! fetched=$(./scripts/fetch-libsodium.sh 2>&1); then
    echo "AEGIS-256 suites: skipped, Debian unstable's libsodium could not be fetched:"
    echo "$fetched" | sed 's/^/    /'
    exit 0
fi
export PKG_CONFIG_PATH=$PWD/.build-deps/libsodium/pkgconfig
echo "AEGIS-256 suites: the file format, the independent decryptor, writes behind and the mount's data paths, with libsodium $(pkg-config --modversion libsodium) (.build-aegis)"
# The expectation makes a build that did not get AEGIS-256 fail, instead of passing with another cipher.
mkdir -p .build-aegis
log=.build-aegis/aegis-suite.log
status=0
PROTECTEDSTORE_EXPECTED_CIPHER=AEGIS-256 swift test --scratch-path .build-aegis \
    --filter 'FileFormatTests|InteropTests|WritesBehindTests|MountTests/(copyRoundTrip|writesBehindAcrossLock|posixSurface|sparseFilesAndAllocation|concurrentFiles)' \
    > "$log" 2>&1 || status=$?
grep -E "✘|error:|Test run with" "$log" || true
[ "$status" -eq 0 ] || echo "AEGIS-256 suites failed; the whole log: $log"
exit "$status"
