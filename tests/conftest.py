"""Every test that takes `impl` runs against the C extension and the
pure-Python twin.  A missing C extension fails the C tests (the import in the
fixture raises); only --no-c-extensions deselects them."""

from __future__ import annotations

import argparse
import gc
import os
import sys

import pytest

from pylimiter._impls import PY, C, LimiterImplementation
from tests._helpers import run
from tests._quick import QuickLoop


def pytest_addoption(parser):
    parser.addoption(
        "--c-extensions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the tests of the C extension too (default: yes)",
    )
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write each test's seconds to PATH (make durations: tests/durations.json) "
             "and mark no test slow by its measured time in this run",
    )


def pytest_configure(config):
    # `slow` and `pure_mode` are set here, from what each test uses and
    # what it took (tests/_quick.py), not by hand.
    config.pluginmanager.register(QuickLoop(config), "pylimiter-quick-loop")


def pytest_collection_modifyitems(config, items):
    for item in items:
        # Tests on the shared SparkSession carry the `spark` marker, so a
        # quick run can leave the JVM out (-m "not spark").
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    config.pluginmanager.get_plugin("pylimiter-quick-loop").modify(items)
    if config.getoption("--c-extensions"):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("c_extension") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (pytest, every test
    module and what they import: PySpark, pandas, hypothesis, ~200,000
    objects) is moved out of the cyclic collector's sight (gc.freeze), so
    a test's gc.collect() walks only what the tests made since: the quick
    loop spent 37 of its 73 s in 171 such calls before.  Not on a Py_DEBUG
    interpreter nor under PYLIMITER_GC_THRESHOLD (make test-dbg), where
    every collection is meant to walk everything."""
    if hasattr(sys, "gettotalrefcount") or os.environ.get("PYLIMITER_GC_THRESHOLD"):
        return
    # gc.get_referrers does not see frozen objects: hypothesis, on its first
    # import, asks it whether the PRNGs its plugins register (trio's) are
    # referred to, and warns (an error here) if it sees no referrer.  So it
    # is imported before the freeze, even when no collected test needs it.
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        pass
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session):
    # Back to normal before the plugins' own end-of-run work.
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _gc_stress():
    """PYLIMITER_GC_THRESHOLD=1 (the Py_DEBUG tier's stress pass, `make
    test-dbg`): a collection at nearly every allocation while each test
    body runs, so a deallocator or traversal that is wrong under the
    cyclic GC fails there and then (pytest itself runs at normal speed)."""
    threshold = os.environ.get("PYLIMITER_GC_THRESHOLD")
    if not threshold:
        yield
        return
    old = gc.get_threshold()
    gc.set_threshold(int(threshold))
    try:
        yield
    finally:
        gc.set_threshold(*old)


@pytest.fixture(autouse=True)
def _never_awaited_in_their_test():
    """The pure twin notes each new request and looks at the noted ones
    later (at the next collection, or some requests on) to warn about those
    never awaited: look at the end of every test, so that a test's
    forgotten requests warn inside that test and its warning filters, not
    in whichever test happens to run the next collection."""
    yield
    from pylimiter import _limiter_py

    _limiter_py._look()


@pytest.fixture(
    scope="session",
    params=(pytest.param(C, marks=pytest.mark.c_extension), PY),
    ids=str,
)
def impl(request) -> LimiterImplementation:
    return request.param


@pytest.fixture(scope="session")
def mod(impl):
    """The implementation module: AsyncSemaphore, AsyncDualMemoryLimiter..."""
    return impl.module


@pytest.fixture
def make_sem(mod):
    """Build semaphores and check the accounting invariant when the test ends."""
    made = []

    def make(*args, **kwargs):
        sem = mod.AsyncSemaphore(*args, **kwargs)
        made.append(sem)
        return sem

    yield make
    for sem in made:
        assert sem.acquired_permits >= 0
        if sem.max_permits > 0:
            assert sem.available_permits == sem.max_permits - sem.acquired_permits




@pytest.fixture(params=["asyncio", "uvloop"])
def arun(request):
    """Run a coroutine on a fresh event loop, default and uvloop (skipped
    where uvloop is not installed): ``arun(coro, timeout=30)``."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")

    def runner(coro, timeout=30):
        return run(coro, timeout, loop=request.param)

    runner.loop = request.param
    return runner


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession (local[2]) every Spark test shares: a JVM start
    costs seconds, so the benchmark grid and the simulators run their
    pipelines in-process on this session instead of starting their own.
    Skipped when the `spark` extra is not installed (an installed wheel's
    test run); with pyspark present, a failure to start is an error."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from pylimiter.spark.session import spark_session

    with spark_session("local[2]", app_name="pylimiter-tests") as session:
        yield session


@pytest.fixture
def gc_disabled():
    """The cyclic collector off for the test (after one collection): what
    is freed then is freed by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
