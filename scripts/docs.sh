#!/usr/bin/env bash
# make docs: the DocC documentation of ProtectedStore (with ProtectedStoreCore, which it re-exports) and
# ProtectedStoreTesting, as one archive in .build/docs, with warnings (an unresolved link, a bad topic) as errors;
# then a check that every public symbol declared in those modules has a summary.
set -euo pipefail
cd "$(dirname "$0")/.."

rm -rf .build/docs
if ! swift package --allow-writing-to-directory .build/docs generate-documentation \
    --target ProtectedStoreCore --target ProtectedStore --target ProtectedStoreTesting \
    --enable-experimental-combined-documentation --warnings-as-errors --output-path .build/docs \
    2>&1 | { grep -v '^\[[0-9]*/[0-9]*\]' || true; }; then
    echo "error: DocC reported the problems above; fix them in the doc comments or the .docc catalogs" >&2
    exit 1
fi
python3 scripts/docs-coverage.py ProtectedStoreCore ProtectedStore ProtectedStoreTesting
echo "Documentation: .build/docs (open .build/docs/index.html through a web server, or: swift package --disable-sandbox preview-documentation --target ProtectedStore)"
