#!/usr/bin/env bash
# Runs the whole suite under one sanitizer in its own build folder (make verify): `address` (AddressSanitizer, with
# UndefinedBehaviorSanitizer on the C code; Swift's own checks already trap on overflow) or `thread` (ThreadSanitizer).
# Any report fails the run, also one printed by a child process (a daemon, a mount) that the test did not look at,
# and the reports themselves are printed, so a CI log that keeps only the tail still shows them.
# An optional second argument is a `swift test --filter` pattern (make test runs the lock and event tests this way).
set -uo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitized-suite.sh address|thread [filter]}
filter=${2:-}
swift=${SWIFT:-swift}

case "$kind" in
address)
    # LeakSanitizer is off: Swift keeps a weak reference's side table behind a shifted pointer in the object's
    # refcount word, where LSan cannot see it, so every weak reference alive at exit reads as a leak.
    export ASAN_OPTIONS=halt_on_error=1:detect_leaks=0:abort_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    scratch=.build-asan
    flags=(--sanitize=address -Xcc -fsanitize=undefined -Xcc -fno-sanitize-recover=undefined)
    ;;
thread)
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    scratch=.build-tsan
    flags=(--sanitize=thread)
    ;;
*)
    echo "error: unknown sanitizer '$kind'; use address or thread" >&2
    exit 2
    ;;
esac

[ -n "$filter" ] && flags+=(--filter "$filter")
what="the whole suite"
[ -n "$filter" ] && what="the tests matching '$filter'"
mkdir -p "$scratch"
log="$scratch/suite${filter:+-$(tr -c 'A-Za-z0-9\n' '-' <<<"${filter%%|*}")}.log"
# A run that hangs fails after this long instead of holding CI forever: 30 minutes for the whole suite, 10 for a part.
limit=${SANITIZED_SUITE_TIMEOUT:-$([ -n "$filter" ] && echo 600 || echo 1800)}
start=$(date +%s)
# To a file, not a pipe: a program a crashed test left running would hold a pipe open and the run would never end.
timeout --kill-after=10 "$limit" "$swift" test "${flags[@]}" --scratch-path "$scratch" > "$log" 2>&1
status=$?
[ "$status" -eq 124 ] && echo "error: $what did not end within $limit s under the $kind sanitizer; killed (see $log)"
# What a test that died under the sanitizer left running (daemons, mounts) goes now.
pkill -f "$PWD/$scratch/" 2>/dev/null
grep -E "^(✘|✔ Test run|✘ Test run)|ERROR: AddressSanitizer|WARNING: ThreadSanitizer|runtime error:|^error:" "$log" | cut -c1-300 | head -60
reports=$(grep -cE "ERROR: AddressSanitizer|WARNING: ThreadSanitizer|runtime error:" "$log")
if [ "$reports" -gt 0 ]; then
    # Each report in full (to its SUMMARY line), at most 400 lines in all.
    awk '/ERROR: AddressSanitizer|WARNING: ThreadSanitizer|runtime error:/ { on = 1 } on { print } /^SUMMARY:/ { on = 0 }' "$log" | head -400
fi
echo "$kind sanitizer: $what in $(( $(date +%s) - start )) s, exit status $status, $reports sanitizer report(s); full log in $log"
[ "$status" -eq 0 ] && [ "$reports" -eq 0 ]
