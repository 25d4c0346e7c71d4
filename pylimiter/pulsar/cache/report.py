"""reports/cache/index.html: a verdict table on PIP-430's two claims computed
from the data, hit rate and storage bytes per policy and cache size for each
workload (tables and plots), and the idle eviction pass cost against the
number of topics."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...spark.cli import fmt_bytes
from ...spark.report import (
    FULL_WIDTH_IN,
    ReportPage,
    RunResult,
    Verdict,
    environment,
    html_table,
    plural,
    pyplot,
    save_figure,
)
from .policies import POLICIES
from .workloads import WORKLOADS

__all__ = ["against_the_others", "claim1", "claim2", "verdicts", "write_report"]

COLORS = {"pip430": "#1b7837", "pip430-no-expected-reads": "#7fbf7b", "fifo": "#999999",
          "lru": "#2166ac", "legacy": "#b2182b"}
CLAIM2_WORKLOADS = ("catchup", "keyshared")


def _ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def _per_workload(summary, column: str, ylabel: str, path: Path, ylim=None,
                  percent: bool = False) -> Path:
    """One panel per workload, a line per policy over the cache sizes;
    ``percent``: the column is a fraction, shown in % as the tables do."""
    plt = pyplot()
    from matplotlib.ticker import PercentFormatter
    workloads = [w for w in WORKLOADS if w in set(summary.workload)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(FULL_WIDTH_IN, 3.9), squeeze=False,
                             layout="constrained")
    for ax, w in zip(axes[0], workloads):
        d = summary[summary.workload == w]
        for p in POLICIES:
            dp = d[d.policy == p].sort_values("cache_mb")
            if len(dp):
                ax.plot(dp.cache_mb, dp[column], marker="o", color=COLORS[p], label=p)
        ax.set_xscale("log", base=2)
        sizes = sorted(set(d.cache_mb))
        ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
        ax.set_title(w)
        ax.set_xlabel("managedLedgerCacheSizeMB")
        if ylim:
            ax.set_ylim(*ylim)
        else:
            ax.set_ylim(bottom=0, top=max(1.0, float(d[column].max()) * 1.05))
        if percent:
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    # one legend for all panels, above them: never over a line
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=len(labels), fontsize=9,
               frameon=False)
    return save_figure(fig, path)


def _scan_figure(scan, path: Path) -> Path:
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter
    fig, ax = plt.subplots(figsize=(FULL_WIDTH_IN * 0.6, 4.0))
    for p in POLICIES:
        d = scan[scan.policy == p].sort_values("topics")
        if len(d):
            ax.plot(d.topics, d.ns_per_pass / 1000, marker="o", color=COLORS[p], label=p)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:,g}")
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlabel("topics (one cached entry each)")
    ax.set_ylabel("CPU per idle eviction pass (µs)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save_figure(fig, path)


def claim1(scan) -> Verdict:
    """PIP-430 claim 1 from the idle-pass measurements."""
    claim = "1. Evicting from the removal queue is cheaper than the legacy per-topic scan"
    if scan is None or not len(scan) or not {"pip430", "legacy"} <= set(scan.policy):
        return Verdict(claim, "not measured (--scan-topics 0)", None)
    q = scan[scan.policy == "pip430"].set_index("topics").ns_per_pass
    leg = scan[scan.policy == "legacy"].set_index("topics").ns_per_pass
    tmax, tmin = max(q.index), min(q.index)
    ratio = leg[tmax] / q[tmax]
    text = (f"idle pass at {tmax:,} topics: {_ns(leg[tmax])} with the scan, {_ns(q[tmax])} "
            f"with the queue ({ratio:,.0f}x cheaper)")
    if tmax > tmin:
        text += (f"; from {tmin:,} to {tmax:,} topics the scan grew {leg[tmax] / leg[tmin]:,.0f}x, "
                 f"the queue {q[tmax] / q[tmin]:.1f}x; every 10 ms "
                 f"(managedLedgerCacheEvictionIntervalMs) the scan alone would take "
                 f"{leg[tmax] / 10e6:.0%} of a core")
    return Verdict(claim, text, bool(ratio > 1))


def claim2(summary) -> list[Verdict]:
    """PIP-430 claim 2: expected read counts cut storage reads for catch-up
    and Key_Shared replay (pip430 against the same queue without them), one
    row per workload."""
    rows = []
    for w in CLAIM2_WORKLOADS:
        claim = (f"2. Keeping entries with expected reads left cuts storage reads: {w} "
                 f"({'catch-up reads' if w == 'catchup' else 'Key_Shared replay'})")
        d = summary[summary.workload == w]
        a = d[d.policy == "pip430"].set_index("cache_mb")
        b = d[d.policy == "pip430-no-expected-reads"].set_index("cache_mb")
        sizes = sorted(set(a.index) & set(b.index))
        if not sizes:
            rows.append(Verdict(claim, "not measured: run this workload with pip430 and "
                                "pip430-no-expected-reads", None))
            continue
        cuts = [1 - a.storage_mib[s] / b.storage_mib[s] if b.storage_mib[s] > 0 else 0.0
                for s in sizes]
        holds = all(c >= 0 for c in cuts) and any(c > 0 for c in cuts)
        s = sizes[max(range(len(sizes)), key=lambda i: cuts[i])]
        text = (f"bytes read from storage {min(cuts):.0%} to {max(cuts):.0%} lower than the "
                f"same queue without expected reads at {sizes[0]:g}-{sizes[-1]:g} MB; at "
                f"{s:g} MB {fmt_bytes(b.storage_mib[s] * 2**20)} -> "
                f"{fmt_bytes(a.storage_mib[s] * 2**20)}, hit rate {b.hit_rate[s]:.1%} -> "
                f"{a.hit_rate[s]:.1%}")
        others = []
        for other in ("fifo", "legacy", "lru"):
            o = d[d.policy == other].set_index("cache_mb")
            if s in o.index and o.storage_mib[s] > 0:
                cut = 1 - a.storage_mib[s] / o.storage_mib[s]
                others.append(f"{cut:.0%} less than {other}" if cut >= 0
                              else f"{-cut:.0%} more than {other}")
        if others:
            text += " (" + ", ".join(others) + ")"
        rows.append(Verdict(claim, text, holds))
    return rows


def against_the_others(summary) -> list[Verdict]:
    """One row per workload: does pip430 hit at least as often and read no
    more from storage than every other policy run, at every cache size?
    Where it does not, the row lists each size it loses at with the numbers
    of the policies that beat it.  Compared at the tables' precision (0.1%
    of hit rate, 0.1 MiB), so the row says what the tables show."""
    rows = []
    for w in [w for w in WORKLOADS if w in set(summary.workload)]:
        d = summary[summary.workload == w]
        mine = d[d.policy == "pip430"].set_index("cache_mb")
        others = [p for p in POLICIES if p != "pip430" and p in set(d.policy)]
        if mine.empty or not others:
            continue
        losses, best = [], []
        for mb in sorted(mine.index):
            hit, read = round(mine.hit_rate[mb] * 100, 1), round(mine.storage_mib[mb], 1)
            more_hits, fewer_reads = [], []
            for p in others:
                o = d[(d.policy == p) & (d.cache_mb == mb)]
                if o.empty:
                    continue
                o_hit = round(float(o.hit_rate.iloc[0]) * 100, 1)
                o_read = round(float(o.storage_mib.iloc[0]), 1)
                if o_hit > hit:
                    more_hits.append(f"{p} {o_hit:.1f}%")
                if o_read < read:
                    fewer_reads.append(f"{p} {o_read:,.1f} MiB")
            if not (more_hits or fewer_reads):
                best.append((mb, hit))
                continue
            text = []
            if more_hits:
                text.append(f"hit rate {hit:.1f}% against {', '.join(more_hits)}")
            if fewer_reads:
                text.append(f"storage reads {read:,.1f} MiB against {', '.join(fewer_reads)}")
            losses.append(f"at {mb:g} MB " + ", ".join(text))
        claim = f"3. PIP-430 does at least as well as every other policy run: {w}"
        won = (f"the best or tied at {', '.join(f'{mb:g}' for mb, _ in best)} MB (hit rate "
               f"{', '.join(f'{h:.1f}%' for _, h in best)})") if best else ""
        measured = "; ".join(losses + ([won] if won else []))
        rows.append(Verdict(claim, measured, not losses))
    return rows


def verdicts(res: RunResult) -> list[Verdict]:
    """The page's verdict rows (and the terminal's headline), from the data:
    PIP-430's two claims, then, per workload, where it loses to another
    policy as well as where it wins."""
    summary, scan = res.tables["summary"], res.tables["scan"]
    return [claim1(scan), *claim2(summary), *against_the_others(summary)]


def _ordered(summary):
    """Rows in the pages' order: workloads and policies as declared, sizes up."""
    rank_w = {w: i for i, w in enumerate(WORKLOADS)}
    rank_p = {p: i for i, p in enumerate(POLICIES)}
    return summary.assign(_w=summary.workload.map(rank_w), _p=summary.policy.map(rank_p)) \
        .sort_values(["_w", "cache_mb", "_p"]).drop(columns=["_w", "_p"])


def _workload_tables(summary) -> list[str]:
    """Per workload: one row per policy, hit rate and MiB read from storage
    at each cache size."""
    tables = []
    for w in [w for w in WORKLOADS if w in set(summary.workload)]:
        d = summary[summary.workload == w]
        sizes = sorted(set(d.cache_mb))
        cols = (["policy"] + [("hit rate", f"{mb:g} MB") for mb in sizes]
                + [("read from storage, MiB", f"{mb:g} MB") for mb in sizes])
        rows = []
        for p in [p for p in POLICIES if p in set(d.policy)]:
            by = d[d.policy == p].set_index("cache_mb")
            rows.append([p] + [by.hit_rate.get(mb) for mb in sizes]
                        + [by.storage_mib.get(mb) for mb in sizes])
        formats = {c: ("{:.1%}" if c[0] == "hit rate" else "{:,.1f}") for c in cols[1:]}
        tables.append(html_table(rows, cols, formats=formats,
                                 caption=f"{w}: {WORKLOADS[w].description}"))
    return tables


#: The all-runs table: summary column -> (header in words, format).
ALL_RUNS = {
    "workload": ("workload", None), "policy": ("policy", None),
    "cache_mb": ("cache size, MB", "{:,.0f}"), "runs": ("runs (seeds)", "{:,}"),
    "hit_rate": ("hit rate", "{:.3f}"), "storage_mib": ("read from storage, MiB", "{:,.1f}"),
    "storage_reads": ("storage reads", "{:,.0f}"),
    "evicted_entries": ("entries evicted", "{:,.0f}"), "requeues": ("requeues", "{:,.0f}"),
    "peak_mib": ("peak cache size, MiB", "{:,.1f}"),
    "eviction_us_per_pass": ("CPU per eviction pass, µs", "{:,.2f}"),
    "max_pass_us": ("longest pass, µs", "{:,.1f}"),
}


def write_report(out: Path, res: RunResult, *, spark_version: Optional[str],
                 command: str) -> Path:
    """Figures, tables and index.html in ``out``; returns the index path.
    ``res``: the tables "summary" (one row per workload, policy and cache
    size) and "scan" (the idle-pass costs) as pandas frames, the
    CacheSettings, and params workloads, policies, seeds and scale."""
    out = Path(out)
    summary, scan = res.tables["summary"], res.tables["scan"]
    seeds = res.params["seeds"]
    page = ReportPage(
        "Broker entry cache: PIP-430 against other eviction policies",
        subtitle="Generated traces replayed on each policy (same reads for all); "
                 "hit rate, bytes read from storage, eviction cost.",
        command=command,
        env=environment(spark_version, **{key: value for key, value, _ in
                                          res.settings.table(group="eviction")},
                        seeds=seeds, scale=res.params["scale"]))
    page.verdicts(verdicts(res), note="3. \"At least as well\": a hit rate no lower and no "
                  "more bytes read from storage than each other policy, at every cache size, "
                  "compared at the tables' precision; where it is not, the row lists who does "
                  "better, and by how much.")
    files = ["runs.parquet", "runs.csv", "summary.parquet", "summary.csv", "scan.parquet",
             "scan.csv"]
    page.tables(_workload_tables(summary),
                title="Hit rate and storage reads per workload, policy and cache size")
    page.paragraph("Policies: " + "; ".join(
        f"{p} = {POLICIES[p].description}" for p in res.params["policies"])
        + ". Every policy but legacy drops entries once every subscription has acknowledged "
          "them; legacy drops them once every cursor has read them (Pulsar's default "
          "before PIP-430), which loses entries waiting for redelivery. Cache sizes are "
          "managedLedgerCacheSizeMB; numbers are means over "
          + plural(seeds, "seed") + ".")
    _per_workload(summary, "hit_rate", "hit rate, %", out / "hit_rate.png", ylim=(0, 1.02),
                  percent=True)
    page.figure("hit_rate.png", "Entry reads served from the cache, per workload and cache size.",
                title="Hit rate")
    _per_workload(summary, "storage_mib", "MiB read from storage", out / "storage.png")
    page.figure("storage.png", "Bytes the misses read from storage (BookKeeper/S3), mean per "
                "trace.", title="Storage reads")
    files += ["hit_rate.png", "storage.png"]
    if scan is not None and len(scan):
        _scan_figure(scan, out / "scan.png")
        page.figure("scan.png", "Median thread CPU time of one periodic eviction pass with "
                    "nothing to evict, all policies measured interleaved in one process per "
                    "topic count.", title="Eviction cost against the number of topics")
        wide = scan.pivot(index="topics", columns="policy", values="ns_per_pass").reset_index()
        formats = {}
        if {"pip430", "legacy"} <= set(wide.columns):
            wide["legacy / pip430"] = wide["legacy"] / wide["pip430"]
            formats["legacy / pip430"] = "{:,.0f}x"
        page.table(wide, title="Idle eviction pass, ns", floats="{:,.1f}", formats=formats)
        files.append("scan.png")
    table = _ordered(summary)[list(ALL_RUNS)].rename(
        columns={k: h for k, (h, _) in ALL_RUNS.items()})
    page.table(table, title=f"All runs (means over {plural(seeds, 'seed')})",
               formats={h: f for h, f in ALL_RUNS.values() if f})
    page.paragraph("Storage reads: read requests to BookKeeper/S3, one per run of "
                   "consecutive entries that missed the cache. Requeues: entries an eviction "
                   "walk moved back to the queue's tail instead of evicting them (recently "
                   "read, or reads still expected). Peak cache size: the most bytes cached at "
                   "once. CPU per eviction pass: thread CPU time of the periodic pass, mean "
                   "over all passes; longest pass: the slowest one.")
    page.files(files)
    return page.write(out)
