#!/usr/bin/env bash
# Rebuilds Tests/Fixtures/v1-device.tar.gz: a small device written by format version 1's own sandboxctl (commit
# 4d365d0, the last before format version 2), for the migration tests (MigrationTests). Not run by make: the fixture is
# committed, and this records how it was made. Needs a Swift toolchain and the build dependencies (make deps).
#
# What it holds (the tests check each of these after `sandboxctl migrate`): two containers (com.example.notes, default
# complete; com.example.mail, default complete-unless-open); files of every class at sizes around the 4096-byte block;
# an empty file; folders with and without a class marker, nested; a long and a non-ASCII name; Inbox items delivered
# unlocked and before first unlock (sealed for class B, awaiting the default class). Passcode: 123456; KDF preset fast.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d)
cleanup() {
    git -C "$repo" worktree remove --force "$work/src" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach "$work/src" 4d365d0 >/dev/null
swift build --package-path "$work/src" --product sandboxctl --scratch-path "$work/build" --quiet
ctl="$work/build/debug/sandboxctl"
export SANDBOXCTL_ROOT="$work/v1-device/root" SANDBOXCTL_DEVICE_SECRET="$work/v1-device/device.secret"
passcode=123456

pattern() {  # pattern SIZE SEED: SIZE bytes that differ by position and seed
    python3 -c "import sys; n, s = int(sys.argv[1]), int(sys.argv[2]); sys.stdout.buffer.write(bytes((i * 31 + s) % 251 for i in range(n)))" "$1" "$2"
}
put() {  # put CLASS BUNDLE:PATH SIZE SEED
    { echo "$passcode"; pattern "$3" "$4"; } | "$ctl" put --passcode-stdin --protection "$1" - "$2" >/dev/null
}

mkdir -p "$work/v1-device"
echo "$passcode" | "$ctl" init --kdf fast --passcode-stdin >/dev/null
"$ctl" create com.example.notes >/dev/null
"$ctl" create com.example.mail --default-protection complete-unless-open >/dev/null

put complete com.example.notes:Documents/a.txt 5 1
put complete-unless-open com.example.notes:Documents/b.bin 4096 2
put complete-until-first-user-authentication com.example.notes:Documents/c.bin 4097 3
put none com.example.notes:Documents/d.bin 10000 4
put complete com.example.notes:Documents/empty 0 5
"$ctl" mkdir --protection none com.example.notes:Documents/Public >/dev/null
"$ctl" mkdir com.example.notes:Documents/Public/Nested >/dev/null
put none com.example.notes:Documents/Public/Nested/n.txt 100 6
"$ctl" mkdir -p com.example.notes:Library/Caches/thumbs >/dev/null
put complete com.example.notes:Library/Caches/thumbs/t1 8192 7
long=$(printf 'long-name-%.0s' $(seq 1 18))end.txt   # 183 bytes: a version 2 long name
put complete "com.example.notes:Documents/$long" 33 8
put complete "com.example.notes:Documents/Résumé – 履歴書.txt" 64 9
"$ctl" mkdir --protection complete-until-first-user-authentication "com.example.notes:Library/Application Support/com.example.notes/db" >/dev/null
put complete-until-first-user-authentication "com.example.notes:Library/Application Support/com.example.notes/db/notes.sqlite" 12288 10

pattern 300 11 > "$work/report.pdf"
echo "$passcode" | "$ctl" inbox deliver --passcode-stdin --from com.example.mail --annotation '{"subject":"Q3"}' com.example.notes "$work/report.pdf" >/dev/null
pattern 5000 12 > "$work/photo.jpg"
"$ctl" inbox deliver --from com.example.camera com.example.notes "$work/photo.jpg" >/dev/null   # before first unlock: sealed for class B
put complete-unless-open com.example.mail:Documents/mail.eml 2000 13

rm -f "$SANDBOXCTL_ROOT/daemon.lock"
tar --sort=name --owner=0 --group=0 --numeric-owner -czf "$repo/Tests/Fixtures/v1-device.tar.gz" -C "$work" v1-device
echo "wrote Tests/Fixtures/v1-device.tar.gz ($(stat -c %s "$repo/Tests/Fixtures/v1-device.tar.gz") bytes)"
