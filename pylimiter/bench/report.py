"""The benchmark grid's plots and page, on the shared report kit.

Speed-ups are ratios, so they are drawn on a log axis (2x faster and 2x
slower are the same distance from the anchor), with one anchor line per
panel.  Cost ratios can be negative (cheaper than no limiter at all: the
timeouts scenario), so they get a linear axis with zero marked.  Axis
numbers are plain (2, 300k, 1.2M), never an offset or 10^n.  The verdict
table is computed from the summary table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from ..spark.report import (
    FULL_WIDTH_IN,
    ReportPage,
    RunResult,
    Verdict,
    environment,
    plural,
    save_figure,
)
from ..spark.report import (
    pyplot as _plt,
)
from .hostwide_report import add_host_section, host_verdicts

__all__ = ["print_summary", "summary_rows", "verdict", "write_report"]

IMPL_COLORS = {"c": "#1f77b4", "python": "#ff7f0e", "anchor": "#555555"}
IMPL_LABELS = {"c": "pylimiter (C)", "python": "pylimiter (pure Python)"}


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _num(v, fmt="{:.0f}") -> str:
    return fmt.format(v) if _ok(v) else ""


def _si(v: float) -> str:
    """300000 -> '300k', 1.2e6 -> '1.2M' (tick labels)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def _plain_ticks(axis, base: Optional[float] = None, si: bool = False) -> None:
    """Log-axis ticks as plain numbers (0.5, 2, 4 or 300k), not 5x10^-1;
    ``base``: a tick at every power of it (2: 0.25, 0.5, 1, 2, 4...)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if base:
        axis.set_major_locator(LogLocator(base=base))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _si(v) if si else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _nice_log_ticks(lo: float, hi: float, at_least: int = 4) -> list[float]:
    """Tick values for a log axis over [lo, hi] that a reader can read off:
    the coarsest of powers of ten, 1-2-5 steps per decade (100k, 200k,
    500k, 1M) and finer ones (1-1.5-2-3-5-7) that gives ``at_least`` ticks,
    so many decades are not crowded and less than one is not bare."""
    if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)):
        return []
    lo, hi = min(lo, hi), max(lo, hi)
    ticks: list[float] = []
    for steps in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7),
                  (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1,
                                              math.ceil(math.log10(hi)) + 1)
                 for m in steps if lo <= m * 10.0 ** e <= hi]
        if len(ticks) >= at_least:
            break
    return ticks


def _readable_log_axis(ax, which: str = "y", si: bool = True) -> None:
    """Label a log axis at _nice_log_ticks over its current limits (plain
    numbers or 100k/1M, no 10^n, no unlabelled decades)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
    ticks = _nice_log_ticks(lo, hi)
    if not ticks:
        return
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _si(v) if si else f"{v:g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _legend_above(ax, ncols: int = 3) -> None:
    """The panel's legend above it, where it cannot hide a bar or a line."""
    ax.legend(fontsize=9, loc="lower left", bbox_to_anchor=(0, 1.01), ncols=ncols,
              frameon=False, borderaxespad=0)


def _label(r) -> str:
    # Long names break at their hyphen so neighbouring ticks do not overlap.
    name = r.scenario.replace("-", "-\n", 1) if len(r.scenario) > 10 else r.scenario
    return f"{name}\nN={r.concurrency} K={r.permits}"


def _ratio_panel(ax, d, value, lo, hi, anchor_label, ylabel, title, log=True):
    """Grouped bars (C, pure Python) per configuration, IQR whiskers, and
    the anchor at 1; on a log axis, or (``log=False``, for ratios that can
    be zero or negative) a linear one with zero marked."""
    configs = list(dict.fromkeys(_label(r) for r in d.itertuples()))
    width = 0.38
    for i, impl in enumerate(("c", "python")):
        g = d[d.impl == impl]
        xs, ys, err = [], [], [[], []]
        for r in g.itertuples():
            v = getattr(r, value)
            if not _ok(v) or (log and v <= 0):
                continue
            xs.append(configs.index(_label(r)) + (i - 0.5) * width)
            ys.append(v)
            q1, q3 = getattr(r, lo), getattr(r, hi)
            err[0].append(max(v - q1, 0) if _ok(q1) else 0)
            err[1].append(max(q3 - v, 0) if _ok(q3) else 0)
        if xs:
            ax.bar(xs, ys, width, color=IMPL_COLORS[impl], label=IMPL_LABELS[impl],
                   yerr=err, capsize=3, error_kw={"lw": 1})
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points",
                            xytext=(0, 3 if y >= 0 else -11), ha="center", fontsize=8)
    ax.axhline(1.0, color=IMPL_COLORS["anchor"], lw=1.2, ls="--", label=anchor_label)
    if log:
        ax.set_yscale("log")
        _plain_ticks(ax.yaxis, base=2)
    else:
        ax.axhline(0.0, color="black", lw=0.8)
        lo_, hi_ = ax.get_ylim()
        ax.set_ylim(min(lo_, -0.1) * 1.1, hi_ * 1.05)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11, pad=34)
    ax.grid(alpha=0.3, axis="y", which="both")
    _legend_above(ax, ncols=2)


def plot_speedup(summary, path: Path) -> bool:
    """Speed-up over the stdlib anchor and, where a baseline exists, the
    limiter's cost relative to the anchor's: two log-axis panels."""
    sp = summary[summary.median_speedup.notna()]
    cost = summary[summary.median_cost_ratio.notna()]
    if sp.empty:
        return False
    plt = _plt()
    panels = 2 if not cost.empty else 1
    n_sp = len(set(_label(r) for r in sp.itertuples()))
    n_cost = len(set(_label(r) for r in cost.itertuples())) if panels == 2 else 0
    fig, axes = plt.subplots(1, panels, figsize=(FULL_WIDTH_IN, 5.2), squeeze=False,
                             gridspec_kw={"width_ratios": [n_sp, max(n_cost, 1) + 1][:panels]})
    _ratio_panel(axes[0][0], sp, "median_speedup", "q1_speedup", "q3_speedup",
                 "anchor (1x)", "anchor time / pylimiter time (log; >1: faster)",
                 "speed-up over the stdlib anchor, same trial (median over trials, IQR)")
    if panels == 2:
        _ratio_panel(axes[0][1], cost, "median_cost_ratio", "q1_cost_ratio", "q3_cost_ratio",
                     "anchor's cost (1)", "cost over no limiter / anchor's\n(<1: cheaper; "
                     "<0: cheaper than no limiter)", "cost of limiting, relative to the anchor's",
                     log=False)
    return bool(save_figure(fig, path))


def plot_throughput(summary, path: Path) -> bool:
    """ops/s against concurrency per implementation, with one anchor line
    per panel (the anchor's median over every trial at that N)."""
    scen = [s for s in ("tasks", "threads") if s in set(summary.scenario)]
    if not scen:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(scen), figsize=(FULL_WIDTH_IN, 4.6), squeeze=False)
    for ax, s in zip(axes[0], scen):
        d = summary[summary.scenario == s].sort_values("concurrency")
        for impl, g in d.groupby("impl"):
            ax.plot(g.concurrency, g.median_ops_per_s, "o-", color=IMPL_COLORS.get(impl),
                    label=IMPL_LABELS.get(impl, impl))
        a = d[d.anchor_median_ns.notna()].groupby("concurrency").anchor_median_ns.median()
        if len(a):
            ax.plot(a.index, 1e9 / a.values, "s--", color=IMPL_COLORS["anchor"],
                    label=d.anchor.dropna().iloc[0])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(set(d.concurrency)))
        _plain_ticks(ax.xaxis)
        # A range of less than a decade had one or two labels (90k, 100k)
        # and the lines above them could not be read off: 1-2-5 ticks (or
        # finer) over the axis' own limits.
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo / 1.15, hi * 1.15)
        _readable_log_axis(ax, "y")
        ax.set_xlabel(f"N: {'tasks' if s == 'tasks' else 'threads'} at once (log)")
        ax.set_ylabel("acquire/release cycles per second (log)")
        ax.set_title(f"{s}: throughput against concurrency (K={int(d.permits.iloc[0])})",
                     fontsize=11, pad=22)
        ax.grid(alpha=0.3, which="both")
        _legend_above(ax)
    return bool(save_figure(fig, path))


def plot_latency(results, path: Path) -> bool:
    """Distribution over trials of the wait-latency p50 and p99: one row per
    configuration, its name on the row's own line (horizontal boxes, so each
    label sits beside its two boxes), p50 and p99 side by side in it."""
    d = results[results.wait_p99_us.notna() & results.failure.isna()]
    if d.empty:
        return False
    plt = _plt()
    groups, labels = [], []
    for (s, impl, n), g in d.groupby(["scenario", "impl", "concurrency"]):
        groups.append((g.wait_p50_us.tolist(), g.wait_p99_us.tolist()))
        labels.append(f"{s}, {IMPL_LABELS.get(impl, impl)}, N={n}")
    rows = len(groups)
    fig, ax = plt.subplots(figsize=(FULL_WIDTH_IN, 1.2 + 0.42 * rows))
    pos = list(range(rows))[::-1]       # the first group at the top
    colors = (("p50", "#6baed6"), ("p99", "#fb6a4a"))
    boxes = []
    # matplotlib 3.10 names it orientation; older ones only know vert.
    import matplotlib
    horizontal = ({"orientation": "horizontal"}
                  if tuple(int(x) for x in matplotlib.__version__.split(".")[:2]) >= (3, 10)
                  else {"vert": False})
    for k, (name, color) in enumerate(colors):
        b = ax.boxplot([g[k] for g in groups], positions=[p + (0.17 if k == 0 else -0.17)
                                                          for p in pos],
                       widths=0.3, patch_artist=True, manage_ticks=False, **horizontal)
        for patch in b["boxes"]:
            patch.set_facecolor(color)
        boxes.append(b["boxes"][0])
    for p in pos[1::2]:                 # every other row shaded: rows stay apart
        ax.axhspan(p - 0.5, p + 0.5, color="#f2f2f2", zorder=0)
    ax.set_yticks(pos)
    ax.set_yticklabels(labels, fontsize=9)
    ax.set_ylim(-0.5, rows - 0.5)
    ax.set_xscale("log")
    _readable_log_axis(ax, "x")
    ax.set_xlabel("wait from acquire call to grant, µs (log)")
    ax.legend(boxes, [name for name, _ in colors], fontsize=9, loc="lower left",
              bbox_to_anchor=(0, 1.0), ncols=2, frameon=False, borderaxespad=0)
    ax.set_title("wait-latency distribution over trials (a box: the trials' p50 or p99)",
                 fontsize=11, pad=22)
    ax.grid(alpha=0.3, axis="x")
    return bool(save_figure(fig, path))


def plot_scaling(scaling, scaling_trials, path: Path) -> bool:
    """ops/s per executor against executors at once; the reference line is
    one executor's rate (flat = no shared bottleneck)."""
    if scaling is None or scaling.empty:
        return False
    plt = _plt()
    impls = list(dict.fromkeys(scaling.impl))
    fig, axes = plt.subplots(1, len(impls), figsize=(FULL_WIDTH_IN, 4.2), squeeze=False)
    for ax, impl in zip(axes[0], impls):
        g = scaling[scaling.impl == impl].sort_values("executors")
        ax.plot(g.executors, g.median_ops_per_s_per_executor / 1e6, "o-",
                color=IMPL_COLORS.get(impl), label=f"{IMPL_LABELS.get(impl, impl)} (median)")
        if scaling_trials is not None:
            t = scaling_trials[scaling_trials.impl == impl]
            ax.scatter(t.concurrency, t.ops_per_s / 1e6, color=IMPL_COLORS.get(impl), alpha=0.3,
                       s=14, label="trials")
        ax.axhline(g.median_ops_per_s_per_executor.iloc[0] / 1e6, color=IMPL_COLORS["anchor"],
                   ls="--", lw=1.2, label="one executor's rate (ideal: flat)")
        ax.set_xlabel("executors running at once, each with its own limiter")
        ax.set_ylabel("million ops/s per executor")
        top = max(g.median_ops_per_s_per_executor.max(),
                  t.ops_per_s.max() if scaling_trials is not None and len(t) else 0) / 1e6
        ax.set_ylim(0, top * 1.15 or 1)
        ax.set_xticks(sorted(set(scaling.executors)))
        ax.set_title(f"per-core scaling: {IMPL_LABELS.get(impl, impl)}", fontsize=11, pad=22)
        ax.grid(alpha=0.3, which="both")
        _legend_above(ax)
    return bool(save_figure(fig, path))


def _row(summary, scenario: str, impl: str, n: Optional[int] = None):
    d = summary[(summary.scenario == scenario) & (summary.impl == impl)]
    if n is not None:
        d = d[d.concurrency == n]
    return None if d.empty else d.sort_values("concurrency").iloc[-1]


def verdict(summary, scaling) -> list[Verdict]:
    """The verdict rows, from the summary and scaling tables: the
    uncontended speed-ups, the contended costs, the pure twin's price,
    scaling and cleanliness."""
    rows = []
    if summary is not None and not summary.empty:
        for scen, anchor in (("uncontended-async", "asyncio.Semaphore"),
                             ("uncontended-threads", "threading.Semaphore")):
            r = _row(summary, scen, "c")
            if r is not None and _ok(r.median_speedup):
                word = "faster" if r.median_speedup >= 1 else "slower"
                factor = r.median_speedup if r.median_speedup >= 1 else 1 / r.median_speedup
                rows.append(Verdict(
                    f"Uncontended, the C limiter is faster than {anchor}",
                    f"{factor:.1f}x {word} than {anchor} (IQR {r.q1_speedup:.2f}-"
                    f"{r.q3_speedup:.2f}x)", bool(r.median_speedup >= 1)))
        r = _row(summary, "tasks", "c")
        if r is not None and _ok(r.median_cost_ratio):
            rows.append(Verdict(
                f"With {plural(int(r.concurrency), 'task')} on "
                f"{plural(int(r.permits), 'permit')}, limiting costs less than with "
                f"asyncio.Semaphore",
                f"cost over a run without a limiter: {r.median_cost_ratio:.2f} of "
                f"asyncio.Semaphore's", bool(r.median_cost_ratio < 1)))
        r = _row(summary, "timeouts", "c")
        if r is not None and _ok(r.median_cost_ratio):
            below = (" (below zero: cheaper than parking without a timeout)"
                     if r.median_cost_ratio < 0 else "")
            rows.append(Verdict(
                f"{plural(int(r.concurrency), 'waiter')} timing out cost less than with "
                f"asyncio.timeout",
                f"{r.median_cost_ratio:.2f} of what asyncio.timeout costs over plain "
                f"parking{below}", bool(r.median_cost_ratio < 1)))
        r = _row(summary, "cancel", "c")
        if r is not None and _ok(r.median_speedup):
            rows.append(Verdict(
                f"Cancelling {plural(int(r.concurrency), 'parked waiter')} (newest first) is "
                f"cheaper than with asyncio.Semaphore",
                f"{r.median_speedup:.1f}x cheaper", bool(r.median_speedup > 1)))
        py = summary[(summary.impl == "python") & summary.median_speedup.notna()]
        if not py.empty:
            rows.append(Verdict(
                "The pure-Python twin's speed against the stdlib anchors",
                f"{py.median_speedup.min():.2f}-{py.median_speedup.max():.2f}x the anchors' "
                f"speed over the scenarios", "fact"))
    if scaling is not None and not scaling.empty:
        g = scaling[scaling.impl == "c"].sort_values("executors")
        if len(g) > 1:
            first, last = g.iloc[0], g.iloc[-1]
            change = last.median_ops_per_s_per_executor / first.median_ops_per_s_per_executor
            rows.append(Verdict(
                "Limiters in different executors share nothing: per-executor throughput "
                "stays flat as executors are added",
                f"{change:.2f}x from 1 to {plural(int(last.executors), 'executor')} (flat: "
                f"0.8-1.25x)", bool(0.8 <= change <= 1.25)))
    if summary is not None and not summary.empty:
        leaked, failed = int(summary.leaked_permits.sum()), int(summary.failed_trials.sum())
        errors = int(summary.errors.sum())
        rows.append(Verdict(
            "No trial leaks a permit, fails or sees an error",
            f"{plural(leaked, 'permit')} leaked, {plural(failed, 'trial')} failed, "
            f"{plural(errors, 'error')} in {plural(int(summary.trials.sum()), 'trial')}",
            not (leaked or failed or errors)))
    return rows


ANCHOR_SHORT = {"asyncio.Semaphore": "asyncio", "threading.Semaphore": "threading",
                "asyncio.timeout+Semaphore": "timeout"}
IMPL_SHORT = {"c": "C", "python": "py"}
SUMMARY_WIDTH = 100


def print_summary(summary_pdf, scaling_pdf, console=None) -> None:
    """The terminal summary: fits 100 columns; N and K explained below it."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=SUMMARY_WIDTH)
    if summary_pdf is not None:
        t = Table(title="pylimiter benchmark grid: medians over trials", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True, title_justify="left")
        for col in ["scenario", "impl", "N", "K", "ns/op", "anchor", "speed-up", "IQR",
                    "cost", "p99 µs"]:
            t.add_column(col, justify="left" if col in ("scenario", "impl", "anchor")
                         else "right", no_wrap=True)
        for r in summary_pdf.itertuples():
            iqr = f"{r.q1_speedup:.2f}-{r.q3_speedup:.2f}" if _ok(r.q1_speedup) else ""
            t.add_row(r.scenario, IMPL_SHORT.get(r.impl, r.impl), str(r.concurrency),
                      str(r.permits), _num(r.median_ns),
                      ANCHOR_SHORT.get(r.anchor, r.anchor or ""),
                      _num(r.median_speedup, "{:.2f}x"), iqr,
                      _num(r.median_cost_ratio, "{:.2f}"),
                      _num(r.wait_p99_us, "{:.1f}" if _ok(r.wait_p99_us)
                           and r.wait_p99_us < 100 else "{:,.0f}"))
        console.print(t)
        console.print(
            "N: tasks, threads or waiters at once; K: permits of the limiter.  speed-up: "
            "anchor's time / pylimiter's in the same trial (>1: pylimiter faster; "
            "IQR over trials).  cost: (pylimiter - no limiter) / (anchor - no limiter), "
            "<1: cheaper than the anchor.  p99 µs: wait from acquire call to grant.  "
            "Anchors: asyncio = asyncio.Semaphore, threading = threading.Semaphore, "
            "timeout = asyncio.timeout around asyncio.Semaphore.acquire.",
            width=SUMMARY_WIDTH, soft_wrap=False)
        errors, leaked = int(summary_pdf["errors"].sum()), int(summary_pdf["leaked_permits"].sum())
        failed = int(summary_pdf["failed_trials"].sum())
        console.print(f"errors: {errors}, leaked permits: {leaked}, failed trials: {failed}")
    if scaling_pdf is not None and len(scaling_pdf):
        s = Table(title="per-core scaling (uncontended, one limiter per executor)",
                  box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
        for col in ["impl", "executors", "trials", "M ops/s per executor", "M ops/s in all"]:
            s.add_column(col, justify="right")
        for r in scaling_pdf.itertuples():
            s.add_row(r.impl, str(r.executors), str(r.trials),
                      _num(r.median_ops_per_s_per_executor / 1e6, "{:.2f}"),
                      _num(r.aggregate_ops_per_s / 1e6, "{:.2f}"))
        console.print(s)


SUMMARY_COLUMNS = ["scenario", "impl", "N", "K", "trials", "ns/op", "anchor", "anchor ns/op",
                   "speed-up [IQR]", "cost [IQR]", "wait p50 µs", "wait p99 µs", "errors",
                   "leaked"]


def summary_rows(summary) -> list[tuple]:
    """The summary as the page shows it: ratios with their IQR in one cell."""
    def ratio(m, q1, q3, unit=""):
        return f"{m:.2f}{unit} [{q1:.2f}-{q3:.2f}]" if _ok(m) else ""

    return [(r.scenario, r.impl, int(r.concurrency), int(r.permits), int(r.trials),
             r.median_ns, r.anchor or "", r.anchor_median_ns,
             ratio(r.median_speedup, r.q1_speedup, r.q3_speedup, "x"),
             ratio(r.median_cost_ratio, r.q1_cost_ratio, r.q3_cost_ratio),
             r.wait_p50_us, r.wait_p99_us, int(r.errors),
             int(r.leaked_permits)) for r in summary.itertuples()]


#: Fixed decimals per column of the page's summary table.
SUMMARY_FORMATS = {"ns/op": "{:,.0f}", "anchor ns/op": "{:,.0f}", "wait p50 µs": "{:,.1f}",
                   "wait p99 µs": "{:,.1f}"}


def write_report(out: Path, res: RunResult, *, spark_version: Optional[str],
                 command: str) -> Path:
    """Plots and ``out/index.html``; returns the page's path.  ``res``: the
    tables "summary" and "results" of the grid, "scaling" and
    "scaling_trials" of the scaling runs, "host_summary" (and
    "host_rounds") of the host-wide stages, as pandas frames (absent where
    nothing ran); params ``master``, ``trials`` and ``host_layout``
    ((executors, cores each)); timings ``elapsed_s``."""
    out = Path(out)
    summary, results, scaling, scaling_trials, host = (
        res.tables.get(name) for name in ("summary", "results", "scaling", "scaling_trials",
                                          "host_summary"))
    figs = []
    if summary is not None:
        if plot_speedup(summary, out / "speedup.png"):
            figs.append(("Speed-up and cost against the stdlib anchors", "speedup.png",
                         "Bars: median over trials of each trial's ratio; whiskers: IQR; "
                         "dashed: the anchor. Speed-ups on a log axis; costs on a linear one, "
                         "where below 0 means cheaper than running without a limiter."))
        if plot_throughput(summary, out / "throughput.png"):
            figs.append(("Throughput against concurrency", "throughput.png",
                         "Dashed: the anchor, median over all trials at that N."))
    if results is not None and plot_latency(results, out / "latency.png"):
        figs.append(("Wait-latency distribution", "latency.png",
                     "Wall time from the acquire call to the grant, per-trial p50 and p99."))
    if plot_scaling(scaling, scaling_trials, out / "scaling.png"):
        figs.append(("Per-core scaling", "scaling.png",
                     "k executors at once, each hammering its own limiter."))
    page = ReportPage(
        "pylimiter benchmark grid",
        subtitle=f"master={res.params['master']}  trials={res.params['trials']}  "
                 f"elapsed={res.timings['elapsed_s']:.0f} s",
        command=command, env=environment(spark_version))
    page.verdicts((verdict(summary, scaling) + host_verdicts(host))
                  or [Verdict("The grid ran", "no grid trials were run", None)])
    page.paragraph("Each trial runs pylimiter, its stdlib anchor and (tasks, timeouts) the "
                   "same work without a limiter in interleaved rounds in one executor "
                   "process, the order flipped every round, timed in thread CPU time (wall "
                   "time for the threads scenario).  A trial's speed-up is the median of its "
                   "per-round ratios anchor / pylimiter; the cost ratio is (pylimiter - no "
                   "limiter) / (anchor - no limiter).  N: tasks, threads or waiters at once; "
                   "K: permits.  Medians and IQR are over trials (repeats spread over "
                   "executors).")
    for title, png, caption in figs:
        page.figure(png, caption, title=title)
    if summary is not None:
        page.table(summary_rows(summary), SUMMARY_COLUMNS, title="Summary (medians over trials)",
                   formats=SUMMARY_FORMATS)
    if scaling is not None:
        page.table(scaling, title="Scaling", headers={
            "impl": "impl", "executors": "executors at once", "trials": "trials",
            "median_ops_per_s_per_executor": "ops/s per executor (median)",
            "aggregate_ops_per_s": "ops/s in all", "leaked_permits": "leaked permits"})
    add_host_section(page, host, res.params.get("host_layout"), out,
                     log_axis=_readable_log_axis)
    written = ((["summary", "results", "trials"] if summary is not None else [])
               + (["scaling", "scaling_trials"] if scaling is not None else [])
               + (["host_summary", "host_rounds", "host_rows"] if host is not None else []))
    page.files([f"{t}.{fmt}" for t in written for fmt in ("csv", "parquet")], "Raw rows")
    return page.write(out)
