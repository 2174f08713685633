"""Large writes straight to a TCP socket with one ``sendmsg``, pieces uncopied.

Twisted's ``write``/``writeSequence`` queue pieces and join them into one ``bytes`` before
sending: a full user-space copy of every large frame (a 1 MiB Raft Append to each follower, a
Fetch response). On this class of machine memory bandwidth, not the interpreter, bounds the
replication path, so that copy matters. ``write_parts`` hands the pieces (bytes, memoryviews)
to the kernel directly when nothing is queued ahead of them on the transport, and queues only
what the socket did not take. Small writes, TLS transports and anything unusual take the
ordinary path.

What is queued would still be copied twice more by Twisted (joined into one ``bytes``, then
joined again with the unsent rest on a later ``doWrite``): a Raft leader whose followers'
sockets were full sent two thirds of its bytes that way. ``gather_writes`` gives a transport a
``doWrite`` that hands its queue to ``sendmsg`` as it is, and lets ``write_parts`` queue views.
"""
from __future__ import annotations

import socket
from typing import Any, Sequence

from twisted.internet import main, tcp
from twisted.internet.interfaces import ISSLTransport

__all__ = ["DIRECT_MIN", "gather_writes", "plain_tcp", "write_parts"]

DIRECT_MIN = 64 * 1024
"""Below this a write is queued as usual: Twisted coalesces small writes of one reactor turn
into one send, which beats a syscall each."""

_IOV_MAX = 1024


def write_parts(transport: Any, parts: Sequence[Any], size: int) -> None:
    """Write ``parts`` (``size`` bytes in all) in order after anything already queued."""
    if size >= DIRECT_MIN and _idle_tcp(transport):
        sent = _send_direct(transport.socket, parts)
        if sent < 0:
            transport.loseConnection()
            return
        if sent == size:
            return
        parts = _after(parts, sent)
    if getattr(transport, _GATHERING, False):
        _queue(transport, parts)
    else:
        transport.write(b"".join(parts))  # one ``bytes`` piece is passed on as it is, uncopied


_GATHERING = "_kmq_gathering"


def gather_writes(transport: Any) -> bool:
    """Make ``transport`` send its queue with ``sendmsg``, pieces uncopied. Returns False (and
    changes nothing) for a transport that is not plain TCP."""
    if not plain_tcp(transport):
        return False

    def doWrite() -> Any:
        return _gathered_write(transport)

    transport.doWrite = doWrite
    setattr(transport, _GATHERING, True)
    return True


def _queue(t: Any, parts: Sequence[Any]) -> None:
    """``t.writeSequence(parts)``, accepting views: Twisted's own check wants ``bytes``."""
    if not t.connected or t._writeDisconnected or not parts:
        return
    t._tempDataBuffer.extend(parts)
    t._tempDataLen += sum(len(p) for p in parts)
    t._maybePauseProducer()
    t.startWriting()


def _gathered_write(t: Any) -> Any:
    """Twisted's ``FileDescriptor.doWrite`` with one ``sendmsg`` of the queued pieces in place
    of joining them; what the socket did not take stays queued as views. The end of the
    queue is handled as Twisted does: stop writing, then resume the producer, finish a
    ``loseConnection`` or half-close."""
    pieces: list[Any] = []
    if t.offset < len(t.dataBuffer):
        pieces.append(memoryview(t.dataBuffer)[t.offset:])
    pieces.extend(t._tempDataBuffer)
    if len(pieces) > _IOV_MAX:
        pieces = _coalesce(pieces)
    rest: list[Any] = []
    if pieces:
        sent = _send_direct(t.socket, pieces)
        if sent < 0:
            return main.CONNECTION_LOST
        rest = _after(pieces, sent)
    t.dataBuffer, t.offset = b"", 0
    t._tempDataBuffer = rest
    t._tempDataLen = sum(len(p) for p in rest)
    if rest:
        return None
    t.stopWriting()
    if t.producer is not None and ((not t.streamingProducer) or t.producerPaused):
        t.producerPaused = False
        t.producer.resumeProducing()
    elif t.disconnecting:
        return t._postLoseConnection()
    elif t._writeDisconnecting:
        t._writeDisconnected = True
        return t._closeWriteConnection()
    return None


def _coalesce(pieces: list[Any]) -> list[Any]:
    """Join each run of small pieces into one (large ones stay views): a reader that lags
    behind many small responses must not make every ``doWrite`` walk thousands of pieces."""
    out: list[Any] = []
    small: list[Any] = []
    for piece in pieces:
        if len(piece) >= DIRECT_MIN:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(piece)
        else:
            small.append(piece)
    if small:
        out.append(b"".join(small))
    return out


def plain_tcp(transport: Any) -> bool:
    """A Twisted TCP connection carrying the protocol's bytes as they are. A TLS listener's
    transport is a wrapper (``twisted.protocols.tls``) whose attribute lookups fall through
    to the TCP connection under it, ``socket`` and ``TLS == False`` included: asking those
    alone sent responses unencrypted onto TLS sockets."""
    return (isinstance(transport, tcp.Connection) and not ISSLTransport.providedBy(transport)
            and not transport.TLS and isinstance(transport.socket, socket.socket))


def _idle_tcp(transport: Any) -> bool:
    """A plain, connected Twisted TCP transport with nothing waiting to be sent."""
    try:
        return (plain_tcp(transport) and transport.connected and not transport.disconnecting
                and not transport._tempDataLen
                and len(transport.dataBuffer) == transport.offset)
    except AttributeError:
        return False


def _send_direct(sock: socket.socket, parts: Sequence[Any]) -> int:
    """Bytes the kernel took (0 when the socket is full); -1 when the connection failed (the
    transport notices and reports it on its next read or write)."""
    sent = 0
    for start in range(0, len(parts), _IOV_MAX):
        batch = parts[start:start + _IOV_MAX]
        want = sum(len(p) for p in batch)
        try:
            n = sock.sendmsg(batch)
        except (BlockingIOError, InterruptedError):
            return sent
        except OSError:
            return -1
        sent += n
        if n < want:
            break
    return sent


def _after(parts: Sequence[Any], sent: int) -> list[Any]:
    """The pieces that remain once the first ``sent`` bytes are gone."""
    rest: list[Any] = []
    for part in parts:
        n = len(part)
        if sent >= n:
            sent -= n
            continue
        rest.append(memoryview(part)[sent:] if sent else part)
        sent = 0
    return rest
