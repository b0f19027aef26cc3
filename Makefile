# `make test` and `make demo` work on a fresh machine: they create (or reuse) .venv first.
# Debian's interpreter where there is one: the multi-user tests run the venv as ordinary users,
# who cannot run an interpreter installed under root's home
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test demo lint typecheck venv clean native proto browser slurm cli-docs docs-check

venv: $(STAMP)

$(STAMP): pyproject.toml $(wildcard setup.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,plot]'
	touch $(STAMP)

# the sources compiled once first: where PYTHONDONTWRITEBYTECODE is set,
# every daemon, job and CLI process the tests start would otherwise compile gpupool again.
# Most tests wait on the processes they start, so their files run on TEST_WORKERS workers; the
# tests marked `serial` (GPU time shares and latencies measured over wall-clock windows) run
# after them, one at a time. Both parts always run; either failing fails `make test`.
TEST_WORKERS ?= 4
test: $(STAMP) slurm native browser
	$(BIN)/python -m compileall -q src
	@status=0; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial" || status=1; \
	$(BIN)/python -m pytest -q -m serial || status=1; \
	exit $$status

# the web dashboard's test drives Debian's headless Chromium: as root, install it when missing;
# elsewhere (not root, no apt-get) that test skips and says why. A failed install does not stop
# `make test`: the rest of the suite runs and the browser test fails, naming what is missing.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			{ apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } || \
			echo "make browser: installing chromium failed; the browser test will fail"; \
		else \
			echo "make browser: no chromium, and not root with apt-get; the browser test skips"; \
		fi; \
	fi

# the Slurm tests run a dev cluster from Debian's packages, and the SPANK plugin builds against
# Slurm's headers: as root, install them when missing (before `native`, which then builds the
# plugin); elsewhere those tests skip and say why
slurm:
	@if ! command -v slurmd >/dev/null && [ ! -x /usr/sbin/slurmd ] || [ ! -f /usr/include/slurm/spank.h ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			{ apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client \
				munge libslurm-dev; } || \
			echo "make slurm: installing Slurm failed; the Slurm tests will skip"; \
		else \
			echo "make slurm: no Slurm, and not root with apt-get; the Slurm tests skip"; \
		fi; \
	fi

# the pool first (a daemon on a simulated node), then inference pooling (services behind the
# router), then the placement replay
demo: $(STAMP) native
	sh examples/pool-demo.sh $(BIN)
	$(BIN)/python examples/inference_demo.py $(BIN)
	$(BIN)/python examples/swap_demo.py $(BIN)
	@printf '\n\033[1m== Placement: the trace replayed through four policies ==\033[0m\n'
	$(BIN)/gpupool demo

# the C libraries under native/ (incremental; pip install runs the same build)
native:
	$(MAKE) -C native

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

# no dead link in README, CHANGELOG and docs/ (files and headings), no doc the code cites missing
docs-check: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_docs_links.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# the kubelet device-plugin stubs, committed (tests/k8s/test_proto.py checks they are current)
proto: $(STAMP)
	cd src && ../$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		--grpc_python_out=. gpupool/k8s/proto/api.proto

# docs/cli.md from the commands' own --help (tests/test_cli_reference.py checks it is current)
cli-docs: $(STAMP)
	$(BIN)/python tools/cli_reference.py
