import asyncio

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the bench extra
    uvloop = None

LOOPS = ["asyncio"] + (["uvloop"] if uvloop is not None else [])


@pytest.fixture(params=LOOPS)
def loop(request):
    """A fresh event loop (default asyncio or uvloop), closed afterwards."""
    lp = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
    yield lp
    lp.close()
