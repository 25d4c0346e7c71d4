"""``reports/balance/index.html``: the four strategies side by side, with the
verdict table computed from the run.  Each verdict row compares like with
like: shedding on against off under the same placement, or one placement
against the other with the same shedding."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...spark.cli import fmt_seconds
from ...spark.report import (
    FIGURE_DPI,
    FULL_WIDTH_IN,
    ReportPage,
    RunResult,
    Verdict,
    environment,
    plural,
    pyplot,
    save_figure,
)
from .cluster import STRATEGIES
from .replay import TABLES
from .split import MIB

__all__ = ["summary_rows", "verdict", "write_report"]

COLORS = {"lltmr+shed": "#1f77b4", "lltmr": "#ff7f0e", "random+shed": "#2ca02c",
          "random": "#d62728"}
LABELS = {s.key: s.label for s in STRATEGIES}


def summary_rows(res: RunResult) -> list[dict]:
    """One row per strategy: what an operator compares."""
    import pandas as pd

    steps = pd.DataFrame(res.tables["steps"])
    rows = []
    n_steps = steps["step"].nunique()
    tail_from = sorted(steps["step"].unique())[n_steps // 2]
    for sp in STRATEGIES:
        s = steps[steps["strategy"] == sp.key]
        tail = s[s["step"] >= tail_from]
        rows.append(dict(
            strategy=sp.key, label=sp.label,
            peak_usage_pct=float(s["max_usage"].max()),
            mean_max_usage_pct=float(s["max_usage"].mean()),
            mean_spread_pct=float(s["spread"].mean()),
            late_spread_pct=float(tail["spread"].mean()),
            mean_stdev_pct=float(s["stdev"].mean()),
            overloaded_broker_steps=int(s["overloaded"].sum()),
            unloads=int(s["unloads"].sum()),
            moved_mib_per_s=float(s["moved_bytes_per_s"].sum() / MIB),
            assignments=int(s["assignments"].sum()),
            splits=int(s["splits"].sum())))
    return rows


def _frames(res):
    import pandas as pd

    return tuple(pd.DataFrame(res.tables[name])
                 for name in ("steps", "brokers", "bundle_loads", "bundles", "summary"))


def verdict(summary, steps, bundle_loads, res) -> list[Verdict]:
    """The verdict rows, from the numbers of this run.  Spreads are means
    over the second half of the run (the cold start left out)."""
    by = {r["strategy"]: r for r in summary.to_dict("records")}
    shed, plain = by["lltmr+shed"], by["lltmr"]
    rshed, rnd = by["random+shed"], by["random"]
    first = bundle_loads["step"].min()
    start = int((bundle_loads["step"] == first).sum())
    threshold = f"{res.settings.overload_threshold_pct:g}%"
    # the busiest broker's peak over the same second half as the spreads
    late = steps[steps["step"] >= sorted(steps["step"].unique())[steps["step"].nunique() // 2]]
    peak = late.groupby("strategy")["max_usage"].max()

    def spread(a, b):
        return (f"{a['late_spread_pct']:.1f} against {b['late_spread_pct']:.1f} usage points "
                f"between the busiest and the idlest broker")

    return [
        Verdict("ThresholdShedder narrows the spread under LeastLongTermMessageRate placement",
                "shedding on against off: " + spread(shed, plain),
                bool(shed["late_spread_pct"] < plain["late_spread_pct"])),
        Verdict("ThresholdShedder narrows the spread under uniform random placement",
                "shedding on against off: " + spread(rshed, rnd),
                bool(rshed["late_spread_pct"] < rnd["late_spread_pct"])),
        Verdict("LeastLongTermMessageRate places better than uniform random",
                f"without shedding {plain['late_spread_pct']:.1f} against "
                f"{rnd['late_spread_pct']:.1f} usage points; with shedding "
                f"{shed['late_spread_pct']:.1f} against {rshed['late_spread_pct']:.1f}",
                bool(plain["late_spread_pct"] < rnd["late_spread_pct"]
                     and shed["late_spread_pct"] < rshed["late_spread_pct"])),
        *_overload_verdicts(threshold, shed, plain, rshed, rnd, peak),
        Verdict("What shedding costs: bundles moved between brokers",
                f"{plural(shed['unloads'], 'unload')} moving {shed['moved_mib_per_s']:,.0f} "
                f"MiB/s of traffic in all (LeastLongTermMessageRate); "
                f"{plural(rshed['unloads'], 'unload')}, {rshed['moved_mib_per_s']:,.0f} MiB/s "
                f"(uniform random)", "cost"),
        Verdict(f"Bundle splitting ({res.settings.split_algorithm}) follows the load",
                f"{start:,} -> {plural(len(res.tables['bundles']), 'bundle')} in "
                f"{plural(int(res.timings.get('splits', 0)), 'split')}, the same for every "
                f"strategy", "fact"),
    ]


def _overload_verdicts(threshold: str, shed, plain, rshed, rnd, peak) -> list[Verdict]:
    """Two rows on the overload threshold: whether shedding reduces the
    broker-steps above it (each placement against its own twin), and
    whether it keeps every broker under it, which is a different claim:
    ThresholdShedder reacts to an overload, it does not prevent one."""
    pairs = ((shed, plain, "LeastLongTermMessageRate"), (rshed, rnd, "uniform random"))
    parts, reduced = [], []
    for on, off, name in pairs:
        a, b = on["overloaded_broker_steps"], off["overloaded_broker_steps"]
        if b == 0:
            how = "none either way" if a == 0 else f"{a:,} against none"
        elif a < b:
            how = f"{a:,} against {b:,}, {b - a:,} fewer ({(b - a) / b:.0%})"
        else:
            how = f"{a:,} against {b:,}, {a - b:,} more" if a > b else f"{a:,} either way"
        parts.append(f"{how} ({name})")
        # Nothing to reduce without shedding: not a yes or a no.
        reduced.append(None if b == 0 and a == 0 else a < b)
    holds = None if all(r is None for r in reduced) else all(r is not False for r in reduced)
    above = (shed["overloaded_broker_steps"], rshed["overloaded_broker_steps"])
    return [
        Verdict(f"ThresholdShedder reduces the broker-steps above the {threshold} overload "
                f"threshold", "broker-steps above it, shedding on against off: "
                + "; ".join(parts), holds),
        Verdict(f"With ThresholdShedder, no broker goes above the {threshold} overload "
                f"threshold",
                f"{plural(above[0], 'broker-step')} above it (LeastLongTermMessageRate), "
                f"{above[1]:,} (uniform random); the busiest broker's peak in the second half "
                f"{peak['lltmr+shed']:.0f}% with shedding against {peak['lltmr']:.0f}% "
                f"without (LeastLongTermMessageRate)", above == (0, 0)),
    ]


def _clip_top(values, pct: float = 98.0) -> float:
    """A y-axis top that a few outliers (the cold start's spike) do not set:
    the ``pct`` percentile with headroom, never above the data's maximum."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return 1.0
    return float(min(v.max() * 1.05, np.percentile(v, pct) * 1.25)) or 1.0


def _mark_clipped(ax, x, y, top: float, color) -> None:
    """Points above the axis drawn as a triangle at the top, with their value."""
    for xi, yi in zip(x, y):
        if yi > top:
            ax.plot([xi], [top * 0.985], marker="^", color=color, ms=7, clip_on=False)
            ax.annotate(f"{yi:.0f}", (xi, top * 0.985), textcoords="offset points",
                        xytext=(6, -10), fontsize=8, color=color)


def _usage_figure(steps, settings, out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(FULL_WIDTH_IN, 7.4), sharex=True, sharey=True,
                             layout="constrained")
    top = max(100.0, float(steps["max_usage"].max()) * 1.05)
    for ax, sp in zip(axes.flat, STRATEGIES):
        s = steps[steps["strategy"] == sp.key].sort_values("step")
        c = COLORS[sp.key]
        ax.fill_between(s["step"], s["min_usage"], s["max_usage"], color=c, alpha=0.25,
                        label="min to max broker")
        ax.plot(s["step"], s["max_usage"], color=c, lw=1.2)
        ax.plot(s["step"], s["min_usage"], color=c, lw=1.2)
        ax.plot(s["step"], s["mean_usage"], color="black", lw=1.4, ls="--", label="mean")
        ax.axhline(settings.overload_threshold_pct, color="grey", lw=1, ls=":",
                   label=f"overload threshold {settings.overload_threshold_pct:g}%")
        ax.set_title(sp.label, fontsize=11)
        ax.set_ylim(0, top)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step (load-manager tick)")
    for ax in axes[:, 0]:
        ax.set_ylabel("broker usage, % (weighted max)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=3, fontsize=9, frameon=False)
    return save_figure(fig, out / "usage.png")


def _spread_figure(steps, out: Path) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(FULL_WIDTH_IN, 4.2), layout="constrained")
    tops = {"spread": _clip_top(steps["spread"]), "stdev": _clip_top(steps["stdev"])}
    for sp in STRATEGIES:
        s = steps[steps["strategy"] == sp.key].sort_values("step")
        for ax, col in ((a, "spread"), (b, "stdev")):
            ax.plot(s["step"], s[col], color=COLORS[sp.key], lw=1.5, label=sp.label)
            _mark_clipped(ax, s["step"], s[col], tops[col], COLORS[sp.key])
    a.set_title("spread: busiest minus idlest broker")
    b.set_title("standard deviation of broker usage")
    for ax, col in ((a, "spread"), (b, "stdev")):
        ax.set_xlabel("step")
        ax.set_ylabel("usage points")
        ax.set_ylim(0, tops[col])
        ax.grid(alpha=0.3)
    handles, labels = a.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=4, fontsize=9,
               frameon=False)
    return save_figure(fig, out / "spread.png")


def _bundles_figure(steps, bundle_loads, bundles, settings, out: Path) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(FULL_WIDTH_IN, 4.2))
    per_step = bundle_loads.groupby("step").size()
    first = steps[steps["strategy"] == STRATEGIES[0].key].sort_values("step")
    split_color = "#9467bd"
    line = a.plot(per_step.index, per_step.values, color="black", lw=1.8,
                  label="bundles in the cluster (left axis)")
    a.set_xlabel("step")
    a.set_ylabel("bundles in the cluster")
    a2 = a.twinx()
    bars = a2.bar(first["step"], first["splits"], color=split_color, alpha=0.5,
                  label="splits in the step (right axis)")
    a2.set_ylabel("splits in the step", color=split_color)
    a2.tick_params(axis="y", colors=split_color)
    # Both axes start at 0: a left axis starting at the first step's count
    # made the line's growth look many times what it was next to the bars.
    a.set_ylim(0, max(1, int(per_step.max())) * 1.08)
    a2.set_ylim(0, max(1, int(first["splits"].max())) * 1.08)
    a.set_zorder(a2.get_zorder() + 1)       # the line over the bars
    a.patch.set_visible(False)
    a.set_title("bundles over time, and splits per step", pad=24)
    a.legend([line[0], bars], [line[0].get_label(), bars.get_label()], fontsize=9,
             loc="lower left", bbox_to_anchor=(0, 1.0), ncols=2, frameon=False,
             borderaxespad=0)
    a.grid(alpha=0.3)
    last = bundle_loads[bundle_loads["step"] == bundle_loads["step"].max()]
    topics = last.groupby("namespace")["topics"].sum()
    count = bundles.groupby("namespace").size()
    b.scatter(topics.reindex(count.index).fillna(0), count.values, s=14, color="#9467bd",
              alpha=0.7)
    b.axhline(settings.max_bundles, color="grey", ls=":", lw=1,
              label=f"loadBalancerNamespaceMaximumBundles = {settings.max_bundles}")
    b.axhline(settings.default_bundles, color="grey", ls="--", lw=1,
              label=f"defaultNumberOfNamespaceBundles = {settings.default_bundles}")
    b.set_xlabel("topics in the namespace (last step)")
    b.set_ylabel("bundles of the namespace (end)")
    b.set_title(f"bundles per namespace ({len(count)} namespaces)")
    b.legend(fontsize=9, loc="lower left", bbox_to_anchor=(0, 1.08), ncols=2, frameon=False,
             borderaxespad=0)
    b.grid(alpha=0.3)
    return save_figure(fig, out / "bundles.png")


def _activity_figure(steps, out: Path) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(FULL_WIDTH_IN, 4.2), layout="constrained")
    shedding = [sp for sp in STRATEGIES if sp.shedding]   # the others never unload
    width = 0.8 / len(shedding)
    for i, sp in enumerate(shedding):
        s = steps[steps["strategy"] == sp.key].sort_values("step")
        x = s["step"] + (i - (len(shedding) - 1) / 2) * width
        a.bar(x, s["unloads"], width=width, color=COLORS[sp.key], label=sp.label)
        b.bar(x, s["moved_bytes_per_s"] / MIB, width=width, color=COLORS[sp.key],
              label=sp.label)
    a.set_title("bundles unloaded per step")
    a.set_ylabel("unloads")
    b.set_title("traffic moved by unloads per step")
    b.set_ylabel("MiB/s moved")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = a.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=2, fontsize=9, frameon=False)
    return save_figure(fig, out / "unloads.png")


def _heatmap_figure(brokers, out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(FULL_WIDTH_IN, 7.0), sharex=True, sharey=True,
                             layout="constrained")
    import numpy as np

    # The colour scale spans the bulk of the run (0.5th to 99.5th
    # percentile): the cold start's empty and overfull brokers show in the
    # end colours instead of squeezing every other step into the middle.
    usage = brokers["usage_pct"].to_numpy(dtype=float)
    vmin, vmax = (float(v) for v in np.percentile(usage, [0.5, 99.5]))
    extend = {(False, False): "neither", (True, False): "min", (False, True): "max",
              (True, True): "both"}[(bool(usage.min() < vmin), bool(usage.max() > vmax))]
    im = None
    for ax, sp in zip(axes.flat, STRATEGIES):
        grid = (brokers[brokers["strategy"] == sp.key]
                .pivot(index="broker", columns="step", values="usage_pct").sort_index())
        im = ax.imshow(grid.values, aspect="auto", cmap="magma", vmin=vmin, vmax=vmax,
                       interpolation="nearest",
                       extent=(grid.columns.min() - 0.5, grid.columns.max() + 0.5,
                               len(grid) - 0.5, -0.5))
        ax.set_title(sp.label, fontsize=11)
        ax.set_yticks(range(len(grid)))
        ax.set_yticklabels(grid.index, fontsize=7 if len(grid) <= 24 else 5)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.colorbar(im, ax=axes, shrink=0.9, extend=extend,
                 label=f"broker usage, % (scale clipped to {vmin:.0f}-{vmax:.0f})")
    # save_figure's tight_layout would fight the constrained layout the
    # colorbar needs.
    fig.savefig(out / "heatmap.png", dpi=FIGURE_DPI)
    plt.close(fig)
    return out / "heatmap.png"


def _settings_rows(s) -> list[tuple[str, str, str]]:
    w = s.weights
    rows = s.table()
    if s.split_positions:
        rows.append(("(admin API) split positions", ", ".join(f"{p:#010x}" for p in
                                                             s.split_positions),
                     "--split-positions"))
    return rows + [
        ("loadBalancer{CPU,Memory,DirectMemory,BandwithIn,BandwithOut}ResourceWeight",
         f"{w.cpu:g}, {w.memory:g}, {w.direct_memory:g}, {w.bandwidth_in:g}, "
         f"{w.bandwidth_out:g}", "--weights"),
        ("(model) broker capacity", f"{s.capacity.msg_rate:,.0f} msg/s, "
         f"{s.capacity.bandwidth_in / MIB:,.0f} MiB/s in, "
         f"{s.capacity.bandwidth_out / MIB:,.0f} MiB/s out",
         "--broker-msg-rate, --broker-bandwidth-mbytes"),
    ]


def write_report(out: Path, res: RunResult, *, spark_version: Optional[str],
                 command: str) -> Path:
    """Plots and ``out/index.html``; returns the page's path."""
    import pandas as pd

    out = Path(out)
    steps, brokers, bundle_loads, bundles, summary = _frames(res)
    tm = res.timings
    rows = tm.get("topic_rows", 0)
    env = environment(spark_version, input=res.params["source"],
                      brokers=len(res.params["brokers"]),
                      namespaces=len(res.params["namespaces"]), steps=tm.get("steps", 0),
                      **{"topic rows": f"{int(rows):,}"})
    page = ReportPage("Pulsar bundle load balancing: four strategies on the same load",
                      subtitle="Bundle splitting, LeastLongTermMessageRate vs uniform random "
                               "placement, ThresholdShedder on and off, replayed step by step "
                               "through pylimiter.pulsar.balance (Pulsar's algorithms).",
                      command=command, env=env)
    page.verdicts(verdict(summary, steps, bundle_loads, res),
                  note="Spread: usage points between the busiest and the idlest broker, mean "
                       "over the second half of the run (after the cold start). Usage: the "
                       "weighted max over CPU and bandwidth, as Pulsar's load manager sees it.")
    _usage_figure(steps, res.settings, out)
    page.figure("usage.png", "Per step: the busiest and the idlest broker (band) and the mean "
                "(dashed). Usage is the weighted max over CPU and bandwidth, as the shedder "
                "and the placement see it.", title="Broker usage per strategy")
    _spread_figure(steps, out)
    page.figure("spread.png", "How far apart the brokers are; lower is better balanced. The "
                "y-axes stop short of the cold start's spike: points above them are drawn as "
                "triangles at the top with their value.", title="Spread over time")
    over = f"broker-steps > {res.settings.overload_threshold_pct:g}%"
    view = summary.drop(columns=["strategy"]).rename(columns={
        "label": "strategy", "mean_spread_pct": "spread, usage points",
        "late_spread_pct": "spread, 2nd half", "peak_usage_pct": "busiest broker's peak, %",
        "mean_max_usage_pct": "busiest broker, mean %",
        "overloaded_broker_steps": over, "moved_mib_per_s": "MiB/s moved",
        "assignments": "placements"})
    page.table(view, columns=["strategy", "spread, usage points", "spread, 2nd half",
                              "busiest broker's peak, %", "busiest broker, mean %", over,
                              "unloads", "MiB/s moved", "placements"],
               title="Summary per strategy", floats="{:.1f}")
    _heatmap_figure(brokers, out)
    page.figure("heatmap.png", "Each row a broker, each column a step. The colour scale "
                "covers the 0.5th to 99.5th percentile of all broker-steps; the cold start's "
                "extremes take the end colours.",
                title="Every broker, every step")
    _activity_figure(steps, out)
    page.figure("unloads.png", "What ThresholdShedder moved (no-shedding strategies stay at "
                "zero); moved traffic is the short-term in+out throughput of the unloaded "
                "bundles.", title="Unloads and bytes moved")
    _bundles_figure(steps, bundle_loads, bundles, res.settings, out)
    page.figure("bundles.png", "Splits are shared by all strategies: they depend only on the "
                "bundles' own load.", title="Bundles per namespace")
    page.table(pd.DataFrame(_settings_rows(res.settings),
                            columns=["broker.conf key", "value", "option"]),
               title="Settings")
    page.paragraph(
        "Model: one step is one load-manager tick (a minute). Bundle loads are the sums of "
        "their topics' rows in the step; short- and long-term bundle data follow Pulsar's "
        "TimeAverageMessageData (10 and 1000 samples). A broker's CPU usage is its in+out "
        "message rate over the capacity above, its bandwidth usage its throughput over the "
        "NIC; memory and direct memory are not modelled (weight 0 by default). Unloaded and "
        "split bundles are placed at once through Pulsar's selectBrokerForAssignment filters "
        "(broker max topics, fewest bundles of the namespace, overload re-check) on the load "
        "data of the step. The first steps are a cold start: every bundle is placed blind on "
        "Pulsar's default estimate for unseen bundles, and when most of them split at once "
        "their children are placed on load data that still counts the parents, which can "
        "leave a broker nearly empty for a step.")
    timing = [
        ("Spark: prepare (generate or read, hash, cache)", fmt_seconds(tm.get("prepare_s", 0))),
        ("Spark: per-step aggregation and split topics", fmt_seconds(tm.get("spark_s", 0))),
        ("Spark jobs for aggregation", f"{int(tm.get('spark_jobs', 0))}"),
        ("topic rows per second (aggregation)",
         f"{rows / tm['spark_s']:,.0f}" if tm.get("spark_s") else ""),
        ("decision loop, driver CPU per step (4 strategies)",
         f"{tm.get('decide_ms_per_step', 0):.1f} ms "
         f"(max {tm.get('decide_ms_per_step_max', 0):.1f} ms)"),
        ("writing tables", fmt_seconds(tm.get("write_s", 0))),
    ]
    page.table(timing, columns=["phase", "time"], title="Where the time went")
    page.files([f"{t}.parquet" for t in TABLES] + [f"{t}.csv" for t in TABLES]
               + ["timings.json"])
    return page.write(out)
