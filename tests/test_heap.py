"""The daemon freezes its start-up heap once ready, so full GC passes stay short."""
from __future__ import annotations

import gc
import time

from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock

from kmqkafka.heap import settle_heap
from kmqkafka.service import BrokerService, Listener


def test_settle_heap_freezes_and_shortens_full_collections() -> None:
    ballast = [[i] for i in range(200_000)]  # long-lived objects, as a broker's start-up
    try:
        t = time.perf_counter()
        gc.collect()
        before = time.perf_counter() - t
        frozen = settle_heap()
        assert frozen >= len(ballast)
        t = time.perf_counter()
        gc.collect()
        after = time.perf_counter() - t
        assert after < before
    finally:
        gc.unfreeze()
        del ballast


class _Store:
    def __init__(self) -> None:
        self.started = False

    def start(self) -> None:
        self.started = True


def test_on_ready_runs_after_store_and_listeners() -> None:
    reactor = MemoryReactorClock()
    store = _Store()
    seen: list[tuple[bool, int]] = []
    service = BrokerService(reactor, store, None, [Listener("PLAINTEXT", "127.0.0.1", 0,
                                                            Factory())])
    service.on_ready = lambda: seen.append((store.started, len(reactor.tcpServers)))
    service.startService()
    assert seen == [(True, 1)]
    assert service.ready
