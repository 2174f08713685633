"""A daemon with a small page-cache budget (KMQKAFKA_PAGE_CACHE_BYTES): confluent-kafka
produces past it, the old part of the partition leaves the page cache, and a consumer reading
everything back from offset 0 gets every record, byte for byte, in order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import http_get, on_tmpfs, resident_bytes, start_broker

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

TOPIC = "cold"
BUDGET = 1 << 20
COUNT = 12_000  # ~12 MB of 1 KiB records


def test_old_data_leaves_the_page_cache_and_reads_back_exactly(tmp_path: Path) -> None:
    if on_tmpfs(tmp_path):
        pytest.skip("the temp dir is on tmpfs, whose pages are memory and never dropped")
    broker = start_broker(tmp_path, env={"KMQKAFKA_PAGE_CACHE_BYTES": str(BUDGET)})
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
        values = [b"%06d" % i + os.urandom(1018) for i in range(COUNT)]
        for i, v in enumerate(values):
            p.produce(TOPIC, key=b"k%d" % i, value=v)
            if i % 1000 == 999:
                p.poll(0)
                p.flush(30)  # several flushes, so older ones fall out of the budget
        assert p.flush(30) == 0

        logs = sorted((broker.data_dir / "channels").glob(f"kafka.{TOPIC}/*.log"))
        assert logs, "no segment of the topic on disk"
        first = logs[0]
        size = first.stat().st_size
        assert size > 4 * BUDGET
        # Everything but the newest BUDGET bytes of the node's durable writes was dropped.
        assert resident_bytes(first, 0, size - 2 * BUDGET) <= 64 * 1024

        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "cold",
                      "enable.auto.commit": False})
        got: list[tuple[int, bytes, bytes]] = []
        try:
            c.assign([TopicPartition(TOPIC, 0, 0)])
            for _ in range(200):
                for m in c.consume(1000, 0.5):
                    assert m.error() is None, m.error()
                    got.append((m.offset(), m.key(), m.value()))
                if len(got) >= COUNT:
                    break
        finally:
            c.close()
        assert [o for o, _k, _v in got] == list(range(COUNT))
        assert [v for _o, _k, v in got] == values
        assert [k for _o, k, _v in got] == [b"k%d" % i for i in range(COUNT)]
        assert broker.health() == 200
        metrics = http_get(broker.http_port, "/metrics").decode()
        dropped = [float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("kmqkafka_page_cache_dropped_bytes_total ")]
        assert dropped and dropped[0] > 8 * BUDGET
    finally:
        broker.stop()

