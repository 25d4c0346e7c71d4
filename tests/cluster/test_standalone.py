"""The cluster tier's own helper, without a cluster: what it does with the
master's UI while that UI is not ready yet."""

from __future__ import annotations

import gc
import http.server
import threading
import urllib.error
import warnings
from pathlib import Path

import pytest

from tests.cluster.standalone import Cluster


class _NotYet(http.server.BaseHTTPRequestHandler):
    """What Spark's master UI answers for /json/ while it starts."""

    def do_GET(self):
        self.send_error(404, "Not Found")

    def log_message(self, *args):
        pass


@pytest.fixture
def not_ready_ui():
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotYet)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def test_state_closes_the_404_it_raises(not_ready_ui, tmp_path):
    """A 404 while the UI starts is an OSError the start-up loop retries on,
    and its held-open response is closed before it propagates: left to the
    collector, CPython 3.14+ warns about it (ResourceWarning, an error in
    whichever test then runs: make test-pythons' 3.14 stage once failed so)."""
    c = Cluster("spark://127.0.0.1:7077", not_ready_ui, Path("python3"), tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            c.state()
        except urllib.error.HTTPError as e:
            assert e.code == 404
            assert isinstance(e, OSError)   # what the start-up loop retries on
            err = e
        else:
            pytest.fail("no HTTPError for a 404")
        assert err.fp is None or err.fp.closed
        del err
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
