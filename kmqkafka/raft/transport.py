"""Peer-to-peer TCP (or TLS) transport: Raft messages, forwarded proposals, snapshot files.

Every node listens on its Raft address and keeps one outgoing connection to each peer, opened
on demand and re-opened with jittered exponential backoff (``backoff_min_s`` doubling to
``backoff_max_s``, jitter from the injected ``random.Random``). A node sends its Raft messages
and requests on its *outgoing* connection; replies come back on the same connection. While a
peer is unreachable its messages are dropped (Raft retransmits) and requests fail at once with
``TransportError``.

Liveness (``live_peers``): every node sends each peer a PING every ``ping_s`` on its outgoing
link, so a node hears from every live peer, followers from each other too. A peer counts as
live while a frame from it arrived recently, or while this node's outgoing link to it is up
and it was heard from within ``FROZEN_S``: a hung process (SIGSTOP, a stalled VM) keeps its
TCP connections open, and is dropped only that way. Kafka's Metadata lists only live nodes
(it fences a broker that misses its heartbeats), and clients keep asking a listed one.

Serving (``serving_peers``): a restarted node takes part in Raft while it catches up, before
its Kafka listeners open. Kafka keeps such a broker fenced, out of Metadata, until it has
caught up; here its PINGs carry ``STARTING`` as their term until the daemon sets ``serving``
(listeners open; cleared again when it stops), and a peer reached on a new link or heard again
after a silence (a restart) counts as starting until a PING says otherwise. Older nodes send 0
there: always serving.

Framing (big endian): ``u32 length, u8 kind, payload`` with ``length`` counting kind + payload::

    1 RAFT          kmqkafka.raft.messages.encode(message)
    2 FORWARD       u64 request id, encoded store command        (follower -> leader)
    3 FORWARD_OK    u64 request id, u64 index, u64 term           (the entry's position)
    4 FORWARD_ERR   u64 request id, u64 leader hint (its id + 1; 0 = none), UTF-8 reason
    5 SNAPSHOT_GET  u64 snapshot index
    6 SNAPSHOT_TAR  u64 size, then ``size`` raw bytes: an uncompressed tar of the tree
                    (``u32 length`` is 9 for this kind; the raw bytes follow the frame)
    7 SNAPSHOT_ERR  UTF-8 reason

A PING (liveness, no answer) is a FORWARD_OK for request id 0, which no request has, with the
sender's node id as its index and 0 (``STARTING`` while it does not serve clients) as its
term: older nodes, which close a link on a frame kind they do not know, ignore it, so a rolling
upgrade keeps its links. Frame kinds this version does not know are ignored too.

Snapshot files travel on a fresh connection per fetch (so a long transfer never delays Raft
traffic); the server streams the hard-linked snapshot tree as a tar straight from its files
(``raft/snapshot_tar.py``: size planned up front, read a MiB at a time on ``run_io``, paced by
the socket), with no temporary copy; the client unpacks it as it arrives, on a thread of its own
and paced the same way, into ``{raft}/snapshots/<index>`` via a ``.part`` directory and a rename.

TLS: when the server has a certificate (``KMQKAFKA_TLS_CERT``) the Raft port speaks TLS and
peers connect with TLS, presenting the same certificate; with ``KMQKAFKA_TLS_CA`` both sides
verify each other against it, without it the link is encrypted but unauthenticated.
Frames larger than ``max_frame`` close the connection.
"""
from __future__ import annotations

import random
import struct
import threading
from pathlib import Path
from typing import Any, Sequence

from twisted.internet import protocol
from twisted.internet.defer import Deferred, fail, maybeDeferred, succeed
from twisted.internet.task import LoopingCall
from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from kmqkafka.net.protocol import _tune_socket
from kmqkafka.net import recvinto
from kmqkafka.net.sendmsg import gather_writes, write_parts
from kmqkafka.raft.errors import MalformedCommand, NotLeaderError, TransportError
from kmqkafka.raft.snapshot_tar import TarPipe, TarPlan, plan as plan_tar, unpack
from kmqkafka.raft.storage import CorruptLog
from kmqkafka.raft.messages import (DecodeError, FrameBuffer, Message, Snapshot, decode,
                                    encode_parts)

__all__ = ["RaftTransport"]

log = Logger()

_HEAD = struct.Struct(">IB")
_U64 = struct.Struct(">Q")
_U64x3 = struct.Struct(">QQQ")
_U64x2 = struct.Struct(">QQ")
RAFT, FORWARD, FORWARD_OK, FORWARD_ERR, SNAPSHOT_GET, SNAPSHOT_TAR, SNAPSHOT_ERR = range(1, 8)
_UNBOUNDED = 1 << 32
# The payload sizes each known kind can have (least, most); any other closes the link, as a
# frame this version would misread (a stranger on the Raft port, say) must not be acted on.
_PAYLOAD_SIZE = {
    FORWARD: (_U64.size, _UNBOUNDED), FORWARD_OK: (_U64x3.size, _U64x3.size),
    FORWARD_ERR: (_U64x2.size, _UNBOUNDED), SNAPSHOT_GET: (_U64.size, _U64.size),
    SNAPSHOT_TAR: (_U64.size, _U64.size),
}
PING_ID = 0  # the request id of a FORWARD_OK that is a PING (requests count from 1)
STARTING = 1  # a PING's term while its sender does not serve Kafka clients yet (or any more)
FROZEN_S = 3.0  # a peer with a link up but silent this long (12 missed pings) is not live
FETCH_STALL_S = 30.0  # a snapshot download that moves no byte for this long fails


class _Link(protocol.Protocol):
    """One framed connection (either direction). Parsing only; the transport decides."""

    def __init__(self, owner: "RaftTransport", outgoing: bool, peer: int = 0) -> None:
        self.owner = owner
        self.outgoing = outgoing
        self.peer = peer
        self.heard_on = False        # incoming: a frame from its peer arrived (``_heard_from``)
        self._held: list[Any] = []   # the start of an incomplete frame, as received
        self._held_len = 0
        self._need = 0               # bytes held before parsing can go on
        self._fills = False          # large frames may be read into their own buffers
        self._fill: FrameBuffer | None = None  # the large frame being read, and how much
        self._filled = 0
        self._raw_left = 0           # bytes of a SNAPSHOT_TAR body still to come
        self._raw_sink: Any = None
        self.on_tar: Any = None      # fetch links: callbacks for the tar body
        self.on_lost: Any = None

    def connectionMade(self) -> None:
        # TCP_NODELAY: small frames (AppendResp, FORWARD_OK) must not wait for Nagle and the
        # peer's delayed ACK, every produce with acks=all waits on a round trip of them. Large
        # reads: a whole Append usually arrives in one chunk and is parsed without buffering.
        try:
            _tune_socket(self.transport)
        except Exception:  # not a TCP socket (tests, other transports)
            pass
        self._fills = recvinto.install(self.transport, self._fill_target, self._fill_done)
        gather_writes(self.transport)
        self.owner._link_made(self)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.owner._link_lost(self, reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    def send(self, kind: int, payload: bytes = b"") -> None:
        self.transport.write(_HEAD.pack(len(payload) + 1, kind) + payload)

    def send_parts(self, kind: int, parts: list[Any]) -> None:
        """One frame from pieces (bytes or views); large pieces such as entry data go to the
        socket uncopied when it takes them at once (``write_parts``)."""
        size = 1
        for part in parts:
            size += len(part)
        head = _HEAD.pack(size, kind)
        write_parts(self.transport, [head + bytes(parts[0]), *parts[1:]], size + 4)

    def dataReceived(self, data: bytes) -> None:
        if self._raw_left:
            data = self._raw(data)
            if not data:
                return
        if self._held:
            self._held.append(data)
            self._held_len += len(data)
            if self._held_len < self._need:
                return
            data = b"".join(self._held)
            self._held, self._held_len = [], 0
        self._parse(data)

    def _parse(self, data: bytes | FrameBuffer) -> None:
        """Parse frames out of immutable buffers only (a chunk as read, the held pieces joined
        once a frame is complete, or a large frame read into its own ``FrameBuffer``), so a
        decoder may keep views of large entry data instead of copying it (see
        ``messages.decode(share=True)``)."""
        end = len(data)
        pos = 0
        view = memoryview(data)
        max_frame = self.owner.max_frame
        frame = self.owner._frame
        try:
            while end - pos >= 5:
                length, kind = _HEAD.unpack_from(data, pos)
                if length < 1 or length > max_frame:
                    log.warn("raft link: bad frame length {n}; closing", n=length)
                    self.transport.loseConnection()
                    return
                nxt = pos + 4 + length
                if nxt > end:
                    break
                size = _PAYLOAD_SIZE.get(kind)
                if size is not None and not size[0] <= length - 1 <= size[1]:
                    log.warn("raft link: a frame of kind {kind} with {n} bytes; closing",
                             kind=kind, n=length - 1)
                    self.transport.loseConnection()
                    return
                if kind == SNAPSHOT_TAR:
                    self._raw_left = _U64.unpack(view[pos + 5:nxt])[0]
                    self._raw_sink = self.on_tar.begin(self._raw_left) if self.on_tar else None
                    if self._raw_left == 0:
                        self._finish_raw()
                    if nxt < end:
                        self.dataReceived(bytes(view[nxt:]))
                    return
                try:
                    frame(self, kind, view[pos + 5:nxt])
                except Exception:
                    log.failure("raft link: bad frame of kind {kind}; closing", kind=kind)
                    self.transport.loseConnection()
                    return
                pos = nxt
            if pos < end:
                rest = end - pos
                need = (4 + _HEAD.unpack_from(data, pos)[0]) if rest >= 5 else 5
                if self._fills and recvinto.worth_filling(need, rest):
                    # The rest of this frame is read straight into its own buffer.
                    self._fill = FrameBuffer(need)
                    self._fill[:rest] = view[pos:]
                    self._filled = rest
                else:
                    # Held as a view (no copy); the frame is complete once _need bytes are.
                    self._held, self._held_len, self._need = [view[pos:]], rest, need
        finally:
            view.release()

    def _fill_target(self) -> memoryview | None:
        return None if self._fill is None else memoryview(self._fill)[self._filled:]

    def _fill_done(self, n: int) -> None:
        self._filled += n
        if self._fill is not None and self._filled == len(self._fill):
            whole, self._fill = self._fill, None
            self._parse(whole)

    def _raw(self, data: bytes) -> bytes:
        take = min(self._raw_left, len(data))
        if self._raw_sink is not None:
            self._raw_sink.write(data[:take])
        self._raw_left -= take
        if self._raw_left == 0:
            self._finish_raw()
        return data[take:]

    def _finish_raw(self) -> None:
        sink, self._raw_sink = self._raw_sink, None
        if self.on_tar is not None:
            self.on_tar.end(sink)


class _LinkFactory(protocol.Factory):
    def __init__(self, owner: "RaftTransport") -> None:
        self.owner = owner

    def buildProtocol(self, addr: Any) -> _Link:
        return _Link(self.owner, outgoing=False)


class _Peer:
    """Outgoing connection state for one peer."""

    def __init__(self, node_id: int, host: str, port: int) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.link: _Link | None = None
        self.connecting = False
        self.retry: IDelayedCall | None = None
        self.backoff = 0.0


class RaftTransport:
    """Carries Raft traffic for one node. Reactor-thread only (tarring runs on ``run_io``)."""

    def __init__(self, node_id: int, listen: tuple[str, int], peers: dict[int, tuple[str, int]],
                 reactor: Any, rng: random.Random, run_io: Any, *, tls_server: Any = None,
                 tls_client: Any = None, backoff_min_s: float = 0.05, backoff_max_s: float = 2.0,
                 max_frame: int = 256 << 20, request_timeout_s: float = 5.0,
                 ping_s: float = 0.25, serving: bool = True) -> None:
        """``serving``: whether the PINGs say this node serves clients from the start (the
        daemon starts with False and sets ``serving`` once its listeners are open)."""
        self.node_id = node_id
        self.listen_addr = listen
        self._peers = {i: _Peer(i, h, p) for i, (h, p) in peers.items() if i != node_id}
        self._reactor = reactor
        self._rng = rng
        self._run_io = run_io
        self._tls_server = tls_server
        self._tls_client = tls_client
        self._backoff = (backoff_min_s, backoff_max_s)
        self.max_frame = max_frame
        self._request_timeout = request_timeout_s
        self._receiver: Any = None
        self._port: Any = None
        self._next_id = 1
        self._requests: dict[int, tuple[Deferred, int, IDelayedCall]] = {}
        self._incoming: set[_Link] = set()
        self._heard: dict[int, float] = {}  # peer -> reactor time of its latest frame
        self._stopping = False
        self._ping_s = ping_s
        self._pinger: LoopingCall | None = None
        self._serving = serving
        self._starting: set[int] = set()  # peers not serving clients (``serving_peers``)
        self._met: set[int] = set()  # peers heard from at least once by this process

    # ------------------------------------------------------------------ lifecycle

    def start(self, receiver: Any) -> None:
        """Listen on the Raft port; ``receiver`` is the ``RaftProposer``."""
        self._receiver = receiver
        host, port = self.listen_addr
        factory = _LinkFactory(self)
        if self._tls_server is not None:
            self._port = self._reactor.listenSSL(port, factory, self._tls_server, interface=host)
        else:
            self._port = self._reactor.listenTCP(port, factory, interface=host)
        for peer in self._peers.values():
            self._connect(peer)
        if self._peers:
            self._pinger = LoopingCall(self._ping)
            self._pinger.clock = self._reactor
            self._pinger.start(self._ping_s, now=False)

    @property
    def serving(self) -> bool:
        """Whether this node serves Kafka clients (its listeners are open), as its PINGs say."""
        return self._serving

    @serving.setter
    def serving(self, value: bool) -> None:
        changed = value != self._serving
        self._serving = value
        if changed and self._pinger is not None and self._pinger.running:
            self._ping()  # the peers list or drop this node now, not a PING later

    def _ping(self) -> None:
        ping = _U64x3.pack(PING_ID, self.node_id, 0 if self._serving else STARTING)
        for peer in self._peers.values():
            if peer.link is not None:
                try:
                    peer.link.send(FORWARD_OK, ping)
                except Exception:  # one link's trouble must not stop the pings to the others
                    log.failure("raft: ping to node {peer} failed", peer=peer.node_id)

    def stop(self) -> Deferred:
        self._stopping = True
        if self._pinger is not None and self._pinger.running:
            self._pinger.stop()
        for peer in self._peers.values():
            if peer.retry is not None and peer.retry.active():
                peer.retry.cancel()
            if peer.link is not None:
                peer.link.transport.loseConnection()
        for link in list(self._incoming):
            link.transport.loseConnection()
        for rid in list(self._requests):
            self._finish(rid, TransportError("transport stopped"))
        port, self._port = self._port, None
        return maybeDeferred(port.stopListening) if port is not None else succeed(None)

    def live_peers(self, within_s: float) -> set[int]:
        """Peers with a working link: a frame from it (Raft traffic or its PING) arrived in
        the last ``within_s`` seconds, or this node's outgoing link to it is up and it was
        heard from within ``FROZEN_S``. The first bridges a reconnect; the second drops a
        killed peer as soon as its link goes (``within_s`` 0: the link alone) and a hung one
        once it has been silent that long, its link up or not."""
        now = self._reactor.seconds()
        heard = self._heard
        live = {i for i, peer in self._peers.items()
                if peer.link is not None and now - heard.get(i, -FROZEN_S - 1) <= FROZEN_S}
        live.update(i for i, at in heard.items() if now - at <= within_s)
        return live

    def serving_peers(self, within_s: float) -> set[int]:
        """``live_peers`` that serve Kafka clients: not starting up (catching up before its
        listeners open) nor stopping, as far as their PINGs tell."""
        return self.live_peers(within_s) - self._starting

    def _heard_from(self, peer: int, now: float, link: _Link) -> None:
        """Note a frame from ``peer`` on ``link``. A peer heard before that speaks on a new
        incoming link (a restarted process connects afresh, often within ``FROZEN_S``) or
        after a longer silence counts as starting until its next PING."""
        last = self._heard.get(peer)  # None too once the link to it was lost
        if peer in self._met and (last is None or now - last > FROZEN_S
                                  or not (link.outgoing or link.heard_on)):
            self._starting.add(peer)
        self._met.add(peer)
        link.heard_on = True
        self._heard[peer] = now

    # ------------------------------------------------------------------ outgoing

    def _connect(self, peer: _Peer) -> None:
        if self._stopping or peer.connecting or peer.link is not None:
            return
        peer.connecting = True
        factory = protocol.ClientFactory()
        factory.noisy = False  # a reconnect every few ticks while a peer is down
        factory.protocol = lambda: _Link(self, outgoing=True, peer=peer.node_id)  # type: ignore
        factory.clientConnectionFailed = lambda c, reason: self._connect_failed(peer)  # type: ignore
        if self._tls_client is not None:
            self._reactor.connectSSL(peer.host, peer.port, factory, self._tls_client, timeout=5)
        else:
            self._reactor.connectTCP(peer.host, peer.port, factory, timeout=5)

    def _connect_failed(self, peer: _Peer) -> None:
        peer.connecting = False
        self._schedule_reconnect(peer)

    def _schedule_reconnect(self, peer: _Peer) -> None:
        if self._stopping or (peer.retry is not None and peer.retry.active()):
            return
        lo, hi = self._backoff
        peer.backoff = min(hi, max(lo, peer.backoff * 2))
        delay = peer.backoff * (0.5 + self._rng.random() / 2)
        peer.retry = self._reactor.callLater(delay, self._connect, peer)

    def _link_made(self, link: _Link) -> None:
        if not link.outgoing:
            self._incoming.add(link)
            return
        if link.on_tar is not None:
            link.on_tar.start()  # a snapshot fetch: ask for the tree
            return
        peer = self._peers.get(link.peer)
        if peer is None:
            return
        peer.connecting = False
        peer.link = link
        peer.backoff = 0.0
        if peer.node_id in self._met:  # a new process, or a link back after a blip:
            self._starting.add(peer.node_id)  # serving again once its PING says so
        self._met.add(peer.node_id)
        self._heard[peer.node_id] = self._reactor.seconds()  # it answered: alive just now
        log.info("raft link to node {peer} up", peer=peer.node_id)

    def _link_lost(self, link: _Link, reason: Failure) -> None:
        self._incoming.discard(link)
        if not link.outgoing or link.on_tar is not None:
            return
        peer = self._peers.get(link.peer)
        if peer is None or peer.link is not link:
            return
        peer.link = None
        self._heard.pop(peer.node_id, None)  # live again at its next frame, not until then
        for rid, (_d, to, _t) in list(self._requests.items()):
            if to == peer.node_id:
                self._finish(rid, TransportError(f"connection to node {to} lost"))
        if not self._stopping:
            log.info("raft link to node {peer} down", peer=peer.node_id)
            self._schedule_reconnect(peer)

    def send(self, messages: Sequence[Message]) -> None:
        """Send Raft messages, best effort (dropped while the peer is unreachable)."""
        for m in messages:
            peer = self._peers.get(m.to)
            if peer is None:
                continue
            if peer.link is None:
                self._connect(peer)
                continue
            try:
                parts = encode_parts(m)
            except CorruptLog:
                # An entry read back from the Raft log file failed its check: drop this
                # message as the network might (Raft sends again; compaction ends it).
                log.failure("raft: cannot send {kind} to node {peer}", kind=type(m).__name__,
                            peer=m.to)
                continue
            peer.link.send_parts(RAFT, parts)

    def forward(self, to: int, data: bytes) -> Deferred:
        """Ask node ``to`` (the leader) to propose ``data``; fires with ``(index, term)``."""
        peer = self._peers.get(to)
        if peer is None or peer.link is None:
            if peer is not None:
                self._connect(peer)
            return fail(TransportError(f"no connection to node {to}"))
        rid = self._next_id
        self._next_id += 1
        d: Deferred = Deferred()
        timer = self._reactor.callLater(self._request_timeout, self._finish, rid,
                                        TransportError(f"node {to} did not answer"))
        self._requests[rid] = (d, to, timer)
        peer.link.send_parts(FORWARD, [_U64.pack(rid), bytes(data)])
        return d

    def _finish(self, rid: int, outcome: Any) -> None:
        entry = self._requests.pop(rid, None)
        if entry is None:
            return
        d, _to, timer = entry
        if timer.active():
            timer.cancel()
        if isinstance(outcome, Exception):
            d.errback(outcome)
        else:
            d.callback(outcome)

    # ------------------------------------------------------------------ incoming frames

    def _frame(self, link: _Link, kind: int, payload: bytes | memoryview) -> None:
        """One frame; ``payload`` is a view of immutable ``bytes`` (a Raft message may keep
        views of its large entries); anything else kept must be copied."""
        if kind == RAFT:
            try:
                message = decode(payload, share=True)
            except DecodeError as e:
                log.warn("raft link: undecodable message: {e}", e=e)
                return
            if message.frm in self._peers:
                self._heard_from(message.frm, self._reactor.seconds(), link)
            if self._receiver is not None:
                self._receiver.receive(message)
        elif kind == FORWARD:
            rid = _U64.unpack_from(payload)[0]
            self._serve_forward(link, rid, payload[8:])
        elif kind == FORWARD_OK:
            rid, index, term = _U64x3.unpack(payload)
            if rid == PING_ID:
                if index in self._peers:
                    self._heard_from(index, self._reactor.seconds(), link)
                    if term == STARTING:
                        self._starting.add(index)
                    else:
                        self._starting.discard(index)
            else:
                self._finish(rid, (index, term))
        elif kind == FORWARD_ERR:
            rid, hint = _U64x2.unpack_from(payload)  # the leader's id + 1; 0: none known
            self._finish(rid, NotLeaderError(bytes(payload[16:]).decode("utf-8", "replace"),
                                             hint - 1 if hint else None))
        elif kind == SNAPSHOT_GET:
            self._serve_snapshot(link, _U64.unpack(payload)[0])
        elif kind == SNAPSHOT_ERR:
            if link.on_tar is not None:
                link.on_tar.error(bytes(payload).decode("utf-8", "replace"))
        # Any other kind is from a newer version: ignored, so mixed versions keep their links.

    def _serve_forward(self, link: _Link, rid: int, data: bytes) -> None:
        try:
            index, term = self._receiver.handle_forward(data)
        except MalformedCommand as e:
            log.warn("raft link: refused a forwarded command: {e}", e=e)
            link.send(FORWARD_ERR, _U64x2.pack(rid, 0) + str(e).encode())
            return
        except NotLeaderError as e:
            hint = 0 if e.leader is None else e.leader + 1  # node 0 is a node, not "none"
            link.send(FORWARD_ERR, _U64x2.pack(rid, hint) + str(e).encode())
            return
        link.send(FORWARD_OK, _U64x3.pack(rid, index, term))

    # ------------------------------------------------------------------ snapshots

    def _serve_snapshot(self, link: _Link, index: int) -> None:
        path = self._receiver.hold_snapshot(index) if self._receiver else None
        if path is None:
            link.send(SNAPSHOT_ERR, f"no snapshot {index} here".encode())
            return

        def send(tar: TarPlan) -> Deferred:
            return _TarSender(tar, link.transport, self._run_io).start()

        def release(result: object) -> object:
            self._receiver.release_snapshot(index)
            return result

        d = self._run_io(plan_tar, path).addCallback(send).addBoth(release)
        d.addErrback(self._serve_failed, index)

    @staticmethod
    def _serve_failed(failure: Failure, index: int) -> None:
        """A peer that went away mid-transfer is ordinary (it asks again); anything else is
        logged with its traceback."""
        if failure.check(ConnectionDone, ConnectionLost, ConnectionAborted):
            log.info("serving snapshot {index} stopped: the peer went away ({why})",
                     index=index, why=failure.getErrorMessage())
        else:
            log.failure("serving snapshot {index}", failure, index=index)

    def fetch_snapshot(self, frm: int, snapshot: Snapshot) -> Deferred:
        """Copy node ``frm``'s snapshot tree (named by ``snapshot.data``) into the local
        snapshot directory; fires once it is complete there."""
        peer = self._peers.get(frm)
        if peer is None:
            return fail(TransportError(f"unknown node {frm}"))
        index = int(snapshot.data.split(b":")[1])
        dest_dir: Path = self._receiver.snapshot_dir
        result: Deferred = Deferred(lambda _d: fetch.error("the download was cancelled"))
        fetch = _Fetch(self, index, dest_dir, result)
        factory = protocol.ClientFactory()
        factory.noisy = False

        def build() -> _Link:
            link = _Link(self, outgoing=True, peer=frm)
            link.on_tar = fetch
            link.on_lost = fetch.lost
            fetch.link = link
            return link

        factory.protocol = build  # type: ignore[assignment]
        factory.clientConnectionFailed = lambda c, reason: fetch.error(  # type: ignore
            f"cannot connect to node {frm}")
        if self._tls_client is not None:
            self._reactor.connectSSL(peer.host, peer.port, factory, self._tls_client, timeout=5)
        else:
            self._reactor.connectTCP(peer.host, peer.port, factory, timeout=5)
        fetch.start = lambda: fetch.link.send(SNAPSHOT_GET, _U64.pack(index))
        return result


@implementer(IPushProducer)
class _TarSender:
    """Server side of one snapshot download: the ``SNAPSHOT_TAR`` frame, then the tar's bytes
    as ``TarPlan.chunks`` reads them on ``run_io``, one read at a time and at most one chunk
    read ahead of what the socket took (a push producer the transport pauses and resumes).
    ``start`` fires once every byte is handed to the transport, or fails with the read's error
    (the connection is then aborted: the follower sees a short tar and asks again) or with
    ``ConnectionLost`` if the follower went away."""

    def __init__(self, tar: TarPlan, transport: Any, run_io: Any) -> None:
        self._tar = tar
        self._chunks = tar.chunks()  # advanced only on run_io, never by two reads at once
        self._transport = transport
        self._run_io = run_io
        self._done: Deferred = Deferred()
        self._paused = False
        self._reading = False
        self._ahead: bytes | None = None
        self._sent = 0
        self._over = False

    def start(self) -> Deferred:
        self._transport.write(_HEAD.pack(9, SNAPSHOT_TAR) + _U64.pack(self._tar.size))
        self._transport.registerProducer(self, True)
        self._read()
        return self._done

    def _read(self) -> None:
        if self._reading or self._over or self._ahead is not None:
            return
        self._reading = True
        d = self._run_io(next, self._chunks, b"")
        d.addCallbacks(self._read_done, self._read_failed)

    def _read_done(self, chunk: bytes) -> None:
        self._reading = False
        if self._over:
            self._close()
        elif not chunk:
            self._finish()
        elif self._paused:
            self._ahead = chunk
        else:
            self._send(chunk)
            self._read()

    def _send(self, chunk: bytes) -> None:
        self._sent += len(chunk)
        self._transport.write(chunk)

    def _finish(self) -> None:
        self._over = True
        self._transport.unregisterProducer()
        if self._sent != self._tar.size:  # never sent: the follower would unpack a bad tar
            self._transport.abortConnection()
            self._done.errback(TransportError(
                f"snapshot tar is {self._sent} bytes, {self._tar.size} were announced"))
        else:
            self._done.callback(None)

    def _read_failed(self, failure: Failure) -> None:
        self._reading = False
        if self._over:
            return
        self._over = True
        self._transport.unregisterProducer()
        self._transport.abortConnection()
        self._done.errback(failure)

    def _close(self) -> None:
        self._run_io(self._chunks.close).addErrback(lambda _: None)

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._ahead is not None and not self._over:
            chunk, self._ahead = self._ahead, None
            self._send(chunk)
        self._read()

    def stopProducing(self) -> None:
        """The connection went: stop reading and close the files."""
        if self._over:
            return
        self._over = True
        if not self._reading:
            self._close()
        self._done.errback(Failure(ConnectionLost("the follower went away")))


class _Fetch:
    """Client side of one snapshot download: the tar is unpacked as it arrives, on a thread of
    its own (``snapshot_tar.unpack``), into ``{dest_dir}/<index>``."""

    def __init__(self, owner: RaftTransport, index: int, dest_dir: Path, result: Deferred) -> None:
        self.owner = owner
        self.index = index
        self.dest_dir = dest_dir
        self.result = result
        self.link: _Link | None = None
        self.start: Any = None
        self.pipe: TarPipe | None = None
        self._progress = 0
        self._watch = owner._reactor.callLater(FETCH_STALL_S, self._check_progress)

    def _check_progress(self) -> None:
        """Every ``FETCH_STALL_S``: a download that moved no byte since the last look (a
        frozen leader, a link that hangs without closing) fails, so the follower can take the
        next leader's snapshot instead of waiting for it forever."""
        self._watch = None
        progress = self.pipe.progress if self.pipe is not None else 0
        if progress == self._progress:
            self.error(f"no snapshot data for {FETCH_STALL_S:.0f} s")
            return
        self._progress = progress
        self._watch = self.owner._reactor.callLater(FETCH_STALL_S, self._check_progress)

    def begin(self, size: int) -> TarPipe:
        reactor = self.owner._reactor
        transport = self.link.transport if self.link is not None else None
        pipe = TarPipe(pause=transport.pauseProducing, resume=transport.resumeProducing,
                       call_in_reactor=reactor.callFromThread)
        self.pipe = pipe
        final = self.dest_dir / f"{self.index:020d}"

        def run() -> None:
            try:
                unpack(pipe, final)
            except BaseException as e:  # noqa: BLE001 - reported to the reactor thread
                reactor.callFromThread(self._unpacked, Failure(e))
            else:
                reactor.callFromThread(self._unpacked, None)

        threading.Thread(target=run, name=f"snapshot-{self.index}-unpack", daemon=True).start()
        return pipe

    def end(self, sink: Any) -> None:
        if sink is not None:
            sink.close()
        self._close_link()

    def _unpacked(self, outcome: Failure | None) -> None:
        if outcome is not None:
            self._close_link()
        self._done(outcome)

    def _close_link(self) -> None:
        if self.link is not None:
            self.link.on_lost = None
            self.link.transport.loseConnection()

    def error(self, reason: str) -> None:
        self._close_link()
        if self.pipe is not None:
            self.pipe.abort()
        self._done(Failure(TransportError(reason)))

    def lost(self, reason: Failure) -> None:
        if self.pipe is not None:
            self.pipe.abort()  # the unpacking thread stops and removes the partial tree
        self._done(Failure(TransportError(f"snapshot link lost: {reason.getErrorMessage()}")))

    def _done(self, outcome: Any) -> None:
        if self._watch is not None and self._watch.active():
            self._watch.cancel()
        self._watch = None
        if self.result.called:
            return
        if isinstance(outcome, Failure):
            self.result.errback(outcome)
        else:
            self.result.callback(outcome)
