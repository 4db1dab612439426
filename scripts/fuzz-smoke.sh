#!/usr/bin/env bash
# Runs each libFuzzer target for $1 seconds from its committed seeds (Fuzz/Corpus), with new inputs kept in a scratch
# folder so the committed corpus stays as reviewed. Prints each target's figures; exits 1 if any target crashed,
# leaving the input in Fuzz/Crashes/ (add it to Fuzz/Regressions/<target>/ with the fix).
set -uo pipefail
cd "$(dirname "$0")/../Fuzz"
seconds="${1:-60}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p Crashes
failed=0
for target in keybag:FuzzKeybag file-header:FuzzFileHeader frame:FuzzFrame names:FuzzNames; do
    corpus="${target%%:*}"; binary=".build/debug/${target##*:}"
    mkdir -p "$scratch/$corpus"
    if "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="Crashes/$corpus-" \
        "$scratch/$corpus" "Corpus/$corpus" > "$scratch/$corpus.log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$corpus.log" | grep -o '[0-9]*$')
        cov=$(grep -o 'cov: [0-9]*' "$scratch/$corpus.log" | tail -1)
        echo "fuzz $corpus: ${seconds} s, ${runs:-?} inputs, $cov, no crash"
    else
        echo "fuzz $corpus: CRASH (see Fuzz/Crashes/ and the log below)"
        tail -30 "$scratch/$corpus.log"
        failed=1
    fi
done
exit $failed
