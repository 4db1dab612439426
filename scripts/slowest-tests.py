#!/usr/bin/env python3
"""Prints the slowest tests of a run, each with the filter that runs it alone.

A test's time is its own, from when it began to run to its end (TIMES: `seconds<TAB>test id` lines, one per test
case, written by the suites' `.ownThread` trait), and for the few tests without that trait Swift Testing's figure from
its xUnit REPORT, which counts from when the test was scheduled (marked "scheduled"); a parameterized test shows its
longest case.

usage: scripts/slowest-tests.py TIMES REPORT [COUNT]
"""
import sys
import xml.etree.ElementTree as ElementTree


def own_times(path):
    """The longest case and the number of cases of each test, by `Module.Suite/function`."""
    tests = {}
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                seconds, _, identifier = line.rstrip("\n").partition("\t")
                key = identifier.split("(")[0]
                longest, cases = tests.get(key, (0.0, 0))
                tests[key] = (max(longest, float(seconds)), cases + 1)
    except OSError:
        pass
    return tests


def scheduled_times(path):
    tests = {}
    try:
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            key = case.get("classname", "") + "/" + case.get("name", "").split("(")[0]
            tests[key] = float(case.get("time", "0"))
    except (OSError, ElementTree.ParseError):
        pass
    return tests


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    own = own_times(sys.argv[1])
    scheduled = scheduled_times(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) == 4 else 10
    rows = [(seconds, key, f"{cases} cases" if cases > 1 else "") for key, (seconds, cases) in own.items()]
    rows += [(seconds, key, "scheduled") for key, seconds in scheduled.items() if key not in own]
    if not rows:
        print(f"slowest tests: no times in {sys.argv[1]} nor {sys.argv[2]}; did the suite run?", file=sys.stderr)
        return 1
    rows.sort(reverse=True)
    print(f"the {min(count, len(rows))} slowest of {len(rows)} tests (each alone: swift test --filter 'Module.Suite/function'):")
    for seconds, key, note in rows[:count]:
        print(f"  {seconds:8.1f} s  {key}" + (f"  ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
