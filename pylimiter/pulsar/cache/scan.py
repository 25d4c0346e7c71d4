"""The cost of one periodic eviction pass with nothing to evict, per policy,
as the number of topics grows: PIP-430's first claim.  Every topic caches
one fresh entry; a fixed clock keeps them all young.  All policies are
measured in one process, rounds interleaved (order rotated every round),
median of thread CPU time per pass."""

from __future__ import annotations

import gc
import statistics
import time

from .policies import POLICIES

__all__ = ["idle_pass_ns"]


def idle_pass_ns(topics: int, policies=("pip430", "legacy"), *, rounds: int = 11,
                 budget_passes: int = 2_000_000) -> dict[str, float]:
    """Median ns per idle ``run_eviction()`` for each policy at ``topics``
    topics.  ``budget_passes`` / topics passes per round for scanning
    policies (at least 1), 20,000 for the others."""
    now = 10**12
    clock = lambda: now  # noqa: E731  (fixed: nothing expires)
    managers = {}
    for name in policies:
        m = POLICIES[name].build(1 << 40, clock=clock)
        for t in range(topics):
            m.cache(f"persistent://tenant/ns/topic-{t}").insert((1, 0), b"x" * 100)
        managers[name] = m
    scans = {"legacy"}
    reps = {n: max(1, budget_passes // topics) if n in scans else 20_000 for n in policies}
    samples: dict[str, list[float]] = {n: [] for n in policies}
    order = list(policies)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            ev, k = managers[name].run_eviction, reps[name]
            gc.collect()
            t0 = time.thread_time_ns()
            for _ in range(k):
                ev()
            samples[name].append((time.thread_time_ns() - t0) / k)
    for name, m in managers.items():
        assert m.size == topics * 100, f"{name} evicted during an idle pass"
    return {n: statistics.median(v) for n, v in samples.items()}
