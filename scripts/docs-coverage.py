#!/usr/bin/env python3
"""Fails unless every public symbol declared in the given modules' sources has a summary (a doc comment).

usage: docs-coverage.py MODULE...

Reads the symbol graphs the DocC plugin extracted (.build/<triple>/extracted-symbols/<package>/<MODULE>/). Symbols
without a source location (synthesized conformances, inherited defaults) are not ours to document.
"""
import glob
import json
import os
import sys


def symbol_graph_folder(module):
    folders = glob.glob(f".build/*/extracted-symbols/*/{module}")
    if not folders:
        sys.exit(f"docs-coverage.py: no symbol graph for {module} under .build; run make docs, which extracts them")
    return max(folders, key=os.path.getmtime)


def undocumented(module):
    missing = []
    for path in glob.glob(os.path.join(symbol_graph_folder(module), "*.symbols.json")):
        with open(path) as file:
            graph = json.load(file)
        for symbol in graph["symbols"]:
            location = symbol.get("location", {})
            if "/Sources/" not in location.get("uri", ""):
                continue
            lines = symbol.get("docComment", {}).get("lines", [])
            if not any(line["text"].strip() for line in lines):
                source = location["uri"].split("/Sources/", 1)[1]
                missing.append(f"Sources/{source}:{location['position']['line'] + 1}: "
                               f"{'.'.join(symbol['pathComponents'])} has no summary")
    return sorted(set(missing))


def main():
    missing = [line for module in sys.argv[1:] for line in undocumented(module)]
    for line in missing:
        print(line, file=sys.stderr)
    if missing:
        sys.exit(f"error: {len(missing)} public symbols have no summary: give each a /// comment of one or two sentences")
    print(f"Every public symbol of {', '.join(sys.argv[1:])} has a summary.")


if __name__ == "__main__":
    main()
