"""The leader's decision loop, one step at a time, for several strategies side
by side on the same bundle loads.

Per step (one load-manager tick, a minute: ``loadBalancerSheddingIntervalMinutes``
and ``loadBalancerSplitIntervalMinutes`` are both 1 by default):

1. every bundle's sample of this step (aggregated by Spark) updates its
   short-term (10 samples) and long-term (1000 samples) averages, Pulsar's
   ``TimeAverageMessageData``;
2. for each strategy: the brokers' load is summed from the bundles they own
   (usage from the broker capacity model below), and, with shedding, the
   ThresholdShedder's bundles are unloaded and placed again;
3. the BundleSplitter picks bundles over a threshold and the chosen split
   algorithm cuts them; this depends only on the bundles' own load, so the
   split decisions are shared by every strategy;
4. for each strategy the split children are placed again
   (``loadBalancerAutoUnloadSplitBundlesEnabled``) or stay with the parent's
   owner.

Placement follows ``ModularLoadManagerImpl.selectBrokerForAssignment``:
brokers over ``loadBalancerBrokerMaxTopics`` are left out (unless all are),
then those that already serve more bundles of the bundle's namespace than
some other broker (``removeMostServicingBrokersForNamespace``), then the
strategy picks; if its pick is over
``loadBalancerBrokerOverloadedThresholdPercentage`` (unweighted), it picks
again among all brokers.  The pick is preallocated the bundle's long-term
rate so later picks in the same step see it; a bundle never seen before
counts as Pulsar's default 50 msg/s in and 50 msg/s out.

The broker model (not Pulsar's, an assumption stated in the report): CPU
usage is the broker's in+out message rate over ``msg_rate`` capacity, and
bandwidth in/out usage is its throughput over the NIC capacity.  Memory and
direct memory are not modelled (their default weights are 0).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from ...spark.settings import ConfigError, setting
from ...spark.settings import Settings as _Settings
from .bundles import Bundle, NamespaceBundles
from .load import BrokerLoad, BundleLoad, LoadWeights, ResourceUsage
from .placement import LeastLongTermMessageRate, UniformRandom
from .shedding import ThresholdShedder
from .split import MIB, SPLIT_ALGORITHMS, TopicStats, split_boundaries
from .splitter import BundleSplitter

__all__ = ["BrokerCapacity", "BundleSample", "Settings", "Simulation", "StepRecord",
           "STRATEGIES", "Strategy", "TimeAverage"]

#: ModularLoadManagerImpl.DEFAULT_MESSAGE_RATE / DEFAULT_MESSAGE_THROUGHPUT:
#: what the leader assumes of a bundle it has never seen.
DEFAULT_MESSAGE_RATE = 50.0
DEFAULT_MESSAGE_THROUGHPUT = 50000.0
#: ModularLoadManagerImpl.NUM_SHORT_SAMPLES / NUM_LONG_SAMPLES.
NUM_SHORT_SAMPLES = 10
NUM_LONG_SAMPLES = 1000


@dataclass(frozen=True)
class BundleSample:
    """One bundle's load in one step: the sums over its topics."""

    topics: int = 0
    sessions: int = 0
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0


ZERO = BundleSample()


class TimeAverage:
    """TimeAverage is Pulsar's ``TimeAverageMessageData``: a plain mean of the
    samples until ``max_samples`` of them, then an exponential average with
    weight 1/max_samples.  The first sample replaces the defaults."""

    __slots__ = ("max_samples", "samples", "rate_in", "rate_out", "tput_in", "tput_out")

    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.samples = 0
        self.rate_in = self.rate_out = DEFAULT_MESSAGE_RATE
        self.tput_in = self.tput_out = DEFAULT_MESSAGE_THROUGHPUT

    def update(self, s: BundleSample) -> None:
        """Fold in one sample."""
        self.samples = n = min(self.samples + 1, self.max_samples)
        keep = (n - 1) / n
        self.rate_in = keep * self.rate_in + s.msg_rate_in / n
        self.rate_out = keep * self.rate_out + s.msg_rate_out / n
        self.tput_in = keep * self.tput_in + s.msg_throughput_in / n
        self.tput_out = keep * self.tput_out + s.msg_throughput_out / n


@dataclass(frozen=True)
class BrokerCapacity:
    """What one broker can carry: ``msg_rate`` messages/s (in+out) at 100% CPU,
    and ``bandwidth_in`` / ``bandwidth_out`` bytes/s of NIC.  The model's
    assumption, not a Pulsar setting: a broker measures its CPU, and its NIC
    speed unless loadBalancerOverrideBrokerNicSpeedGbps (unset by default)
    overrides it.  The simulator's --broker-msg-rate and
    --broker-bandwidth-mbytes default to these."""

    msg_rate: float = 200_000.0
    bandwidth_in: float = 200.0 * MIB
    bandwidth_out: float = 200.0 * MIB


@dataclass(frozen=True)
class Settings(_Settings):
    """Every knob of the simulated load manager, each declared once with its
    broker.conf key (``python -m pylimiter.pulsar.balance simulate`` derives
    its flags and the report its settings table from these declarations).
    Groups: "split" (bundle splitting), "shedding" (placement and
    shedding).  Not broker.conf settings: ``split_positions`` (what Pulsar's
    admin API passes to specified_positions_divide), ``weights`` (the five
    loadBalancer*ResourceWeight keys), ``capacity`` (the broker model)."""

    KEY_FAMILIES = ("loadBalancer", "defaultNamespaceBundle")

    default_bundles: int = setting(
        "defaultNumberOfNamespaceBundles", 4, "bundles", "bundles of a new namespace",
        group="split", minimum=1)
    split_algorithm: str = setting(
        "defaultNamespaceBundleSplitAlgorithm", "range_equally_divide", "",
        "how a bundle is cut in two", group="split", choices=SPLIT_ALGORITHMS)
    split_positions: Optional[tuple[int, ...]] = None
    auto_split: bool = setting(
        "loadBalancerAutoBundleSplitEnabled", True, "",
        "split bundles over a threshold", group="split")
    auto_unload_split_bundles: bool = setting(
        "loadBalancerAutoUnloadSplitBundlesEnabled", True, "",
        "place split children again (else they stay on the parent's broker)", group="split")
    max_topics: int = setting(
        "loadBalancerNamespaceBundleMaxTopics", 1000, "topics",
        "a bundle with more topics is split", group="split")
    max_sessions: int = setting(
        "loadBalancerNamespaceBundleMaxSessions", 1000, "sessions",
        "a bundle with more producers and consumers is split (0 or -1: no limit)",
        group="split", minimum=-1)
    max_msg_rate: float = setting(
        "loadBalancerNamespaceBundleMaxMsgRate", 30000.0, "msg/s",
        "a bundle with more messages in+out is split", group="split")
    max_bandwidth_mbytes: float = setting(
        "loadBalancerNamespaceBundleMaxBandwidthMbytes", 100.0, "MiB/s",
        "a bundle with more bytes in+out is split", group="split")
    max_bundles: int = setting(
        "loadBalancerNamespaceMaximumBundles", 128, "bundles",
        "a namespace is not split beyond this", group="split", minimum=1)
    flow_threshold_pct: float = setting(
        "flowOrQpsDifferenceThresholdPercentage", 10.0, "%",
        "flow_or_qps_equally_divide: the halves' allowed difference", group="split")
    overload_threshold_pct: float = setting(
        "loadBalancerBrokerOverloadedThresholdPercentage", 85.0, "%",
        "a broker this busy is overloaded (placement picks again)", group="shedding")
    threshold_pct: float = setting(
        "loadBalancerBrokerThresholdShedderPercentage", 10.0, "%",
        "ThresholdShedder unloads from brokers this far above the average usage",
        group="shedding")
    history: float = setting(
        "loadBalancerHistoryResourcePercentage", 0.9, "",
        "weight of the past in the shedder's usage average", group="shedding", maximum=1)
    min_throughput_mb: float = setting(
        "loadBalancerBundleUnloadMinThroughputThreshold", 10.0, "MB/s",
        "a bundle with less traffic is not worth unloading", group="shedding")
    lower_boundary_shedding: bool = setting(
        "lowerBoundarySheddingEnabled", False, "",
        "also unload to lift brokers far below the average", group="shedding")
    grace_steps: int = setting(
        "loadBalancerSheddingGracePeriodMinutes", 30, "steps",
        "an unloaded bundle is left alone this long (a step is a minute)",
        group="shedding")
    broker_max_topics: int = setting(
        "loadBalancerBrokerMaxTopics", 50000, "topics",
        "placement leaves out brokers with more topics", group="shedding", minimum=1)
    weights: LoadWeights = field(default_factory=LoadWeights)
    capacity: BrokerCapacity = field(default_factory=BrokerCapacity)

    def __post_init__(self):
        super().__post_init__()
        if self.split_algorithm == "specified_positions_divide" and not self.split_positions:
            raise ConfigError("specified_positions_divide needs split positions")
        if self.max_bundles < self.default_bundles:
            raise ConfigError("need default_bundles <= max_bundles, got "
                              f"{self.default_bundles} and {self.max_bundles}")

    def splitter(self) -> BundleSplitter:
        """The BundleSplitter these settings describe."""
        return BundleSplitter(self.max_topics, self.max_sessions, self.max_msg_rate,
                              self.max_bandwidth_mbytes, self.max_bundles)


@dataclass(frozen=True)
class Strategy:
    """One column of the comparison: a placement strategy, with or without
    the ThresholdShedder."""

    key: str
    label: str
    placement: str      # "least-long-term-message-rate" or "uniform-random"
    shedding: bool


STRATEGIES = (
    Strategy("lltmr+shed", "LeastLongTermMessageRate + ThresholdShedder",
             "least-long-term-message-rate", True),
    Strategy("lltmr", "LeastLongTermMessageRate, no shedding",
             "least-long-term-message-rate", False),
    Strategy("random+shed", "uniform random + ThresholdShedder", "uniform-random", True),
    Strategy("random", "uniform random, no shedding", "uniform-random", False),
)


@dataclass
class StepRecord:
    """What one step produced: per-strategy summary rows, per-broker rows,
    decision rows, and the driver CPU seconds spent deciding."""

    steps: list[dict] = field(default_factory=list)
    brokers: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    splits: int = 0
    decide_cpu_s: float = 0.0


class _History:
    __slots__ = ("short", "long", "last")

    def __init__(self):
        self.short = TimeAverage(NUM_SHORT_SAMPLES)
        self.long = TimeAverage(NUM_LONG_SAMPLES)
        self.last = ZERO

    def update(self, s: BundleSample) -> None:
        self.short.update(s)
        self.long.update(s)
        self.last = s

    def load(self) -> BundleLoad:
        return BundleLoad(msg_throughput_in=self.short.tput_in,
                          msg_throughput_out=self.short.tput_out,
                          long_term_msg_rate_in=self.long.rate_in,
                          long_term_msg_rate_out=self.long.rate_out,
                          long_term_throughput_in=self.long.tput_in,
                          long_term_throughput_out=self.long.tput_out,
                          topics=self.last.topics, sessions=self.last.sessions)


class _StrategyState:
    """One strategy's view of the cluster: who owns what, and its own
    shedder (whose averages are state) and random source."""

    def __init__(self, spec: Strategy, settings: Settings, rng: random.Random):
        self.spec = spec
        self.settings = settings
        if spec.placement == "least-long-term-message-rate":
            self.placement = LeastLongTermMessageRate(settings.overload_threshold_pct,
                                                      settings.weights, rng)
        elif spec.placement == "uniform-random":
            self.placement = UniformRandom(rng)
        else:
            raise ValueError(f"unknown placement {spec.placement!r}")
        self.shedder = ThresholdShedder(settings.threshold_pct, settings.history,
                                        settings.min_throughput_mb,
                                        settings.lower_boundary_shedding,
                                        settings.weights) if spec.shedding else None
        self.owner: dict[str, str] = {}
        self.ns_count: dict[str, Counter] = {}
        self.unloaded_at: dict[str, int] = {}
        # Per step: the loads the leader sees, and topics preallocated.
        self.loads: dict[str, BrokerLoad] = {}
        self.topics: dict[str, int] = {}

    def add_broker(self, broker: str) -> None:
        self.ns_count.setdefault(broker, Counter())
        self.loads.setdefault(broker, BrokerLoad())
        self.topics.setdefault(broker, 0)

    def assign(self, bundle: str, ns: str, live: Sequence[str], rate: float, topics: int) -> str:
        """selectBrokerForAssignment: filters, the strategy's pick, the
        overload re-check, and the preallocation."""
        s = self.settings
        cands = [b for b in live if self.topics[b] <= s.broker_max_topics] or list(live)
        least = min(self.ns_count[b][ns] for b in cands)
        cands = [b for b in cands if self.ns_count[b][ns] == least]
        chosen = self.placement.select(cands, self.loads)
        if chosen is None:
            raise RuntimeError(f"no broker to assign {bundle} to")
        if self.loads[chosen].max_resource_usage() > s.overload_threshold_pct / 100.0:
            chosen = self.placement.select(live, self.loads) or chosen
        self.loads[chosen].preallocated_msg_rate += rate
        self.topics[chosen] += topics
        self.ns_count[chosen][ns] += 1
        self.owner[bundle] = chosen
        return chosen

    def release(self, bundle: str, ns: str) -> str:
        broker = self.owner.pop(bundle)
        self.ns_count[broker][ns] -= 1
        return broker

    def observe(self, live: Sequence[str], hist: Mapping[str, _History]) -> None:
        """Rebuild the brokers' load data from the bundles they own: this
        step's sums (short term) and the bundles' long-term rates."""
        cap = self.settings.capacity
        acc = {b: [0.0] * 6 + [0, []] for b in live}
        for bundle, broker in self.owner.items():
            h = hist[bundle]
            s, lt = h.last, h.long
            a = acc[broker]
            a[0] += s.msg_rate_in
            a[1] += s.msg_rate_out
            a[2] += s.msg_throughput_in
            a[3] += s.msg_throughput_out
            a[4] += lt.rate_in
            a[5] += lt.rate_out
            a[6] += s.topics
            a[7].append(bundle)
        self.loads = {}
        for b in live:
            r_in, r_out, t_in, t_out, lt_in, lt_out, topics, owned = acc[b]
            self.loads[b] = BrokerLoad(
                cpu=ResourceUsage(r_in + r_out, cap.msg_rate),
                bandwidth_in=ResourceUsage(t_in, cap.bandwidth_in),
                bandwidth_out=ResourceUsage(t_out, cap.bandwidth_out),
                msg_rate_in=r_in, msg_rate_out=r_out, msg_throughput_in=t_in,
                msg_throughput_out=t_out, long_term_msg_rate_in=lt_in,
                long_term_msg_rate_out=lt_out, bundles=frozenset(owned))
            self.topics[b] = topics


def _namespace_of(bundle_name: str) -> str:
    return bundle_name.rsplit("/", 1)[0]


class Simulation:
    """Simulation owns the bundle layouts (shared) and one state per strategy.

    ``namespaces`` are the namespace names ("tenant/ns"), ``brokers`` the
    broker names; ``seed`` fixes every random choice.  Feed it one step at a
    time with ``step()``; ``layout()`` says which bundles to aggregate the next
    step's topics into."""

    def __init__(self, namespaces: Sequence[str], brokers: Sequence[str], settings: Settings,
                 strategies: Sequence[Strategy] = STRATEGIES, seed: int = 1):
        if not brokers:
            raise ValueError("need at least one broker")
        if len(set(brokers)) != len(brokers):
            raise ValueError("broker names must be unique")
        self.settings = settings
        self.live = list(brokers)
        self.layouts = {ns: NamespaceBundles.default(settings.default_bundles)
                        for ns in namespaces}
        self.created: dict[str, int] = {}
        self.hist: dict[str, _History] = {}
        self.splitter = settings.splitter()
        self.states = [_StrategyState(sp, settings, random.Random(f"{seed}/{sp.key}"))
                       for sp in strategies]
        for st in self.states:
            for b in self.live:
                st.add_broker(b)
        self.total_splits = 0

    # ---- the layout Spark aggregates into ----------------------------------------------

    def layout(self) -> list[tuple[str, str, int, int]]:
        """(namespace, full bundle name, lower, upper exclusive) for every
        bundle; the last bundle of a namespace ends at 2**32 (exclusive)."""
        out = []
        for ns, nb in self.layouts.items():
            for b in nb.bundles:
                out.append((ns, f"{ns}/{b.name}", b.lower, b.upper + 1 if b.last else b.upper))
        return out

    def bundle_names(self) -> list[str]:
        """Every current bundle's full name, namespace by namespace."""
        return [f"{ns}/{b.name}" for ns, nb in self.layouts.items() for b in nb.bundles]

    def ownership(self) -> list[dict]:
        """strategy, namespace, bundle, broker for every bundle now."""
        rows = []
        for st in self.states:
            for bundle, broker in st.owner.items():
                rows.append(dict(strategy=st.spec.key, namespace=_namespace_of(bundle),
                                 bundle=bundle, broker=broker))
        return rows

    # ---- one step ------------------------------------------------------------------------

    def step(self, t: int, samples: Mapping[str, BundleSample],
             topics_of: Optional[Callable[[list[tuple[str, Bundle]]],
                                          Mapping[str, Mapping[str, TopicStats]]]] = None
             ) -> StepRecord:
        """Run step ``t`` on this step's bundle samples (full bundle name ->
        BundleSample; missing bundles had no topics).  ``topics_of`` fetches
        the topics of bundles to split (for every algorithm but
        range_equally_divide): given [(full name, Bundle)], it returns
        full name -> {topic: TopicStats}."""
        cpu0 = time.thread_time()
        rec = StepRecord()
        names = self.bundle_names()
        unknown = set(samples) - set(names)
        if unknown:
            raise ValueError(f"samples for bundles not in the layout: {sorted(unknown)[:3]}")
        for name in names:
            h = self.hist.get(name)
            if h is None:
                h = self.hist[name] = _History()
                self.created.setdefault(name, t)
            h.update(samples.get(name, ZERO))
        loads = {name: self.hist[name].load() for name in names}

        for st in self.states:
            # Bundles nobody owns yet (the first step) are placed blind, on
            # Pulsar's default estimate: no broker has reported anything.
            for name in names:
                if name not in st.owner:
                    st.assign(name, _namespace_of(name), self.live, 2 * DEFAULT_MESSAGE_RATE, 0)
            st.observe(self.live, self.hist)
            self._record_usage(st, t, rec)
            if st.shedder is not None:
                self._shed(st, t, loads, rec)

        splits, fetch_cpu = self._split(loads, topics_of) if self.settings.auto_split else ([], 0)
        for st in self.states:
            for parent, children in splits:
                self._replace(st, t, parent, children, rec)
        rec.splits = len(splits)
        self.total_splits += len(splits)
        for row in rec.steps:
            row["splits"] = len(splits)
        # Fetching topics runs Spark jobs: that is not the leader's work.
        rec.decide_cpu_s = time.thread_time() - cpu0 - fetch_cpu
        return rec

    def _record_usage(self, st: _StrategyState, t: int, rec: StepRecord) -> None:
        w = self.settings.weights
        usages = []
        for b in self.live:
            d = st.loads[b]
            u = 100.0 * d.weighted_usage(w)
            usages.append(u)
            rec.brokers.append(dict(
                strategy=st.spec.key, step=t, broker=b, usage_pct=u, cpu_pct=d.cpu.percent,
                bandwidth_in_pct=d.bandwidth_in.percent,
                bandwidth_out_pct=d.bandwidth_out.percent,
                msg_rate=d.msg_rate_in + d.msg_rate_out,
                throughput=d.msg_throughput_in + d.msg_throughput_out,
                bundles=len(d.bundles), topics=st.topics[b]))
        mean = sum(usages) / len(usages)
        rec.steps.append(dict(
            strategy=st.spec.key, step=t, brokers=len(usages), bundles=len(st.owner),
            max_usage=max(usages), mean_usage=mean, min_usage=min(usages),
            spread=max(usages) - min(usages),
            stdev=math.sqrt(sum((u - mean) ** 2 for u in usages) / len(usages)),
            overloaded=sum(u > self.settings.overload_threshold_pct for u in usages),
            unloads=0, moved_bytes_per_s=0.0, assignments=0, splits=0))

    def _shed(self, st: _StrategyState, t: int, loads: Mapping[str, BundleLoad],
              rec: StepRecord) -> None:
        # doLoadShedding forgets an unload once it is older than the grace
        # period: one unloaded `grace` minutes ago is still protected.
        grace = self.settings.grace_steps
        recent = {b for b, at in st.unloaded_at.items() if t - at <= grace}
        plan = st.shedder.find_bundles_for_unloading(st.loads, loads, recent)
        row = rec.steps[-1]
        for broker, bundles in plan.items():
            for bundle in bundles:
                ns = _namespace_of(bundle)
                st.release(bundle, ns)
                h = self.hist[bundle]
                lt = h.long
                to = st.assign(bundle, ns, self.live, lt.rate_in + lt.rate_out, h.last.topics)
                st.unloaded_at[bundle] = t
                moved = loads[bundle].msg_throughput_in + loads[bundle].msg_throughput_out
                row["unloads"] += 1
                row["assignments"] += 1
                row["moved_bytes_per_s"] += moved
                rec.decisions.append(dict(
                    strategy=st.spec.key, step=t, action="unload", bundle=bundle,
                    namespace=ns, from_broker=broker, to_broker=to, throughput=moved,
                    msg_rate=h.last.msg_rate_in + h.last.msg_rate_out, detail=""))

    def _split(self, loads: Mapping[str, BundleLoad], topics_of):
        """Split what the splitter picks; returns [(parent, children)] and
        the CPU time spent fetching topics."""
        s = self.settings
        picks = self.splitter.find_bundles_to_split(loads)
        if not picks:
            return [], 0.0
        bundles = {}
        for name in picks:
            ns, rng = name.rsplit("/", 1)
            nb = self.layouts[ns]
            bundles[name] = nb.bundles[nb.index(int(rng.split("_")[0], 16))]
        topics, fetch_cpu = {}, 0.0
        if s.split_algorithm != "range_equally_divide":
            if topics_of is None:
                raise ValueError(f"{s.split_algorithm} needs the topics of the bundles to split")
            fetch_cpu = time.thread_time()
            topics = topics_of([(n, bundles[n]) for n in picks])
            fetch_cpu = time.thread_time() - fetch_cpu
        done = []
        for name in picks:
            ns = _namespace_of(name)
            bundle = bundles[name]
            cuts = split_boundaries(s.split_algorithm, bundle, topics.get(name, {}),
                                    positions=s.split_positions, max_msg_rate=s.max_msg_rate,
                                    max_bandwidth_mbytes=s.max_bandwidth_mbytes,
                                    threshold_pct=s.flow_threshold_pct)
            room = s.max_bundles - len(self.layouts[ns])
            if not cuts or room <= 0:
                continue
            # A multi-way cut (flow_or_qps) may not take the namespace past
            # loadBalancerNamespaceMaximumBundles: keep its lowest cuts.
            cuts = cuts[:room]
            self.layouts[ns] = self.layouts[ns].split(bundle, cuts)
            edges = [bundle.lower, *cuts, bundle.upper]
            children = [f"{ns}/{Bundle(lo, hi, bundle.last and hi == bundle.upper).name}"
                        for lo, hi in zip(edges, edges[1:])]
            del self.hist[name]
            done.append((name, children))
        return done, fetch_cpu

    def _replace(self, st: _StrategyState, t: int, parent: str, children: list[str],
                 rec: StepRecord) -> None:
        ns = _namespace_of(parent)
        owner = st.release(parent, ns)
        st.unloaded_at.pop(parent, None)
        row = next(r for r in reversed(rec.steps) if r["strategy"] == st.spec.key)
        rec.decisions.append(dict(strategy=st.spec.key, step=t, action="split", bundle=parent,
                                  namespace=ns, from_broker=owner, to_broker=owner,
                                  throughput=0.0, msg_rate=0.0,
                                  detail=" ".join(c.rsplit("/", 1)[1] for c in children)))
        for child in children:
            if self.settings.auto_unload_split_bundles:
                to = st.assign(child, ns, self.live, 2 * DEFAULT_MESSAGE_RATE, 0)
                row["assignments"] += 1
                rec.decisions.append(dict(strategy=st.spec.key, step=t, action="assign",
                                          bundle=child, namespace=ns, from_broker=owner,
                                          to_broker=to, throughput=0.0, msg_rate=0.0,
                                          detail="split child"))
            else:
                st.owner[child] = owner
                st.ns_count[owner][ns] += 1

    # ---- checks ----------------------------------------------------------------------------

    def check(self) -> None:
        """Raise AssertionError unless every bundle is owned by exactly one
        live broker in every strategy and no namespace is over max_bundles."""
        names = set(self.bundle_names())
        for st in self.states:
            if set(st.owner) != names:
                missing = names - set(st.owner)
                extra = set(st.owner) - names
                raise AssertionError(f"{st.spec.key}: unowned {sorted(missing)[:3]}, "
                                     f"stale {sorted(extra)[:3]}")
            dead = {b for b in st.owner.values() if b not in self.live}
            if dead:
                raise AssertionError(f"{st.spec.key}: bundles on dead brokers {sorted(dead)}")
            counts = Counter((b, _namespace_of(n)) for n, b in st.owner.items())
            kept = {(b, ns): n for b, c in st.ns_count.items() for ns, n in c.items() if n}
            if counts != kept:
                raise AssertionError(f"{st.spec.key}: per-namespace bundle counts drifted")
        for ns, nb in self.layouts.items():
            if len(nb) > self.settings.max_bundles:
                raise AssertionError(f"{ns} has {len(nb)} bundles > {self.settings.max_bundles}")
