"""Decoding produced batches off the reactor, with each partition's appends kept in order.

Most produced batches are appended as they arrive: the broker checks their header and CRC and
never decodes a record. A few must be decoded (a compacted topic's keys, timestamp bounds, a
header max timestamp that cannot be right). Decoding a compressed batch is decompression of up
to ``records.DECOMPRESSED_MAX``; a request of many such batches held the reactor for 7 s
(50 zstd batches of 6.5 KB, each a 200 MB run of zeros), and every other client with it, where
Kafka decodes on its request-handler threads. Such a batch is decoded on a thread here
(decompressors release the GIL), at most ``DECODERS`` at a time.

Appends to one partition must still be issued in the order the requests arrived (an
idempotent producer's next batch must not overtake the one being decoded), so a batch sent to a
partition while an earlier one waits for its decoding waits its turn too (``PartitionOrder``).
"""
from __future__ import annotations

from typing import Any, Callable

from twisted.internet import threads
from twisted.internet.defer import Deferred, DeferredSemaphore, maybeDeferred

__all__ = ["DECODERS", "PartitionOrder", "off_reactor"]

DECODERS = 2
"""Threads decoding at once: batches beyond that queue, so the reactor's thread pool stays
available to its other users (the /metrics page)."""


class PartitionOrder:
    """Runs each partition's append steps in submission order once their input is ready."""

    def __init__(self) -> None:
        self._tails: dict[str, Deferred[None]] = {}

    def waiting(self, channel: str) -> bool:
        """An earlier step of ``channel`` has not run yet: a new one must queue behind it."""
        return channel in self._tails

    def run(self, channel: str, ready: Deferred[Any], step: Callable[[Any], Any]) -> Deferred[Any]:
        """Call ``step`` with ``ready``'s result (a ``Failure`` too) once it has fired and every
        step submitted earlier for ``channel`` has been called; fires with what ``step``
        returns. ``step`` issues its append synchronously, so the order is the issue order."""
        previous = self._tails.get(channel)
        turn: Deferred[None] = Deferred()
        self._tails[channel] = turn

        def go(result: Any) -> Any:
            try:
                return step(result)
            finally:
                if self._tails.get(channel) is turn:
                    del self._tails[channel]
                turn.callback(None)

        if previous is None:
            return ready.addBoth(go)
        joined: Deferred[Any] = Deferred()

        def after_previous(_: None) -> None:
            ready.chainDeferred(joined)

        previous.addCallback(after_previous)
        return joined.addBoth(go)


def off_reactor(reactor: Any, slots: DeferredSemaphore, f: Callable[..., Any],
                *args: Any) -> Deferred[Any]:
    """``f(*args)`` on the reactor's thread pool, at most ``slots`` at once; inline for a
    reactor without threads (``task.Clock`` in tests)."""
    pool = getattr(reactor, "getThreadPool", None)
    if pool is None:
        return maybeDeferred(f, *args)
    return slots.run(threads.deferToThreadPool, reactor, pool(), f, *args)
