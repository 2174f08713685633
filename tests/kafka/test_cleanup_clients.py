"""Log cleanup seen by real clients: Kafka's compaction and time-based rolling semantics.

The daemon runs its cleaner and retention checks every 300 ms here
(``CONNECTORS_KAFKA_LOG_CLEANER_BACKOFF_MS`` / ``..._LOG_RETENTION_CHECK_INTERVAL_MS``), so
what Kafka's cleaner would leave is visible within seconds.
"""
from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import BrokerProcess, start_broker

WAIT = 20.0


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("cleanup"), env={
        "CONNECTORS_KAFKA_LOG_CLEANER_BACKOFF_MS": "300",
        "CONNECTORS_KAFKA_LOG_RETENTION_CHECK_INTERVAL_MS": "300"})
    try:
        yield b
    finally:
        b.stop()


def create(kafka: BrokerProcess, config: dict[str, str]) -> str:
    name = f"cleanup-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(WAIT)
    return name


def produce(kafka: BrokerProcess, topic: str, pairs: list[tuple[bytes | None, bytes | None]],
            timestamp: int = 0) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    for key, value in pairs:
        p.produce(topic, value, key, timestamp=timestamp)
        p.flush(WAIT)  # one batch each: every record is its own unit for the cleaner


def read_all(kafka: BrokerProcess, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "cleanup-reader",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        return read_to_eof(c)
    finally:
        c.close()


def read_to_eof(c: Consumer, *, strict: bool = False
                ) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of what ``c`` reads until the end of its partition; ``strict``:
    any error other than the end of partition fails."""
    out = []
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            assert not strict or m.error().code() == -191, m.error()
            if m.error().code() == -191:  # _PARTITION_EOF
                return out
            continue
        out.append((m.offset(), m.key(), m.value()))
    raise AssertionError(f"no end of partition within {WAIT}s: {out}")


def wait_for(kafka: BrokerProcess, topic: str, want: list) -> None:
    deadline = time.monotonic() + WAIT
    got: list = []
    while time.monotonic() < deadline:
        got = read_all(kafka, topic)
        if got == want:
            return
        time.sleep(0.3)
    raise AssertionError(f"{got} != {want}")


def test_compaction_keeps_the_active_segment_and_stamps_tombstones(kafka: BrokerProcess) -> None:
    """Only closed segments are cleaned, and records in the active one supersede nothing
    yet; a tombstone outlives the first clean by delete.retention.ms, however old it is."""
    old = int(time.time() * 1000) - 2 * 3600 * 1000
    topic = create(kafka, {"cleanup.policy": "compact", "segment.ms": "200"})
    produce(kafka, topic, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", None)], old + 1)
    time.sleep(0.3)
    produce(kafka, topic, [(b"a", b"3")])  # 2 h of record time later: rolls, stays active
    wait_for(kafka, topic, [(2, b"a", b"2"), (3, b"b", None), (4, b"a", b"3")])
    time.sleep(1.0)  # several more passes: the tombstone's horizon is a day away
    assert read_all(kafka, topic) == [(2, b"a", b"2"), (3, b"b", None), (4, b"a", b"3")]

    short = create(kafka, {"cleanup.policy": "compact", "segment.ms": "200",
                           "delete.retention.ms": "3000"})
    produce(kafka, short, [(b"k", b"1"), (b"k", None)], old)
    time.sleep(0.3)
    produce(kafka, short, [(b"z", b"roll")])
    wait_for(kafka, short, [(1, b"k", None), (2, b"z", b"roll")])
    wait_for(kafka, short, [(2, b"z", b"roll")])  # a pass after the horizon drops it


def test_segments_roll_by_record_time_so_retention_drops_old_records(
        kafka: BrokerProcess) -> None:
    """Kafka rolls when a batch's timestamp is segment.ms past the segment's first batch:
    the record two hours old ends up alone in a closed segment that retention.ms expires."""
    topic = create(kafka, {"segment.ms": "600000", "retention.ms": "3600000"})
    now = int(time.time() * 1000)
    produce(kafka, topic, [(None, b"old")], now - 2 * 3600 * 1000)
    produce(kafka, topic, [(None, b"new")], now)
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "cleanup-wm"})
    try:
        deadline = time.monotonic() + WAIT
        low = -1
        while time.monotonic() < deadline:
            low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT)
            if low == 1:
                break
            time.sleep(0.3)
        assert (low, high) == (1, 2)
    finally:
        c.close()


def test_compact_delete_keeps_the_log_start_under_segments_the_cleaner_emptied(
        kafka: BrokerProcess) -> None:
    """compact,delete with a week's retention: once the cleaner empties the first segments
    (every key superseded), Kafka keeps them, dated by their records, until retention.ms:
    the low watermark stays 0 and a consumer at offset 1 reads on instead of being reset."""
    # Any dirt triggers a pass: with the default ratio (0.5) a pass that ran between the
    # produces (a loaded machine) leaves (a, 2) behind the cleaned point, too little dirt
    # after it for another pass, as Kafka's cleaner would.
    topic = create(kafka, {"cleanup.policy": "compact,delete", "segment.ms": "100",
                           "min.cleanable.dirty.ratio": "0.01"})
    start = int(time.time() * 1000) - 60_000
    pairs: list[tuple[bytes | None, bytes | None]] = [
        (b"a", b"1"), (b"a", b"2"), (b"b", b"1"), (b"a", b"3"), (b"z", b"x")]
    for i, pair in enumerate(pairs):
        produce(kafka, topic, [pair], start + i * 1000)  # each record rolls a segment
    want = [(2, b"b", b"1"), (3, b"a", b"3"), (4, b"z", b"x")]
    wait_for(kafka, topic, want)
    time.sleep(1.0)  # several retention checks after the clean
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "cleanup-emptied",
                  "auto.offset.reset": "latest", "enable.partition.eof": True})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT) == (0, 5)
        c.assign([TopicPartition(topic, 0, 1)])
        assert [offset for offset, _k, _v in read_to_eof(c, strict=True)] == [2, 3, 4]
    finally:
        c.close()
