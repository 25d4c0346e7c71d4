"""pylimiter.pulsar.cache.workloads: the generated traces are seeded,
deterministic and read as the workloads describe."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.cache.workloads import (
    ADD,
    MARK_DELETE,
    READ,
    REPLAY_ADD,
    REPLAY_READ,
    WORKLOADS,
    Trace,
)

from .kit import release_only

SMALL = dict(scale=0.05, duration=4.0)


@release_only
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_traces_are_deterministic_and_seeded(workload):
    a = list(Trace(workload, 3, **SMALL))
    b = list(Trace(workload, 3, **SMALL))
    c = list(Trace(workload, 4, **SMALL))
    assert a == b and a != c and a
    assert all(x[0] <= y[0] for x, y in zip(a, a[1:]))          # time order
    kinds = {e[1] for e in a}
    assert {ADD, READ, MARK_DELETE} <= kinds


@release_only
def test_trace_reads_and_replays():
    t = Trace("keyshared", 1, scale=0.1, duration=20)
    events = list(t)
    reads = sum(e[4] - e[3] + 1 for e in events if e[1] == READ)
    reads += sum(len(e[3]) for e in events if e[1] == REPLAY_READ)
    assert t.reads == reads and reads > 0
    added = [x for e in events if e[1] == REPLAY_ADD for x in e[3]]
    redelivered = [x for e in events if e[1] == REPLAY_READ for x in e[3]]
    assert added and redelivered and set(redelivered) <= set(added)
    # the mark-delete never passes an entry still waiting for redelivery
    pending: dict[int, set] = {}
    md: dict[int, int] = {}
    for e in events:
        p = pending.setdefault(e[2], set())
        if e[1] == REPLAY_ADD:
            p |= set(e[3])
        elif e[1] == REPLAY_READ:
            p -= set(e[3])
        elif e[1] == MARK_DELETE:
            md[e[2]] = e[3]
        assert all(x > md.get(e[2], -1) for x in p)
    t2 = Trace("catchup", 1, scale=0.05, duration=5)
    list(t2)
    assert all(len(s) >= 6000 for s in t2.sizes)                   # the backlog's sizes too
    with pytest.raises(ValueError, match="unknown workload"):
        Trace("nope")
