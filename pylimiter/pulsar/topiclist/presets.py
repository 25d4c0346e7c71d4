"""The topic-list load presets (``load --preset NAME``): what each starts
and how hard it pushes.  Plain data, importable without the ``topiclist``
extra, so that the command line can list them in its ``--help``; sizing a
preset's pools (``Preset.limits``) needs the protocol, imported then."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A load run against a broker the preset starts itself, in a process
    of its own (so that its memory is its own), with pools sized in
    listings of its namespace: the load is then known to overrun them.

    topics: generated topics in the namespace; heap_listings: the heap pool,
    in listings' heap estimates; direct_answers: the direct pool, in answer
    frames; timeout_ms: both pools' wait timeout; queue_share: both pools'
    queue size, as a share of the connections (so that the pools and the
    queue together hold fewer requests than the clients make, at any
    scale); connections, of which slow_share read each answer read_delay s
    late; retry_delay: the clients' pause after TooManyRequests; duration
    (s)."""

    name: str
    help: str
    topics: int
    heap_listings: float
    direct_answers: float
    timeout_ms: int
    queue_share: float
    connections: int
    slow_share: float
    read_delay: float
    retry_delay: float
    duration: float

    def queue_for(self, connections: int) -> int:
        """Both pools' queue size for this many connections."""
        return max(1, round(connections * self.queue_share))

    def limits(self, namespace: str, topics: int, connections: int) -> dict:
        """The broker's settings for `topics` generated topics and this
        many connections: pool sizes (MB) from one listing's heap estimate
        and answer frame, with 1% to spare so that exactly that many fit;
        the queues from the connections."""
        from . import protocol
        from .broker import generated_topics
        from .protocol import CommandType

        names = generated_topics(namespace, topics)
        heap = protocol.estimate_heap(names)
        frame = protocol.frame_size(protocol.cmd(
            CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE, "getTopicsOfNamespaceResponse",
            request_id=2**63 - 1, topics=names, topics_hash=protocol.topics_hash(names),
            changed=True, filtered=False))
        mb = 1024 * 1024
        return {"listing_heap_bytes": heap, "answer_frame_bytes": frame,
                "heap_mb": max(heap * self.heap_listings * 1.01, 1) / mb,
                "direct_mb": max(frame * self.direct_answers * 1.01, 1) / mb,
                "heap_timeout_ms": self.timeout_ms, "direct_timeout_ms": self.timeout_ms,
                "heap_queue": self.queue_for(connections),
                "direct_queue": self.queue_for(connections)}


#: The load presets, by name (``load --preset NAME``).
PRESETS = {
    "limits": Preset(
        "limits",
        "start a broker with small pools (heap: 4 listings of its 10,000 topics, direct: "
        "2 answers; a wait times out after 0.75 s; half as many requests may queue as "
        "there are connections) and overrun them with 40 connections, a quarter of them "
        "reading each answer 0.5 s late; print each pool's waits, refusals and peak "
        "against its limit, and the broker's peak memory",
        topics=10_000, heap_listings=4, direct_answers=2, timeout_ms=750, queue_share=0.5,
        connections=40, slow_share=0.25, read_delay=0.5, retry_delay=0.1, duration=10.0),
}
