"""The benchmark grid's plots and page, on the shared report kit.

Speed-ups and costs are ratios, so they are drawn on log axes (2x faster and
2x slower are the same distance from the anchor), with one anchor line per
panel.  The verdict paragraph is computed from the summary table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..spark.report import (
    FULL_WIDTH_IN,
    ReportPage,
    environment,
    pyplot as _plt,
    save_figure,
)

__all__ = ["RunResult", "print_summary", "summary_rows", "verdict", "write_report"]

IMPL_COLORS = {"c": "#1f77b4", "python": "#ff7f0e", "anchor": "#555555"}
IMPL_LABELS = {"c": "pylimiter (C)", "python": "pylimiter (pure Python)"}




@dataclass
class RunResult:
    """What a grid run produced, as pandas frames (None where nothing ran):
    the summary and the per-trial results of the grid, the scaling summary
    and its trials; and where and how long it ran."""

    summary: Any = None
    results: Any = None
    scaling: Any = None
    scaling_trials: Any = None
    master: str = ""
    trials: int = 0
    elapsed_s: float = 0.0


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _num(v, fmt="{:.0f}") -> str:
    return fmt.format(v) if _ok(v) else ""


def _plain_ticks(axis) -> None:
    """Log-axis ticks as plain numbers (0.5, 2, 4), not 5x10^-1."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _label(r) -> str:
    # Long names break at their hyphen so neighbouring ticks do not overlap.
    name = r.scenario.replace("-", "-\n", 1) if len(r.scenario) > 10 else r.scenario
    return f"{name}\nN={r.concurrency} K={r.permits}"


def _ratio_panel(ax, d, value, lo, hi, anchor_label, ylabel, title):
    """Grouped bars (C, pure Python) per configuration on a log axis, IQR
    whiskers, and the anchor at 1."""
    configs = list(dict.fromkeys(_label(r) for r in d.itertuples()))
    width = 0.38
    for i, impl in enumerate(("c", "python")):
        g = d[d.impl == impl]
        xs, ys, err = [], [], [[], []]
        for r in g.itertuples():
            v = getattr(r, value)
            if not _ok(v) or v <= 0:
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
                ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 3),
                            ha="center", fontsize=8)
    ax.axhline(1.0, color=IMPL_COLORS["anchor"], lw=1.2, ls="--", label=anchor_label)
    ax.set_yscale("log")
    _plain_ticks(ax.yaxis)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=9, loc="best")


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
                     "anchor's cost (1)", "cost over no limiter / anchor's (log; <1: cheaper)",
                     "cost of limiting, relative to the anchor's")
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
        ax.set_xlabel(f"N: {'tasks' if s == 'tasks' else 'threads'} at once (log)")
        ax.set_ylabel("acquire/release cycles per second (log)")
        ax.set_title(f"{s}: throughput against concurrency (K={int(d.permits.iloc[0])})",
                     fontsize=11)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=9)
    return bool(save_figure(fig, path))


def plot_latency(results, path: Path) -> bool:
    """Distribution over trials of the wait-latency p50 and p99."""
    d = results[results.wait_p99_us.notna() & results.failure.isna()]
    if d.empty:
        return False
    plt = _plt()
    groups, labels = [], []
    for (s, impl, n), g in d.groupby(["scenario", "impl", "concurrency"]):
        groups.append((g.wait_p50_us.tolist(), g.wait_p99_us.tolist()))
        labels.append(f"{s} {'C' if impl == 'c' else 'py'} N={n}")
    fig, ax = plt.subplots(figsize=(FULL_WIDTH_IN, 5.6))
    pos = range(len(groups))
    b1 = ax.boxplot([g[0] for g in groups], positions=[p - 0.18 for p in pos], widths=0.3,
                    patch_artist=True)
    b2 = ax.boxplot([g[1] for g in groups], positions=[p + 0.18 for p in pos], widths=0.3,
                    patch_artist=True)
    for b, color in ((b1, "#9ecae1"), (b2, "#fc9272")):
        for patch in b["boxes"]:
            patch.set_facecolor(color)
    ax.set_yscale("log")
    ax.set_xticks(list(pos))
    ax.set_xticklabels(labels, fontsize=8, rotation=35, ha="right")
    ax.set_ylabel("wait from acquire call to grant, µs (log)")
    ax.legend([b1["boxes"][0], b2["boxes"][0]], ["p50", "p99"], fontsize=9)
    ax.set_title("wait-latency distribution over trials (boxes: trials)", fontsize=11)
    ax.grid(alpha=0.3, axis="y")
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
        ax.plot(g.executors, g.median_ops_per_s_per_executor, "o-",
                color=IMPL_COLORS.get(impl), label=f"{IMPL_LABELS.get(impl, impl)} (median)")
        if scaling_trials is not None:
            t = scaling_trials[scaling_trials.impl == impl]
            ax.scatter(t.concurrency, t.ops_per_s, color=IMPL_COLORS.get(impl), alpha=0.3, s=14,
                       label="trials")
        ax.axhline(g.median_ops_per_s_per_executor.iloc[0], color=IMPL_COLORS["anchor"],
                   ls="--", lw=1.2, label="one executor's rate (ideal: flat)")
        ax.set_xlabel("executors running at once, each with its own limiter")
        ax.set_ylabel("ops/s per executor")
        ax.set_ylim(bottom=0)
        ax.set_xticks(sorted(set(scaling.executors)))
        ax.set_title(f"per-core scaling: {IMPL_LABELS.get(impl, impl)}", fontsize=11)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=9)
    return bool(save_figure(fig, path))


def _row(summary, scenario: str, impl: str, n: Optional[int] = None):
    d = summary[(summary.scenario == scenario) & (summary.impl == impl)]
    if n is not None:
        d = d[d.concurrency == n]
    return None if d.empty else d.sort_values("concurrency").iloc[-1]


def verdict(summary, scaling) -> str:
    """One paragraph from the numbers: the uncontended speed-ups, the
    contended cost, the pure twin's price, scaling and cleanliness."""
    if summary is None or summary.empty:
        parts = []
    else:
        parts = []
        for scen, anchor in (("uncontended-async", "asyncio.Semaphore"),
                             ("uncontended-threads", "threading.Semaphore")):
            r = _row(summary, scen, "c")
            if r is not None and _ok(r.median_speedup):
                word = "faster" if r.median_speedup >= 1 else "slower"
                factor = r.median_speedup if r.median_speedup >= 1 else 1 / r.median_speedup
                parts.append(f"uncontended, the C implementation is {factor:.1f}x {word} than "
                             f"{anchor} (IQR {r.q1_speedup:.2f}-{r.q3_speedup:.2f}x)")
        r = _row(summary, "tasks", "c")
        if r is not None and _ok(r.median_cost_ratio):
            rel = "less than" if r.median_cost_ratio < 1 else "more than"
            parts.append(f"with {r.concurrency} tasks on {r.permits} permits its cost over a "
                         f"run without a limiter is {r.median_cost_ratio:.2f} of "
                         f"asyncio.Semaphore's ({rel} the anchor's)")
        r = _row(summary, "timeouts", "c")
        if r is not None and _ok(r.median_cost_ratio):
            parts.append(f"{r.concurrency} waiters timing out cost {r.median_cost_ratio:.2f} of "
                         f"what asyncio.timeout costs over plain parking")
        r = _row(summary, "cancel", "c")
        if r is not None and _ok(r.median_speedup):
            parts.append(f"cancelling {r.concurrency} parked waiters newest-first is "
                         f"{r.median_speedup:.1f}x cheaper than with asyncio.Semaphore")
        py = summary[(summary.impl == "python") & summary.median_speedup.notna()]
        if not py.empty:
            parts.append(f"the pure-Python twin runs at {py.median_speedup.min():.2f}-"
                         f"{py.median_speedup.max():.2f}x the anchors' speed")
    text = "; ".join(parts)
    text = (text[0].upper() + text[1:] + ".") if text else "No grid trials were run."
    if scaling is not None and not scaling.empty:
        for impl, g in scaling.groupby("impl"):
            g = g.sort_values("executors")
            first, last = g.iloc[0], g.iloc[-1]
            if len(g) > 1 and impl == "c":
                change = last.median_ops_per_s_per_executor / first.median_ops_per_s_per_executor
                shape = "stays flat" if 0.8 <= change <= 1.25 else (
                    "drops" if change < 1 else "rises")
                text += (f" Per-executor throughput {shape} from 1 to {int(last.executors)} "
                         f"executors ({change:.2f}x), so nothing is shared between limiters.")
    if summary is not None and not summary.empty:
        leaked, failed = int(summary.leaked_permits.sum()), int(summary.failed_trials.sum())
        errors = int(summary.errors.sum())
        text += (" No trial leaked a permit, failed or saw an error."
                 if not (leaked or failed or errors) else
                 f" Problems: {leaked} permits leaked, {failed} trials failed, {errors} errors.")
    return text


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
             _num(r.median_ns, "{:,.0f}"), r.anchor or "", _num(r.anchor_median_ns, "{:,.0f}"),
             ratio(r.median_speedup, r.q1_speedup, r.q3_speedup, "x"),
             ratio(r.median_cost_ratio, r.q1_cost_ratio, r.q3_cost_ratio),
             _num(r.wait_p50_us, "{:.1f}"), _num(r.wait_p99_us, "{:.1f}"), int(r.errors),
             int(r.leaked_permits)) for r in summary.itertuples()]


def write_report(out: Path, res: RunResult, *, spark_version: Optional[str],
                 command: str) -> Path:
    """Plots and ``out/index.html``; returns the page's path."""
    out = Path(out)
    summary, results, scaling, scaling_trials = (res.summary, res.results, res.scaling,
                                                 res.scaling_trials)
    figs = []
    if summary is not None:
        if plot_speedup(summary, out / "speedup.png"):
            figs.append(("Speed-up and cost against the stdlib anchors", "speedup.png",
                         "Bars: median over trials of each trial's ratio; whiskers: IQR. "
                         "Log axes: the dashed line is the anchor."))
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
        subtitle=f"master={res.master}  trials={res.trials}  elapsed={res.elapsed_s:.0f} s",
        command=command, env=environment(spark_version))
    page.verdict(verdict(summary, scaling))
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
        page.table(summary_rows(summary), SUMMARY_COLUMNS, title="Summary (medians over trials)")
    if scaling is not None:
        page.table(scaling, title="Scaling")
    page.files(["results.parquet", "results.csv", "trials.*", "summary.*", "scaling.*",
                "scaling_trials.*"], "Raw rows")
    return page.write(out)
