"""Ordered start and stop of the daemon: HTTP, store, then Kafka listeners; stop in reverse.

Start: the metrics/health site listens first (``/health`` says 503 while recovering), then the
store recovers (``store.start()``), then the Kafka listeners open; only then is the broker ready.
Stop: not ready, stop accepting Kafka connections, let each connection answer what it has already
read (bounded by ``drain_timeout``), close them, ``store.stop()`` (fsyncs), stop the site.

A start-up failure after the reactor runs (store recovery, a port in use) is logged as one
critical line and the process exits with status 1 once the reactor has shut down.
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, fail, inlineCallbacks, maybeDeferred
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.net.protocol import KafkaFactory

LISTEN_BACKLOG = 1024  # the kernel clips it to net.core.somaxconn (4096 by default)


@dataclass
class Listener:
    """A port to open: ``tls`` is a context factory for TLS listeners, else ``None``."""

    name: str
    host: str
    port: int
    factory: Factory
    tls: Any = None


class BrokerService(MultiService):
    """The daemon's top service. ``reactor`` provides IReactorTCP, IReactorSSL, IReactorTime."""

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        store: Any,
        http: Listener | None,
        listeners: list[Listener],
        drain_timeout: float = 5.0,
        on_ready: Callable[[], Any] | None = None,
    ) -> None:
        """``on_ready`` runs once the listeners are open (the daemon settles its heap there);
        ``release_parked``, if set, answers parked group calls when the drain begins."""
        super().__init__()
        self.reactor = reactor
        self.store = store
        self.http = http
        self.listeners = listeners
        self.drain_timeout = drain_timeout
        self.on_ready = on_ready
        self.release_parked: Callable[[], Any] | None = None
        self.ready = False
        self.exit_code = 0
        self.started: Deferred[None] | None = None
        self._http_port: IListeningPort | None = None
        self._ports: list[IListeningPort] = []
        self._store_started = False

    def is_ready(self) -> bool:
        """True once the store has recovered and every listener is open, and until a failed
        fsync makes the store refuse writes; false too while the disk refuses writes (a full
        disk), for ``/health``."""
        return self.ready and not (getattr(self.store, "failed", False)
                                   or getattr(self.store, "refusing_writes", False))

    def startService(self) -> None:
        super().startService()
        if self.http is not None:
            try:
                self._http_port = self._listen(self.http)
            except Exception:  # e.g. the port is taken: stop with one line, exit status 1
                self.started = fail()
                self.started.addErrback(self._fatal)
                return
        self.started = self._start()
        self.started.addErrback(self._fatal)

    @inlineCallbacks
    def _start(self) -> Any:
        yield maybeDeferred(self.store.start)
        self._store_started = True
        if not self.running:
            return
        catch_up = getattr(self.store, "catch_up", None)
        if catch_up is not None and not (yield catch_up()):
            self.log.info("no raft leader answered within five election timeouts: serving "
                          "what this node holds and catching up in the background")
        if not self.running:
            return
        for listener in self.listeners:
            self._ports.append(self._listen(listener))
        self._announce(True)  # the other nodes list this one in Metadata from now on
        self.ready = True
        if self.on_ready is not None:
            self.on_ready()
        self.log.info(
            "kmqkafka ready: {listeners}",
            listeners=", ".join(f"{l.name} {l.host}:{l.port}" for l in self.listeners) or "no"
            " Kafka listeners",
        )

    def _announce(self, serving: bool) -> None:
        announce = getattr(self.store, "set_serving", None)
        if announce is not None:
            announce(serving)

    def _listen(self, listener: Listener) -> IListeningPort:
        # A deep accept queue: hundreds of clients reconnecting at once (a restart, a network
        # blip) overflowed Twisted's default of 50 and waited out SYN retries of 1-5 s.
        if listener.tls is not None:
            return self.reactor.listenSSL(
                listener.port, listener.factory, listener.tls, backlog=LISTEN_BACKLOG,
                interface=listener.host
            )
        return self.reactor.listenTCP(listener.port, listener.factory, backlog=LISTEN_BACKLOG,
                                      interface=listener.host)

    def _fatal(self, failure: Failure) -> None:
        self.log.critical("kmqkafka could not start: {error}", error=failure.getErrorMessage())
        self.exit_code = 1
        if self.reactor.running:
            self.reactor.stop()
        else:
            self.reactor.callWhenRunning(_stop, self.reactor)

    @inlineCallbacks
    def stopService(self) -> Any:
        self.ready = False
        if self._store_started:
            self._announce(False)  # dropped from the others' Metadata before it goes
        yield maybeDeferred(super().stopService)
        ports, self._ports = self._ports, []
        for port in ports:
            yield maybeDeferred(port.stopListening)
        drains = [listener.factory.drain(self.drain_timeout) for listener in self.listeners
                  if isinstance(listener.factory, KafkaFactory)]
        if self._store_started:
            # No new requests are read now; parked fetches answer with what they have rather
            # than hold the drain until they time out (and lose their answer).
            self.store.waiters.wake_all()
        if self.release_parked is not None:
            try:
                self.release_parked()  # joins waiting for a rebalance, likewise
            except Exception:
                self.log.failure("releasing parked group calls failed")
        for drained in drains:
            yield drained
        if self._store_started:
            self._store_started = False
            try:
                yield maybeDeferred(self.store.stop)
            except Exception:
                self.log.failure("store did not stop cleanly")
                self.exit_code = 1
        if self._http_port is not None:
            port, self._http_port = self._http_port, None
            yield maybeDeferred(port.stopListening)
        self.log.info("kmqkafka stopped")


def exit_cleanly_on_sigterm(reactor: Any) -> None:
    """Make SIGTERM a clean stop (exit status 0) instead of twistd's re-raised signal.

    twistd records the signal that stopped the reactor and re-kills itself with it, so a
    SIGTERM'd daemon would report death-by-signal to systemd. Call once the reactor runs.
    """

    def on_sigterm(signum: int, frame: object) -> None:
        reactor.callFromThread(_stop, reactor)

    signal.signal(signal.SIGTERM, on_sigterm)


def _stop(reactor: Any) -> None:
    if reactor.running:
        reactor.stop()


def exit_with(service: BrokerService) -> None:
    """After reactor shutdown: leave with ``service.exit_code`` if it is non-zero."""
    if service.exit_code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(service.exit_code)
