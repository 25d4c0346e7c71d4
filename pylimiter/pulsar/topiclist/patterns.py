"""Topics patterns, matched as Pulsar matches them: RE2 (linear time, as
Pulsar's RE2/J), against topic names without their scheme, whole-name
(fullmatch), with the pattern's length capped by subscriptionPatternMaxLength.

Python's own `re` backtracks: a 36-character pattern such as
'persistent://public/default/(.*.*)*X' takes it seconds per topic.  RE2
cannot backtrack and refuses what it cannot match in linear time
(back-references, look-around); such a pattern is an InvalidTopicName.
Filtering a large namespace runs in chunks, each a step of its own (a fair
turn in the service, see fair.py), so other connections are served while it
runs.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Iterable, Optional

import re2

from . import protocol

#: Topics matched between two yields to the event loop (about 5 ms of RE2).
CHUNK = 1024

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False     # the error goes to the client, not stderr


class PatternTooLong(ValueError):
    """Longer than subscriptionPatternMaxLength (Java string length)."""


class InvalidPattern(ValueError):
    """Not a pattern RE2 takes, or an unknown topic domain."""


def java_length(text: str) -> int:
    """String.length() in Java: UTF-16 code units."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


class TopicsPattern:
    """A compiled topics pattern; `matches(topic)` takes a full topic name."""

    __slots__ = ("source", "_fullmatch")

    def __init__(self, pattern: str, max_length: int):
        """PatternTooLong or InvalidPattern if it cannot be used.  Protobuf
        hands over the bytes of a string field that is not UTF-8: such a
        pattern is an InvalidPattern too."""
        if not isinstance(pattern, str):
            raise InvalidPattern("the pattern is not valid UTF-8")
        try:
            domainless = protocol.strip_domain_pattern(pattern)
        except ValueError as exc:
            raise InvalidPattern(str(exc)) from None
        if java_length(domainless) > max_length:
            raise PatternTooLong(f"Pattern longer than maximum: {max_length}")
        try:
            rx = re2.compile(domainless, _OPTIONS)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", "replace")
            raise InvalidPattern(f"{reason}") from None
        self.source = pattern
        self._fullmatch = rx.fullmatch

    def matches(self, topic: str) -> bool:
        """Whether the topic, without its scheme, matches whole."""
        return self._fullmatch(protocol.strip_domain(topic)) is not None

    def filter(self, topics: Iterable[str]) -> list[str]:
        """The matching topics, in order, without yielding (small lists)."""
        return [t for t in topics if self.matches(t)]

    async def filter_async(self, topics: list[str],
                           run: Optional[Callable[..., Awaitable]] = None) -> list[str]:
        """The matching topics, in order, CHUNK topics per step: each step
        is ``await run(self.filter, chunk)`` (a fair turn), or without
        `run` a plain call followed by a yield to the event loop."""
        out: list[str] = []
        for start in range(0, len(topics), CHUNK):
            chunk = topics[start:start + CHUNK]
            if run is not None:
                out.extend(await run(self.filter, chunk))
            else:
                if start:
                    await asyncio.sleep(0)
                out.extend(self.filter(chunk))
        return out
