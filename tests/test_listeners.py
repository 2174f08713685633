"""The Kafka listeners are opened with a deep accept queue."""
from __future__ import annotations

from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock

from kmqkafka.service import LISTEN_BACKLOG, BrokerService, Listener


class _Store:
    def start(self) -> None:
        pass


def test_listeners_accept_a_reconnect_storm_into_their_queue() -> None:
    """Twisted's default backlog of 50 dropped the SYNs of a burst of 300 clients (1-5 s of
    retries each); plaintext and TLS listeners now ask for LISTEN_BACKLOG."""
    reactor = MemoryReactorClock()
    service = BrokerService(reactor, _Store(), None, [
        Listener("PLAINTEXT", "127.0.0.1", 0, Factory()),
        Listener("SSL", "127.0.0.1", 0, Factory(), tls=object())])
    service.startService()
    assert LISTEN_BACKLOG >= 1024
    assert [server[2] for server in reactor.tcpServers] == [LISTEN_BACKLOG]
    assert [server[3] for server in reactor.sslServers] == [LISTEN_BACKLOG]
