"""The benchmark grid's plots and page, on the shared report kit."""

from __future__ import annotations

import math
from pathlib import Path

from ..spark.report import ReportPage, environment, pyplot as _plt, save_figure

IMPL_COLORS = {"c": "#1f77b4", "python": "#ff7f0e", "anchor": "#7f7f7f"}


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def plot_throughput(summary, path: Path) -> bool:
    """ops/s against concurrency, per implementation, with the anchor."""
    scen = [s for s in ("tasks", "threads") if s in set(summary.scenario)]
    if not scen:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(scen), figsize=(6 * len(scen), 4), squeeze=False)
    for ax, s in zip(axes[0], scen):
        d = summary[summary.scenario == s].sort_values("concurrency")
        for impl, g in d.groupby("impl"):
            ax.plot(g.concurrency, g.median_ops_per_s, "o-", color=IMPL_COLORS.get(impl),
                    label=f"pylimiter-{impl}")
            a = g.anchor_median_ns
            if a.notna().any():
                ax.plot(g.concurrency, 1e9 / a, "x--", color=IMPL_COLORS.get(impl), alpha=0.5,
                        label=f"{g.anchor.iloc[0]} (in {impl} trials)")
        ax.set_xscale("log")
        ax.set_xlabel("concurrency (tasks or threads)")
        ax.set_ylabel("ops/s (median over trials)")
        ax.set_title(f"{s}: throughput vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
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
        labels.append(f"{s}\n{impl} N={n}")
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(groups)), 4.5))
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
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("wait from acquire call to grant, µs")
    ax.legend([b1["boxes"][0], b2["boxes"][0]], ["p50", "p99"], fontsize=8)
    ax.set_title("wait-latency distribution over trials")
    ax.grid(alpha=0.3, axis="y")
    return bool(save_figure(fig, path))


def plot_speedup(summary, path: Path) -> bool:
    d = summary[summary.median_speedup.notna()]
    if d.empty:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(d)), 4.5))
    labels = [f"{r.scenario}\nN={r.concurrency}" for r in d.itertuples()]
    colors = [IMPL_COLORS.get(r.impl, "k") for r in d.itertuples()]
    err = [0 if not _ok(v) else v / 2 for v in d.iqr_speedup]
    ax.bar(range(len(d)), d.median_speedup, color=colors, yerr=err, capsize=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(d)))
    ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("anchor time / pylimiter time (>1: pylimiter faster)")
    ax.set_title("speed-up over the stdlib anchor, same trial\n(bars: median, whiskers: IQR)", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=IMPL_COLORS[i]) for i in ("c", "python")]
    ax.legend(handles, ["pylimiter C", "pylimiter pure Python"], fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return bool(save_figure(fig, path))


def plot_scaling(scaling, scaling_trials, path: Path) -> bool:
    if scaling is None or scaling.empty:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for impl, g in scaling.groupby("impl"):
        ax.plot(g.executors, g.median_ops_per_s_per_executor, "o-",
                color=IMPL_COLORS.get(impl), label=f"pylimiter-{impl} (median)")
        if scaling_trials is not None:
            t = scaling_trials[scaling_trials.impl == impl]
            ax.scatter(t.concurrency, t.ops_per_s, color=IMPL_COLORS.get(impl), alpha=0.3, s=12)
    ax.set_xlabel("executors running at once (each with its own limiter)")
    ax.set_ylabel("ops/s per executor")
    ax.set_yscale("log")
    ax.set_xticks(sorted(set(scaling.executors)))
    ax.set_title("per-core scaling (flat = no shared bottleneck)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return bool(save_figure(fig, path))


def write_report(out: Path, summary, results, scaling, scaling_trials, meta: dict) -> Path:
    figs = []
    if summary is not None:
        if plot_throughput(summary, out / "throughput.png"):
            figs.append(("Throughput against concurrency", "throughput.png"))
        if plot_speedup(summary, out / "speedup.png"):
            figs.append(("Speed-up ratios over the stdlib anchors", "speedup.png"))
    if results is not None and plot_latency(results, out / "latency.png"):
        figs.append(("Wait-latency distribution", "latency.png"))
    if plot_scaling(scaling, scaling_trials, out / "scaling.png"):
        figs.append(("Per-core scaling", "scaling.png"))
    page = ReportPage(
        "pylimiter benchmark grid",
        subtitle=f"master={meta.get('master')}  trials={meta.get('trials')}  "
                 f"elapsed={meta.get('elapsed_s', 0):.0f} s",
        command=f"python -m pylimiter.bench {meta.get('argv') or ''}".strip(),
        env=environment(meta.get("spark_version")))
    page.paragraph("Each trial runs the implementation and its stdlib anchor alternately in one "
                   "executor process; speed-up = anchor ns/op divided by pylimiter ns/op of that "
                   "trial. Medians and IQR are over trials (repeats spread over executors).")
    for title, png in figs:
        page.figure(png, title=title)
    page.table(summary, title="Summary")
    if scaling is not None:
        page.table(scaling, title="Scaling")
    page.files(["results.parquet", "results.csv", "trials.parquet", "summary.*", "scaling.*"],
               "Raw rows")
    return page.write(out)
