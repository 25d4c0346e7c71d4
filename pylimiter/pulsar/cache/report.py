"""reports/cache/index.html: hit rate and storage bytes per policy and cache
size for each workload, the idle eviction pass cost against the number of
topics, and a verdict on PIP-430's two claims computed from the data."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..._cli import fmt_bytes
from ...spark.report import FULL_WIDTH_IN, ReportPage, environment, pyplot, save_figure
from ._common import CacheSettings
from .policies import POLICIES
from .workloads import WORKLOADS

__all__ = ["RunResult", "claim1", "claim2", "write_report"]

COLORS = {"pip430": "#1b7837", "pip430-no-expected-reads": "#7fbf7b", "fifo": "#999999",
          "lru": "#2166ac", "legacy": "#b2182b"}
CLAIM2_WORKLOADS = ("catchup", "keyshared")


@dataclass
class RunResult:
    """What a sweep produced, for the page: the summary (one row per
    workload, policy and cache size) and the idle-pass costs as pandas
    frames, and what was swept with which eviction settings."""

    summary: Any
    scan: Any
    workloads: list[str]
    policies: list[str]
    seeds: int
    scale: float
    settings: CacheSettings = field(default_factory=CacheSettings)


def _ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def _per_workload(summary, column: str, ylabel: str, path: Path, ylim=None) -> Path:
    plt = pyplot()
    workloads = [w for w in WORKLOADS if w in set(summary.workload)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(FULL_WIDTH_IN, 3.6), squeeze=False)
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
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=8, loc="best")
    return save_figure(fig, path)


def _scan_figure(scan, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(FULL_WIDTH_IN * 0.6, 4.0))
    for p in POLICIES:
        d = scan[scan.policy == p].sort_values("topics")
        if len(d):
            ax.plot(d.topics, d.ns_per_pass / 1000, marker="o", color=COLORS[p], label=p)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("topics (one cached entry each)")
    ax.set_ylabel("CPU per idle eviction pass (µs)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return save_figure(fig, path)


def claim1(scan) -> tuple[str, bool | None]:
    """PIP-430 claim 1 from the idle-pass measurements."""
    if scan is None or not len(scan) or not {"pip430", "legacy"} <= set(scan.policy):
        return "Claim 1 (cheaper eviction) was not measured (no --scan-topics).", None
    q = scan[scan.policy == "pip430"].set_index("topics").ns_per_pass
    leg = scan[scan.policy == "legacy"].set_index("topics").ns_per_pass
    tmax, tmin = max(q.index), min(q.index)
    ratio = leg[tmax] / q[tmax]
    text = (f"Claim 1 (eviction without per-topic scans is cheaper): at {tmax:,} topics an idle "
            f"eviction pass costs {_ns(leg[tmax])} with the legacy per-cache scan and "
            f"{_ns(q[tmax])} with the removal queue, {ratio:,.0f}x cheaper")
    if tmax > tmin:
        text += (f"; from {tmin:,} to {tmax:,} topics the scan grew {leg[tmax] / leg[tmin]:,.0f}x "
                 f"and the queue's pass {q[tmax] / q[tmin]:.1f}x")
        at10ms = leg[tmax] / 10e6
        text += (f". Run every 10 ms (managedLedgerCacheEvictionIntervalMs), the scan alone "
                 f"would use {at10ms:.0%} of a core here at {tmax:,} topics")
    return text + ". Holds." if ratio > 1 else text + ". Does not hold.", ratio > 1


def claim2(summary) -> tuple[str, bool | None]:
    """PIP-430 claim 2: expected read counts cut storage reads for catch-up
    and Key_Shared replay (pip430 against the same queue without them)."""
    parts, verdicts = [], []
    for w in CLAIM2_WORKLOADS:
        d = summary[summary.workload == w]
        a = d[d.policy == "pip430"].set_index("cache_mb")
        b = d[d.policy == "pip430-no-expected-reads"].set_index("cache_mb")
        sizes = sorted(set(a.index) & set(b.index))
        if not sizes:
            continue
        cuts = [1 - a.storage_mib[s] / b.storage_mib[s] if b.storage_mib[s] > 0 else 0.0
                for s in sizes]
        holds = all(c >= 0 for c in cuts) and any(c > 0 for c in cuts)
        verdicts.append(holds)
        best = max(range(len(sizes)), key=lambda i: cuts[i])
        s = sizes[best]
        part = (f"{w}: pip430 cut the bytes read from storage by {min(cuts):.0%} to "
                f"{max(cuts):.0%} against the same queue without expected reads over "
                f"{sizes[0]:g}-{sizes[-1]:g} MB (at {s:g} MB {fmt_bytes(b.storage_mib[s] * 2**20)}"
                f" -> {fmt_bytes(a.storage_mib[s] * 2**20)}, hit rate "
                f"{b.hit_rate[s]:.1%} -> {a.hit_rate[s]:.1%})")
        for other in ("fifo", "legacy", "lru"):
            o = d[d.policy == other].set_index("cache_mb")
            if s in o.index and o.storage_mib[s] > 0:
                cut = 1 - a.storage_mib[s] / o.storage_mib[s]
                part += (f"; {cut:.0%} less than {other}" if cut >= 0
                         else f"; {-cut:.0%} more than {other}")
        parts.append(part)
    if not parts:
        return ("Claim 2 (expected reads cut storage reads) was not measured: run the catchup or "
                "keyshared workload with pip430 and pip430-no-expected-reads."), None
    ok = all(verdicts)
    return ("Claim 2 (keeping entries with remaining expected reads cuts storage reads for "
            "catch-up and Key_Shared replay): " + "; ".join(parts)
            + (". Holds." if ok else ". Does not hold everywhere.")), ok


def write_report(out: Path, res: RunResult, *, spark_version: Optional[str],
                 command: str) -> Path:
    """Figures, tables and index.html in ``out``; returns the index path."""
    out = Path(out)
    summary, scan = res.summary, res.scan
    page = ReportPage(
        "Broker entry cache: PIP-430 against other eviction policies",
        subtitle="Generated traces replayed on each policy (same reads for all); "
                 "hit rate, bytes read from storage, eviction cost.",
        command=command,
        env=environment(spark_version, **{key: value for key, value, _ in
                                          res.settings.table(group="eviction")},
                        seeds=res.seeds, scale=res.scale))
    c1, _ = claim1(scan)
    c2, _ = claim2(summary)
    page.verdict(f"{c1} {c2}")
    files = ["runs.parquet", "runs.csv", "summary.parquet", "summary.csv", "scan.parquet",
             "scan.csv"]
    page.paragraph("Workloads: " + "; ".join(
        f"{w} = {WORKLOADS[w].description}" for w in res.workloads) + ".")
    page.paragraph("Policies: " + "; ".join(
        f"{p} = {POLICIES[p].description}" for p in res.policies)
        + ". Every policy but legacy drops entries once every subscription has acknowledged "
          "them; legacy drops them once every cursor has read them (Pulsar's default "
          "before PIP-430), which loses entries waiting for redelivery.")
    _per_workload(summary, "hit_rate", "hit rate", out / "hit_rate.png", ylim=(0, 1.02))
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
        if {"pip430", "legacy"} <= set(wide.columns):
            wide["legacy / pip430"] = wide["legacy"] / wide["pip430"]
        page.table(wide, title="Idle pass, ns", floats="{:.1f}")
        files.append("scan.png")
    cols = ["workload", "policy", "cache_mb", "runs", "hit_rate", "storage_mib",
            "storage_reads", "evicted_entries", "requeues", "peak_mib", "eviction_us_per_pass",
            "max_pass_us"]
    page.table(summary[cols], title="All runs (means over seeds)", floats="{:.3f}")
    page.files(files)
    return page.write(out)
