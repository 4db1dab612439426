# Quick start: `make demo` and `make test`. Both install missing system packages when run as root.
SWIFT ?= swift

.PHONY: deps demo test test-tsan test-asan-all test-tsan-all bench fuzz verify

deps:
	@./scripts/ensure-deps.sh

demo: deps
	@$(SWIFT) build --product sandboxctl --quiet
	@$$($(SWIFT) build --show-bin-path)/sandboxctl demo

# The daemon memory tests scan a release build of sandboxctl, as it ships (docs/SECURITY.md).
test: deps
	$(SWIFT) build -c release --product sandboxctl --quiet
	PROTECTEDSTORE_RELEASE_BIN=$$($(SWIFT) build -c release --show-bin-path) $(SWIFT) test
	@$(MAKE) --no-print-directory test-tsan

# The lock and event tests under ThreadSanitizer, in their own build folder (docs/SECURITY.md).
test-tsan: deps
	@./scripts/sanitized-suite.sh thread 'LockEventTests|ConcurrencyTests|DaemonProtocolTests|TestDeviceTests'

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
	@$(SWIFT) build -c release --product sandboxctl --quiet
	@PROTECTEDSTORE_RELEASE_BIN=$$($(SWIFT) build -c release --show-bin-path) $(SWIFT) test --filter MemoryHygieneTests > .build/memory-hygiene.log 2>&1; status=$$?; \
		grep -E "memory hygiene|Test run with|✘" .build/memory-hygiene.log; exit $$status
	@$$($(SWIFT) build --show-bin-path)/ps-verify load
	@$(MAKE) --no-print-directory test-asan-all
	@$(MAKE) --no-print-directory test-tsan-all

bench: deps
	@$(SWIFT) build -c release --product sandboxctl --quiet
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench crypto --size-mib 256
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench lock --subscribers 100
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench lock --subscribers 1000
	@$(SWIFT) build -c release --product notes-bench --quiet
	@$$($(SWIFT) build -c release --show-bin-path)/notes-bench
