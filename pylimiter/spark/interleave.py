"""Side-by-side timing: two or more *sides* (pylimiter, its stdlib anchor, a
no-limiter baseline) measured in the same process, one round of each at a
time, so that whatever the machine does meanwhile (another tenant, a
frequency change, a GC-heavy neighbour) falls on every side alike.

- Rounds are interleaved and the order is flipped every round (A B, B A,
  A B ...; with three sides A B C, C B A ...), so no side always runs first
  after the others have warmed the caches.
- A figure is computed *per round* from that round's sides (a speed-up
  ``anchor / mine``, or a cost ratio ``(mine - base) / (anchor - base)``)
  and summarised by its median over rounds, with the quartiles and the
  extremes as its spread.  Medians of separately run benchmarks are not
  used for anything: on a shared machine they drift apart.
- Each side times itself (it knows where its set-up ends) and returns
  nanoseconds of the clock it was given: thread CPU time
  (:func:`time.thread_time_ns`) for single-threaded scenarios, so time the
  thread spends descheduled or blocked in ``epoll`` waiting for a timer is
  not counted, and wall time (:func:`time.perf_counter_ns`) only where
  several threads share the work.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

__all__ = ["CPU", "WALL", "Spread", "interleaved", "per_round"]

#: Clock for single-threaded scenarios: CPU time of the calling thread.
CPU = time.thread_time_ns
#: Clock for scenarios whose work is spread over several threads.
WALL = time.perf_counter_ns


@dataclass(frozen=True)
class Spread:
    """A figure over rounds: median, quartiles (IQR) and extremes."""

    median: float
    q1: float
    q3: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        """Summarise the per-round values (at least one, NaNs dropped)."""
        vals = sorted(v for v in values if not math.isnan(v))
        if not vals:
            raise ValueError("no finite values to summarise")
        if len(vals) == 1:
            q1 = q3 = vals[0]
        else:
            q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
        return cls(statistics.median(vals), q1, q3, vals[0], vals[-1], len(vals))

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def as_dict(self, prefix: str = "") -> dict:
        return {f"{prefix}{k}": getattr(self, k) for k in ("median", "q1", "q3", "lo", "hi", "n")}


def interleaved(sides: Mapping[str, Callable[[], float]], rounds: int, warmup: int = 1,
                budget_s: Optional[float] = None, max_rounds: int = 1000,
                before: Optional[Callable[[], None]] = None) -> dict[str, list[float]]:
    """Run every side once per round, flipping the order each round, and
    return each side's per-round results (what the side returned: its own
    nanoseconds, or ns per operation).

    ``rounds`` rounds at least; with ``budget_s`` more rounds follow until
    that much wall time has passed (at most ``max_rounds``).  ``warmup``
    leading rounds are run and dropped.  ``before`` runs (untimed by the
    sides) ahead of every side, e.g. ``gc.collect``, so one side's garbage
    is not collected on the next side's clock."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(sides)
    out: dict[str, list[float]] = {name: [] for name in names}
    deadline = None
    r = 0
    while True:
        if r == warmup and budget_s is not None:
            deadline = time.perf_counter() + budget_s
        done = r - warmup
        if done >= rounds and (deadline is None or time.perf_counter() >= deadline
                               or done >= max_rounds):
            return out
        order = names if r % 2 == 0 else names[::-1]
        results = {}
        for name in order:
            if before is not None:
                before()
            results[name] = sides[name]()
        if r >= warmup:
            for name in names:
                out[name].append(results[name])
        r += 1


def per_round(samples: Mapping[str, Sequence[float]],
              figure: Callable[..., float]) -> list[float]:
    """``figure(**one_round)`` for every round: e.g.
    ``per_round(s, lambda mine, anchor: anchor / mine)``."""
    n = min(len(v) for v in samples.values())
    return [figure(**{k: v[i] for k, v in samples.items()}) for i in range(n)]
