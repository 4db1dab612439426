# Quick start: `make demo` and `make test`. Both install missing system packages when run as root.
SWIFT ?= swift

# A target whose recipe failed is not left looking finished.
.DELETE_ON_ERROR:

.PHONY: deps build-deps demo test test-tsan test-aegis test-asan-all test-tsan-all bench fuzz verify release dist install uninstall deb docs

# The build that ships: the Swift runtime linked in (no Swift toolchain needed where it is installed), no $ORIGIN
# search path, bind-now. `make test` scans and packages this same binary.
RELEASE_BUILD = $(SWIFT) build -c release --static-swift-stdlib --disable-local-rpath -Xlinker -z -Xlinker now
RELEASE_BIN = $$($(SWIFT) build -c release --show-bin-path)
# The static Foundation archive calls mktemp(3) (not from our code); glibc's link-time warning about it says nothing
# about this project.
FOUNDATION_LINK_WARNING = use of .mktemp. is dangerous

deps:
	@./scripts/ensure-deps.sh

# What building, installing and packaging need, without the tests' tools (so `sudo make install` installs no lintian).
build-deps:
	@./scripts/ensure-deps.sh build

demo: deps
	@$(SWIFT) build --product sandboxctl --quiet
	@$$($(SWIFT) build --show-bin-path)/sandboxctl demo

# The daemon memory tests scan the release build of sandboxctl, as it ships (docs/SECURITY.md); the packaging tests
# install it, build the Debian package from it and run lintian on that. Then the lock tests under ThreadSanitizer, the
# file format's and the mount's data-path tests with AEGIS-256, and the documentation, so a broken link or an undocumented public symbol fails
# here too. Each stage is timed (scripts/stage.sh), and the suite ends with its ten slowest tests (scripts/timed-suite.sh).
test: deps
	@./scripts/stage.sh --reset
	@./scripts/stage.sh "release build" $(MAKE) --no-print-directory release
	@./scripts/stage.sh "debug build" $(SWIFT) build --build-tests --quiet
	@PROTECTEDSTORE_RELEASE_BIN="$(RELEASE_BIN)" SWIFT="$(SWIFT)" ./scripts/stage.sh "swift test" ./scripts/timed-suite.sh --skip-build
	@./scripts/stage.sh "ThreadSanitizer tests" $(MAKE) --no-print-directory test-tsan
	@./scripts/stage.sh "AEGIS-256 tests" $(MAKE) --no-print-directory test-aegis
	@./scripts/stage.sh "documentation" $(MAKE) --no-print-directory docs
	@./scripts/stage.sh --summary

# The shipped binary and the argument parser's man-page generator, both release builds.
release: build-deps
	@bash -o pipefail -c '$(RELEASE_BUILD) --product sandboxctl --quiet 2>&1 | { grep -v "$(FOUNDATION_LINK_WARNING)" || true; }'
	@$(SWIFT) build -c release --product generate-manual --quiet

# Everything install and deb ship, in .build/dist: the stripped binary, man pages, completions, the PAM module. Remade
# only when an input changed, so `sudo make install` after `make dist` runs no Swift build as root. A removed source
# file is no input any more: `make release dist` then, or remove .build/dist.
DIST_INPUTS := Makefile Package.swift $(wildcard Package.resolved) \
	$(shell find Sources scripts/dist.sh scripts/man-pages.py -type f 2>/dev/null)
dist: .build/dist/VERSION
.build/dist/VERSION: $(DIST_INPUTS)
	@$(MAKE) --no-print-directory release
	@./scripts/dist.sh "$(RELEASE_BIN)" .build/dist

# make install [PREFIX=/usr/local] [DESTDIR=staging-root]; BINDIR, MANDIR and the other folders of scripts/install.sh
# can be given the same way (make passes command-line variables to the script's environment).
install: .build/dist/VERSION
	@./scripts/install.sh .build/dist

uninstall:
	@./scripts/install.sh --uninstall

# sandboxctl_<version>_<arch>.deb in .build/deb.
deb: .build/dist/VERSION
	@./scripts/build-deb.sh .build/dist .build/deb

# The DocC documentation of ProtectedStore (with ProtectedStoreCore, which it re-exports) and ProtectedStoreTesting,
# one archive in .build/docs, warnings as errors, and a check that every public symbol has a summary.
docs: build-deps
	@./scripts/docs.sh

# The lock and event tests under ThreadSanitizer, in their own build folder (docs/SECURITY.md). The writes-behind tests
# run in a process of their own: beside the others, that process hung at times in the Swift runtime's generic-metadata
# initialisation (every waiting thread in swift_getCanonicalPrespecializedGenericMetadata, none holding it), alone never.
test-tsan: deps
	@./scripts/sanitized-suite.sh thread 'LockEventTests|ConcurrencyTests|DaemonProtocolTests|TestDeviceTests'
	@./scripts/sanitized-suite.sh thread 'WritesBehindTests'

# The file format's tests and the mount's data paths in a build with AEGIS-256 (libsodium 1.0.19 or later, fetched
# where the system's is older).
test-aegis: deps
	@./scripts/aegis-suite.sh

# The whole suite under AddressSanitizer (and UBSan on the C code), then under ThreadSanitizer; any report fails.
test-asan-all: deps
	@./scripts/sanitized-suite.sh address
test-tsan-all: deps
	@./scripts/sanitized-suite.sh thread

# libFuzzer smoke run: FUZZ_SECONDS per target (default 60), from the committed seeds; a crash input lands in Fuzz/Crashes.
FUZZ_SECONDS ?= 60
fuzz: deps
	@$(SWIFT) build --package-path Fuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library --quiet
	@./scripts/fuzz-smoke.sh $(FUZZ_SECONDS)

# The reliability and security campaign: crash harness (quick), power cuts, fuzz smoke, memory hygiene, load, then the whole
# suite under each sanitizer.
verify: deps
	@$(SWIFT) build --product sandboxctl --quiet
	@$(SWIFT) build --product ps-verify --quiet
	@$$($(SWIFT) build --show-bin-path)/ps-verify crash --quick
	@$$($(SWIFT) build --show-bin-path)/ps-verify powercut
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory release
	@PROTECTEDSTORE_RELEASE_BIN="$(RELEASE_BIN)" $(SWIFT) test --filter MemoryHygieneTests > .build/memory-hygiene.log 2>&1; status=$$?; \
		grep -E "memory hygiene|Test run with|✘" .build/memory-hygiene.log; exit $$status
	@$$($(SWIFT) build --show-bin-path)/ps-verify load
	@$(MAKE) --no-print-directory test-asan-all
	@$(MAKE) --no-print-directory test-tsan-all

bench: deps release
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench crypto --size-mib 256
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench lock --subscribers 100
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench lock --subscribers 1000
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench keychain
	@$(SWIFT) build -c release --product notes-bench --quiet
	@$$($(SWIFT) build -c release --show-bin-path)/notes-bench
