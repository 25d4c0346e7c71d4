# pylimiter: `make test` and `make bench` do all set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PURE_VENV ?= .venv-pure

.PHONY: all venv build debug test test-c test-py test-pure test-pythons bench bench-micro clean \
	wheels check-wheels wheel-cp311 test-aarch64 model-check

all: build

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=64" "Cython>=3.0.10" wheel build \
	    "pytest>=8" "hypothesis>=6.100" "pytest-benchmark>=4" "anyio>=4" "uvloop>=0.19" "rich>=13"
	touch $@

venv: $(VENV)/.deps

build: venv
	$(PY) setup.py -q build_ext --inplace

debug: venv
	PYLIMITER_DEBUG_BUILD=1 $(PY) setup.py -q build_ext --inplace --force

# Everything: both implementations, the C tier (plain, TSAN, ASAN+UBSan),
# the env-var pure mode, and a pure install in a venv of its own.
test: build
	$(PY) -m pytest
	PYLIMITER_NO_EXTENSIONS=1 $(PY) -m pytest --no-c-extensions -q
	$(MAKE) test-pure

test-c: build
	$(PY) -m pytest tests/test_c_core.py

# PYLIMITER_NO_EXTENSIONS=1 at install time: no extension is built or shipped,
# and the installed package reports IMPLEMENTATION == "python".
test-pure:
	rm -rf $(PURE_VENV)
	$(PYTHON) -m venv $(PURE_VENV)
	PYLIMITER_NO_EXTENSIONS=1 $(PURE_VENV)/bin/python -m pip install -q .
	cd /tmp && PYLIMITER_NO_EXTENSIONS=1 $(CURDIR)/$(PURE_VENV)/bin/python -c "\
	import pathlib, pylimiter; \
	assert pylimiter.IMPLEMENTATION == 'python', pylimiter.IMPLEMENTATION; \
	d = pathlib.Path(pylimiter.__file__).parent; \
	assert not list(d.glob('*.so')), 'extension shipped in a pure install'; \
	print('pure install OK:', d)"

# The suite on every interpreter under /root/.pyenv/versions (3.10-3.13).
test-pythons:
	for v in 3.10 3.11 3.12 3.13; do \
	  p=$$(ls -d /root/.pyenv/versions/$$v.*/bin/python$$v 2>/dev/null | head -1); \
	  if [ -z "$$p" ]; then echo "skip $$v: not installed"; continue; fi; \
	  $(MAKE) --no-print-directory PYTHON=$$p VENV=.venv-$$v build && \
	  .venv-$$v/bin/python -m pytest -q -x -p no:cacheprovider || exit 1; \
	done

# The main job: build, then the micro benchmarks side by side, then the table.
bench: build
	$(PY) -m pytest benchmarks/micro --benchmark-only -q -p no:cacheprovider \
	    --benchmark-json=reports/micro.json --benchmark-columns=median,iqr,rounds \
	    --benchmark-sort=name
	$(PY) -m benchmarks.micro.report reports/micro.json

bench-micro: bench

# Four manylinux_2_17 x86_64 wheels (3.10-3.13) and the sdist in wheels/dist,
# each installed into a fresh venv and tested there.
wheels: venv
	wheels/build_wheels.sh
	$(PY) wheels/check_wheels.py wheels/dist

# What CI does on every run: the cp311 wheel and the sdist, built and checked.
wheel-cp311: venv
	wheels/build_wheels.sh 3.11
	$(PY) wheels/check_wheels.py wheels/dist --python 3.11

# The C tier (LL/SC, LSE, outline atomics; several -cpu models), a cp311
# manylinux_2_17_aarch64 wheel and the Python suite on it under qemu-aarch64,
# then the memory-model check.
test-aarch64: venv model-check
	wheels/test_aarch64.sh

# Relacy model of the acquire/release/wake handoff: random schedules plus an
# exhaustive search up to 2 preemptions; weakened builds must fail.
model-check: venv
	@test -f /usr/include/relacy/relacy.hpp || { apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq relacy-dev g++ >/dev/null; }
	mkdir -p build/model
	g++ -std=c++11 -O1 -w tests/model/plim_relacy.cpp -o build/model/plim_relacy
	build/model/plim_relacy 1000000
	build/model/plim_relacy 2 bound
	$(PY) -m pytest -q -p no:cacheprovider tests/test_model_check.py

clean:
	rm -rf build dist *.egg-info pylimiter/*.so pylimiter/_limiter_c.c reports .pytest_cache
