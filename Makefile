# pylimiter: `make test` and `make bench` do all set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PURE_VENV ?= .venv-pure

.PHONY: all venv build debug test test-c test-py test-pure test-dbg dbg-python test-pythons bench \
	bench-micro asv java clean \
	wheels check-wheels wheel-cp311 test-aarch64 model-check relacy spin proto bench-table \
	cursor-sim cursor-bench cache-sim cache-bench balance

all: build

# $(call step,WHAT,HOW LONG,COMMAND): say what COMMAND does and about how
# long it takes here (pip -q prints nothing for minutes), run it, say how
# long it took.
step = @printf '== %s (%s)\n' "$(1)" "$(2)"; t0=$$(date +%s); $(3) || exit $$?; \
	echo "   done in $$(( $$(date +%s) - t0 )) s"
ALL_EXTRAS := spark,topiclist,prometheus

# The dev tools (pyproject's PEP 735 `dev` group), then pylimiter itself,
# editable with every extra, so `.venv/bin/python` imports it from any
# directory while `make build` keeps the in-place extension fresh.
$(VENV)/.deps: pyproject.toml
	@echo "== make venv: $(VENV), in 4 steps, about 3 min here with pip's cache warm (10+ min cold)"
	$(call step,[1/4] $(VENV): a virtualenv of $(PYTHON),about 10 s,$(PYTHON) -m venv $(VENV))
	$(call step,[2/4] pip itself,about 5 s,$(PY) -m pip install -q --upgrade "pip>=25.1")
	$(call step,[3/4] the dev tools: pip install --group dev (Cython$(comma) pytest$(comma) PySpark$(comma) mypy$(comma) MkDocs...),about 1 min,$(PY) -m pip install -q --group dev)
	$(call step,[4/4] pylimiter editable with the extras $(ALL_EXTRAS),about 2 min: it compiles the C extensions,$(PY) -m pip install -q --no-build-isolation -e '.[$(ALL_EXTRAS)]')
	@touch $@
comma := ,

venv: $(VENV)/.deps

build: venv
	$(call step,make build: the C extensions in place (Cython then cc),about 2 s when nothing changed; 1-2 min after a C or Cython edit,$(PY) setup.py -q build_ext --inplace)

debug: venv
	PYLIMITER_DEBUG_BUILD=1 $(PY) setup.py -q build_ext --inplace --force

# The quick loop, under a minute here: every test but the slow ones, which
# tests/_quick.py picks by what each runs (a JVM, a child process, a type
# check, the C compiler tier) and by what each took in the last `make
# durations` (tests/durations.json; over PYLIMITER_QUICK_LIMIT_S, 0.25 s).
# Bytecode is written even under PYTHONDONTWRITEBYTECODE: rewriting every
# test module's asserts again costs ~7 s a run.  CHECK_ARGS adds pytest
# options (CHECK_ARGS="-x tests/test_semaphore.py").
.PHONY: check durations
CHECK_ARGS ?=
check: build
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -m "not slow" $(CHECK_ARGS)

# Every test that is not slow by what it runs, timed again into
# tests/durations.json (about 3 min here; commit the file).
durations: build
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -m "not slow" \
	    --record-durations tests/durations.json

# Everything: both implementations, the C tier (plain, TSAN, ASAN+UBSan),
# the Relacy memory-model check, the Spark pipelines on one shared local
# session and on a standalone cluster of one worker whose Python has no
# pylimiter (tests/cluster: `make test-cluster` alone), the CLIs; then the
# public API again in env-var pure mode (the pipelines, CLIs and the C core
# alone, already run, are left out there), and a pure install in a venv of
# its own; then the Py_DEBUG tier.  ruff check (pyproject's rules) first.
# Every stage runs even when one before it failed; the last lines say which
# failed, and make fails if any did.
TEST_STAGES := lint pytest pure-mode test-pure test-dbg
test: build relacy spin dbg-python
	@failed=""; \
	for stage in $(TEST_STAGES); do \
	    echo "== make test: $$stage"; \
	    $(MAKE) --no-print-directory test-stage-$$stage || failed="$$failed $$stage"; \
	done; \
	if [ -n "$$failed" ]; then echo "== make test: FAILED:$$failed (passed: the others of $(TEST_STAGES))"; exit 1; fi; \
	echo "== make test: all stages passed ($(TEST_STAGES))"

.PHONY: test-stage-lint test-stage-pytest test-stage-pure-mode test-stage-test-pure \
	test-stage-test-dbg test-cluster cluster-env
test-stage-lint:
	$(PY) -m ruff check .
test-stage-pytest: cluster-env
	$(PY) -m pytest
# Its own marker (tests/_quick.py): every test but those of a JVM, a child
# process, a type check or the C compiler tier, slow or not.
test-stage-pure-mode:
	PYLIMITER_NO_EXTENSIONS=1 $(PY) -m pytest --no-c-extensions -q -m pure_mode
test-stage-test-pure: test-pure
test-stage-test-dbg: test-dbg

# The executors' environment for a cluster (docs/pulsar/cluster.md, "Running on a cluster"):
# a venv of this interpreter without pip, only pylimiter's wheel in it
# (--no-deps: executors need nothing else), packed by venv-pack into
# build/cluster-env/pylimiter-env.tar.gz for --executor-env.  Its bin/python
# links to this interpreter's path: the nodes need the same Python there.
CLUSTER_ENV := build/cluster-env
cluster-env: build
	rm -rf $(CLUSTER_ENV)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(CLUSTER_ENV)/wheel .
	$$($(PY) -c "import sys; print(sys._base_executable)") -m venv --without-pip $(CLUSTER_ENV)/venv
	$(PY) -m pip --python $(CLUSTER_ENV)/venv/bin/python install -q --no-deps \
	    $(CLUSTER_ENV)/wheel/*.whl
	$(PY) -m venv_pack -q -p $(CLUSTER_ENV)/venv -o $(CLUSTER_ENV)/pylimiter-env.tar.gz
	@ls -l $(CLUSTER_ENV)/pylimiter-env.tar.gz

# A standalone master and one worker on 127.0.0.1 (pyspark's spark-class),
# the worker's Python a bare venv without pylimiter; each pipeline at a small
# scale with --executor-env against local[*]'s results (tests/cluster).
test-cluster: cluster-env
	$(PY) -m pytest -q -p no:cacheprovider tests/cluster

# The Py_DEBUG tier (issue 18): Debian's python3.11-dbg, whose refcount and
# GC assertions abort on a double free, a freelist entry used twice or an
# object tracked twice, runs the limiter's and the entry cache's suites
# against extensions built for it with AddressSanitizer and UBSan (and C
# assertions, PLIM_DEBUG), in a venv of its own: once under -X dev -W error,
# then a stress pass with a collection at nearly every allocation
# (PYLIMITER_GC_THRESHOLD=1) over the tests that make and drop the most
# objects.  The sanitizers cover the binding's own C (the deallocation
# hooks, the StopIteration cache), which the C tier (tests/test_c_core.py)
# cannot reach.  The C twin only: the pure one runs everywhere else.
# Debian's 3.11 (3.11.2) is not pyenv's (3.11.7), hence the separate venv;
# its extensions (*.cpython-311d-*.so) sit beside the others and only it
# loads them.
DBG_PYTHON ?= python3.11-dbg
DBG_VENV ?= .venv-dbg
DBG_PY := $(DBG_VENV)/bin/python
DBG_CORE := tests/test_api.py tests/test_semaphore.py tests/test_dual.py tests/test_habits.py \
	tests/test_wakeups.py tests/test_await_path.py tests/test_timers.py tests/test_switch.py \
	tests/test_prometheus.py tests/test_differential.py tests/test_crash.py \
	tests/test_attributes.py tests/test_misuse.py tests/test_base_exceptions.py \
	tests/test_twin_parity.py tests/test_hostile.py tests/test_wake_failures.py \
	tests/test_subinterpreters.py \
	tests/shared/test_api.py tests/shared/test_processes.py tests/shared/test_death.py \
	tests/shared/test_hostile.py
# The Spark pipeline is left out: this venv has no PySpark.
DBG_CACHE := $(filter-out %/test_pipeline.py,$(wildcard tests/pulsar/cache/test_*.py))
DBG_STRESS := tests/test_wakeups.py tests/test_habits.py tests/test_await_path.py \
	tests/test_base_exceptions.py tests/test_misuse.py tests/pulsar/cache/test_manager.py \
	tests/pulsar/cache/test_reader.py tests/pulsar/cache/test_queue.py
DBG_PYTEST := -X dev -W error -m pytest -q -rfE -p no:cacheprovider -m "not spark"
DBG_CFLAGS := -O0 -g -UNDEBUG -DPLIM_DEBUG=1 -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined
# The sanitizer runtimes go first into the (uninstrumented) interpreter;
# leaks are CPython's own at exit, not checked.
DBG_ENV = LD_PRELOAD="$$(cc -print-file-name=libasan.so) $$(cc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# Installed from Debian when this user can and nothing else on the system
# changes (.ci/apt_tier.sh says what and why first; PYLIMITER_NO_APT=1 skips).
# Its headers come with it (libpython3.11-dbg); venv brings ensurepip.
dbg-python:
	@command -v $(DBG_PYTHON) >/dev/null 2>&1 || .ci/apt_tier.sh "the Py_DEBUG tier (make test-dbg)" \
	    "Debian's debug CPython, whose refcount and GC checks abort on a double free" \
	    python3.11-dbg python3.11-venv || true

# The tools at the main venv's versions (same Cython: same generated C);
# rm -rf $(DBG_VENV) after changing the list.
$(DBG_VENV)/.deps: pyproject.toml $(VENV)/.deps
	rm -rf $(DBG_VENV)
	$(DBG_PYTHON) -m venv $(DBG_VENV)
	PYTHONWARNINGS=ignore $(DBG_PY) -m pip install -q --upgrade "pip>=25.1" \
	    $$($(PY) -c "from importlib.metadata import version as v; \
	        print(' '.join(f'{p}=={v(p)}' for p in \
	        ('cython', 'setuptools', 'pytest', 'hypothesis', 'prometheus_client', 'trio')))")
	touch $@

test-dbg: build dbg-python
	@if ! command -v $(DBG_PYTHON) >/dev/null 2>&1; then \
	    echo "Py_DEBUG tier NOT run: $(DBG_PYTHON) is missing (make dbg-python says why;" \
	         "as root: apt-get install --no-install-recommends python3.11-dbg python3.11-venv)"; \
	else \
	    $(MAKE) --no-print-directory $(DBG_VENV)/.deps && \
	    CFLAGS="$(DBG_CFLAGS)" LDFLAGS="-fsanitize=address,undefined" $(DBG_PY) setup.py -q \
	        build_ext --inplace --build-temp build/temp-dbg >/dev/null && \
	    $(DBG_ENV) $(DBG_PY) $(DBG_PYTEST) -k "not python" $(DBG_CORE) $(DBG_CACHE) && \
	    $(DBG_ENV) PYLIMITER_GC_THRESHOLD=1 $(DBG_PY) $(DBG_PYTEST) \
	        -k "not python and not 200_concurrent and not trio" $(DBG_STRESS); \
	fi

# The Relacy headers for the memory-model check (tests/test_memory_model.py):
# installed from Debian as dbg-python above, else one line says why the check
# will be skipped.
RELACY := /usr/include/relacy/relacy.hpp
relacy:
	@{ test -f $(RELACY) && command -v g++ >/dev/null 2>&1; } || .ci/apt_tier.sh \
	    "the memory-model check (tests/test_memory_model.py)" \
	    "the Relacy headers and the C++ compiler that builds the model" relacy-dev g++ || true
	@test -f $(RELACY) || echo "memory-model check NOT run: $(RELACY) is missing"

# spin, for the model of the host-wide limiter's cross-process protocol
# (tests/shared/test_shm_model.py), as relacy-dev above.
spin:
	@command -v spin >/dev/null 2>&1 || .ci/apt_tier.sh \
	    "the host-wide limiter's protocol model (tests/shared/test_shm_model.py)" \
	    "the spin model checker" spin || true
	@command -v spin >/dev/null 2>&1 || echo "host-wide limiter model check NOT run: spin is missing"

test-c: build
	$(PY) -m pytest tests/test_c_core.py

# PYLIMITER_NO_EXTENSIONS=1 at install time: no extension is built or shipped,
# the build records it (pylimiter/_build_config.py in the install, not in the
# tree), and the installed package imports as pure with the variable unset
# or 1; PYLIMITER_NO_EXTENSIONS=0 asks for what it does not have: an
# ImportError in one line.
test-pure:
	rm -rf $(PURE_VENV)
	$(PYTHON) -m venv $(PURE_VENV)
	PYLIMITER_NO_EXTENSIONS=1 $(PURE_VENV)/bin/python -m pip install -q .
	@test ! -e pylimiter/_build_config.py || { echo "pylimiter/_build_config.py written into the tree"; exit 1; }
	cd /tmp && for v in unset 1; do \
	  if [ $$v = unset ]; then e="env -u PYLIMITER_NO_EXTENSIONS"; else e="env PYLIMITER_NO_EXTENSIONS=$$v"; fi; \
	  $$e $(CURDIR)/$(PURE_VENV)/bin/python -c "\
	import pathlib, pylimiter, pylimiter.pulsar.cache as c; \
	assert (pylimiter.IMPLEMENTATION, c.IMPLEMENTATION) == ('python', 'python'), pylimiter.IMPLEMENTATION; \
	d = pathlib.Path(pylimiter.__file__).parent; \
	assert not list(d.rglob('*.so')), 'extension shipped in a pure install'; \
	print('pure install OK (PYLIMITER_NO_EXTENSIONS $$v):', d)" || exit 1; \
	done
	cd /tmp && ! PYLIMITER_NO_EXTENSIONS=0 $(CURDIR)/$(PURE_VENV)/bin/python -c "import pylimiter" \
	    2>/tmp/pylimiter-test-pure.err
	tail -1 /tmp/pylimiter-test-pure.err | grep -q "^ImportError: pylimiter: PYLIMITER_NO_EXTENSIONS=0 asks for the C extensions"
	@echo "pure install OK (PYLIMITER_NO_EXTENSIONS=0): $$(tail -1 /tmp/pylimiter-test-pure.err)"

# The suite on every interpreter: 3.10-3.13 from /root/.pyenv/versions, 3.14
# and 3.15 (Debian sid's packages) inside the sid root that wheels/pythons.sh
# makes (once; cached in wheels/work/sid), each with a venv of its own
# (.venv-3.X, created inside the root for 3.14/3.15).  pulsar-client has no
# cp315 build: on 3.15 the official-client tests drive the 3.14 venv's.
PYENV_PYTHONS := 3.10 3.11 3.12 3.13
SID_PYTHONS := 3.14 3.15
test-pythons: relacy
	wheels/pythons.sh amd64
	for v in $(PYENV_PYTHONS); do \
	  p=$$(ls -d /root/.pyenv/versions/$$v.*/bin/python$$v 2>/dev/null | head -1); \
	  if [ -z "$$p" ]; then echo "skip $$v: not installed"; continue; fi; \
	  echo "== CPython $$v: $$p"; \
	  $(MAKE) --no-print-directory PYTHON=$$p VENV=.venv-$$v build && \
	  .venv-$$v/bin/python -m pytest -q -x -p no:cacheprovider || exit 1; \
	done
	for v in $(SID_PYTHONS); do \
	  echo "== CPython $$v: Debian sid's python$$v (wheels/in_sid.sh amd64)"; \
	  wheels/in_sid.sh amd64 make --no-print-directory PYTHON=python$$v VENV=.venv-$$v build && \
	  PYLIMITER_PULSAR_CLIENT_PYTHON=$(CURDIR)/.venv-3.14/bin/python \
	    wheels/in_sid.sh amd64 .venv-$$v/bin/python -m pytest -q -x -p no:cacheprovider || exit 1; \
	done

# PySpark needs a JVM; say so plainly instead of letting py4j time out.
java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java (17+) is required for PySpark:" \
	    "apt-get install openjdk-17-jre-headless" >&2; exit 1; }
	@java -version 2>&1 | head -1

# The main job: the benchmark grid on Spark (local[*]), a summary table with
# the ratios to the stdlib anchors, and reports/bench/index.html with plots.
BENCH_ARGS ?=
bench: build java
	$(PY) -m pylimiter.bench --out reports/bench $(BENCH_ARGS)

# Quick before/after comparisons for a PR: pytest-benchmark, one process;
# the ratios (figures group) are measured side by side inside one test each.
bench-micro: build
	mkdir -p reports
	$(PY) -m pytest benchmarks/micro --benchmark-only -q -p no:cacheprovider \
	    --benchmark-json=reports/micro.json --benchmark-columns=median,iqr,rounds \
	    --benchmark-sort=name --benchmark-timer=time.thread_time
	$(PY) -m benchmarks.micro.report reports/micro.json

# asv: the suites for HEAD in this venv, then the HTML site
# (benchmarks/.asv/html).  `asv continuous` is in benchmarks/README.md.
asv: build
	cd benchmarks && ../$(PY) -m asv machine --yes --machine local >/dev/null
	cd benchmarks && ../$(PY) -m asv run --machine local --show-stderr \
	    --environment existing:$(CURDIR)/$(PY) --set-commit-hash $$(git rev-parse HEAD)
	cd benchmarks && ../$(PY) -m asv publish
	@echo "asv site: $(CURDIR)/benchmarks/.asv/html/index.html (serve: cd benchmarks && asv preview)"

# Twelve manylinux_2_17 wheels (x86_64 and aarch64, cp310-cp315) and the
# sdist in wheels/dist, every one built on this host and its tag read back
# (auditwheel show).  Checks: x86_64 cp310-cp313 and the sdist in fresh venvs
# of pyenv's CPythons; x86_64 cp314/cp315 in venvs of Debian sid's python3.14
# / python3.15 inside the amd64 sid root; aarch64 cp311/cp313 by Debian's
# arm64 CPython under qemu, cp310/cp312 by python.org's CPython cross-built
# here for arm64 (wheels/aarch64_env.sh), cp314/cp315 inside the arm64 sid
# root under qemu; each the suite and the pure pass.
wheels: venv
	wheels/pythons.sh
	wheels/build_wheels.sh
	wheels/build_aarch64.sh
	wheels/show_tags.sh
	$(PY) wheels/check_wheels.py wheels/dist $(foreach v,$(PYENV_PYTHONS),--python $(v))
	wheels/in_sid.sh amd64 python3.14 wheels/check_wheels.py wheels/dist --no-sdist \
	    $(foreach v,$(SID_PYTHONS),--python $(v))
	wheels/check_aarch64.sh

# What CI does on every run: the cp311 wheel and the sdist, built and checked.
wheel-cp311: venv
	wheels/build_wheels.sh 3.11
	$(PY) wheels/check_wheels.py wheels/dist --python 3.11

# The memory-model check, the C tier (LL/SC, LSE, outline atomics; several
# -cpu models), then the cp310-cp315 manylinux_2_17_aarch64 wheels, built and
# checked as in `make wheels`.
test-aarch64: venv model-check
	wheels/pythons.sh
	wheels/test_aarch64.sh

# Relacy model of the acquire/release/wake handoff: random schedules plus an
# exhaustive search up to 2 preemptions; weakened builds must fail.
model-check: build relacy
	@test -f $(RELACY) || { echo "error: relacy-dev is required" >&2; exit 1; }
	mkdir -p build/model
	g++ -std=c++11 -O1 -w tests/model/plim_relacy.cpp -o build/model/plim_relacy
	build/model/plim_relacy 1000000
	build/model/plim_relacy 2 bound
	$(PY) -m pytest -q -p no:cacheprovider tests/test_memory_model.py

# Message lifecycle (pylimiter.pulsar.cursor): the subscription sweep on
# Spark local[*] -> reports/cursor/index.html (CURSOR_ARGS passes options,
# e.g. CURSOR_ARGS="--ttl-min 60 --delayed-share 0,0.2"); and the
# hole-tracking benchmark against pyroaring -> benchmarks/results/cursor_holes*.
CURSOR_ARGS ?=
cursor-sim: build java
	$(PY) -m pylimiter.pulsar.cursor simulate --out reports/cursor $(CURSOR_ARGS)

cursor-bench: build
	$(PY) -m benchmarks.cursor_holes

# The broker entry cache (PIP-430): the policy simulator's default sweep on
# Spark local[*] -> reports/cache/index.html (CACHE_SIM_ARGS adds flags, e.g.
# --scale 0.2 for a quick look), and the cache's speed and memory benchmarks
# (benchmarks/README.md, "Broker entry cache").
CACHE_SIM_ARGS ?=
cache-sim: build java
	$(PY) -m pylimiter.pulsar.cache simulate --out reports/cache $(CACHE_SIM_ARGS)

cache-bench: build
	$(PY) -m benchmarks.cache_bench

# Bundle load balancing (issue 10): the generated 600K-topic, 200-namespace,
# 20-broker, 60-step cluster through Pulsar's splitter, two placements and
# ThresholdShedder on/off on Spark local[*]; reports/balance/index.html.
# BALANCE_ARGS="--input rows.parquet --brokers 12 ..." replays your own load.
BALANCE_ARGS ?=
balance: build java
	$(PY) -m pylimiter.pulsar.balance simulate --out reports/balance $(BALANCE_ARGS)

# The speed figures on CPython 3.10-3.13 (pyenv) and 3.14-3.15 (Debian
# sid's, in the sid root), default loop and uvloop, into
# benchmarks/results/figures.md, .csv and headline.md, whose table it also
# copies into README.md (the docs include the file): one run, one source.
bench-table: build
	wheels/pythons.sh amd64
	$(PY) -m benchmarks.table

# Regenerate the committed protobuf module from its .proto with the pinned
# grpcio-tools (tests/pulsar/topiclist/test_protocol_gencode.py checks they agree).
PROTO_DIR := pylimiter/pulsar/topiclist
proto: venv
	$(PY) -m grpc_tools.protoc -I$(PROTO_DIR) --python_out=$(PROTO_DIR) \
	    $(PROTO_DIR)/pulsar_topiclist.proto

# The wheels already in wheels/dist checked again without rebuilding them:
# contents, then the suite in a fresh venv of each CPython that can run one.
check-wheels: venv
	$(PY) wheels/check_wheels.py wheels/dist

# Every extension's build output: Cython's .c (and annotated .html) beside
# each .pyx, and the compiled modules.
PYX := $(shell find pylimiter -name '*.pyx')
# The documentation site (docs/, mkdocs.yml) into site/, strict: a warning (a
# broken link or anchor, a page left out of the nav, an API name that does
# not resolve) fails the build.  The API reference is read statically from
# the pure-Python twin, so the C extension need not be built.
.PHONY: docs
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
	@echo "docs: open site/index.html"

clean:
	rm -rf build dist *.egg-info reports site .pytest_cache $(PYX:.pyx=.c) $(PYX:.pyx=.html)
	find pylimiter -name '*.so' -delete
