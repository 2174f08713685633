"""acks=all is a promise: after kill -9 and restart, every acknowledged record is served again
with the offset its delivery report carried and the bytes that were sent."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from conftest import start_broker

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

TOPIC = "durable"


def test_acknowledged_records_survive_kill_9(tmp_path: Path) -> None:
    broker = start_broker(tmp_path)
    acked: dict[int, bytes] = {}
    lock = threading.Lock()
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2,
                      "message.timeout.ms": 5000, "retries": 0,
                      "socket.connection.setup.timeout.ms": 1000})

        def report(err: object, msg: object) -> None:
            if err is None:
                with lock:
                    acked[msg.offset()] = msg.value()  # type: ignore[attr-defined]

        p.produce(TOPIC, value=b"first")  # creates the topic
        assert p.flush(10) == 0
        sent = 0
        killed = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                p.produce(TOPIC, value=b"%08d:" % sent + os.urandom(200), on_delivery=report)
                sent += 1
            except BufferError:
                pass
            p.poll(0)
            if not killed and len(acked) >= 3000:
                broker.kill()  # SIGKILL mid-production: records are in flight
                killed = True
                kill_time = time.monotonic()
            if killed and time.monotonic() - kill_time > 0.5:
                break
        p.flush(6)  # the rest fail (message.timeout.ms): never acknowledged
        assert killed, "production too slow to reach the kill point"
        with lock:
            promised = dict(acked)
        assert len(promised) >= 3000
        print(f"\nsent {sent}, acknowledged {len(promised)} before kill -9")

        broker.restart()
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check",
                      "enable.auto.commit": False})
        try:
            low, high = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
            assert low == 0 and high >= max(promised) + 1
            c.assign([TopicPartition(TOPIC, 0, 1)])
            served: dict[int, bytes] = {}
            stop = time.monotonic() + 30
            while len(served) < high - 1 and time.monotonic() < stop:
                for m in c.consume(10_000, 0.5):
                    assert m.error() is None, m.error()
                    served[m.offset()] = m.value()
        finally:
            c.close()
        # Dense offsets, and every acknowledged record is there with its offset and bytes.
        assert sorted(served) == list(range(1, high))
        missing = [o for o, v in promised.items() if served.get(o) != v]
        assert not missing, f"{len(missing)} acknowledged record(s) lost or changed"
    finally:
        broker.stop()
