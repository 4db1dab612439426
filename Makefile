# Quick start: `make demo` and `make test`. Both install missing system packages when run as root.
SWIFT ?= swift

.PHONY: deps demo test bench

deps:
	@./scripts/ensure-deps.sh

demo: deps
	@$(SWIFT) build --product sandboxctl --quiet
	@$$($(SWIFT) build --show-bin-path)/sandboxctl demo

test: deps
	$(SWIFT) test

bench: deps
	@$(SWIFT) build -c release --product sandboxctl --quiet
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench crypto --size-mib 256
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench lock --subscribers 100
	@$$($(SWIFT) build -c release --show-bin-path)/sandboxctl bench lock --subscribers 1000
	@$(SWIFT) build -c release --product notes-bench --quiet
	@$$($(SWIFT) build -c release --show-bin-path)/notes-bench
