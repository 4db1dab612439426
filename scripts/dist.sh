#!/usr/bin/env bash
# Assembles what `make install` and `make deb` ship, from a release build, without building Swift (the packaging tests
# run it inside `swift test`):
#   usage: scripts/dist.sh BIN_DIR OUT_DIR
# BIN_DIR holds sandboxctl (built with --static-swift-stdlib --disable-local-rpath, as `make dist` does) and the
# argument parser's generate-manual. OUT_DIR gets:
#   bin/sandboxctl                    stripped
#   man/man1/sandboxctl*.1            one page per subcommand (generate-manual, then scripts/man-pages.py)
#   completions/{sandboxctl.bash,_sandboxctl,sandboxctl.fish}
#   pam/pam_sandboxctl.so             the PAM module, built by cc (no Swift runtime inside a login program)
#   VERSION                           what `sandboxctl --version` prints: the one version of the release
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 BIN_DIR OUT_DIR" >&2
    exit 64
fi
bin_dir=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
umask 022
for tool in cc strip readelf python3; do
    command -v "$tool" >/dev/null || { echo "error: $tool is missing (apt-get install gcc binutils python3)" >&2; exit 1; }
done
for tool in "$bin_dir/sandboxctl" "$bin_dir/generate-manual"; do
    if [ ! -x "$tool" ]; then
        echo "error: $tool is missing; build it first (make dist builds both)" >&2
        exit 1
    fi
done
needed=$(readelf -d "$bin_dir/sandboxctl")
if [[ $needed == *libswiftCore* ]]; then
    echo "error: $bin_dir/sandboxctl links the Swift runtime dynamically; build it with --static-swift-stdlib (make dist)" >&2
    exit 1
fi

# Everything goes into a new folder that replaces OUT_DIR only when complete: a failed step leaves the last good one.
mkdir -p "$(dirname "$out")"
staging=$(mktemp -d "${out%/}.new.XXXXXX")
generated=$(mktemp -d)
trap 'rm -rf "$staging" "$generated"' EXIT
mkdir -p "$staging/bin" "$staging/man/man1" "$staging/completions" "$staging/pam"

# Nothing outside the binary's own code may be copied in: strip removes the symbols and the build's notes.
strip --strip-unneeded --remove-section=.comment --remove-section=.note -o "$staging/bin/sandboxctl" "$bin_dir/sandboxctl"
chmod 755 "$staging/bin/sandboxctl"
version=$("$staging/bin/sandboxctl" --version)

# Reproducible pages: dated by SOURCE_DATE_EPOCH, else by the last commit, as Debian's tools do.
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%F)
elif date=$(git -C "$root" log -1 --format=%cs 2>/dev/null) && [ -n "$date" ]; then
    :
else
    date=$(date -u +%F)
fi
"$bin_dir/generate-manual" "$staging/bin/sandboxctl" --multi-page --date "$date" --output-directory "$generated" >/dev/null
python3 "$root/scripts/man-pages.py" "$generated" "$staging/man/man1" "$version"

# bash sources its completions, so the generated #! line would only mislead (lintian: bash-completion-with-hashbang).
"$staging/bin/sandboxctl" --generate-completion-script bash | sed '1{/^#!/d}' > "$staging/completions/sandboxctl.bash"
"$staging/bin/sandboxctl" --generate-completion-script zsh > "$staging/completions/_sandboxctl"
"$staging/bin/sandboxctl" --generate-completion-script fish > "$staging/completions/sandboxctl.fish"

# Debian's hardening flags (dpkg-buildflags), so lintian finds them and a login program gets them.
${CC:-cc} -shared -fPIC -O2 -g0 -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong -fstack-clash-protection \
    -I "$root/Sources/PAMSandboxctl/include" "$root/Sources/PAMSandboxctl/pam_sandboxctl.c" \
    -Wl,-z,relro,-z,now -Wl,--as-needed -lpam -o "$staging/pam/pam_sandboxctl.so"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$staging/pam/pam_sandboxctl.so"
chmod 644 "$staging/pam/pam_sandboxctl.so"

# VERSION last: it is what make takes for a finished folder.
echo "$version" > "$staging/VERSION"
chmod 755 "$staging"
rm -rf "$out"
mv "$staging" "$out"
