"""The simulator's report: ``reports/cursor/index.html`` with its plots, on
the shared ReportPage.  Every number in the verdict comes from the tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..._cli import fmt_bytes, fmt_seconds
from ...spark.report import FULL_WIDTH_IN, ReportPage, environment, pyplot, save_figure
from ...spark.rows import field_names
from .replay import TABLES, Point

__all__ = ["RunResult", "write_report"]

RULES = {"publish": "Pulsar (TTL from publish)", "deliverable": "ours (TTL from delivery)"}


@dataclass
class RunResult:
    """What a sweep produced: its points, the rows of each table (TABLES) by
    name, the wall time and the executors' time in all."""

    points: list[Point]
    tables: dict[str, list[tuple]]
    wall_s: float
    task_seconds: float


def _frame(res: RunResult, name: str):
    import pandas as pd

    return pd.DataFrame(res.tables[name], columns=field_names(TABLES[name]))


def _label(r) -> str:
    return (f"#{r.point} TTL {r.ttl_min:g}m ret {r.retention_min:g}m "
            f"fail {r.ack_fail:.1%} roll {r.rollover_entries}")


def write_report(out: Path, res: RunResult, *, spark_version: Optional[str],
                 command: str) -> Path:
    """Draw the figures and write index.html into ``out``."""
    out = Path(out)
    summary = _frame(res, "summary")
    series = _frame(res, "series")
    life = _frame(res, "lifetimes")
    points = res.points
    p0 = points[0]
    env = environment(spark_version, points=len(points),
                      subscriptions=len(summary), **{
                          "traffic": f"{p0.rate} msg/min for {p0.publish_min} min, "
                                     f"{p0.msg_bytes} B each",
                          "quota": (f"{fmt_bytes(p0.quota_bytes)} on hole bytes, "
                                    f"{p0.quota_policy}" if p0.quota_bytes >= 0 else "none"),
                          "wall time": fmt_seconds(res.wall_s),
                          "task time": f"{res.task_seconds:.1f} s"})
    page = ReportPage("Message lifecycle: holes, TTL and delayed messages, quotas, retention",
                      subtitle="Pulsar subscriptions simulated on pylimiter.pulsar.cursor "
                               "(seed 003: Tencent Cloud, 600K topics)",
                      command=command, env=env)
    base = summary[~summary.compensator]
    pulsar, ours = base[base.rule == "publish"], base[base.rule == "deliverable"]
    lost_p, lost_o = int(pulsar.lost_before_delivery.sum()), int(ours.lost_before_delivery.sum())
    delayed = int(pulsar.delayed.sum())
    comp = {c: summary[(summary.rule == "deliverable") & (summary.compensator == c)]
            for c in (False, True)}
    ranges_off, ranges_on = comp[False].peak_ranges.mean(), comp[True].peak_ranges.mean()
    mem_off, mem_on = comp[False].peak_range_bytes.max(), comp[True].peak_range_bytes.max()
    lp = life[(life.rule == "publish") & (~life.compensator)]
    w = lp.messages.sum()
    mae_seed = (lp.seed_rule_mae_min * lp.messages).sum() / w if w else float("nan")
    mae_pulsar = (lp.pulsar_rule_mae_min * lp.messages).sum() / w if w else float("nan")
    lo = life[(life.rule == "deliverable") & (~life.compensator)]
    longer = (lo.measured_median_min.median() / lp.measured_median_min.median()
              if len(lo) and len(lp) else float("nan"))
    acts = {(r, c): int(summary[(summary.rule == r) & (summary.compensator == c)]
                        .quota_actions.sum())
            for r in ("publish", "deliverable") for c in (False, True)}
    quota = (f"The backlog quota ({fmt_bytes(p0.quota_bytes)}, {p0.quota_policy}) fired "
             f"{acts['deliverable', False]:,} times under our rule without the compensator, "
             f"{acts['deliverable', True]:,} with it, and {acts['publish', False]:,} under "
             f"Pulsar's rule (whose TTL throws the delayed messages away). "
             if p0.quota_bytes >= 0 else "")
    page.verdict(
        f"Under Pulsar's rule {lost_p:,} of {delayed:,} delayed messages "
        f"({lost_p / max(delayed, 1):.0%}) were expired before their delivery time; under ours "
        f"{lost_o:,}. The compensator cut the peak number of hole ranges from "
        f"{ranges_off:,.0f} to {ranges_on:,.0f} on average (peak range-set memory "
        f"{fmt_bytes(mem_off)} -> {fmt_bytes(mem_on)}). {quota}Measured message lifetimes miss "
        f"max(TTL, retention) + rollover delay by {mae_pulsar:,.1f} min on average, and the "
        f"seed's TTL + retention rule by {mae_seed:,.1f} min: retention counts from the "
        f"ledger's close, not after TTL. The price of never expiring a delayed message early: "
        f"mark-delete waits for it, so ledgers live {longer:.1f}x longer (median lifetime).")

    # ---- 1. delayed messages lost
    plt = pyplot()
    d = base[base.delayed > 0].sort_values(["point", "rule"])
    if len(d):
        fig, ax = plt.subplots(figsize=(FULL_WIDTH_IN, 4.8))
        pts = sorted(d.point.unique())
        xs = range(len(pts))
        for k, (rule, color) in enumerate((("publish", "#c0392b"), ("deliverable", "#2e86c1"))):
            sub = d[d.rule == rule].set_index("point").loc[pts]
            bars = ax.bar([x + (k - 0.5) * 0.4 for x in xs],
                          sub.lost_before_delivery / sub.delayed, 0.4, label=RULES[rule],
                          color=color)
            ax.bar_label(bars, labels=[f"{v:,}" for v in sub.lost_before_delivery],
                         fontsize=7, padding=2)
        first = d[d.rule == "publish"].set_index("point").loc[pts]
        ax.set_xticks(list(xs))
        ax.set_xticklabels([_label(r) for r in first.reset_index().itertuples()], rotation=30,
                           ha="right", fontsize=8)
        ax.set_ylabel("share of delayed messages\nexpired before delivery")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
        ax.set_ylim(0, 1.05)
        ax.legend(loc="upper left", ncols=2)
        ax.grid(axis="y", alpha=0.3)
        save_figure(fig, out / "delayed_lost.png")
        page.figure("delayed_lost.png", "Bars: share of the delayed messages; labels: how many. "
                    "Delays are uniform up to 2 x TTL, so under Pulsar's rule about half of them "
                    "expire first; under ours none can (compensator off).",
                    title="Delayed messages expired before their delivery time")

    # ---- 2. holes and memory over time
    picks = _representatives(summary)
    fig, axes = plt.subplots(1, 3, figsize=(FULL_WIDTH_IN, 4.6))
    for pt, color in zip(picks, ("#2e86c1", "#c0392b", "#27ae60", "#8e44ad")):
        row = summary[summary.point == pt].iloc[0]
        for c, style in ((False, "-"), (True, "--")):
            s = series[(series.point == pt) & (series.rule == "deliverable")
                       & (series.compensator == c)]
            lab = f"{_label(row)}{', compensated' if c else ''}"
            axes[0].plot(s.minute / 60, s.ranges, style, color=color, label=lab)
            axes[1].plot(s.minute / 60, s.range_bytes / 1024, style, color=color)
            axes[2].plot(s.minute / 60, s.backlog_bytes / 1024, style, color=color)
    axes[0].set_ylabel("hole ranges (len(acked))")
    axes[1].set_ylabel("AckRangeSet memory, KiB")
    axes[2].set_ylabel("backlog (holes' bytes), KiB")
    if p0.quota_bytes >= 0:
        axes[2].axhline(p0.quota_bytes / 1024, color="k", lw=0.8, ls=":", label="quota")
        axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("hours")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, out / "holes.png")
    page.figure("holes.png", "Our TTL rule; solid without, dashed with the compensator. Holes "
                "include delayed messages waiting for their delivery time.",
                title="Holes, range-set memory and backlog over time")

    # ---- 3. lifetimes
    if len(lp):
        # Message-weighted medians per point, over the fates.
        w = lp.assign(m=lp.measured_median_min * lp.messages,
                      x=lp.pulsar_rule_median_min * lp.messages).groupby("point")[
            ["m", "x", "messages", "seed_rule_min"]].agg(
            {"m": "sum", "x": "sum", "messages": "sum", "seed_rule_min": "first"})
        meta = summary[(summary.rule == "publish") & (~summary.compensator)].set_index("point")
        pts = list(w.index)
        fig, ax = plt.subplots(figsize=(FULL_WIDTH_IN, 4.8))
        xs = range(len(pts))
        seed = list(w.seed_rule_min)
        pul = list(w.x / w.messages)
        ax.bar([x - 0.27 for x in xs], list(w.m / w.messages), 0.27, label="measured (median)",
               color="#34495e")
        ax.bar(list(xs), pul, 0.27, label="max(TTL, retention) + rollover delay",
               color="#27ae60")
        ax.bar([x + 0.27 for x in xs], seed, 0.27, label="seed: TTL + retention if TTL < "
               "retention, else TTL", color="#e67e22")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([_label(r) for r in meta.loc[pts].reset_index().itertuples()],
                           rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("message lifetime, minutes")
        ax.legend(fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        save_figure(fig, out / "lifetime.png")
        page.figure("lifetime.png", "Pulsar's TTL rule, no compensator: publish to ledger "
                    "deletion, all messages of a point.",
                    title="Message lifetime: measured against the two rules")

    cols = ["point", "ttl_min", "retention_min", "delayed_share", "ack_fail",
            "rollover_entries", "rule", "compensator", "published", "delayed",
            "lost_before_delivery", "expired", "evicted", "redelivered", "quota_actions",
            "blocked_min", "peak_ranges", "peak_range_bytes", "peak_backlog_bytes",
            "not_deleted"]
    page.table(summary.assign(compensator=summary.compensator.map({True: "on", False: "off"}))
               .sort_values(["point", "rule", "compensator"]), cols, title="Every subscription",
               floats="{:.3g}")
    page.table(life.assign(compensator=life.compensator.map({True: "on", False: "off"}))
               .sort_values(["point", "rule", "compensator", "fate"]),
               ["point", "ttl_min", "retention_min", "rollover_entries", "rule", "compensator",
                "fate", "messages", "measured_median_min", "measured_p95_min", "seed_rule_min",
                "pulsar_rule_median_min", "seed_rule_mae_min", "pulsar_rule_mae_min"],
               title="Lifetimes by how messages were acknowledged (minutes)", floats="{:.1f}")
    page.paragraph("Rules. Pulsar's: a message expires when now > publish + TTL, and the "
                   "expiry monitor moves mark-delete to the newest expired entry. Ours: the TTL "
                   "clock starts at max(publish, deliver_at), and the Expirer acknowledges "
                   "exactly the expired entries. A hole is an entry after mark-delete that is "
                   "not acknowledged; the quota is checked every minute on the holes' bytes.")
    page.files([f"{n}.parquet" for n in res.tables] + [f"{n}.csv" for n in res.tables])
    return page.write(out)


def _representatives(summary) -> list:
    """Up to four points to plot over time: the first of each ack-failure rate,
    at the largest TTL."""
    ttl = summary.ttl_min.max()
    rows = summary[summary.ttl_min == ttl].sort_values("point")
    picks = []
    for fail in sorted(rows.ack_fail.unique()):
        picks.append(int(rows[rows.ack_fail == fail].point.iloc[0]))
    return picks[:4]
