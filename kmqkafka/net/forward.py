"""Relaying a Kafka request from a follower to the leader's Kafka listener.

A follower that receives a request only the leader can answer (group coordination, offsets)
re-sends it to the leader as a Kafka client would: the decoded kio request is written again
(same API key and version, a new correlation id) on a connection to the leader's advertised
Kafka endpoint, and the leader's decoded response is handed back to the dispatcher, which
writes it with the client's own correlation id.

The request header's client id is ``FORWARD_PREFIX + "<peer>|<principal>|<client id>"`` (the
principal percent-quoted): the leader takes the original peer, principal and client id back
from it (``unwrap``), authorizes the request as that principal when it trusts the relaying
connection (``groups._relayed_ctx``), and never forwards such a request a second time (a stale
view of who leads answers NOT_COORDINATOR instead of bouncing).

Connections: a Kafka connection answers strictly in request order, so a parked call (JoinGroup,
SyncGroup) would hold back everything queued behind it. Quick calls share one pooled connection
per endpoint; ``exclusive=True`` calls get a connection of their own, closed once answered, or
when the caller cancels (the client went away): the leader then sees the connection drop and
releases the parked member as it would for a direct client.

Reactor-thread only.
"""
from __future__ import annotations

import io
import struct
from typing import Any
from urllib.parse import quote, unquote

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure

__all__ = ["FORWARD_PREFIX", "ForwardError", "Forwarder", "unwrap", "wrap"]

FORWARD_PREFIX = "\u2192kmq-fwd|"
_LEN = struct.Struct(">i")
_MAX_FRAME = 256 << 20


class ForwardError(Exception):
    """The leader could not be reached, dropped the connection, or did not answer in time."""


def wrap(peer: str, principal: str, client_id: str | None) -> str:
    return f"{FORWARD_PREFIX}{peer}|{quote(principal, safe=':=,@. ')}|{client_id or ''}"


def unwrap(client_id: str | None) -> tuple[str, str, str | None] | None:
    """``(peer, principal, client_id)`` of a forwarded request's header client id, else
    None."""
    if not client_id or not client_id.startswith(FORWARD_PREFIX):
        return None
    peer, _, rest = client_id[len(FORWARD_PREFIX):].partition("|")
    principal, _, original = rest.partition("|")
    return peer, unquote(principal), original or None


def encode_request(request: Any, correlation_id: int, client_id: str) -> bytes:
    header_type = request.__header_schema__
    header = header_type(request_api_key=request.__api_key__,
                         request_api_version=request.__version__,
                         correlation_id=correlation_id, client_id=client_id)
    buf = io.BytesIO()
    entity_writer(header_type)(buf, header)
    entity_writer(type(request))(buf, request)
    payload = buf.getvalue()
    return _LEN.pack(len(payload)) + payload


class _Connection(Protocol):
    """One client connection to a leader; answers come back in request order."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._next = 0
        self._waiting: dict[int, tuple[Deferred, type]] = {}
        self.open = False
        self.on_lost: Any = None

    def connectionMade(self) -> None:
        self.open = True
        try:
            self.transport.setTcpNoDelay(True)  # type: ignore[attr-defined]
        except Exception:
            pass
        credentials = self.factory.credentials
        if credentials is None:
            self.factory.made(self)
            return
        d = self._authenticate(*credentials)
        d.addCallbacks(lambda _: self.factory.made(self), self._refused)

    def _authenticate(self, mechanism: str, user: str, password: str) -> Deferred:
        """SASL on a listener that asks for it: SaslHandshake v1, then SaslAuthenticate
        exchanges until the mechanism's client side is done (``net/sasl.client_steps``)."""
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        from kmqkafka.net.sasl import client_steps

        steps = client_steps(mechanism, user, password)

        def check(response: Any) -> Any:
            if response.error_code != 0:
                why = getattr(response, "error_message", None) or response.error_code
                raise ForwardError(f"the leader refused SASL {mechanism}: {why}")
            return response

        def step(server_bytes: bytes | None) -> Any:
            try:
                token = next(steps) if server_bytes is None else steps.send(server_bytes)
            except StopIteration:
                return None
            d = self.send(SaslAuthenticateRequest(auth_bytes=token), "")
            return d.addCallback(check).addCallback(lambda r: step(bytes(r.auth_bytes)))

        d = self.send(SaslHandshakeRequest(mechanism=mechanism), "")
        return d.addCallback(check).addCallback(lambda _: step(None))

    def _refused(self, failure: Failure) -> None:
        self.factory.refused(failure)
        self.transport.loseConnection()

    def send(self, request: Any, client_id: str) -> Deferred:
        if not self.open:
            return fail(ForwardError("connection to the leader is closed"))
        self._next = (self._next + 1) & 0x7FFFFFFF
        correlation = self._next
        response_type = load_response_schema(request.__api_key__, request.__version__)
        d: Deferred = Deferred()
        self._waiting[correlation] = (d, response_type)
        self.transport.write(encode_request(request, correlation, client_id))
        return d

    def dataReceived(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= 4:
            (size,) = _LEN.unpack_from(self._buf, 0)
            if size < 0 or size > _MAX_FRAME:
                self.transport.loseConnection()
                return
            if len(self._buf) < 4 + size:
                return
            frame = bytes(self._buf[4:4 + size])
            del self._buf[:4 + size]
            self._frame(frame)

    def _frame(self, frame: bytes) -> None:
        (correlation,) = _LEN.unpack_from(frame, 0)
        entry = self._waiting.pop(correlation, None)
        if entry is None:
            return  # the caller gave up (timeout / cancel)
        d, response_type = entry
        try:
            header, used = entity_reader(response_type.__header_schema__)(frame, 0)
            response, _ = entity_reader(response_type)(frame, used)
        except Exception as exc:
            d.errback(ForwardError(f"undecodable answer from the leader: {exc!r}"))
            return
        d.callback(response)

    def forget(self, d: Deferred) -> None:
        for correlation, (waiting, _) in list(self._waiting.items()):
            if waiting is d:
                del self._waiting[correlation]

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self.open = False
        waiting, self._waiting = self._waiting, {}
        for d, _ in waiting.values():
            d.errback(ForwardError("the leader closed the connection"))
        if self.on_lost is not None:
            self.on_lost(self)
        self.factory.lost(self)


class _Factory(ClientFactory):
    protocol = _Connection

    def __init__(self, ready: Deferred, endpoint: tuple[str, int],
                 live: dict[_Connection, tuple[str, int]],
                 credentials: tuple[str, str, str] | None = None) -> None:
        self.credentials = credentials  # (mechanism, user, password) for a SASL listener
        self.ready: Deferred | None = ready
        self.endpoint = endpoint
        self.live = live  # the forwarder's open connections and their endpoints

    def made(self, conn: _Connection) -> None:
        self.live[conn] = self.endpoint
        d, self.ready = self.ready, None
        if d is not None and not d.called:
            d.callback(conn)

    def lost(self, conn: _Connection) -> None:
        self.live.pop(conn, None)

    def refused(self, failure: Failure) -> None:
        d, self.ready = self.ready, None
        if d is not None and not d.called:
            d.errback(failure if failure.check(ForwardError) else
                      Failure(ForwardError(failure.getErrorMessage())))

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        d, self.ready = self.ready, None
        if d is not None and not d.called:
            d.errback(ForwardError(f"cannot reach the leader: {reason.getErrorMessage()}"))


class Forwarder:
    """Sends kio requests to other nodes' Kafka listeners and returns their kio responses."""

    def __init__(self, reactor: Any, *, connect_timeout_s: float = 5.0,
                 request_timeout_s: float = 30.0,
                 credentials: tuple[str, str, str] | None = None) -> None:
        """``credentials``: (mechanism, user, password) when the listeners ask for SASL."""
        self._reactor = reactor
        self._credentials = credentials
        self._connect_timeout = connect_timeout_s
        self._timeout = request_timeout_s
        self._pool: dict[tuple[str, int], _Connection] = {}
        self._connecting: dict[tuple[str, int], list[Deferred]] = {}
        self._live: dict[_Connection, tuple[str, int]] = {}
        self.forwarded = 0

    def call(self, host: str, port: int, request: Any, client_id: str, *,
             exclusive: bool = False, timeout_s: float | None = None) -> Deferred:
        """Fire with the leader's kio response, or fail with ``ForwardError``. Cancelling the
        result abandons the call (and closes an exclusive connection)."""
        self.forwarded += 1
        timeout = self._timeout if timeout_s is None else timeout_s
        state: dict[str, Any] = {"conn": None, "inner": None}

        def cancel(_: Deferred) -> None:
            inner, conn = state["inner"], state["conn"]
            if conn is not None and inner is not None:
                conn.forget(inner)
            if exclusive and conn is not None:
                conn.transport.loseConnection()

        outer: Deferred = Deferred(cancel)
        timer = self._reactor.callLater(timeout, self._expire, outer, state, exclusive)

        def got(conn: _Connection) -> None:
            if outer.called:
                if exclusive:
                    conn.transport.loseConnection()
                return
            state["conn"] = conn
            inner = conn.send(request, client_id)
            state["inner"] = inner
            inner.addCallbacks(done, failed)

        def done(response: Any) -> None:
            if timer.active():
                timer.cancel()
            if exclusive and state["conn"] is not None:
                state["conn"].transport.loseConnection()
            if not outer.called:
                outer.callback(response)

        def failed(f: Failure) -> None:
            if timer.active():
                timer.cancel()
            if not outer.called:
                outer.errback(f if f.check(ForwardError) else
                              Failure(ForwardError(f.getErrorMessage())))

        conn_d = self._connect(host, port) if exclusive else self._pooled(host, port)
        conn_d.addCallbacks(got, failed)
        return outer

    def _expire(self, outer: Deferred, state: dict, exclusive: bool) -> None:
        if outer.called:
            return
        conn, inner = state["conn"], state["inner"]
        if conn is not None and inner is not None:
            conn.forget(inner)
            # A leader that stopped answering is better reconnected; on a pooled connection
            # the other callers fail too and retry (clients treat that as retriable).
            conn.transport.loseConnection()
        outer.errback(ForwardError("the leader did not answer in time"))

    def _connect(self, host: str, port: int) -> Deferred:
        ready: Deferred = Deferred()
        self._reactor.connectTCP(host, port,
                                 _Factory(ready, (host, port), self._live, self._credentials),
                                 timeout=self._connect_timeout)
        return ready

    def _pooled(self, host: str, port: int) -> Deferred:
        key = (host, port)
        conn = self._pool.get(key)
        if conn is not None and conn.open:
            return succeed(conn)
        self._pool.pop(key, None)
        waiter: Deferred = Deferred()
        connecting = self._connecting.get(key)
        if connecting is not None:
            connecting.append(waiter)
            return waiter
        self._connecting[key] = [waiter]

        def made(conn: _Connection) -> None:
            self._pool[key] = conn
            conn.on_lost = lambda c: (self._pool.pop(key, None)
                                      if self._pool.get(key) is c else None)
            for w in self._connecting.pop(key, []):
                w.callback(conn)

        def failed(f: Failure) -> None:
            for w in self._connecting.pop(key, []):
                w.errback(f)

        self._connect(host, port).addCallbacks(made, failed)
        return waiter

    def leader_moved(self, now: tuple[str, int] | None) -> int:
        """Abort every connection to an endpoint other than ``now`` (the new leader's): calls
        waiting on a stalled old leader fail at once, with the retriable error a lost
        connection gives, instead of at their timeout (30 s) while a new leader already
        serves. Returns how many were aborted."""
        gone = [conn for conn, where in self._live.items() if where != now]
        for conn in gone:
            conn.transport.abortConnection()
        return len(gone)

    def close(self) -> None:
        for conn in list(self._pool.values()):
            if conn.open:
                conn.transport.loseConnection()
        self._pool.clear()

