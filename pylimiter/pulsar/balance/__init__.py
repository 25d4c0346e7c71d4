"""Pulsar's bundle load balancing, exactly as the broker runs it: topics hashed
into namespace bundles, the four split algorithms, the bundle splitter,
LeastLongTermMessageRate placement and ThresholdShedder, as a pure-Python
library; plus ``python -m pylimiter.pulsar.balance simulate``, a PySpark
pipeline that replays a cluster's topic load through them and compares
strategies in ``reports/balance/index.html``.

Each class names, in its docstring, the ``broker.conf`` keys its parameters
stand for.  Modules:

``bundles``    topic_hash, Bundle, NamespaceBundles (NamespaceBundles,
               NamespaceBundleFactory)
``split``      the four NamespaceBundleSplitAlgorithm classes
``splitter``   BundleSplitterTask
``placement``  LeastLongTermMessageRate (and uniform random, for comparison)
``shedding``   ThresholdShedder
``load``       LocalBrokerData / BundleData / ResourceUsage / resource weights
``cluster``    the leader's decision loop, several strategies side by side
``generate``, ``source``, ``pipeline``, ``report``
               the Spark replay and its HTML page (the ``spark`` extra)

The library modules need nothing beyond the standard library.
"""

from .bundles import FULL_LOWER_BOUND, FULL_UPPER_BOUND, Bundle, NamespaceBundles, topic_hash
from .load import BrokerLoad, BundleLoad, LoadWeights, ResourceUsage
from .placement import LeastLongTermMessageRate, UniformRandom
from .shedding import ThresholdShedder
from .split import SPLIT_ALGORITHMS, TopicStats, split_boundaries
from .splitter import BundleSplitter

__all__ = [
    "FULL_LOWER_BOUND", "FULL_UPPER_BOUND", "SPLIT_ALGORITHMS", "BrokerLoad", "Bundle",
    "BundleLoad", "BundleSplitter", "LeastLongTermMessageRate", "LoadWeights",
    "NamespaceBundles", "ResourceUsage", "ThresholdShedder", "TopicStats", "UniformRandom",
    "split_boundaries", "topic_hash",
]
