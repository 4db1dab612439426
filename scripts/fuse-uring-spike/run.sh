#!/usr/bin/env bash
# Times stat(2) (two FUSE round trips: LOOKUP, GETATTR) of a spike file system served four ways on this machine: over
# /dev/fuse by one libfuse thread, free to run anywhere and then with the caller on processor 0 too; over FUSE's
# io_uring transport, the ring threads free and then each pinned to its processor. See docs/FUSE-IO-URING.md; the
# mount's own transport (Sources/CFuseRings) grew from this spike.
#
#   scripts/fuse-uring-spike/run.sh [--count N] [--rounds N]
#
# Needs root (mounting, and enable_uring, turned on for the io_uring rows and set back to what it was after), gcc,
# pkg-config, libfuse3-dev, and Linux 6.14 or later with CONFIG_FUSE_IO_URING.
set -euo pipefail
count=100000
rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --count) count="${2:?--count needs a number}"; shift 2 ;;
        --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "error: needs root (it mounts, and sets /sys/module/fuse/parameters/enable_uring)" >&2; exit 1; }
knob=/sys/module/fuse/parameters/enable_uring
[ -w "$knob" ] || { echo "error: $knob is missing: this kernel has no FUSE io_uring transport (Linux 6.14+, CONFIG_FUSE_IO_URING)" >&2; exit 1; }
pkg-config --exists fuse3 || { echo "error: libfuse3's headers are missing; install them: apt-get install libfuse3-dev pkg-config" >&2; exit 1; }

here=$(cd "$(dirname "$0")" && pwd)
was=$(cat "$knob")
server=""
work=$(mktemp -d /tmp/fuse-uring-spike.XXXXXX)
cleanup() {
    umount -l "$work/mnt" 2>/dev/null || true
    if [ -n "$server" ]; then kill -9 "$server" 2>/dev/null || true; fi
    echo "$was" > "$knob" || echo "warning: could not set $knob back to $was" >&2
    rm -rf "$work"
}
trap cleanup EXIT
gcc -O2 -Wall -Werror -o "$work/spike" "$here/spike.c" $(pkg-config --cflags --libs fuse3) -lpthread
gcc -O2 -Wall -Werror -o "$work/stat-loop" "$here/stat-loop.c"
mkdir "$work/mnt"

# measure NAME TRANSPORT PIN-SERVER PIN-CALLER [environment...]: prints the µs per stat of each round.
measure() {
    local name=$1 transport=$2 server_cpus=$3 caller_cpus=$4; shift 4
    if [ "$transport" = uring ]; then echo Y > "$knob"; else echo N > "$knob"; fi
    env "$@" taskset -c "$server_cpus" "$work/spike" "$work/mnt" "$transport" 2>"$work/server.log" &
    server=$!
    for _ in $(seq 1 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
    mountpoint -q "$work/mnt" || { echo "error: the spike did not mount; it said:" >&2; cat "$work/server.log" >&2; exit 1; }
    "$work/stat-loop" "$work/mnt/f" 1000 >/dev/null
    : > "$work/server.log"
    local samples=""
    for _ in $(seq 1 "$rounds"); do samples="$samples $(taskset -c "$caller_cpus" "$work/stat-loop" "$work/mnt/f" "$count")"; done
    umount -l "$work/mnt"
    kill -9 "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
    if [ "$transport" = uring ] && [ -s "$work/server.log" ]; then
        echo "error: in the row \"$name\" requests were not served from the rings; the spike said:" >&2
        head -5 "$work/server.log" >&2
        exit 1
    fi
    printf '| %-56s |%s |\n' "$name" "$samples"
}

all=0-$(( $(nproc --all) - 1 ))
echo "µs per stat(2), $count calls a round, $rounds rounds:"
echo "| transport | rounds |"
echo "|---|---|"
measure "/dev/fuse, one libfuse thread" devfuse "$all" "$all"
measure "/dev/fuse, one libfuse thread, caller on processor 0 too" devfuse 0 0
measure "io_uring, ring threads free" uring "$all" "$all"
measure "io_uring, ring threads pinned" uring "$all" "$all" SPIKE_PIN=1
