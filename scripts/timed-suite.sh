#!/usr/bin/env bash
# make test's suite: `swift test`, its output shown as it comes and kept in .build/suite.log, then the ten slowest
# tests with their times (scripts/slowest-tests.py: each test's own time, .build/test-times.tsv, and Swift Testing's
# xUnit report), each with the filter that runs it alone, so a test that starts to grow is seen in the first run where
# it does.
#   usage: scripts/timed-suite.sh [swift test option...]
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .build
log=.build/suite.log
times=.build/test-times.tsv
rm -f "$log" "$times" .build/suite.xml .build/suite-swift-testing.xml
: > "$log"
# To a file, not a pipe: a program a failed test left running would hold a pipe open, and the run would never end.
PROTECTEDSTORE_TEST_TIMES=$PWD/$times ${SWIFT:-swift} test --xunit-output .build/suite.xml "$@" > "$log" 2>&1 &
suite=$!
tail -n +1 -F --pid="$suite" "$log" 2>/dev/null
wait "$suite"
status=$?
python3 scripts/slowest-tests.py "$times" .build/suite-swift-testing.xml 10 || true
exit "$status"
