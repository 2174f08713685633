"""Read the rest of a large frame straight into the buffer it will live in (``recv_into``).

Twisted's TCP transport reads into a fresh ``bytes`` per ``doRead`` and the protocol then
joins the chunks of a frame that spans several reads: two copies of every byte (and fresh
pages for each chunk) before the frame is whole. A Raft follower receives about every byte
the cluster stores that way. ``install`` lets a protocol that knows how long its pending frame
is take over the reads until that frame is complete; at all other times the transport reads
as usual. Plain TCP transports only (TLS decrypts into its own buffers).
"""
from __future__ import annotations

from typing import Any, Callable

from twisted.internet import main

from kmqkafka.net.sendmsg import plain_tcp

__all__ = ["FillBudget", "install", "worth_filling"]

FILL_MIN = 256 * 1024
"""Smaller frames are read as usual: the copy saved is not worth a buffer of their own."""
FILL_MAX = 16 << 20
"""Larger frames are read as usual (the buffer grows as data arrives): a buffer is
allocated whole, and a peer must not get a huge one for a four-byte length prefix."""
FILL_HEAD = 64 * 1024
"""A frame gets its own buffer only once this much of it has arrived, which bounds what a
peer can make the broker allocate to 256 times what it sent."""


FILL_BUDGET = 256 << 20
"""Bytes the fill buffers of all Kafka connections may hold at once: FILL_HEAD still let
100 connections that each announced a 16 MiB frame and sent 64 KiB of it make the broker
hold 1.6 GB. Past the budget a frame is read as usual, its buffer growing only as its bytes
arrive."""


class FillBudget:
    """Bytes promised to fill buffers, shared by the connections of one process."""

    def __init__(self, limit: int = FILL_BUDGET) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes for a fill buffer; False when that would pass the limit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        """Return what ``take`` reserved (the frame completed, or its connection went)."""
        self.held -= size


def worth_filling(size: int, have: int) -> bool:
    """Whether a frame of ``size`` bytes, ``have`` of them already here, should be read into a
    buffer of its own."""
    return FILL_MIN <= size <= FILL_MAX and have >= FILL_HEAD


def install(transport: Any, target: Callable[[], memoryview | None],
            filled: Callable[[int], None]) -> bool:
    """Route ``transport``'s reads into ``target()`` whenever it returns a view (the unfilled
    rest of the pending frame), reporting each read's size to ``filled``. Returns False (and
    changes nothing) for a transport this cannot serve."""
    if not plain_tcp(transport):  # a TLS wrapper's doRead is never called by the reactor
        return False
    sock = transport.socket
    plain = transport.doRead

    def doRead() -> Any:
        into = target()
        if into is None:
            return plain()
        try:
            n = sock.recv_into(into)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return main.CONNECTION_LOST
        if not n:
            return main.CONNECTION_DONE
        filled(n)
        return None

    transport.doRead = doRead
    return True
