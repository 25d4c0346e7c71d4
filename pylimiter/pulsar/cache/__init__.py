"""The Pulsar broker entry cache (PIP-430): a global removal queue with
expected-read-count eviction, per-topic entry caches, a memory-bounded read
path on pylimiter's AsyncSemaphore, and (``python -m pylimiter.pulsar.cache
simulate``) a PySpark simulator that compares eviction policies.

``CacheEntry``, ``RemovalQueue``, ``EntryCacheManager`` and ``EntryCache``
come from the C implementation (``_cache_c``, over csrc/plim_cacheq.c)
unless ``PYLIMITER_NO_EXTENSIONS`` is set; ``_cache_py`` is the pure-Python
twin with the same behaviour, always importable.  ``IMPLEMENTATION`` says
which one is active.
"""

from typing import TYPE_CHECKING

from ... import _impls
from ._common import ENTRY_OVERHEAD_BYTES, SETTINGS, CacheStats, NotInitialisedError

if TYPE_CHECKING:
    from ._cache_py import CacheEntry, EntryCache, EntryCacheManager, RemovalQueue
else:
    # No fallback: a missing or broken extension is an error, not a slowdown.
    _active = _impls.active_module("cache")
    CacheEntry = _active.CacheEntry
    EntryCache = _active.EntryCache
    EntryCacheManager = _active.EntryCacheManager
    RemovalQueue = _active.RemovalQueue
    del _active

IMPLEMENTATION = _impls.ACTIVE.tag

from .reader import EntryReader  # noqa: E402  (uses the classes above)

__all__ = [
    "CacheEntry",
    "RemovalQueue",
    "EntryCacheManager",
    "EntryCache",
    "CacheStats",
    "EntryReader",
    "ENTRY_OVERHEAD_BYTES",
    "NotInitialisedError",
    "SETTINGS",
    "IMPLEMENTATION",
]
