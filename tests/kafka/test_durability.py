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


def test_a_clean_restart_takes_the_saved_index_and_serves_everything(tmp_path: Path) -> None:
    """SIGTERM saves each active segment's index (start-up otherwise walks every batch of
    it); the restarted daemon takes it, removes it, serves every record at its offset,
    finds offsets by timestamp, and appends after the last one."""
    broker = start_broker(tmp_path)
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                      "batch.num.messages": 3})
        sent = [b"%05d" % i for i in range(3000)]
        for i, value in enumerate(sent):
            p.produce(TOPIC, value=value, timestamp=1_700_000_000_000 + i)
            if i % 500 == 0:
                p.poll(0)
        assert p.flush(20) == 0
        assert broker.stop() == 0
        channel = broker.data_dir / "channels" / f"kafka.{TOPIC}"
        assert len(list(channel.glob("*.scan"))) == 1
        broker.restart()
        assert not list(channel.glob("*.scan"))
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        p.produce(TOPIC, value=b"after")
        assert p.flush(10) == 0
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check-clean",
                      "enable.auto.commit": False})
        try:
            (found,) = c.offsets_for_times(
                [TopicPartition(TOPIC, 0, 1_700_000_000_000 + 2500)], timeout=10)
            assert found.offset == 2500
            c.assign([TopicPartition(TOPIC, 0, 0)])
            served: dict[int, bytes] = {}
            stop = time.monotonic() + 30
            while len(served) < len(sent) + 1 and time.monotonic() < stop:
                for m in c.consume(10_000, 0.5):
                    assert m.error() is None, m.error()
                    served[m.offset()] = m.value()
        finally:
            c.close()
        assert served == {**dict(enumerate(sent)), len(sent): b"after"}
    finally:
        broker.stop()
