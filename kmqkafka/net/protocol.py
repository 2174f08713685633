"""The Kafka connection: framing, header decoding, version checks and ordered responses.

A connection reads 4-byte big-endian size-prefixed frames into one linear ``bytearray`` with a read
offset. For each frame it reads (api_key, api_version, correlation_id), refuses unknown API keys
(close), answers unadvertised versions without running a handler (see ``Dispatcher``), decodes the
request header (v1 or v2, as kio's request class says) and the body with kio (a large Produce read
into a buffer of its own with ``fast_requests``, its batches left in that buffer), and hands the
request to the dispatcher. A request's handler starts only once every earlier request on the connection
has been answered, as Kafka mutes a channel from a request's arrival until its response is sent
(so a ListOffsets sent right behind a DeleteRecords sees the new log start). Two exceptions: a
Produce behind Produces only (their appends are proposed in request order anyway), and requests
another node relays (``net/forward``), whose pooled connection carries many clients' calls, each
client's own order already kept by the connection it came in on. Responses are written strictly
in request order. Protocol violations (oversized or negative frame size, unknown API key,
undecodable or over-long body) are logged once and close only that connection.

Back-pressure: the connection stops reading (``pauseProducing``) while any of these holds, and
reads again once none does:

- more than ``MAX_IN_FLIGHT`` requests, or requests of more than ``MAX_IN_FLIGHT_BYTES``
  in all, await their response (until both fall to their half). A Produce waits for a group
  commit, and librdkafka sends one Produce per partition: with 64 partitions a cap of 64
  requests (resumed at 16) left the disk idle half the time, so the count is generous and
  the bytes bound the memory;
- ``MAX_FETCHES_IN_FLIGHT`` Fetches await theirs: each may hold up to its ``max_bytes`` of
  stored batches, and no client sends a second Fetch to one broker before the first returns;
- the transport holds more than its ``bufferSize`` of unsent responses: a client that sends
  requests and never reads the answers must not make the broker buffer them without end
  (Kafka mutes a channel until its response is sent);
- the service is draining for shutdown.

Everything here runs on the reactor thread.
"""
from __future__ import annotations

import struct
from collections import deque
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.dispatch import CLOSE_CONNECTION, NO_RESPONSE, Dispatcher, api_name
from kmqkafka.kafka.context import ANONYMOUS, Broker, RequestContext
from kmqkafka.metrics import Metrics
from kmqkafka.net import guard
from kmqkafka.net.chunks import ChunkWriter
from kmqkafka.net.forward import FORWARD_PREFIX
from kmqkafka.net.sasl import SaslUsers
from kmqkafka.net import fast_bodies, fast_requests, recvinto, shared
from kmqkafka.net.sendmsg import gather_writes, write_parts
from kmqkafka.net.tls import certificate_principal

MAX_IN_FLIGHT = 1024
MAX_IN_FLIGHT_BYTES = 32 << 20
FAILED_AUTHENTICATION_DELAY_S = 0.1  # Kafka's connection.failed.authentication.delay.ms
SASL_MAX_FRAME_BYTES = 512 << 10  # Kafka's sasl.server.max.receive.size, before authentication
MAX_FETCHES_IN_FLIGHT = 2
_PRODUCE = 0
_FETCH = 1
IDLE_ABORT_S = 5.0  # an idle connection still open this long after its close is cut off
_COMPACT_AT = 256 * 1024
_PREFIX = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")
_HEADER_TAGS = {0: b"", 1: b"\x00"}


def _peer_text(address: IAddress | None) -> str:
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    return f"{host}:{port}" if host is not None else str(address)


READ_SIZE = 1 << 20
# Twisted sends at most SEND_LIMIT (128 KiB) per writable event: a 10 MiB Fetch response took
# 80 reactor turns. Larger sends cut that to ~10 (the kernel still takes what fits).
SEND_SIZE = 1 << 20


def _encode_body(response: Any) -> bytes:
    """A response's body alone (no header): what ``net/shared.py`` keeps of a shared one."""
    body = ChunkWriter()
    entity_writer(type(response))(body, response)
    return body.getvalue()


def _tune_socket(transport: Any) -> None:
    """TCP_NODELAY, large reads and large sends on the TCP transport (under TLS, the wrapped
    one)."""
    tcp = getattr(transport, "transport", None) or transport
    for t in {id(transport): transport, id(tcp): tcp}.values():
        nodelay = getattr(t, "setTcpNoDelay", None)
        if nodelay is not None:
            nodelay(True)
        if hasattr(t, "bufferSize"):
            t.bufferSize = READ_SIZE
        if hasattr(t, "SEND_LIMIT"):
            t.SEND_LIMIT = max(t.SEND_LIMIT, SEND_SIZE)

class _Slot:
    """One request's place in the connection's response order."""

    __slots__ = ("ctx", "deferred", "done", "result", "started", "size")

    def __init__(self, ctx: RequestContext | None, started: float, size: int = 0) -> None:
        self.ctx = ctx
        self.started = started
        self.size = size  # the request's frame bytes, counted in ``_pending_bytes``
        self.deferred: Deferred[Any] | None = None
        self.done = False
        self.result: Any = None


class KafkaProtocol(Protocol):
    """One client connection. Created by ``KafkaFactory``; never used by handlers."""

    log = Logger()

    def __init__(self, factory: KafkaFactory) -> None:
        self.factory = factory
        self._buf = bytearray()
        self._pos = 0
        self._pending: deque[_Slot] = deque()
        self._pending_bytes = 0  # frame bytes of the requests in ``_pending``
        self._holds: set[str] = set()  # why reading is paused (back-pressure); empty: reading
        self._fetches = 0  # Fetches awaiting their response
        self._waiting: deque[tuple[_Slot, Any]] = deque()  # read, handler not started yet
        self._running = 0  # handlers started, not finished
        self._running_produces = 0  # of which Produce
        self._starting = False
        self._closing = False
        self._counted = False
        self._in_process = False
        self._drain_waiters: list[Deferred[None]] = []
        self.peer = ""
        self.last_active = factory.reactor.seconds()
        self.idle_closed = False  # ``KafkaFactory.close_idle`` closed it already
        self._fills = False  # a large request may be read into a buffer of its own
        users = factory.sasl_users
        self.sasl = users.session() if users is not None else None  # None: no SASL
        self._tls_principal: str | None = None  # set at the first request (``_principal``)
        self._fill: bytearray | None = None
        self._filled = 0

    # -- Twisted hooks -------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.peer = _peer_text(self.transport.getPeer())
        if not self.factory.limiter.acquire():
            self.factory.metrics.kafka_connections_refused.inc()
            self.log.warn("refusing Kafka connection from {peer}: {limit} connections open",
                          peer=self.peer, limit=self.factory.limiter.limit)
            self._closing = True
            self.transport.abortConnection()
            return
        self._counted = True
        # Kafka answers small requests (acks, heartbeats) at once: no Nagle delay. Big
        # produce requests are read in large slices, not 64 KiB at a time.
        _tune_socket(self.transport)
        self.transport.registerProducer(_WriteBacklog(self), True)
        self._fills = recvinto.install(self.transport, self._fill_target, self._fill_done)
        gather_writes(self.transport)
        self.factory.connection_opened(self)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._closing = True
        if self._counted:
            self._counted = False
            self.factory.limiter.release()
            self.factory.connection_closed(self)
        pending, self._pending = self._pending, deque()
        # Requests not started yet go, as the unread bytes of a muted Kafka channel would.
        self._waiting.clear()
        wait_only = self.factory.dispatcher.wait_only
        for slot in pending:
            # Only waits are cancelled: a request that changes state (Produce, a commit, an
            # admin call) runs to the end, as in Kafka; its response goes nowhere.
            if slot.deferred is not None and not slot.done and slot.ctx is not None \
                    and wait_only(slot.ctx.api_key):
                slot.deferred.cancel()
        self._buf = bytearray()
        self._pos = 0
        if self._fill is not None:
            self.factory.fill_budget.give(len(self._fill))
            self._fill = None
        self._fire_drained()

    @property
    def busy(self) -> bool:
        """A request is in flight (a parked Fetch is not idleness)."""
        return bool(self._pending)

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        self.last_active = self.factory.reactor.seconds()
        self._buf += data
        self._process()

    # -- framing -------------------------------------------------------------------------------

    def _process(self) -> None:
        # Re-entry (a handler finishing synchronously and resuming us) would resize the buffer
        # under a live memoryview; the outer loop picks up the remaining frames instead.
        if self._in_process:
            return
        self._in_process = True
        try:
            self._process_frames()
        finally:
            self._in_process = False

    def _process_frames(self) -> None:
        buf = self._buf
        cap = self.factory.max_frame_bytes
        if self.sasl is not None and not self.sasl.authenticated:
            cap = SASL_MAX_FRAME_BYTES  # nothing large is read from a client not yet known
        while not self._holds and not self._closing:
            available = len(buf) - self._pos
            if available < 4:
                break
            (size,) = _PREFIX.unpack_from(buf, self._pos)
            if size < 0 or size > cap:
                self._violation("frame_size", "frame size {size} outside 0..{cap}", size=size,
                                cap=cap)
                return
            if available - 4 < size:
                if self._fills and recvinto.worth_filling(size, available - 4):
                    self._start_fill(size)
                break
            start = self._pos + 4
            self._pos = start + size
            with memoryview(buf) as whole, whole[start:start + size].toreadonly() as frame:
                self._frame(frame)
        if self._closing:
            return
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        elif self._pos >= _COMPACT_AT:
            del buf[: self._pos]
            self._pos = 0

    def _start_fill(self, size: int) -> None:
        """Read the rest of this large request (a produce of up to a MiB or more) straight
        into a buffer of its own (``recvinto``) rather than appending 1 MiB reads to the
        connection buffer: one copy of every produced byte less. Not while the fill buffers
        of all connections already hold ``recvinto.FILL_BUDGET``."""
        if not self.factory.fill_budget.take(size):
            return
        start = self._pos + 4
        have = len(self._buf) - start
        self._fill = bytearray(size)
        self._fill[:have] = memoryview(self._buf)[start:]
        self._filled = have
        self._buf.clear()
        self._pos = 0

    def _fill_target(self) -> memoryview | None:
        return None if self._fill is None else memoryview(self._fill)[self._filled:]

    def _fill_done(self, n: int) -> None:
        self._filled += n
        self.last_active = self.factory.reactor.seconds()
        if self._fill is None or self._filled < len(self._fill):
            return
        whole, self._fill = self._fill, None
        self.factory.fill_budget.give(len(whole))
        self._in_process = True
        try:
            with memoryview(whole) as view, view.toreadonly() as frame:
                self._frame(frame, owned=True)
        finally:
            self._in_process = False
        self._process()

    def _violation(self, reason: str, message: str, **fields: Any) -> None:
        """Log once, count, and close this connection (discarding anything unread)."""
        self.factory.metrics.kafka_protocol_errors.labels(reason).inc()
        self.log.warn("closing Kafka connection from {peer}: " + message, peer=self.peer,
                      **fields)
        self._closing = True
        self._buf = bytearray()
        self._pos = 0
        self.transport.abortConnection()

    def _frame(self, frame: memoryview, owned: bool = False) -> None:
        """Decode and start one request. ``owned``: ``frame`` is a buffer of its own, never
        written again, so a Produce's batches may stay in it (``fast_requests``)."""
        if self.sasl is not None and self.sasl.raw_tokens:
            self._raw_sasl_token(frame)
            return
        if len(frame) < _HEAD.size:
            self._violation("truncated_header", "frame of {n} bytes has no request header",
                            n=len(frame))
            return
        api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
        dispatcher = self.factory.dispatcher
        if dispatcher.lookup(api_key) is None:
            self._violation("unknown_api_key", "unknown API key {api_key}", api_key=api_key)
            return
        if self.sasl is not None and not self.sasl.allows(api_key):
            # Kafka's SaslServerAuthenticator: anything but ApiVersions and the SASL requests
            # before authentication is an invalid request, and the connection closes; so does
            # a request after the session expired without re-authentication (KIP-368).
            if self.sasl.authenticated:
                self._violation("sasl_session_expired", "{api} request after the SASL session "
                                "expired", api=api_name(api_key))
            else:
                self._violation("unauthenticated", "{api} request before SASL authentication",
                                api=api_name(api_key))
            return
        if not dispatcher.supports(api_key, api_version):
            answer = dispatcher.unsupported_version_response(api_key, api_version)
            if answer is None:
                self._violation("unsupported_version", "{api} v{version} is not supported",
                                api=api_name(api_key), version=api_version)
                return
            response, header_version = answer
            slot = _Slot(None, self.factory.reactor.seconds())
            slot.done = True
            slot.result = (correlation_id, response, header_version)
            self._pending.append(slot)
            self._flush()
            return
        request_type = dispatcher.request_type(api_key, api_version)
        response_type = dispatcher.response_type(api_key, api_version)
        try:
            # Lengths first: kio would reserve whatever an array count claims (see guard.py).
            guard.check(request_type.__header_schema__, frame, 0)
            frame = guard.without_unknown_tags(frame)
            header, used = entity_reader(request_type.__header_schema__)(frame, 0)
            guard.check(request_type, frame, used)
            frame = guard.without_unknown_tags(frame)
            if owned and api_key == _PRODUCE:
                request = fast_requests.read_produce(request_type, api_version, frame, used)
            else:
                request, _end = entity_reader(request_type)(frame, used)
            # Trailing bytes are ignored, as Apache Kafka does: librdkafka, for one, sends
            # Metadata v12 bodies with fields the schema no longer has.
        except (SerialError, ValueError, TypeError, OverflowError, KeyError) as e:
            self._violation("malformed_request", "malformed {api} v{version} request: {error}",
                            api=api_name(api_key), version=api_version, error=str(e))
            return
        ctx = RequestContext(
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
            client_id=header.client_id,
            response_type=response_type,
            broker=self.factory.broker,
            principal=self._principal(),
            peer=self.peer,
            listener=self.factory.listener,
            sasl=self.sasl,
        )
        slot = _Slot(ctx, self.factory.reactor.seconds(), len(frame))
        self._pending.append(slot)
        self._pending_bytes += slot.size
        if api_key == _FETCH:
            self._fetches += 1
            if self._fetches >= MAX_FETCHES_IN_FLIGHT:
                self.hold_reading("fetches", True)
        if len(self._pending) > MAX_IN_FLIGHT or self._pending_bytes > MAX_IN_FLIGHT_BYTES:
            self.hold_reading("in_flight", True)
        self._waiting.append((slot, request))
        self._start_waiting()

    def _principal(self) -> str:
        """The SASL session's principal; else a TLS client certificate's; else ANONYMOUS."""
        if self.sasl is not None:
            return self.sasl.principal
        if self._tls_principal is None:
            found = None
            if self.factory.listener == "SSL":
                try:
                    found = certificate_principal(self.transport)
                except Exception:  # no handshake yet, or a certificate we cannot name
                    found = None
            self._tls_principal = found or ANONYMOUS
        return self._tls_principal

    def _raw_sasl_token(self, frame: memoryview) -> None:
        """After a v0 SaslHandshake a frame is a bare SASL token, answered by a bare one
        (Kafka before SaslAuthenticate); refused credentials close the connection."""
        assert self.sasl is not None
        if self._pending:
            self._violation("sasl_state", "SASL token while requests are still answered")
            return
        counter = self.factory.metrics.kafka_sasl_authentications
        try:
            reply = self.sasl.authenticate(bytes(frame))
        except Exception as e:  # AuthenticationFailed, IllegalSaslState
            counter.labels(self.sasl.mechanism or "", "failure").inc()
            self._violation("sasl_failed", "SASL authentication failed: {why}", why=str(e))
            return
        if self.sasl.authenticated:
            counter.labels(self.sasl.mechanism or "", "success").inc()
        self._write([_PREFIX.pack(len(reply)), reply])

    def _start_waiting(self) -> None:
        """Start the handlers of waiting requests, in order, while nothing earlier is running
        (or only Produces run and the next one is a Produce too, or the next one is relayed)."""
        if self._starting:
            return  # a handler that finished at once: the loop below goes on
        self._starting = True
        try:
            while self._waiting and not self._closing:
                slot, request = self._waiting[0]
                assert slot.ctx is not None
                produce = slot.ctx.api_key == _PRODUCE
                relayed = (slot.ctx.client_id or "").startswith(FORWARD_PREFIX)
                if self._running and not relayed \
                        and not (produce and self._running == self._running_produces):
                    return
                self._waiting.popleft()
                self._running += 1
                self._running_produces += int(produce)
                d = self.factory.dispatcher.dispatch(request, slot.ctx)
                slot.deferred = d
                d.addBoth(self._handled, slot)
        finally:
            self._starting = False

    # -- responses -----------------------------------------------------------------------------

    def _handled(self, result: Any, slot: _Slot) -> None:
        if isinstance(result, Failure):  # only CancelledError reaches here
            result = CLOSE_CONNECTION
        slot.done = True
        assert slot.ctx is not None
        self._running -= 1
        self._running_produces -= int(slot.ctx.api_key == _PRODUCE)
        if slot.ctx.api_key == _FETCH:
            self._fetches -= 1
        if result is CLOSE_CONNECTION or result is NO_RESPONSE:
            slot.result = result
        else:
            slot.result = (
                slot.ctx.correlation_id,
                result,
                slot.ctx.response_type.__header_schema__.__version__,
            )
        count, latency = self.factory.metrics.request_series(api_name(slot.ctx.api_key),
                                                             str(slot.ctx.api_version))
        count.inc()
        latency.observe(max(0.0, self.factory.reactor.seconds() - slot.started))
        if not self._closing:
            self._start_waiting()
            self._flush()
        if self._fetches < MAX_FETCHES_IN_FLIGHT:
            self.hold_reading("fetches", False)

    def _flush(self) -> None:
        """Write every finished response at the head of the queue, in request order."""
        out: list[Any] = []
        while self._pending and self._pending[0].done:
            slot = self._pending.popleft()
            self._pending_bytes -= slot.size
            if slot.result is NO_RESPONSE:
                continue
            if slot.result is CLOSE_CONNECTION:
                if out:
                    self._write(out)
                self._violation("handler_failed", "the handler could not answer (or an acks=0 "
                                "produce failed); closing")
                return
            correlation_id, response, header_version = slot.result
            try:
                out.extend(self._encode(correlation_id, response, header_version))
            except Exception:
                self.log.failure("cannot encode {response_type} for {peer}",
                                 response_type=type(response).__name__, peer=self.peer)
                if out:
                    self._write(out)
                self._violation("encode_failed", "response could not be encoded")
                return
        if out:
            self._write(out)
        if self.sasl is not None and self.sasl.failed:
            # Refused credentials: the answer says why, then the connection closes, a little
            # later (Kafka's connection.failed.authentication.delay.ms): a client that sees
            # the close before it has read the answer reports a lost socket instead.
            self._closing = True
            self.factory.reactor.callLater(FAILED_AUTHENTICATION_DELAY_S,
                                           self.transport.loseConnection)
            return
        if (len(self._pending) <= MAX_IN_FLIGHT // 2
                and self._pending_bytes <= MAX_IN_FLIGHT_BYTES // 2):
            self.hold_reading("in_flight", False)
        if not self._pending:
            self._fire_drained()

    def _write(self, parts: list[Any]) -> None:
        """Hand encoded pieces to the transport: a large response (stored batches as views
        over pread buffers) goes to the socket uncopied when it takes it at once, anything
        else is joined into one ``bytes`` (Twisted would join its queue anyway)."""
        self.last_active = self.factory.reactor.seconds()
        write_parts(self.transport, parts, sum(len(p) for p in parts))

    @staticmethod
    def _encode(correlation_id: int, response: Any, header_version: int) -> list[Any]:
        """The framed response as pieces (bytes, bytearray, memoryview); large values
        (stored batches) stay uncopied until ``_write``."""
        # Response header v0 is the correlation id; v1 adds an empty tagged-field section.
        head = _PREFIX.pack(correlation_id) + _HEADER_TAGS[header_version]
        encoded = fast_bodies.body(response)
        if type(encoded) is list:
            size = len(head) + sum(len(p) for p in encoded)
            return [_PREFIX.pack(size) + head, *encoded]
        if encoded is None:
            encoded = shared.encoded(response, _encode_body)
        if encoded is not None:
            return [_PREFIX.pack(len(head) + len(encoded)) + head, encoded]
        out = ChunkWriter()
        out.write(head)
        entity_writer(type(response))(out, response)
        return [_PREFIX.pack(out.size), *out.parts()]

    # -- shutdown ------------------------------------------------------------------------------

    def drain(self) -> Deferred[None]:
        """Stop reading new requests; fire when every accepted request has been answered."""
        self.hold_reading("draining", True)
        if not self._pending or self._closing:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._drain_waiters.append(d)
        return d

    def hold_reading(self, reason: str, on: bool) -> None:
        """Add (``on``) or lift one reason to stop reading requests; the socket is paused
        while any reason stands and resumed, with the frames already buffered processed,
        when the last one is lifted."""
        held = bool(self._holds)
        if on:
            self._holds.add(reason)
        else:
            self._holds.discard(reason)
        if self._closing or self.transport is None or held == bool(self._holds):
            return
        if self._holds:
            self.transport.pauseProducing()
        else:
            self.transport.resumeProducing()
            self._process()

    def _fire_drained(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for d in waiters:
            d.callback(None)


_FILL_BUDGET = recvinto.FillBudget()  # one per process: the plaintext and TLS listeners share it


class _WriteBacklog:
    """Registered with the transport as a streaming producer of the connection's responses:
    the transport pauses it when its queue of unsent bytes passes ``bufferSize`` and resumes
    it once the queue is empty, and the connection stops reading requests in between."""

    __slots__ = ("protocol",)

    def __init__(self, protocol: KafkaProtocol) -> None:
        self.protocol = protocol

    def pauseProducing(self) -> None:
        self.protocol.hold_reading("write_backlog", True)

    def resumeProducing(self) -> None:
        self.protocol.hold_reading("write_backlog", False)

    def stopProducing(self) -> None:
        """The connection is going; ``connectionLost`` cleans up."""


class ConnectionLimiter:
    """A connection budget shared by the plaintext and TLS listeners."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def acquire(self) -> bool:
        """Take one slot; ``False`` when the limit is reached."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        """Give back a slot taken by ``acquire``."""
        self.open -= 1


class KafkaFactory(Factory):
    """Builds ``KafkaProtocol`` for one listener; holds the dispatcher and metrics."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        metrics: Metrics,
        reactor: IReactorTime,
        max_frame_bytes: int,
        limiter: ConnectionLimiter,
        listener: str = "PLAINTEXT",
        broker: Broker | None = None,
        max_idle_s: float | None = None,
        sasl_users: SaslUsers | None = None,
    ) -> None:
        """``max_idle_s``: close connections idle that long (Kafka's connections.max.idle.ms);
        checked every quarter of it, at most every 30 s, while the factory listens.
        ``sasl_users``: every connection must authenticate with SASL first (None: no SASL)."""
        self.sasl_users = sasl_users
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.reactor = reactor
        self.max_frame_bytes = max_frame_bytes
        self.limiter = limiter
        self.listener = listener
        self.broker = broker
        self.connections: set[KafkaProtocol] = set()
        self.fill_budget = _FILL_BUDGET
        self.noisy = False
        self.max_idle_s = max_idle_s
        self._idle_sweep: LoopingCall | None = None

    def buildProtocol(self, addr: IAddress) -> KafkaProtocol:
        return KafkaProtocol(self)

    def startFactory(self) -> None:
        if self.max_idle_s and self._idle_sweep is None:
            self._idle_sweep = LoopingCall(self.close_idle)
            self._idle_sweep.clock = self.reactor
            self._idle_sweep.start(min(30.0, max(0.25, self.max_idle_s / 4)), now=False)

    def stopFactory(self) -> None:
        if self._idle_sweep is not None and self._idle_sweep.running:
            self._idle_sweep.stop()
        self._idle_sweep = None

    def close_idle(self) -> int:
        """Close every connection with nothing in flight and no bytes for ``max_idle_s``."""
        if not self.max_idle_s:
            return 0
        cutoff = self.reactor.seconds() - self.max_idle_s
        idle = [p for p in self.connections
                if not p.busy and p.last_active < cutoff and not p.idle_closed]
        for p in idle:
            p.log.info("closing Kafka connection from {peer}: idle for {s:.0f}s", peer=p.peer,
                       s=self.max_idle_s)
            p.idle_closed = True
            p.transport.loseConnection()
            # TLS waits for the peer's close_notify, which a silent peer never sends: Kafka
            # closes the socket whatever the peer does.
            self.reactor.callLater(IDLE_ABORT_S, self._abort_if_open, p)
        return len(idle)

    def _abort_if_open(self, protocol: "KafkaProtocol") -> None:
        if protocol in self.connections:
            protocol.transport.abortConnection()

    def connection_opened(self, protocol: KafkaProtocol) -> None:
        """Called by a protocol that was admitted under the connection cap."""
        self.connections.add(protocol)
        self.metrics.kafka_connections.labels(self.listener).inc()

    def connection_closed(self, protocol: KafkaProtocol) -> None:
        """Called by an admitted protocol when its connection goes."""
        self.connections.discard(protocol)
        self.metrics.kafka_connections.labels(self.listener).dec()

    def drain(self, timeout: float) -> Deferred[None]:
        """Answer in-flight requests (at most ``timeout`` seconds), then close every connection."""
        waits = [p.drain() for p in list(self.connections)]
        d: Deferred[Any] = DeferredList(waits, consumeErrors=True)
        d.addTimeout(timeout, self.reactor)  # type: ignore[arg-type]

        def close(_: object) -> None:
            for p in list(self.connections):
                p.transport.loseConnection()

        d.addBoth(close)
        return d


__all__ = ["ConnectionLimiter", "KafkaFactory", "KafkaProtocol", "MAX_IN_FLIGHT"]
