"""The daemon freezes its start-up heap once ready, so full GC passes stay short."""
from __future__ import annotations

import gc
import platform
import subprocess
import sys
import time

import pytest

from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock

from kmqkafka.heap import settle_heap
from kmqkafka.service import BrokerService, Listener
from tests.conftest import peak_rss_kb, start_broker


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


_SECOND_BLOCK_FAULTS = """
import resource, sys
from kmqkafka.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
block = bytearray(16 << 20)  # a produce batch's worth and more, as the daemon reads them
block[::4096] = b"x" * len(block[::4096])
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = bytearray(16 << 20)
block[::4096] = b"x" * len(block[::4096])
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's knobs are glibc's")
def test_keep_freed_memory_reuses_freed_blocks_without_page_faults() -> None:
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _SECOND_BLOCK_FAULTS, mode], check=True,
                             capture_output=True, text=True).stdout
        return int(out.strip())

    pages = (16 << 20) // 4096
    assert faults("default") > pages // 2  # glibc handed the first block back to the kernel
    assert faults("keep") < pages // 8


def test_the_daemon_starts_without_building_hypothesis_tables(tmp_path) -> None:
    """kio registers Hypothesis strategies when Hypothesis is installed (here it is: a test
    dependency); the daemon hides it from kio, so start-up stays small and writes nothing
    into its working directory."""
    pytest.importorskip("hypothesis")
    broker = start_broker(tmp_path)
    try:
        assert peak_rss_kb(broker.proc.pid) < 150_000  # 253 MB with the tables, 63 MB without
        assert not (broker.cwd / ".hypothesis").exists()
    finally:
        broker.stop()
