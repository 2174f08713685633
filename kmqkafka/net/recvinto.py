"""Read the rest of a large frame straight into the buffer it will live in (``recv_into``).

Twisted's TCP transport reads into a fresh ``bytes`` per ``doRead`` and the protocol then
joins the chunks of a frame that spans several reads: two copies of every byte (and fresh
pages for each chunk) before the frame is whole. A Raft follower receives about every byte
the cluster stores that way. ``install`` lets a protocol that knows how long its pending frame
is take over the reads until that frame is complete; at all other times the transport reads
as usual. Plain TCP transports only (TLS decrypts into its own buffers).
"""
from __future__ import annotations

import socket
from typing import Any, Callable

from twisted.internet import main

__all__ = ["install"]


def install(transport: Any, target: Callable[[], memoryview | None],
            filled: Callable[[int], None]) -> bool:
    """Route ``transport``'s reads into ``target()`` whenever it returns a view (the unfilled
    rest of the pending frame), reporting each read's size to ``filled``. Returns False (and
    changes nothing) for a transport this cannot serve."""
    sock = getattr(transport, "socket", None)
    plain = getattr(transport, "doRead", None)
    if (getattr(transport, "TLS", True) or not isinstance(sock, socket.socket)
            or plain is None):
        return False

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
