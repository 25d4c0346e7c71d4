"""The host-wide scenarios' part of the bench report: verdict rows, a
figure (throughput and hand-off latency against the number of Python
workers sharing one SharedSemaphore), a table, and the terminal summary.
Every statement is computed from the run's summary table
(:data:`pylimiter.bench.hostwide_pipeline.HOST_SUMMARY_SQL`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from ..spark.report import FULL_WIDTH_IN, Verdict, plural, save_figure
from ..spark.report import pyplot as _plt

__all__ = ["add_host_section", "host_problems", "host_verdicts", "plot_hostwide",
           "print_host_summary"]

IMPL_COLORS = {"c": "#1f77b4", "python": "#ff7f0e"}
IMPL_LABELS = {"c": "SharedSemaphore (C)", "python": "SharedSemaphore (pure Python)"}
FLOCK = "fcntl.flock"
FLOCK_COLOR = "#555555"
#: Each series a little to the side of k, so equal values do not hide each other.
X_SHIFT = {("c", "shared"): -0.06, ("python", "shared"): 0.06, ("c", "flock"): 0.0}

#: What the section says the scenarios are (the report must say it is
#: host-wide), one paragraph each.
HOST_WIDE_TEXT = (
    "Host-wide scenarios: every Python worker process of an executor opens the same "
    "SharedSemaphore (one segment per run and stage, in /dev/shm or the executors' "
    "$PYLIMITER_SHM_DIR), so the processes on one host share one budget: one limit, one "
    "FIFO queue, one high-water mark kept in the segment.  On local[*] and on a standalone "
    "cluster of one worker all the workers are on this host.  k = the Python workers "
    "(cores) running at once, one Spark barrier stage per k.",
    "host-handoff: a limit of 1; each worker runs one thread looping acquire_blocking(1) "
    "-> a 20 µs critical section (busy) -> release.  A hand-off is a grant whose previous "
    "holder was another process that released after this request was made; its latency "
    "runs from the releaser's CLOCK_MONOTONIC reading just before release to the "
    "grantee's when its call returned.  Hand-offs happen only while two workers run at "
    "the same time: on a shared machine a worker that runs alone takes the permit "
    "uncontended, so hand-offs/s says how many of the grants were hand-offs.  Beside it, "
    "in the same workers and rounds: fcntl.flock on a shared file, the host-wide mutex "
    "users write by hand (not FIFO: a releaser that asks again at once may take it back).",
    "host-load: a limit of 16; each worker runs 100 asyncio tasks looping acquire(1) -> "
    "1 ms sleep -> release.  Throughput: the grants of all the host's workers per second; "
    "wait: from the acquire call to the grant.",
    "Timing: the sides run in the same time slots in every worker, the order flipped "
    "every round, on a schedule the workers agree on in shared memory (Spark's barrier "
    "lets some tasks go up to a second after the others, so it only orders the phases).  "
    "Figures are medians over rounds (per round: throughput summed over the workers, the "
    "median over the workers of their hand-off p50, the worst of their p99).  The "
    "high-water mark is read from the segment after every round; after the last, the "
    "host's books (acquired, queued, holders()) must be zero.",
)


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _fmt_us(v) -> str:
    if not _ok(v):
        return "-"
    return f"{v:,.0f} µs" if v >= 100 else f"{v:.1f} µs"


def _shared(summary, scenario: str):
    return summary[(summary.scenario == scenario) & (summary.side == "shared")]


def host_problems(summary) -> list[str]:
    """What makes the run fail: a high-water mark above the limit, books
    not clean after a stage, errors or failed rows."""
    if summary is None or summary.empty:
        return []
    bad = []
    shared = summary[summary.side == "shared"]
    over = shared[shared.peak > shared.limit]
    if len(over):
        r = over.iloc[0]
        bad.append(f"host budget exceeded: high-water mark {int(r.peak)} > limit "
                   f"{int(r.limit)} ({r.scenario}, {r.impl}, {int(r.cores)} workers)")
    left = int(summary.leaked.fillna(0).max()) + int(summary.unbalanced.fillna(0).max())
    if left:
        bad.append(f"host-wide books not clean after a stage ({left} permits)")
    failures, errors = int(summary.failures.sum()), int(summary.errors.sum())
    if failures or errors:
        bad.append(f"host-wide: {plural(failures, 'failed row')}, {plural(errors, 'error')}")
    return bad


def host_verdicts(summary) -> list[Verdict]:
    """The verdict rows: the budget and the books (claims), hand-off and
    throughput (what was measured, no claim)."""
    if summary is None or summary.empty:
        return []
    rows = []
    shared = summary[summary.side == "shared"]
    marks = []
    for scen, g in shared.groupby("scenario"):
        g = g[g.peak.notna()]
        if len(g):
            marks.append(f"{scen}: high-water mark {int(g.peak.max())} <= limit "
                         f"{int(g.limit.max())}")
    held = bool(len(shared) and shared.peak.notna().all()
                and (shared.peak <= shared.limit).all())
    procs = int(shared.processes.max())
    rows.append(Verdict(
        "Host budget held: the Python workers of a host share one SharedSemaphore and "
        "never hold more than its limit",
        "; ".join(marks) + f" (up to {plural(procs, 'worker')} on one host, "
        f"{', '.join(sorted(set(shared.impl)))})" if marks else "no high-water mark read",
        held if marks else None))
    leaked = int(summary.leaked.fillna(0).max())
    unbalanced = int(summary.unbalanced.fillna(0).max())
    failures, errors = int(summary.failures.sum()), int(summary.errors.sum())
    stages = len(shared.groupby(["scenario", "impl", "cores", "host"]))
    rows.append(Verdict(
        "Every host-wide stage ends with clean books (nothing held or queued; holders() "
        "all 0)",
        f"{plural(leaked, 'permit')} held or queued, {unbalanced} in holders(), "
        f"{plural(errors, 'error')}, {plural(failures, 'failed row')} after "
        f"{plural(stages, 'stage')}", not (leaked or unbalanced or failures or errors)))
    ho = _shared(summary, "host-handoff")
    ho = ho[(ho.impl == "c") & ho.handoff_p50_us.notna()]
    if len(ho):
        r = ho.sort_values("cores").iloc[-1]
        fl = summary[(summary.scenario == "host-handoff") & (summary.side == "flock")
                     & (summary.impl == "c") & (summary.cores == r.cores)
                     & (summary.host == r.host)]
        anchor = ""
        if len(fl) and _ok(fl.iloc[0].handoff_p50_us):
            f = fl.iloc[0]
            anchor = (f"; {FLOCK} in the same rounds: p50 {_fmt_us(f.handoff_p50_us)}, "
                      f"{f.handoffs_per_s:,.0f} hand-offs/s of {f.grants_per_s:,.0f} grants/s")
            if _ok(r.anchor_over_mine_p50):
                anchor += f" (its p50 / ours: {r.anchor_over_mine_p50:.2f}, median of rounds)"
        rows.append(Verdict(
            f"Hand-off between {int(r.cores)} Python workers on one SharedSemaphore (C)",
            f"p50 {_fmt_us(r.handoff_p50_us)}, p99 {_fmt_us(r.handoff_p99_us)}; "
            f"{r.handoffs_per_s:,.0f} hand-offs/s of {r.grants_per_s:,.0f} grants/s"
            + anchor, "fact"))
    ld = _shared(summary, "host-load")
    ld = ld[ld.impl == "c"].sort_values("cores")
    if len(ld):
        per = ", ".join(f"{r.grants_per_s:,.0f} with {plural(int(r.cores), 'worker')}"
                        for r in ld.itertuples())
        rows.append(Verdict(
            "Host throughput through one SharedSemaphore of 16 permits (C, 100 tasks per "
            "worker, 1 ms hold)", f"grants/s: {per}", "fact"))
    return rows


def plot_hostwide(summary, path: Path, log_axis=None) -> bool:
    """Three panels against k (workers at once): host-handoff grants/s and
    hand-offs/s, host-handoff latency p50/p99 (log), host-load grants/s.
    ``log_axis(ax, "y")`` labels a log axis (the grid report passes its
    own, so both read alike)."""
    if summary is None or summary.empty:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(FULL_WIDTH_IN, 4.4))
    ks = sorted(set(int(k) for k in summary.cores))
    ho = summary[summary.scenario == "host-handoff"]
    ld = summary[summary.scenario == "host-load"]
    ax = axes[0]
    for (impl, side), g in ho.groupby(["impl", "side"]):
        if side == "flock" and impl != "c":
            continue                    # one anchor line: the C run's stages
        g = g.sort_values("cores")
        color = IMPL_COLORS.get(impl) if side == "shared" else FLOCK_COLOR
        label = IMPL_LABELS.get(impl, impl) if side == "shared" else FLOCK
        style = "o-" if side == "shared" else "s--"
        ax.plot(g.cores, g.grants_per_s, style, color=color, label=f"{label}: grants")
        h = g[g.handoffs_per_s > 0]     # none with one worker: nobody to hand off to
        if len(h):
            ax.plot(h.cores, h.handoffs_per_s, style[0] + ":", color=color, alpha=0.6,
                    mfc="white", label=f"{label}: hand-offs")
    ax.set_title("host-handoff (limit 1): per second", fontsize=10)
    ax.set_ylabel("per second, host-wide (log)")
    ax = axes[1]
    for (impl, side), g in ho.groupby(["impl", "side"]):
        if side == "flock" and impl != "c":
            continue
        g = g[g.handoff_p50_us.notna()].sort_values("cores")
        if g.empty:
            continue
        color = IMPL_COLORS.get(impl) if side == "shared" else FLOCK_COLOR
        label = IMPL_LABELS.get(impl, impl) if side == "shared" else FLOCK
        x = g.cores + X_SHIFT.get((impl, side), 0.0)
        ax.plot(x, g.handoff_p50_us, "o-" if side == "shared" else "s--", color=color,
                label=f"{label} p50")
        ax.plot(x, g.handoff_p99_us, "v:", color=color, label=f"{label} p99")
    if 1 in ks and ax.lines:
        ax.annotate("one worker:\nno hand-off", (1, 0.5), xycoords=("data", "axes fraction"),
                    ha="center", fontsize=8, color="#777777")
    ax.set_title("host-handoff: latency between processes", fontsize=10)
    ax.set_ylabel("µs, release in one process to grant in another (log)")
    ax = axes[2]
    for impl, g in ld[ld.side == "shared"].groupby("impl"):
        g = g.sort_values("cores")
        ax.plot(g.cores, g.grants_per_s, "o-", color=IMPL_COLORS.get(impl),
                label=IMPL_LABELS.get(impl, impl))
        ax.fill_between(g.cores, g.grants_per_s_q1, g.grants_per_s_q3,
                        color=IMPL_COLORS.get(impl), alpha=0.15)
    ax.set_title("host-load (limit 16, 100 tasks/worker): grants/s", fontsize=10)
    ax.set_ylabel("grants per second, host-wide (log)")
    for ax in axes:
        if not ax.lines:
            ax.set_visible(False)
            continue
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo / 1.3, hi * 1.3)
        if log_axis is not None:
            log_axis(ax, "y")
        ax.set_xticks(ks)
        ax.set_xlim(min(ks) - 0.3, max(ks) + 0.3)
        ax.set_xlabel("k: Python workers on one SharedSemaphore")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best", frameon=False)
    fig.tight_layout()
    return bool(save_figure(fig, path))


HOST_COLUMNS = ["scenario", "impl", "side", "host", "k workers", "rounds", "limit",
                "high-water mark", "grants/s [IQR]", "hand-offs/s", "hand-off p50 µs",
                "hand-off p99 µs", "wait p50 µs", "wait p99 µs", "flock p50 / ours",
                "left held", "errors"]


def host_rows(summary) -> list[tuple]:
    """The summary as the page shows it."""
    out = []
    for r in summary.itertuples():
        out.append((r.scenario, r.impl, FLOCK if r.side == "flock" else "SharedSemaphore",
                    r.host, int(r.cores), int(r.rounds), int(r.limit) if _ok(r.limit) else "",
                    int(r.peak) if _ok(r.peak) else "",
                    f"{r.grants_per_s:,.0f} [{r.grants_per_s_q1:,.0f}-{r.grants_per_s_q3:,.0f}]"
                    if _ok(r.grants_per_s) else "",
                    r.handoffs_per_s if r.scenario == "host-handoff" else None,
                    r.handoff_p50_us, r.handoff_p99_us, r.wait_p50_us, r.wait_p99_us,
                    r.anchor_over_mine_p50,
                    int((r.leaked or 0) + (r.unbalanced or 0))
                    if _ok(r.leaked) and _ok(r.unbalanced) else "",
                    int(r.errors) + int(r.failures)))
    return out


HOST_FORMATS = {"hand-offs/s": "{:,.0f}", "hand-off p50 µs": "{:,.1f}",
                "hand-off p99 µs": "{:,.1f}", "wait p50 µs": "{:,.0f}",
                "wait p99 µs": "{:,.0f}", "flock p50 / ours": "{:.3g}"}


def _layout_text(layout) -> str:
    execs, cores = layout if layout else (None, None)
    if execs is None:
        return "executors x cores: unknown"
    return f"this session: {plural(execs, 'executor')} x {plural(cores, 'core')}"


def add_host_section(page, summary, layout, out: Path, log_axis=None) -> None:
    """The section "Host-wide: one SharedSemaphore per host" (nothing when
    the host-wide scenarios did not run); ``log_axis``: see plot_hostwide."""
    if summary is None or summary.empty:
        return
    page.heading("Host-wide: one SharedSemaphore per host")
    for i, text in enumerate(HOST_WIDE_TEXT):
        page.paragraph(text + (f"  ({_layout_text(layout).capitalize()}.)" if i == 0 else ""))
    if plot_hostwide(summary, Path(out) / "hostwide.png", log_axis):
        page.figure("hostwide.png", "Medians over rounds against k, the Python workers "
                    "sharing one SharedSemaphore on one host (a shaded band: the IQR over "
                    "rounds).  fcntl.flock: the same workers and rounds, the C run's stage.")
    page.table(host_rows(summary), HOST_COLUMNS, formats=HOST_FORMATS,
               caption="Host-wide summary (medians over rounds; high-water mark: the most "
                       "permits held at once on the host, read from the segment)")


def print_host_summary(summary, layout=None, console: Optional[Any] = None) -> None:
    """The host-wide stages in the terminal (nothing when they did not run)."""
    if summary is None or summary.empty:
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=100)
    t = Table(title=f"host-wide: one SharedSemaphore per host ({_layout_text(layout)})",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              title_justify="left")
    for col in ["scenario", "impl", "side", "k", "HWM/limit", "grants/s", "hand-offs/s",
                "p50 µs", "p99 µs"]:
        t.add_column(col, justify="left" if col in ("scenario", "impl", "side") else "right",
                     no_wrap=True)
    for r in summary.itertuples():
        handoff = r.scenario == "host-handoff"
        p50 = r.handoff_p50_us if handoff else r.wait_p50_us
        p99 = r.handoff_p99_us if handoff else r.wait_p99_us
        t.add_row(r.scenario, r.impl, "flock" if r.side == "flock" else "shared",
                  str(int(r.cores)),
                  f"{int(r.peak)}/{int(r.limit)}" if _ok(r.peak) else "-",
                  f"{r.grants_per_s:,.0f}" if _ok(r.grants_per_s) else "-",
                  f"{r.handoffs_per_s:,.0f}" if handoff and _ok(r.handoffs_per_s) else "",
                  f"{p50:,.1f}" if _ok(p50) else "-", f"{p99:,.1f}" if _ok(p99) else "-")
    console.print(t)
    console.print("k: Python workers on one SharedSemaphore at once (one host: one budget).  "
                  "HWM: the segment's high-water mark.  p50/p99: hand-off latency between "
                  "processes (host-handoff) or wait from acquire to grant (host-load).",
                  width=100, soft_wrap=False)
