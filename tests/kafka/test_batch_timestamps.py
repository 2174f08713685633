"""A batch whose header max timestamp is unset (-1), as sarama 1.22 sends every batch, against a
real daemon over a raw socket: Kafka stores such a CreateTime batch with the max timestamp of
its records (LogValidator), so retention keeps it, a lookup by time finds it, and the timestamp
bounds see its records. It used to be dated 1970: the next retention run deleted it, although
acknowledged with acks=all."""
from __future__ import annotations

import time
from typing import Iterator

import pytest
from conftest import BrokerProcess, start_broker
from kio.schema.errors import ErrorCode

from kmqkafka import records
from kmqkafka.records import NewRecord, build_batch
from tests.kafka.test_produce_fetch import Raw, fetch, list_offsets, parts_of, produce, unique

E = ErrorCode
CHECK_MS = 100  # retention runs this often here


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("ts"),
                     env={"CONNECTORS_KAFKA_LOG_RETENTION_CHECK_INTERVAL_MS": str(CHECK_MS)})
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[Raw]:
    r = Raw(broker)
    yield r
    r.close()


def _undated(batch: bytes) -> bytes:
    """``batch`` as sarama 1.22 frames it: the first timestamp set, the max timestamp -1."""
    buf = bytearray(batch)
    buf[35:43] = (-1).to_bytes(8, "big", signed=True)
    buf[17:21] = records.crc32c(memoryview(buf)[21:]).to_bytes(4, "big")
    return bytes(buf)


def _batch(stamps: list[int], compression: int = records.COMPRESSION_NONE) -> bytes:
    return _undated(build_batch([NewRecord(value=b"v%d" % i, key=b"k", timestamp=ts)
                                 for i, ts in enumerate(stamps)],
                                now_ms=stamps[0], compression=compression))


def _stored_headers(raw: Raw, topic: str) -> list[records.BatchHeader]:
    blob = parts_of(fetch(raw, topic, {0: 0}))[0].records
    out, pos = [], 0
    while pos < len(blob):
        header = records.read_header(blob, pos)
        out.append(header)
        pos += header.size
    return out


@pytest.mark.parametrize("codec", [records.COMPRESSION_NONE, records.COMPRESSION_LZ4])
def test_an_undated_batch_is_stored_with_its_records_max_timestamp_and_kept(
        raw: Raw, codec: int) -> None:
    topic = unique("undated")
    now = int(time.time() * 1000)
    stamps = [now - 5_000, now - 1_000, now - 3_000]
    got = produce(raw, topic, {0: _batch(stamps, codec)})[0]
    assert (got.error_code, got.base_offset) == (E.none, 0)
    (header,) = _stored_headers(raw, topic)
    assert header.max_timestamp == now - 1_000
    time.sleep(10 * CHECK_MS / 1000)  # several retention runs (retention.ms: 7 days)
    assert list_offsets(raw, topic, {0: -2})[0].offset == 0
    assert [r.timestamp for r in records.iter_records(
        parts_of(fetch(raw, topic, {0: 0}))[0].records)] == stamps
    found = list_offsets(raw, topic, {0: now - 2_000})[0]  # by time: the record at now - 1 s
    assert (found.offset, found.timestamp) == (1, now - 1_000)


def test_an_undated_batch_from_the_future_is_refused_by_the_timestamp_bound(raw: Raw) -> None:
    topic = unique("undated-future")
    now = int(time.time() * 1000)
    got = produce(raw, topic, {0: _batch([now, now + 2 * 3600_000])})[0]
    assert got.error_code is E.invalid_timestamp  # message.timestamp.after.max.ms: 1 hour


def test_records_without_any_timestamp_are_dated_when_stored(raw: Raw) -> None:
    topic = unique("no-timestamps")
    before = int(time.time() * 1000)
    blob = build_batch([NewRecord(value=b"x"), NewRecord(value=b"y")], now_ms=-1)
    assert records.read_header(blob).max_timestamp == -1
    assert produce(raw, topic, {0: blob})[0].error_code is E.none
    (header,) = _stored_headers(raw, topic)
    assert before <= header.max_timestamp <= int(time.time() * 1000)
    time.sleep(10 * CHECK_MS / 1000)
    assert list_offsets(raw, topic, {0: -2})[0].offset == 0
    assert list_offsets(raw, topic, {0: -1})[0].offset == 2


def test_a_well_formed_batch_is_stored_as_sent(raw: Raw) -> None:
    topic = unique("dated")
    now = int(time.time() * 1000)
    blob = build_batch([NewRecord(value=b"v", timestamp=now)], now_ms=now)
    assert produce(raw, topic, {0: blob})[0].error_code is E.none
    stored = parts_of(fetch(raw, topic, {0: 0}))[0].records
    assert stored[12:] == blob[12:]  # base offset and leader epoch are the broker's to set
