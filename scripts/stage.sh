#!/usr/bin/env bash
# One stage of make test, timed: runs COMMAND, prints how long it took, and keeps that for the summary, which
# `--summary` prints (every stage and the total); a stage that fails prints the summary so far.
#   usage: scripts/stage.sh --reset | scripts/stage.sh NAME COMMAND [ARGUMENT...] | scripts/stage.sh --summary
set -uo pipefail
cd "$(dirname "$0")/.."
times=.build/test-stages.tsv

summary() {
    echo "make test, stage by stage:"
    awk -F '\t' '{ total += $2; printf "  %-28s %6d s  %s\n", $1, $2, $3 } END { printf "  %-28s %6d s\n", "in all", total }' "$times"
}

case "${1:?usage: scripts/stage.sh --reset | NAME COMMAND... | --summary}" in
--reset) mkdir -p .build && : > "$times"; exit 0 ;;
--summary) summary; exit 0 ;;
esac
name=$1
shift
start=$(date +%s)
"$@"
status=$?
seconds=$(( $(date +%s) - start ))
outcome=ok
[ "$status" -eq 0 ] || outcome="failed (exit status $status)"
mkdir -p .build
printf '%s\t%d\t%s\n' "$name" "$seconds" "$outcome" >> "$times"
echo "stage '$name': $seconds s, $outcome"
[ "$status" -eq 0 ] || summary
exit "$status"
