"""Message lifecycle of a Pulsar subscription (seed 003, Tencent Cloud):
acknowledgment holes, mark-delete, TTL, backlog quotas.

``AckRangeSet``      acknowledged positions as ranges ``(lower, upper]`` per
                     ledger (Pulsar's individuallyDeletedMessages)
``Cursor``           mark-delete plus those ranges over a topic's ledgers:
                     individual and cumulative acks, holes, backlog, recovery
``HoleCompensator``  the holes old enough to redeliver (Tencent's task)
``is_entry_expired``, ``Expirer``   TTL whose clock starts when a delayed
                     message becomes deliverable (or Pulsar's publish-time rule)
``BacklogQuota``     size and time limits with Pulsar's three policies

``python -m pylimiter.pulsar.cursor simulate`` sweeps these over subscriptions
on Spark and writes ``reports/cursor/index.html`` (the ``spark`` extra).
"""

from ._positions import Position
from .cursor import Cursor, HoleCompensator
from .lifecycle import BacklogQuota, EntryMeta, Expirer, is_entry_expired
from .ranges import AckRangeSet

__all__ = ["AckRangeSet", "BacklogQuota", "Cursor", "EntryMeta", "Expirer", "HoleCompensator",
           "Position", "is_entry_expired"]
