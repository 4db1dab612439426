#!/usr/bin/env bash
# Benchmarks `sandboxctl mount` against gocryptfs and the plain backing directory, in one run on this machine:
# dd write and read of 1 GiB (bs=128k), extracting a tar of a source tree of thousands of small files, ls -lR, rm -rf,
# git clone of a local repository (this one) and SQLite inserts, one transaction each (journal DELETE, synchronous FULL).
# Prints a table of median times, the ratio of the mount to gocryptfs (below 1 is faster) and the write throughput
# against gocryptfs', writes the figures as CSV, and draws a chart (PNG) when matplotlib is available.
#
#   scripts/bench-mount.sh [--rounds N] [--size-mib N] [--tree DIR] [--under DIR] [--io-uring] [--sandboxctl BINARY]
#                          [--csv FILE] [--chart FILE]
#
# The mount is `make release`'s sandboxctl unless --sandboxctl names another build (one linked with a newer
# libsodium, say: README, "A faster cipher").
# The mount takes its requests over /dev/fuse, as gocryptfs does. --io-uring (root, Linux 6.14+) turns on FUSE over
# io_uring (/sys/module/fuse/parameters/enable_uring) for the mount's start and sets it back after: the mount then
# answers each processor's requests on that processor (docs/FUSE-IO-URING.md); gocryptfs cannot use it.
#
# Needs root for apt-get (gocryptfs) and for dropping the dentry cache before ls -lR; as another user it prints the
# apt-get command and measures ls -lR with warm caches. Everything lives in a temporary folder under /var/tmp (the
# same disk for the three; --under /dev/shm puts it in memory, without the disk's write-back, and needs about three
# times --size-mib of it), removed at the end.
set -euo pipefail

rounds=5
size_mib=1024
tree=/usr/include
under=/var/tmp
csv=""
chart=""
io_uring=0
sandboxctl=""
knob=/sys/module/fuse/parameters/enable_uring
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --size-mib) size_mib="$2"; shift 2 ;;
        --tree) tree="$2"; shift 2 ;;
        --under) under="$2"; shift 2 ;;
        --csv) csv="$2"; shift 2 ;;
        --chart) chart="$2"; shift 2 ;;
        --io-uring) io_uring=1; shift ;;
        --sandboxctl) sandboxctl=$(realpath -m "$2"); shift 2 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

if [ "$io_uring" = 1 ]; then
    [ "$(id -u)" -eq 0 ] || { echo "error: --io-uring needs root (it sets $knob)" >&2; exit 1; }
    [ -w "$knob" ] || { echo "error: $knob is missing: this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)" >&2; exit 1; }
fi
# Before the cd below, so a relative --under means the caller's folder.
[ -d "$under" ] && [ -w "$under" ] || { echo "error: $under is not a folder this user can write to (--under)" >&2; exit 64; }
under=$(cd "$under" && pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)
./scripts/ensure-deps.sh
if ! command -v gocryptfs >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "Installing gocryptfs (the reference encrypted FUSE file system)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gocryptfs >/dev/null
    else
        echo "error: gocryptfs is missing. Install it with:" >&2
        echo "    sudo apt-get install -y gocryptfs" >&2
        exit 1
    fi
fi
[ -d "$tree" ] || { echo "error: $tree is not a directory (--tree)" >&2; exit 64; }

if [ -z "${sandboxctl:-}" ]; then
    make --no-print-directory release   # the build that ships (static Swift runtime), as make test scans it
    sandboxctl="$(swift build -c release --show-bin-path)/sandboxctl"
fi
[ -x "$sandboxctl" ] || { echo "error: $sandboxctl is not an executable (--sandboxctl)" >&2; exit 64; }

work=$(mktemp -d "$under/bench-mount.XXXXXX")
daemon_pid=""
knob_was=""
cleanup() {
    set +e
    if [ -n "$knob_was" ]; then echo "$knob_was" > "$knob" || echo "warning: could not set $knob back to $knob_was" >&2; fi
    fusermount3 -u -z "$work/ps-mnt" 2>/dev/null || true
    fusermount3 -u -z "$work/gc-mnt" 2>/dev/null || true
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

echo "Preparing in $work: tar of $tree ($(find "$tree" -type f | wc -l) files, $(du -sh "$tree" | cut -f1))"
# ext4 without a journal avoids reusing the inodes freed in the last minute (six, while their inode-table block is
# unwritten), looking each one's block up as it passes it: after an rm -rf every create scans past thousands
# (docs/PERFORMANCE.md, "Reads straight into the ring, and what the disk rows measure").
disk_note=""
majmin=$(findmnt -n -o MAJ:MIN -T "$work" 2>/dev/null | head -n 1 | tr -d ' ') || majmin=""
device=""
if [ -n "$majmin" ] && [ -e "/sys/dev/block/$majmin" ]; then device=$(basename "$(readlink -f "/sys/dev/block/$majmin")"); fi
if [ -n "$device" ] && [ "$(cat "/sys/fs/ext4/$device/journal_task" 2>/dev/null)" = "<none>" ]; then
    disk_note="Note: $under is on ext4 without a journal ($device). Each file created there after removals scans past the inodes freed in the last minute, so tar -x and git clone measure that scan as much as the file systems, and vary from round to round for the plain folder, gocryptfs and the mount alike; --under /dev/shm measures without it."
    echo "$disk_note"
fi
tar -C "$(dirname "$tree")" -cf "$work/tree.tar" "$(basename "$tree")"
git clone -q --bare "$repo" "$work/repo.git"
inserts=500
{
    echo "PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE; PRAGMA synchronous = FULL;"
    echo "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT);"
    for i in $(seq 1 "$inserts"); do echo "INSERT INTO notes (title, body) VALUES ('note $i', printf('%.*c', 2000, 'x'));"; done
} > "$work/inserts.sql"

# ProtectedStore: a device with its daemon, unlocked, the container mounted; files go to Documents (class A).
export SANDBOXCTL_ROOT="$work/ps-root" SANDBOXCTL_DEVICE_SECRET="$work/ps.secret"
printf 'bench-passcode\n' | "$sandboxctl" init --kdf fast --passcode-stdin >/dev/null 2>&1
"$sandboxctl" create com.example.bench >/dev/null
"$sandboxctl" daemon --grace 1 2>"$work/daemon.log" &
daemon_pid=$!
for _ in $(seq 1 100); do "$sandboxctl" status >/dev/null 2>&1 && break; sleep 0.05; done
printf 'bench-passcode\n' | "$sandboxctl" unlock --passcode-stdin >/dev/null
mkdir "$work/ps-mnt"
if [ "$io_uring" = 1 ]; then
    knob_was=$(cat "$knob")
    echo Y > "$knob"
    mounted=$("$sandboxctl" mount com.example.bench "$work/ps-mnt")
    # The rings register after the mount's start; the first request they carry is logged.
    log=$(sed -n 's/.*, log \(.*\))\.$/\1/p' <<<"$mounted")
    for _ in $(seq 1 100); do stat "$work/ps-mnt/Documents" >/dev/null; grep -q "requests come over io_uring now" "$log" && break; sleep 0.05; done
    grep -q "requests come over io_uring now" "$log" || { echo "error: the mount did not take requests over io_uring; its log ($log) says:" >&2; tail -5 "$log" >&2; exit 1; }
    echo "$knob_was" > "$knob" && knob_was=""
    echo "The mount takes its requests over FUSE's io_uring transport"
else
    "$sandboxctl" mount --no-io-uring com.example.bench "$work/ps-mnt" >/dev/null
fi

# Which cipher the mount seals new files with (FORMAT.md §4.1, header byte 8), read off a probe file's stored header.
touch "$work/before-probe"
sleep 0.01
echo probe > "$work/ps-mnt/Documents/cipher-probe"
probe=$(find "$work/ps-root" -ignore_readdir_race -type f -newer "$work/before-probe" ! -name '.sandboxctl-*' \
    -exec sh -c '[ "$(head -c 4 "$1")" = PSEF ]' sh {} \; -print)
[ "$(wc -l <<<"$probe")" = 1 ] && [ -n "$probe" ] \
    || { echo "error: expected one stored file for the cipher probe under $work/ps-root, found: ${probe:-none}" >&2; exit 1; }
case $(od -An -tu1 -j8 -N1 "$probe" | tr -d ' ') in
    1) cipher=XChaCha20-Poly1305 ;; 2) cipher=AES-256-GCM ;; 3) cipher=AEGIS-256 ;;
    *) echo "error: $probe names no cipher this script knows (header byte 8)" >&2; exit 1 ;;
esac
rm "$work/ps-mnt/Documents/cipher-probe"
echo "The mount seals new files with $cipher"

# gocryptfs with its defaults (AES-256-GCM, encrypted names); a cheap scrypt only shortens its start.
mkdir "$work/gc-cipher" "$work/gc-mnt" "$work/plain"
gocryptfs -init -q -scryptn 10 -extpass "echo bench-passcode" "$work/gc-cipher" >/dev/null 2>&1
gocryptfs -q -nosyslog -extpass "echo bench-passcode" "$work/gc-cipher" "$work/gc-mnt"

names=(plain gocryptfs mount)
dirs=("$work/plain" "$work/gc-mnt" "$work/ps-mnt/Documents")
operations=(write read tar ls rm git sqlite)
declare -A samples

now() { date +%s%N; }
drop_dentries() { sync; [ "$(id -u)" -eq 0 ] && echo 2 > /proc/sys/vm/drop_caches || true; }

run_operation() {  # operation, target directory; prints milliseconds
    local operation=$1 dir=$2 start end
    case "$operation" in
        write)
            start=$(now); dd if=/dev/zero of="$dir/big" bs=128k count=$((size_mib * 8)) status=none; end=$(now) ;;
        read)
            # The FUSE file systems' own page cache is dropped; the backing files stay cached for all three.
            [ "$dir" != "$work/plain" ] && dd if="$dir/big" iflag=nocache count=0 status=none
            start=$(now); dd if="$dir/big" of=/dev/null bs=128k status=none; end=$(now)
            rm -f "$dir/big" ;;
        tar)
            mkdir "$dir/tree"
            start=$(now); tar -C "$dir/tree" -xf "$work/tree.tar"; end=$(now) ;;
        ls)
            drop_dentries
            start=$(now); ls -lR "$dir/tree" >/dev/null; end=$(now) ;;
        rm)
            start=$(now); rm -rf "$dir/tree"; end=$(now) ;;
        git)
            start=$(now); git clone -q --no-hardlinks "$work/repo.git" "$dir/clone"; end=$(now)
            rm -rf "$dir/clone" ;;
        sqlite)
            start=$(now); sqlite3 "$dir/bench.db" < "$work/inserts.sql" >/dev/null; end=$(now)
            rm -f "$dir/bench.db" ;;
    esac
    sync
    echo $(( (end - start) / 1000000 ))
}

for round in $(seq 1 "$rounds"); do
    for operation in "${operations[@]}"; do
        # Each round starts with another target, so none always runs right after the same neighbour's disk write-back.
        for step in 0 1 2; do
            index=$(( (round + step) % 3 ))
            ms=$(run_operation "$operation" "${dirs[$index]}")
            samples[$operation,${names[$index]}]+="$ms "
        done
    done
    echo "round $round/$rounds done"
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
label() {
    case "$1" in
        write) echo "write ${size_mib} MiB (dd bs=128k)" ;;
        read) echo "read ${size_mib} MiB (dd bs=128k)" ;;
        tar) echo "tar -x of $(basename "$tree") ($(tar -tf "$work/tree.tar" | wc -l) entries)" ;;
        ls) echo "ls -lR of the tree" ;;
        rm) echo "rm -rf of the tree" ;;
        git) echo "git clone of this repository ($(git -C "$work/repo.git" count-objects -v | awk '/^(count|in-pack):/ { n += $2 } END { print n }') objects)" ;;
        sqlite) echo "SQLite: $inserts inserts (one transaction each)" ;;
    esac
}

csv_file=${csv:-$work/bench-mount.csv}
echo "operation,plain_ms,gocryptfs_ms,mount_ms,mount_over_gocryptfs" > "$csv_file"
echo
echo "Median of $rounds rounds, milliseconds (MB/s for dd); ratio = mount / gocryptfs, at or below 0.8 meets the target."
printf '| %-34s | %14s | %14s | %14s | %7s |\n' operation "plain dir" gocryptfs "sandboxctl mount" ratio
printf '|%s|%s|%s|%s|%s|\n' "------------------------------------" "----------------" "----------------" "----------------" "---------"
for operation in "${operations[@]}"; do
    plain=$(echo "${samples[$operation,plain]}" | median)
    gc=$(echo "${samples[$operation,gocryptfs]}" | median)
    ps=$(echo "${samples[$operation,mount]}" | median)
    ratio=$(awk -v a="$ps" -v b="$gc" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    cell() {
        if [ "$operation" = write ] || [ "$operation" = read ]; then
            awk -v ms="$1" -v mib="$size_mib" 'BEGIN { printf "%d (%d MB/s)", ms, (ms > 0 ? mib * 1048.576 / ms : 0) }'
        else
            echo "$1"
        fi
    }
    printf '| %-34s | %14s | %14s | %14s | %7s |\n' "$(label "$operation")" "$(cell "$plain")" "$(cell "$gc")" "$(cell "$ps")" "$ratio"
    echo "$(label "$operation"),$plain,$gc,$ps,$ratio" >> "$csv_file"
done
[ -z "$disk_note" ] || echo "$disk_note"
if [ -n "${samples[write,mount]:-}" ]; then
    awk -v gc="$(echo "${samples[write,gocryptfs]}" | median)" -v ps="$(echo "${samples[write,mount]}" | median)" \
        'BEGIN { if (ps > 0) printf "Write throughput: %.2f x gocryptfs'"'"' (target: at least 2 x).\n", gc / ps }'
fi
echo
echo "All samples (ms): $(for key in "${!samples[@]}"; do printf '%s=[%s] ' "$key" "${samples[$key]% }"; done)"
[ -n "$csv" ] && echo "CSV: $csv"

if [ -n "$chart" ]; then
    if ! python3 -c 'import matplotlib' >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        python3 -m pip install --quiet matplotlib >/dev/null 2>&1 || true
    fi
    if python3 -c 'import matplotlib' >/dev/null 2>&1; then
        python3 "$repo/scripts/bench-mount-chart.py" "$csv_file" "$chart"
        echo "Chart: $chart"
    else
        echo "note: no chart drawn; matplotlib is missing (python3 -m pip install --user matplotlib)"
    fi
fi
