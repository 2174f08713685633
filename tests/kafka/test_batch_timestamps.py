"""A batch whose header max timestamp is unset (-1), as sarama 1.22 sends every batch, against a
real daemon over a raw socket: Kafka stores such a CreateTime batch with the max timestamp of
its records (LogValidator), so retention keeps it, a lookup by time finds it, and the timestamp
bounds see its records. It used to be dated 1970: the next retention run deleted it, although
acknowledged with acks=all."""
from __future__ import annotations

import datetime
import time
from typing import Iterator

import pytest
from conftest import BrokerProcess, start_broker
from kio.schema.errors import ErrorCode

from kmqkafka import records
from kmqkafka.records import NewRecord, build_batch
from tests.kafka.test_produce_fetch import Raw, fetch, list_offsets, parts_of, produce, unique
from tests.store import with_header

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
    return with_header(batch, max_ts=-1)


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


def test_a_header_claiming_a_later_max_than_its_records_is_made_exact(raw: Raw) -> None:
    """Past the topic's after bound the records are decoded (they are within it): the
    stored header then says what they say, so MAX_TIMESTAMP and retention see the truth."""
    topic = unique("overstated")
    now = int(time.time() * 1000)
    blob = build_batch([NewRecord(value=b"a", timestamp=now), NewRecord(value=b"b", timestamp=now + 1)],
                       now_ms=now)
    assert produce(raw, topic, {0: with_header(blob, max_ts=now + 10**9)})[0].error_code is E.none
    later = build_batch([NewRecord(value=b"c", timestamp=now + 200)], now_ms=now + 200)
    assert produce(raw, topic, {0: later})[0].error_code is E.none
    assert [h.max_timestamp for h in _stored_headers(raw, topic)] == [now + 1, now + 200]
    newest = list_offsets(raw, topic, {0: -3})[0]
    assert (newest.offset, newest.timestamp) == (2, now + 200)


def _create(raw: Raw, topic: str, configs: dict[str, str]) -> None:
    response = raw.call(19, 4, topics=[{"name": topic, "num_partitions": 1,
                                        "replication_factor": 1, "assignments": [],
                                        "configs": [{"name": k, "value": v}
                                                    for k, v in configs.items()]}],
                        timeout=datetime.timedelta(seconds=5), validate_only=False)
    assert response.topics[0].error_code is E.none


def _lat_batch(now: int) -> bytes:
    blob = build_batch([NewRecord(value=b"a", timestamp=now - 5),
                        NewRecord(value=b"b", timestamp=now)], now_ms=now - 5)
    return with_header(blob, attributes=records.TIMESTAMP_TYPE_LOG_APPEND)


def test_the_log_append_time_bit_from_a_client_is_refused_on_a_log_append_time_topic(
        raw: Raw) -> None:
    topic = unique("lat-bit")
    _create(raw, topic, {"message.timestamp.type": "LogAppendTime"})
    got = produce(raw, topic, {0: _lat_batch(int(time.time() * 1000))})[0]
    assert got.error_code is E.invalid_timestamp
    assert [e.batch_index for e in got.record_errors] == [0, 1]
    assert list_offsets(raw, topic, {0: -1})[0].offset == 0  # nothing stored


def test_the_log_append_time_bit_from_a_client_is_cleared_on_a_create_time_topic(
        raw: Raw) -> None:
    """Kafka keeps the batch as CreateTime, so its records keep their own timestamps."""
    topic = unique("lat-bit-ct")
    _create(raw, topic, {"message.timestamp.type": "CreateTime"})
    now = int(time.time() * 1000)
    assert produce(raw, topic, {0: _lat_batch(now)})[0].error_code is E.none
    (header,) = _stored_headers(raw, topic)
    assert not header.log_append_time and header.max_timestamp == now
    assert [r.timestamp for r in records.iter_records(
        parts_of(fetch(raw, topic, {0: 0}))[0].records)] == [now - 5, now]
