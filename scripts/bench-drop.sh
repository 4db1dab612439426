#!/usr/bin/env bash
# Benchmarks the Inbox drop folder (`sandboxctl inbox mount`) against `sandboxctl inbox deliver` of the same file and
# against `cp` into a plain folder on the same disk, in one run: median wall time of N rounds each, from the start of
# the copy until the item is in the Inbox (for the drop folder: until `inbox list` shows it), and MB/s.
#
#   scripts/bench-drop.sh [--rounds N] [--size-mib N]
#
# Release build; a device with the fast KDF in a temporary folder under /var/tmp, removed at the end.
set -euo pipefail

rounds=5
size_mib=256
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --size-mib) size_mib="$2"; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

cd "$(dirname "$0")/.."
./scripts/ensure-deps.sh
make --no-print-directory release   # the build that ships (static Swift runtime), as make test scans it
sandboxctl="$(swift build -c release --show-bin-path)/sandboxctl"

work=$(mktemp -d /var/tmp/bench-drop.XXXXXX)
cleanup() {
    fusermount3 -u -z "$work/drop" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
export SANDBOXCTL_ROOT="$work/root" XDG_STATE_HOME="$work/state"
echo bench | "$sandboxctl" init --kdf fast --passcode-stdin >/dev/null
"$sandboxctl" create com.example.bench >/dev/null
mkdir -p "$work/drop" "$work/plain"
head -c "$((size_mib << 20))" /dev/urandom > "$work/source.bin"
"$sandboxctl" inbox mount com.example.bench "$work/drop" --settle 0 >/dev/null

now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

: > "$work/cp.times"; : > "$work/deliver.times"; : > "$work/drop.times"
for round in $(seq "$rounds"); do
    sync
    start=$(now); cp "$work/source.bin" "$work/plain/copy-$round.bin"; sync "$work/plain/copy-$round.bin"; end=$(now)
    awk "BEGIN { print $end - $start }" >> "$work/cp.times"
    rm "$work/plain/copy-$round.bin"

    start=$(now); "$sandboxctl" inbox deliver com.example.bench "$work/source.bin" >/dev/null; end=$(now)
    awk "BEGIN { print $end - $start }" >> "$work/deliver.times"

    # Delivered when its staged file (the one name in the root that is in clear) has been renamed into the Inbox.
    start=$(now); cp "$work/source.bin" "$work/drop/dropped-$round.bin"
    while [ -n "$(find "$work/root" -name '.sandboxctl-tmp-drop-*' -print -quit)" ]; do sleep 0.005; done
    end=$(now)
    awk "BEGIN { print $end - $start }" >> "$work/drop.times"
done

cp_s=$(median < "$work/cp.times"); deliver_s=$(median < "$work/deliver.times"); drop_s=$(median < "$work/drop.times")
printf 'bench-drop: %d MiB, %d rounds, median seconds (cp: into a plain folder, fsynced)\n' "$size_mib" "$rounds"
printf '%-34s %9s %9s %14s\n' "way in" "seconds" "MB/s" "ratio to cp"
for row in "cp (plain folder):$cp_s" "sandboxctl inbox deliver:$deliver_s" "cp into the drop folder:$drop_s"; do
    name=${row%%:*}; s=${row##*:}
    printf '%-34s %9.3f %9.1f %14.2f\n' "$name" "$s" "$(awk "BEGIN { print $size_mib * 1.048576 / $s }")" "$(awk "BEGIN { print $s / $cp_s }")"
done
[ "$("$sandboxctl" inbox list com.example.bench --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" -eq $((2 * rounds)) ] \
    || { echo "error: the Inbox does not hold the $((2 * rounds)) items delivered" >&2; exit 1; }
