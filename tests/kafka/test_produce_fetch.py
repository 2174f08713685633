"""Produce, Fetch, ListOffsets and OffsetForLeaderEpoch over a raw socket against a real daemon.

Requests are encoded with kio exactly as a client would send them, so every per-partition error
path (bad CRC, old magic, oversize batch, unknown partition, bad topic name, bad acks) and every
Fetch rule (limits, offsets out of range, long poll, sessions) is checked on the wire.
"""
from __future__ import annotations

import datetime
import io
import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import BrokerProcess, start_broker
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kmqkafka import records
from kmqkafka.records import NewRecord, build_batch

MAX_MESSAGE_BYTES = 64 * 1024
E = ErrorCode


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("pf"),
                     env={"CONNECTORS_KAFKA_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES)})
    try:
        yield b
    finally:
        b.stop()


class Raw:
    """A minimal Kafka client: kio-encoded requests, one at a time (or pipelined by hand)."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.sock = socket.create_connection((broker.host, broker.kafka_port), timeout=10)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def send(self, api_key: int, version: int, **fields: Any) -> int:
        cls = load_request_schema(api_key, version)
        request = _build(cls, fields)
        header_cls = cls.__header_schema__
        self.correlation += 1
        buf = io.BytesIO()
        entity_writer(header_cls)(buf, header_cls(
            request_api_key=api_key, request_api_version=version,
            correlation_id=self.correlation, client_id="raw-test"))
        entity_writer(cls)(buf, request)
        body = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        return self.correlation

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        size = struct.unpack(">i", self._exactly(4))[0]
        frame = self._exactly(size)
        cls = load_response_schema(api_key, version)
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        response, _ = entity_reader(cls)(frame, used)
        return header.correlation_id, response

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        sent = self.send(api_key, version, **fields)
        got, response = self.receive(api_key, version)
        assert got == sent
        return response

    def _exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return bytes(out)


def _build(cls: type, fields: dict[str, Any]) -> Any:
    """Instantiate a kio class from plain values, nested dicts becoming the nested classes."""
    import typing

    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in fields.items():
        if name not in cls.__dataclass_fields__:
            continue
        tp = hints[name]
        if isinstance(value, list):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if typing.get_origin(args[0]) is tuple:  # Optional[tuple[X, ...]]
                args = list(typing.get_args(args[0]))
            inner = args[0]
            value = tuple(_build(inner, v) if isinstance(v, dict) else v for v in value)
        kwargs[name] = value
    return cls(**kwargs)


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[Raw]:
    r = Raw(broker)
    yield r
    r.close()


def batch(n: int = 1, *, value_size: int = 10, ts: int = 1_700_000_000_000,
          compression: int = records.COMPRESSION_NONE) -> bytes:
    return build_batch([NewRecord(value=b"v" * value_size, key=b"k%d" % i, timestamp=ts + i)
                        for i in range(n)], now_ms=ts, compression=compression)


def produce(raw: Raw, topic: str, parts: dict[int, bytes | None], *, version: int = 9,
            acks: int = -1) -> dict[int, Any]:
    response = raw.call(0, version, transactional_id=None, acks=acks,
                        timeout=datetime.timedelta(seconds=5),
                        topic_data=[{"name": topic, "partition_data": [
                            {"index": p, "records": r} for p, r in parts.items()]}])
    (t,) = response.responses
    assert t.name == topic
    return {p.index: p for p in t.partition_responses}


def fetch(raw: Raw, topic: str, offsets: dict[int, int], *, version: int = 11,
          max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 50 << 20,
          partition_max_bytes: int = 1 << 20, session_id: int = 0, session_epoch: int = -1,
          topic_id: uuid.UUID | None = None, isolation_level: int = 0) -> Any:
    partitions = [{"partition": p, "fetch_offset": o, "partition_max_bytes": partition_max_bytes,
                   "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}
                  for p, o in offsets.items()]
    topics = [{"topic": topic, "topic_id": topic_id, "partitions": partitions}] if offsets else []
    return raw.call(1, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                    min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=isolation_level,
                    session_id=session_id, session_epoch=session_epoch, topics=topics,
                    forgotten_topics_data=[], rack_id="")


def parts_of(response: Any) -> dict[int, Any]:
    return {p.partition_index: p for t in response.responses for p in t.partitions}


def list_offsets(raw: Raw, topic: str, timestamps: dict[int, int], version: int = 7) -> dict[int, Any]:
    response = raw.call(2, version, replica_id=-1, isolation_level=0, topics=[
        {"name": topic, "partitions": [{"partition_index": p, "timestamp": ts,
                                        "current_leader_epoch": -1}
                                       for p, ts in timestamps.items()]}],
        timeout=datetime.timedelta(seconds=1))
    return {p.partition_index: p for t in response.topics for p in t.partitions}


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# --- Produce ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 7, 9, 12])
def test_produce_assigns_dense_offsets_and_fetch_returns_the_stored_bytes(raw: Raw,
                                                                           version: int) -> None:
    topic = unique("dense")
    sent = [bytearray(batch(3)), bytearray(batch(2, compression=records.COMPRESSION_GZIP)),
            bytearray(batch(1))]
    for b in sent:
        records.set_partition_leader_epoch(b, -1)  # as the Java producer sends them
    bases = [produce(raw, topic, {0: b}, version=version)[0] for b in sent]
    assert [(r.error_code, r.base_offset) for r in bases] == [(E.none, 0), (E.none, 3),
                                                              (E.none, 5)]
    assert all(r.log_start_offset == 0 for r in bases if version >= 5)
    (p,) = parts_of(fetch(raw, topic, {0: 0})).values()
    assert p.error_code is E.none and p.high_watermark == 6 and p.log_start_offset == 0
    assert p.last_stable_offset == 6 and p.aborted_transactions is None
    committed = parts_of(fetch(raw, topic, {0: 0}, isolation_level=1))[0]
    assert committed.aborted_transactions == () and committed.records == p.records
    # Stored as sent, except the base offset and leader epoch the broker assigns.
    expected = b""
    for base, b in zip((0, 3, 5), sent):
        copy = bytearray(b)
        records.set_base_offset(copy, base)
        records.set_partition_leader_epoch(copy, 0)
        expected += bytes(copy)
    assert bytes(p.records) == expected


def test_produce_v3_plus_rules_for_the_records_blob(raw: Raw) -> None:
    """Kafka's ProduceRequest.validateRecords: exactly one magic-2 batch per partition, no zstd
    before v7; and its log check that the offset range matches the record count."""
    topic = unique("rules")
    produce(raw, topic, {0: batch()})
    answers = [produce(raw, topic, {0: blob})[0] for blob in (batch(2) + batch(1), b"")]
    # Refused while Kafka reads the request: no message, no log start offset.
    assert [(a.error_code, a.error_message, a.log_start_offset) for a in answers] == \
        [(E.invalid_record, None, -1)] * 2
    zstd = batch(2, compression=records.COMPRESSION_ZSTD)
    assert produce(raw, topic, {0: zstd}, version=6)[0].error_code \
        is E.unsupported_compression_type
    for count, delta in ((5, 1), (2, 7)):  # header count or offset range lies; CRC is good
        bad = bytearray(batch(2))
        struct.pack_into(">i", bad, 23, delta)   # lastOffsetDelta
        struct.pack_into(">i", bad, 57, count)   # records count
        struct.pack_into(">I", bad, 17, records.crc32c(memoryview(bad)[21:]))
        answer = produce(raw, topic, {0: bytes(bad)})[0]
        # Refused by the log (LogValidator): the log start offset, still no message.
        assert (answer.error_code, answer.error_message, answer.log_start_offset) == \
            (E.invalid_record, None, 0)
    moved = build_batch([NewRecord(value=b"v")], now_ms=0, base_offset=42)
    answer = produce(raw, topic, {0: moved})[0]  # Kafka: a client's batch starts at 0
    assert (answer.error_code, answer.error_message, answer.log_start_offset) == (
        E.invalid_record, None, 0)
    assert list_offsets(raw, topic, {0: -1})[0].offset == 1  # nothing of those stored
    assert produce(raw, topic, {0: zstd}, version=7)[0].base_offset == 1


def test_a_batch_larger_than_a_segment_is_record_list_too_large(raw: Raw) -> None:
    topic = unique("segsize")
    # The smallest segment Kafka 4 allows (KIP-1030), under a larger max.message.bytes.
    create_topic(raw, topic, segment_bytes=str(1 << 20), max_message_bytes=str(4 << 20))
    assert produce(raw, topic, {0: batch(1, value_size=500_000)})[0].error_code is E.none
    big = produce(raw, topic, {0: batch(1, value_size=2 << 20)})[0]
    assert big.error_code is E.record_list_too_large
    assert list_offsets(raw, topic, {0: -1})[0].offset == 1


def test_record_level_topic_rules(broker: BrokerProcess, raw: Raw) -> None:
    """Compacted topics refuse records without a key (INVALID_RECORD); timestamp bounds refuse
    CreateTime records too far from the broker's clock (INVALID_TIMESTAMP), compressed too."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    compacted, bounded = unique("cmp"), unique("tsb")
    fs = admin.create_topics([
        NewTopic(compacted, 1, config={"cleanup.policy": "compact",
                                       "max.message.bytes": "1000000"}),
        NewTopic(bounded, 1, config={"message.timestamp.before.max.ms": "60000",
                                     "message.timestamp.after.max.ms": "60000"})])
    for f in fs.values():
        f.result(15)
    now = int(time.time() * 1000)
    keyless = build_batch([NewRecord(value=b"k", key=b"a", timestamp=now),
                           NewRecord(value=b"v", key=None, timestamp=now)], now_ms=now,
                          compression=records.COMPRESSION_GZIP)
    answer = produce(raw, compacted, {0: keyless})[0]
    assert answer.error_code is E.invalid_record
    assert answer.error_message.startswith("Compacted topic cannot accept message without key")
    assert produce(raw, compacted, {0: batch(2)})[0].error_code is E.none
    for ts in (now - 3_600_000, now + 3_600_000):
        late = build_batch([NewRecord(value=b"v", key=b"k", timestamp=now),
                            NewRecord(value=b"v", key=b"k", timestamp=ts)], now_ms=now,
                           compression=records.COMPRESSION_LZ4)
        assert produce(raw, bounded, {0: late})[0].error_code is E.invalid_timestamp
    fresh = build_batch([NewRecord(value=b"v", timestamp=now)], now_ms=now)
    assert produce(raw, bounded, {0: fresh})[0].base_offset == 0
    # Record-level checks run on the reactor: a batch of more records than that is refused.
    from kmqkafka.kafka.produce import MAX_CHECKED_RECORDS

    many = build_batch([NewRecord(value=b"", key=b"k")] * (MAX_CHECKED_RECORDS + 1), now_ms=now,
                       compression=records.COMPRESSION_ZSTD)
    started = time.monotonic()
    assert produce(raw, compacted, {0: many})[0].error_code is E.invalid_record
    assert time.monotonic() - started < 2


def test_a_topic_codec_recompresses_what_producers_send(broker: BrokerProcess,
                                                        raw: Raw) -> None:
    """Kafka's LogValidator stores a batch in the topic's compression.type when that names a
    codec (``uncompressed``: none), keeping the producer's id, epoch and sequence; with
    ``producer`` (the default) the batch stays as sent. A real idempotent client's lz4
    batches are read back in the topic's codec with every record intact."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    codecs = {"gzip": records.COMPRESSION_GZIP, "zstd": records.COMPRESSION_ZSTD,
              "uncompressed": records.COMPRESSION_NONE, "producer": records.COMPRESSION_LZ4}
    topics = {unique(f"codec-{name}"): name for name in codecs}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    fs = admin.create_topics([
        NewTopic(t, 1, config={"compression.type": name, "compression.zstd.level": "1"})
        for t, name in topics.items()])
    for f in fs.values():
        f.result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4",
                  "enable.idempotence": True, "linger.ms": 20})
    for t in topics:
        for i in range(30):
            p.produce(t, value=b"value-%d" % i * 8, key=b"k%d" % i)
    assert p.flush(15) == 0
    for t, name in topics.items():
        data = bytes(parts_of(fetch(raw, t, {0: 0}))[0].records or b"")
        batches = records.split_batches(data)
        assert {h.compression for _pos, h in batches} == {codecs[name]}, name
        assert all(h.producer_id >= 0 and h.base_sequence >= 0 for _pos, h in batches)
        values = [r.value for pos, _h in batches for r in records.iter_records(data, pos)]
        assert values == [b"value-%d" % i * 8 for i in range(30)], name
    gzip_topic = next(t for t, name in topics.items() if name == "gzip")
    plain = batch(3)
    answer = produce(raw, gzip_topic, {0: plain})[0]
    assert (answer.error_code, answer.base_offset) == (E.none, 30)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_large_produce_requests_are_stored_exactly_in_every_codec(broker: BrokerProcess,
                                                                  raw: Raw, codec: str) -> None:
    """Requests of 256 KiB and more keep their batches in the buffer they were read into
    (``net/fast_requests``): a real client's large batches, in every codec, to a plain topic,
    to one that recompresses them, and to a compacted one (whose records are decoded to check
    keys), are read back byte for byte."""
    import os as _os

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    big = {"max.message.bytes": str(4 << 20)}  # this module's broker allows 64 KiB
    configs = {"plain": big, "recompressed": {**big, "compression.type": "gzip"},
               "compacted": {**big, "cleanup.policy": "compact"}}
    topics = {kind: unique(f"large-{codec}-{kind}") for kind in configs}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topics[k], 2, config=c)
                                  for k, c in configs.items()]).values():
        f.result(15)
    # Random values do not compress: every codec's requests stay above 256 KiB.
    values = [_os.urandom(1024) for _ in range(1200)]
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec,
                  "linger.ms": 200, "batch.size": 900_000, "acks": "all",
                  "retries": 0})  # a refused batch must fail, not come back in a smaller request
    failed: list[Any] = []
    for t in topics.values():
        for i, v in enumerate(values):
            p.produce(t, value=v, key=b"k%d" % i, partition=i % 2,
                      on_delivery=lambda err, _m: err is not None and failed.append(err))
    assert p.flush(30) == 0 and failed == []
    for kind, t in topics.items():
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"),
                      "enable.auto.commit": False})
        c.assign([TopicPartition(t, part, 0) for part in (0, 1)])
        got: dict[bytes, bytes] = {}
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert m.error() is None, m.error()
                got[m.key()] = m.value()
        c.close()
        assert got == {b"k%d" % i: v for i, v in enumerate(values)}, kind


def test_a_compression_bomb_to_a_compacted_topic_is_refused(broker: BrokerProcess,
                                                             raw: Raw) -> None:
    """A compacted topic's records are decoded to check keys: a few KiB of zstd that would
    expand past ``records.DECOMPRESSED_MAX`` is CORRUPT_MESSAGE, and the broker carries on."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = unique("bomb")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, config={"cleanup.policy": "compact"})]
                        )[topic].result(15)
    bomb = build_batch([NewRecord(value=bytes(records.DECOMPRESSED_MAX), key=b"k")],
                       now_ms=1, compression=records.COMPRESSION_ZSTD)
    assert len(bomb) < MAX_MESSAGE_BYTES
    answer = produce(raw, topic, {0: bomb})[0]
    assert answer.error_code is E.corrupt_message
    assert produce(raw, topic, {0: batch()})[0].base_offset == 0


def test_many_bombs_in_one_request_do_not_hold_other_clients(broker: BrokerProcess,
                                                             raw: Raw) -> None:
    """Batches whose records must be decoded are decompressed on a thread: one request of
    bombs (each up to ``DECOMPRESSED_MAX`` of work) held every other client for seconds when
    they were decoded on the reactor."""
    import threading

    topic = unique("bombs")
    create_topic(raw, topic, partitions=24, cleanup_policy="compact")
    bomb = build_batch([NewRecord(value=bytes(records.DECOMPRESSED_MAX), key=b"k")],
                       now_ms=1, compression=records.COMPRESSION_ZSTD)
    answers: dict[int, Any] = {}

    def send_bombs() -> None:
        other = Raw(broker)
        try:
            answers.update(produce(other, topic, {p: bomb for p in range(24)}))
        finally:
            other.close()

    sender = threading.Thread(target=send_bombs)
    sender.start()
    slowest = 0.0
    deadline = time.monotonic() + 60
    while sender.is_alive() and time.monotonic() < deadline:
        started = time.monotonic()
        raw.call(18, 0)  # ApiVersions
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.02)
    sender.join(60)
    assert {a.error_code for a in answers.values()} == {E.corrupt_message}
    assert len(answers) == 24
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"


def test_a_batch_behind_one_being_decoded_keeps_its_place(raw: Raw) -> None:
    """A compressed batch to a compacted topic is decoded off the reactor; an uncompressed
    batch pipelined right behind it to the same partition is appended after it."""
    topic = unique("order")
    create_topic(raw, topic, cleanup_policy="compact")
    first = batch(2000, value_size=20_000, compression=records.COMPRESSION_GZIP)
    fields = dict(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5))
    sent = []
    for blob in (first, batch(1)):
        sent.append(raw.send(0, 9, **fields, topic_data=[{"name": topic, "partition_data": [
            {"index": 0, "records": blob}]}]))
    got = [raw.receive(0, 9) for _ in sent]
    assert [c for c, _ in got] == sent
    parts = [r.responses[0].partition_responses[0] for _, r in got]
    assert [p.error_code for p in parts] == [E.none, E.none], parts
    offsets = [p.base_offset for p in parts]
    assert offsets == [0, 2000]


def test_one_bad_partition_never_fails_the_others(raw: Raw) -> None:
    topic = unique("mixed")
    produce(raw, topic, {0: batch()})  # auto-create (one partition)
    corrupt = bytearray(batch())
    corrupt[-1] ^= 0xFF
    old_magic = bytearray(batch())
    old_magic[16] = 1
    answers = produce(raw, topic, {0: bytes(corrupt), 1: batch(), 7: batch()})
    assert answers[0].error_code is E.corrupt_message
    assert answers[1].error_code is E.unknown_topic_or_partition
    assert answers[7].error_code is E.unknown_topic_or_partition
    answers = produce(raw, topic, {0: bytes(old_magic)})
    assert answers[0].error_code is E.invalid_record  # v3+ carries magic 2 only
    assert list_offsets(raw, topic, {0: -1})[0].offset == 1
    answers = produce(raw, topic, {0: batch()})
    assert answers[0].error_code is E.none and answers[0].base_offset == 1


def test_topic_name_with_tilde_is_invalid(raw: Raw) -> None:
    answers = produce(raw, "a~b", {0: batch()})
    assert answers[0].error_code is E.invalid_topic_exception


def test_message_size_limit_on_both_sides(raw: Raw) -> None:
    topic = unique("size")

    def sized(total: int) -> bytes:
        """The largest one-record batch of at most ``total`` bytes."""
        size = total - len(batch(1, value_size=0))
        while len(b := batch(1, value_size=size)) > total:  # varint lengths grow too
            size -= 1
        return b

    exact, over = sized(MAX_MESSAGE_BYTES), sized(MAX_MESSAGE_BYTES + 1)
    assert (len(exact), len(over)) == (MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1)
    assert produce(raw, topic, {0: exact})[0].error_code is E.none
    refused = produce(raw, topic, {0: over})[0]
    # Kafka's RecordTooLargeException: neither a message nor the log start offset.
    assert (refused.error_code, refused.error_message, refused.log_start_offset) == (
        E.message_too_large, None, -1)


def test_a_client_sees_kafkas_own_error_for_an_oversized_batch(broker: BrokerProcess,
                                                                raw: Raw) -> None:
    """Kafka's ReplicaManager sends an error_message only for refused records, so a client
    reports a refused batch with its own text for the code (kafka-python raises the error
    with no argument), never a broker's sentence."""
    from kafka import KafkaProducer
    from kafka.errors import MessageSizeTooLargeError

    topic = unique("too-large")
    create_topic(raw, topic, max_message_bytes="2000")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0, linger_ms=0,
                             max_request_size=1 << 20, request_timeout_ms=5000)
    try:
        with pytest.raises(MessageSizeTooLargeError) as refused:
            producer.send(topic, value=b"x" * 3000).get(timeout=10)
        assert refused.value.args in ((), (None,)), refused.value.args
        assert producer.send(topic, value=b"small").get(timeout=10).offset == 0
    finally:
        producer.close(timeout=5)


def test_acks_zero_has_no_response_and_bad_acks_are_refused(raw: Raw) -> None:
    topic = unique("acks")
    raw.send(0, 9, transactional_id=None, acks=0, timeout=datetime.timedelta(seconds=5),
             topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch()}]}])
    answers = produce(raw, topic, {0: batch()}, acks=1)  # the next response is this one's
    assert answers[0].error_code is E.none and answers[0].base_offset == 1
    assert produce(raw, topic, {0: batch()}, acks=2)[0].error_code is E.invalid_required_acks


def test_a_failed_acks_zero_produce_closes_the_connection(broker: BrokerProcess) -> None:
    """With no response to carry the error, Kafka closes the connection so the client
    notices; the broker goes on serving new connections."""
    topic = unique("acks0")
    r = Raw(broker)
    try:
        produce(r, topic, {0: batch()})
        r.send(0, 9, transactional_id=None, acks=0, timeout=datetime.timedelta(seconds=5),
               topic_data=[{"name": topic, "partition_data": [{"index": 5,
                                                               "records": batch()}]}])
        with pytest.raises((ConnectionError, struct.error, OSError)):
            produce(r, topic, {0: batch()})
    finally:
        r.close()
    other = Raw(broker)
    try:
        assert produce(other, topic, {0: batch()})[0].base_offset == 1
    finally:
        other.close()


def test_produce_v13_addresses_topics_by_id(raw: Raw) -> None:
    topic = unique("byid")
    produce(raw, topic, {0: batch()})
    meta = raw.call(3, 12, topics=[{"name": topic, "topic_id": uuid.UUID(int=0)}],
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    topic_id = meta.topics[0].topic_id
    response = raw.call(0, 13, transactional_id=None, acks=-1,
                        timeout=datetime.timedelta(seconds=5), topic_data=[
                            {"topic_id": topic_id,
                             "partition_data": [{"index": 0, "records": batch()}]},
                            {"topic_id": uuid.uuid4(),
                             "partition_data": [{"index": 0, "records": batch()}]}])
    ok, missing = response.responses
    assert ok.topic_id == topic_id and ok.partition_responses[0].base_offset == 1
    assert missing.partition_responses[0].error_code is E.unknown_topic_id
    got = fetch(raw, topic, {0: 1}, version=17, topic_id=topic_id)
    assert got.responses[0].topic_id == topic_id
    assert parts_of(got)[0].high_watermark == 2
    # Kafka: UNKNOWN_TOPIC_ID only for an id it does not know; a partition the topic lacks is
    # UNKNOWN_TOPIC_OR_PARTITION.
    lacking = fetch(raw, topic, {5: 0}, version=17, topic_id=topic_id)
    assert parts_of(lacking)[5].error_code is E.unknown_topic_or_partition
    unknown = fetch(raw, topic, {0: 0}, version=17, topic_id=uuid.uuid4())
    assert parts_of(unknown)[0].error_code is E.unknown_topic_id


# --- Fetch ------------------------------------------------------------------------------------


def test_fetch_offsets_out_of_range_and_at_the_end(raw: Raw) -> None:
    topic = unique("range")
    produce(raw, topic, {0: batch(3)})
    assert parts_of(fetch(raw, topic, {0: 4}))[0].error_code is E.offset_out_of_range
    assert parts_of(fetch(raw, topic, {0: -1}))[0].error_code is E.offset_out_of_range
    at_end = parts_of(fetch(raw, topic, {0: 3}))[0]
    assert at_end.error_code is E.none and at_end.high_watermark == 3 and not at_end.records
    middle = parts_of(fetch(raw, topic, {0: 1}))[0]
    # The whole batch holding offset 1 comes back; the client skips the records before it.
    assert records.read_header(middle.records).base_offset == 0
    unknown = parts_of(fetch(raw, unique("nope"), {0: 0}))[0]
    assert unknown.error_code is E.unknown_topic_or_partition
    assert parts_of(fetch(raw, topic, {3: 0}))[3].error_code is E.unknown_topic_or_partition



def test_a_partition_named_twice_in_a_fetch_is_answered_once_for_its_last_entry(
        raw: Raw) -> None:
    """Kafka keys a Fetch's partitions in a map: a sessionless Fetch naming one twice gets one
    answer for it, at its first place, read from the offset of its last entry."""
    topic, other = unique("twice"), unique("twice-other")
    for _ in range(3):
        produce(raw, topic, {0: batch()})
    produce(raw, other, {0: batch()})
    entry = {"partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
             "last_fetched_epoch": -1, "log_start_offset": -1}
    resp = raw.call(1, 12, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1,
                    max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                    topics=[{"topic": topic, "partitions": [
                        {"partition": 0, "fetch_offset": 0, **entry}]},
                        {"topic": other, "partitions": [
                            {"partition": 0, "fetch_offset": 0, **entry}]},
                        {"topic": topic, "partitions": [
                            {"partition": 0, "fetch_offset": 2, **entry}]}],
                    forgotten_topics_data=[], rack_id="")
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in resp.responses] == [
        (topic, [0]), (other, [0])]
    answer = resp.responses[0].partitions[0]
    assert records.read_header(answer.records).base_offset == 2
    assert len(answer.records) == len(batch())

def test_fetch_limits_return_at_least_one_batch_for_the_first_partition_only(raw: Raw) -> None:
    a, b = unique("lim-a"), unique("lim-b")
    big = batch(1, value_size=4000)
    produce(raw, a, {0: big})
    produce(raw, a, {0: batch()})
    produce(raw, b, {0: big})
    resp = raw.call(1, 11, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1,
                    max_bytes=1000, isolation_level=0, session_id=0, session_epoch=-1,
                    topics=[{"topic": t, "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100,
                         "current_leader_epoch": -1, "log_start_offset": -1}]} for t in (a, b)],
                    forgotten_topics_data=[], rack_id="")
    first, second = (t.partitions[0] for t in resp.responses)
    assert len(first.records) == len(big)  # one whole batch despite both limits
    assert second.error_code is E.none and len(second.records) == 0
    assert second.high_watermark == 1
    # Within limits: both batches of `a` fit in partition_max_bytes.
    both = parts_of(fetch(raw, a, {0: 0}, partition_max_bytes=len(big) + 200))[0]
    assert len(both.records) == len(big) + len(batch())
    only = parts_of(fetch(raw, a, {0: 0}, partition_max_bytes=len(big) + 10))[0]
    assert len(only.records) == len(big)


def test_large_fetch_responses_reach_the_client(raw: Raw) -> None:
    """Batches far above the encoder's small-write threshold, alone and several together."""
    topic = unique("large")
    sent = [batch(1, value_size=60_000) for _ in range(3)]
    for b in sent:
        produce(raw, topic, {0: b})
    one = parts_of(fetch(raw, topic, {0: 0}, partition_max_bytes=70_000))[0]
    assert len(one.records) == len(sent[0])
    three = parts_of(fetch(raw, topic, {0: 0}))[0]
    assert len(three.records) == sum(map(len, sent))
    assert [h.base_offset for _p, h in records.split_batches(three.records)] == [0, 1, 2]


def test_a_partition_adds_about_the_soft_cap_per_response(raw: Raw) -> None:
    """A client allowing 50 MiB per partition gets ~PARTITION_SOFT_CAP per response (whole
    batches, in order, nothing skipped); a batch larger than the cap still comes whole, also
    behind another partition's data."""
    from kmqkafka.kafka.fetch import PARTITION_SOFT_CAP

    def create_big(name: str) -> None:  # this module's broker caps batches at 64 KiB
        r = raw.call(19, 5, timeout=datetime.timedelta(seconds=10), validate_only=False,
                     topics=[{"name": name, "num_partitions": 1, "replication_factor": 1,
                              "assignments": [], "configs": [
                                  {"name": "max.message.bytes", "value": str(8 << 20)}]}])
        assert r.topics[0].error_code is E.none

    topic = unique("softcap")
    create_big(topic)
    sent = [batch(1, value_size=400_000) for _ in range(12)]  # ~4.8 MB in all
    for b in sent:
        produce(raw, topic, {0: b})
    got, offset = [], 0
    while offset < len(sent):
        part = parts_of(fetch(raw, topic, {0: offset}, partition_max_bytes=50 << 20))[0]
        assert 0 < len(part.records) <= PARTITION_SOFT_CAP
        for _p, header in records.split_batches(part.records):
            got.append(header.base_offset)
        offset = got[-1] + 1
    assert got == list(range(len(sent)))

    small, huge = unique("softcap-small"), unique("softcap-huge")
    create_big(huge)
    produce(raw, small, {0: batch()})
    big = batch(1, value_size=PARTITION_SOFT_CAP + 100_000)
    assert produce(raw, huge, {0: big})[0].error_code is E.none
    resp = raw.call(1, 11, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1,
                    max_bytes=50 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                    topics=[{"topic": t, "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 10 << 20,
                         "current_leader_epoch": -1, "log_start_offset": -1}]}
                        for t in (small, huge)],
                    forgotten_topics_data=[], rack_id="")
    first, second = (t.partitions[0] for t in resp.responses)
    assert len(first.records) == len(batch()) and len(second.records) == len(big)

    # A min_bytes above the cap lifts it: answered at once from one partition, not at max_wait.
    started = time.monotonic()
    part = parts_of(fetch(raw, topic, {0: 0}, partition_max_bytes=50 << 20,
                          min_bytes=PARTITION_SOFT_CAP * 2, max_wait_ms=5000))[0]
    assert len(part.records) == sum(map(len, sent))
    assert time.monotonic() - started < 2.5


def test_min_bytes_just_under_the_soft_cap_answers_at_once(raw: Raw) -> None:
    """The per-partition soft cap must not park a fetch whose min_bytes the stored data
    already meets: 160 batches of ~60 KB stored, min_bytes = 2 MiB, max_wait 5 s."""
    topic = unique("capwait")
    for _ in range(160):
        assert produce(raw, topic, {0: batch(1, value_size=MAX_MESSAGE_BYTES - 4000)}
                       )[0].error_code is E.none
    started = time.monotonic()
    p = parts_of(fetch(raw, topic, {0: 0}, max_wait_ms=5000, min_bytes=2 << 20,
                       partition_max_bytes=50 << 20))[0]
    assert time.monotonic() - started < 2.5
    assert p.error_code is E.none and len(p.records) >= 2 << 20


def test_idle_long_poll_returns_after_max_wait(raw: Raw) -> None:
    topic = unique("idle")
    produce(raw, topic, {0: batch()})
    started = time.monotonic()
    p = parts_of(fetch(raw, topic, {0: 1}, max_wait_ms=300))[0]
    elapsed = time.monotonic() - started
    assert p.error_code is E.none and not p.records
    assert 0.28 <= elapsed < 0.6, elapsed


def test_parked_fetch_wakes_as_soon_as_data_arrives(broker: BrokerProcess, raw: Raw) -> None:
    topic = unique("wake")
    produce(raw, topic, {0: batch()})
    producer = Raw(broker)
    try:
        latencies = []
        for i in range(20):
            raw.send(1, 11, replica_id=-1, max_wait=datetime.timedelta(seconds=5), min_bytes=1,
                     max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                     topics=[{"topic": topic, "partitions": [
                         {"partition": 0, "fetch_offset": 1 + i, "partition_max_bytes": 1 << 20,
                          "current_leader_epoch": -1, "log_start_offset": -1}]}],
                     forgotten_topics_data=[], rack_id="")
            time.sleep(0.02)  # let the fetch park
            started = time.monotonic()
            produce(producer, topic, {0: batch()}, acks=1)
            _corr, resp = raw.receive(1, 11)
            latencies.append(time.monotonic() - started)
            assert parts_of(resp)[0].records
        latencies.sort()
        print(f"fetch wake latency p50={latencies[10] * 1000:.2f}ms "
              f"max={latencies[-1] * 1000:.2f}ms")
        assert latencies[10] < 0.05 and latencies[-1] < 0.5
    finally:
        producer.close()


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_a_produce_whose_client_hangs_up_is_still_appended(broker: BrokerProcess,
                                                           raw: Raw, acks: int) -> None:
    """Kafka processes every request it has read in full; only the answer is lost."""
    topic = unique("hangup")
    produce(raw, topic, {0: batch()})  # the topic exists before the hang-ups
    for _ in range(10):
        r = Raw(broker)
        r.send(0, 9, transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
               topic_data=[{"name": topic, "partition_data": [{"index": 0,
                                                               "records": batch(2)}]}])
        r.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if list_offsets(raw, topic, {0: -1})[0].offset == 21:
            break
        time.sleep(0.1)
    assert list_offsets(raw, topic, {0: -1})[0].offset == 21
    assert "Traceback" not in broker.log()


def test_closing_the_connection_cancels_the_parked_fetch(broker: BrokerProcess) -> None:
    topic = unique("gone")
    r = Raw(broker)
    produce(r, topic, {0: batch()})
    r.send(1, 11, replica_id=-1, max_wait=datetime.timedelta(seconds=20), min_bytes=1,
           max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
           topics=[{"topic": topic, "partitions": [
               {"partition": 0, "fetch_offset": 1, "partition_max_bytes": 1 << 20,
                "current_leader_epoch": -1, "log_start_offset": -1}]}],
           forgotten_topics_data=[], rack_id="")
    time.sleep(0.1)
    r.close()
    time.sleep(0.1)
    other = Raw(broker)
    try:  # the broker is fine and the data arrives for others
        produce(other, topic, {0: batch()})
        assert parts_of(fetch(other, topic, {0: 1}))[0].records
    finally:
        other.close()
    assert "Unhandled error" not in broker.log()


def test_fetch_sessions_answer_only_what_changed(raw: Raw) -> None:
    a, b = unique("sess-a"), unique("sess-b")
    produce(raw, a, {0: batch()})
    produce(raw, b, {0: batch()})
    both = [{"topic": t, "partitions": [{"partition": 0, "fetch_offset": 1,
                                          "partition_max_bytes": 1 << 20,
                                          "current_leader_epoch": -1, "log_start_offset": -1}]}
            for t in (a, b)]
    common = dict(replica_id=-1, min_bytes=1, max_bytes=1 << 20, isolation_level=0, rack_id="")
    full = raw.call(1, 11, max_wait=datetime.timedelta(0), session_id=0, session_epoch=0,
                    topics=both, forgotten_topics_data=[], **common)
    sid = full.session_id
    assert sid != 0 and full.error_code is E.none and len(full.responses) == 2
    # Nothing new: an incremental fetch with no partitions parks, then answers nothing.
    quiet = raw.call(1, 11, max_wait=datetime.timedelta(milliseconds=50), session_id=sid,
                     session_epoch=1, topics=[], forgotten_topics_data=[], **common)
    assert quiet.session_id == sid and quiet.responses == ()
    # New data on b only: b (from its cached offset) is answered, a is not.
    started = time.monotonic()
    raw.send(1, 11, max_wait=datetime.timedelta(seconds=5), session_id=sid, session_epoch=2,
             topics=[], forgotten_topics_data=[], **common)
    other = Raw.__new__(Raw)
    other.sock = socket.create_connection(raw.sock.getpeername(), timeout=10)
    other.correlation = 0
    try:
        produce(other, b, {0: batch()})
    finally:
        other.close()
    _c, news = raw.receive(1, 11)
    assert time.monotonic() - started < 2
    assert [t.topic for t in news.responses] == [b]
    assert news.responses[0].partitions[0].high_watermark == 2
    # Forget a; wrong epoch; unknown session.
    forget = raw.call(1, 11, max_wait=datetime.timedelta(0), session_id=sid, session_epoch=3,
                      topics=[], forgotten_topics_data=[{"topic": a, "partitions": [0]}], **common)
    assert forget.error_code is E.none
    stale = raw.call(1, 11, max_wait=datetime.timedelta(0), session_id=sid, session_epoch=3,
                     topics=[], forgotten_topics_data=[], **common)
    assert stale.error_code is E.invalid_fetch_session_epoch and stale.responses == ()
    lost = raw.call(1, 11, max_wait=datetime.timedelta(0), session_id=sid + 1 if sid < 2**31 - 1
                    else 1, session_epoch=1, topics=[], forgotten_topics_data=[], **common)
    assert lost.error_code is E.fetch_session_id_not_found
    closed = raw.call(1, 11, max_wait=datetime.timedelta(0), session_id=sid, session_epoch=-1,
                      topics=both, forgotten_topics_data=[], **common)
    assert closed.session_id == 0 and len(closed.responses) == 2


def test_old_fetch_versions_still_work(raw: Raw) -> None:
    topic = unique("v4")
    produce(raw, topic, {0: batch(2)}, version=3)
    p = parts_of(fetch(raw, topic, {0: 0}, version=4))[0]
    assert p.error_code is E.none and p.high_watermark == 2 and p.records


# --- ListOffsets / OffsetForLeaderEpoch ---------------------------------------------------------


def test_list_offsets_earliest_latest_timestamp_and_max(raw: Raw) -> None:
    topic = unique("lo")
    # Timestamps 1000, 1001, 1002 | 5000 | 2000, 2001 — max is in the middle.
    produce(raw, topic, {0: batch(3, ts=1000)})
    produce(raw, topic, {0: batch(1, ts=5000)})
    produce(raw, topic, {0: batch(2, ts=2000)})
    got = list_offsets(raw, topic, {0: -2})[0]
    assert (got.error_code, got.offset, got.timestamp) == (E.none, 0, -1)
    assert list_offsets(raw, topic, {0: -1})[0].offset == 6
    got = list_offsets(raw, topic, {0: 1001})[0]
    assert (got.offset, got.timestamp) == (1, 1001)
    got = list_offsets(raw, topic, {0: 1500})[0]
    assert (got.offset, got.timestamp) == (3, 5000)
    got = list_offsets(raw, topic, {0: 6000})[0]
    assert (got.error_code, got.offset, got.timestamp) == (E.none, -1, -1)
    got = list_offsets(raw, topic, {0: -3})[0]
    assert (got.offset, got.timestamp) == (3, 5000)
    assert list_offsets(raw, topic, {4: -1})[4].error_code is E.unknown_topic_or_partition
    got = list_offsets(raw, topic, {0: -1}, version=1)[0]
    assert got.offset == 6
    empty = unique("lo-empty")
    produce(raw, empty, {0: None})  # auto-creates; the empty record set itself is refused
    assert list_offsets(raw, empty, {0: -3})[0].offset == -1
    assert list_offsets(raw, empty, {0: -1})[0].offset == 0


def test_list_offsets_leader_epoch_checks(raw: Raw) -> None:
    topic = unique("lo-epoch")
    produce(raw, topic, {0: batch()})
    response = raw.call(2, 7, replica_id=-1, isolation_level=0, topics=[
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1,
                                        "current_leader_epoch": 3}]}])
    assert response.topics[0].partitions[0].error_code is E.unknown_leader_epoch


def test_list_offsets_partition_named_twice_is_invalid_everywhere(raw: Raw) -> None:
    topic = unique("lo-dup")
    produce(raw, topic, {0: batch()})
    ask = {"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1}
    response = raw.call(2, 7, replica_id=-1, isolation_level=0, topics=[
        {"name": topic, "partitions": [ask]}, {"name": topic, "partitions": [ask]}])
    assert [p.error_code for t in response.topics for p in t.partitions] == [
        E.invalid_request, E.invalid_request]


def test_offset_for_leader_epoch(raw: Raw) -> None:
    topic = unique("ofle")
    produce(raw, topic, {0: batch(4)})

    def ask(leader_epoch: int, current: int = -1, partition: int = 0) -> Any:
        response = raw.call(23, 4, replica_id=-1, topics=[
            {"topic": topic, "partitions": [{"partition": partition,
                                             "current_leader_epoch": current,
                                             "leader_epoch": leader_epoch}]}])
        return response.topics[0].partitions[0]

    got = ask(0, current=0)
    assert (got.error_code, got.leader_epoch, got.end_offset) == (E.none, 0, 4)
    got = ask(2)
    assert (got.leader_epoch, got.end_offset) == (-1, -1)
    assert ask(0, current=1).error_code is E.unknown_leader_epoch
    assert ask(0, partition=9).error_code is E.unknown_topic_or_partition


# --- topic configs, partitions, producer ids, metrics -----------------------------------------


def create_topic(raw: Raw, name: str, partitions: int = 1, **configs: str) -> None:
    response = raw.call(19, 5, topics=[{
        "name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
        "configs": [{"name": k.replace("_", "."), "value": v} for k, v in configs.items()]}],
        timeout=datetime.timedelta(seconds=5), validate_only=False)
    assert response.topics[0].error_code is E.none, response


def test_log_append_time_topic_rewrites_the_batch_timestamp(raw: Raw) -> None:
    topic = unique("lat")
    create_topic(raw, topic, message_timestamp_type="LogAppendTime")
    before = time.time() * 1000
    (r,) = produce(raw, topic, {0: batch(3, ts=1000)}).values()
    after = time.time() * 1000
    assert r.error_code is E.none and r.log_append_time is not None
    append_ms = r.log_append_time.timestamp() * 1000
    assert before - 5 <= append_ms <= after + 5
    stored = parts_of(fetch(raw, topic, {0: 0}))[0].records
    header = records.validate_batch(stored)  # the rewritten CRC is right
    assert header.attributes & records.TIMESTAMP_TYPE_LOG_APPEND
    assert header.max_timestamp == int(append_ms)
    # CreateTime topics answer log_append_time -1 (decoded as None).
    assert produce(raw, unique("ct"), {0: batch()})[0].log_append_time is None


def test_topic_max_message_bytes_overrides_the_broker_limit(raw: Raw) -> None:
    topic = unique("topic-limit")
    create_topic(raw, topic, max_message_bytes="2000")
    assert produce(raw, topic, {0: batch(1, value_size=1500)})[0].error_code is E.none
    assert produce(raw, topic, {0: batch(1, value_size=2500)})[0].error_code is E.message_too_large


def test_partitions_are_independent_offset_spaces(raw: Raw) -> None:
    topic = unique("parts")
    create_topic(raw, topic, partitions=3)
    answers = produce(raw, topic, {0: batch(2), 2: batch(5)})
    assert (answers[0].base_offset, answers[2].base_offset) == (0, 0)
    answers = produce(raw, topic, {2: batch(1), 1: batch(1)})
    assert (answers[2].base_offset, answers[1].base_offset) == (5, 0)
    got = parts_of(fetch(raw, topic, {0: 0, 1: 0, 2: 0}))
    assert [got[p].high_watermark for p in range(3)] == [2, 1, 6]


def test_batches_with_a_producer_id_are_stored_as_sent(raw: Raw) -> None:
    topic = unique("pid")
    b = build_batch([NewRecord(value=b"x")], now_ms=1, producer_id=42, producer_epoch=0,
                    base_sequence=0)
    assert produce(raw, topic, {0: b})[0].error_code is E.none
    stored = parts_of(fetch(raw, topic, {0: 0}))[0].records
    header = records.read_header(stored)
    assert (header.producer_id, header.base_sequence) == (42, 0)


def test_bytes_in_and_out_are_counted_per_topic(broker: BrokerProcess, raw: Raw) -> None:
    from conftest import http_get

    topic = unique("metrics")
    b = batch(4)
    produce(raw, topic, {0: b})
    fetch(raw, topic, {0: 0})
    text = http_get(broker.http_port, "/metrics").decode()

    def value(metric: str) -> float:
        for line in text.splitlines():
            if line.startswith(f'{metric}{{topic="{topic}"}}'):
                return float(line.split()[-1])
        raise AssertionError(f"{metric} for {topic} missing")

    assert value("kmqkafka_kafka_topic_bytes_in_total") == len(b)
    assert value("kmqkafka_kafka_topic_bytes_out_total") == len(b)


# --- in process, on a fake clock: parking, waking, cancelling -----------------------------------


class InProcess:
    """The Fetch/Produce handlers over a real store on a ``task.Clock`` (no sockets, no threads)."""

    def __init__(self, tmp_path: Path) -> None:
        from prometheus_client import CollectorRegistry
        from twisted.internet.task import Clock

        from kmqkafka.config import Settings
        from kmqkafka.kafka.context import Broker
        from kmqkafka.kafka.topics import TopicCatalog
        from kmqkafka.metrics import Metrics
        from kmqkafka.store.store import ChannelStore

        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.store = ChannelStore(tmp_path / "data", self.clock, threaded_io=False)
        self.store.start()
        self.broker = Broker(settings=Settings(), reactor=self.clock,
                             metrics=Metrics(CollectorRegistry()), store=self.store,
                             extras={"topics": TopicCatalog(self.store)})

    def ctx(self, api_key: int, version: int) -> Any:
        from kmqkafka.dispatch import Dispatcher
        from kmqkafka.kafka.context import RequestContext

        return RequestContext(api_key=api_key, api_version=version, correlation_id=1,
                              client_id="t", response_type=Dispatcher().response_type(
                                  api_key, version), broker=self.broker)

    def produce(self, topic: str, data: bytes, flush: bool = True) -> None:
        from kmqkafka.kafka import produce as produce_api

        request = _build(load_request_schema(0, 9), dict(
            transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=1),
            topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": data}]}]))
        out: list[Any] = []
        produce_api.handle(request, self.ctx(0, 9)).addBoth(out.append)
        if flush:
            self.clock.advance(0)  # group commit
        assert out and out[0].responses[0].partition_responses[0].error_code is E.none

    def fetch(self, topic: str, offset: int, max_wait_ms: int) -> Any:
        from kmqkafka.kafka import fetch as fetch_api

        request = _build(load_request_schema(1, 11), dict(
            replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1,
            max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
                 "current_leader_epoch": -1, "log_start_offset": -1}]}],
            forgotten_topics_data=[], rack_id=""))
        return fetch_api.handle(request, self.ctx(1, 11))


def test_parked_fetch_times_out_on_the_clock(tmp_path: Path) -> None:
    env = InProcess(tmp_path)
    env.produce("t", batch())
    d = env.fetch("t", 1, max_wait_ms=500)
    out: list[Any] = []
    d.addCallback(out.append)
    env.clock.advance(0.499)
    assert out == [] and len(env.store.waiters) == 1
    env.clock.advance(0.001)
    assert out and not parts_of(out[0])[0].records and len(env.store.waiters) == 0


def test_a_parked_fetch_that_times_out_is_answered_without_reading_again(
        tmp_path: Path) -> None:
    """Nothing it watched moved, so the answer is the read it parked with: an idle consumer
    on thousands of partitions paid for every one twice per fetch."""
    env = InProcess(tmp_path)
    env.produce("t", batch())
    reads: list[str] = []
    original = env.store.read
    env.store.read = lambda channel, *a, **kw: reads.append(channel) or original(channel, *a, **kw)
    out: list[Any] = []
    env.fetch("t", 1, max_wait_ms=500).addCallback(out.append)
    assert len(reads) == 1
    env.clock.advance(0.5)
    part = parts_of(out[0])[0]
    assert len(reads) == 1 and not part.records and part.high_watermark == 1
    # Woken by data, it reads again (and answers with it).
    out.clear()
    env.fetch("t", 1, max_wait_ms=500).addCallback(out.append)
    env.produce("t", batch(2))
    part = parts_of(out[0])[0]
    assert len(reads) == 3 and part.records and part.high_watermark == 3


def test_parked_fetch_wakes_on_the_group_commit_not_before(tmp_path: Path) -> None:
    env = InProcess(tmp_path)
    env.produce("t", batch())
    out: list[Any] = []
    env.fetch("t", 1, max_wait_ms=500).addCallback(out.append)
    env.produce("t", batch(2), flush=False)  # acks=1: answered from the page cache
    assert out == []  # not durable yet, so not visible
    env.clock.advance(0)  # the group commit
    assert out and parts_of(out[0])[0].high_watermark == 3
    assert len(records.split_batches(parts_of(out[0])[0].records)) == 1


def test_cancelling_a_parked_fetch_releases_its_waiter(tmp_path: Path) -> None:
    from twisted.internet.defer import CancelledError

    env = InProcess(tmp_path)
    env.produce("t", batch())
    d = env.fetch("t", 1, max_wait_ms=30_000)
    failures: list[Any] = []
    d.addErrback(failures.append)
    assert len(env.store.waiters) == 1
    d.cancel()  # what the protocol does when the connection goes
    assert failures and failures[0].check(CancelledError)
    assert len(env.store.waiters) == 0
    env.clock.advance(31)  # the cancelled wait's timer is gone too: nothing fires
    assert len(failures) == 1


class _Trickle:
    """A socket whose ``sendall`` delivers a request in pieces with pauses, so the broker sees
    a large request's head first and reads the rest as it comes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def sendall(self, data: bytes) -> None:
        for start in range(0, len(data), 150_000):
            self.sock.sendall(data[start:start + 150_000])
            time.sleep(0.05)

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def close(self) -> None:
        self.sock.close()


def test_large_requests_arriving_in_pieces_are_read_whole(tmp_path: Path) -> None:
    """A request of 256 KiB or more is read into its own buffer as it arrives (``recvinto``):
    produces of ~800 KB sent in pauses, followed by small requests on the same connection,
    are stored exactly and answered in order."""
    broker = start_broker(tmp_path)
    try:
        _produce_large_in_pieces(broker)
    finally:
        broker.stop()


def _produce_large_in_pieces(broker: BrokerProcess) -> None:
    topic = unique("big")
    raw = Raw(broker)
    raw.sock = _Trickle(raw.sock)
    blobs = [build_batch([NewRecord(value=bytes([65 + b]) * 1000 + b"%06d" % i, key=b"k")
                          for i in range(800)], now_ms=1_700_000_000_000) for b in range(3)]
    answers = [produce(raw, topic, {0: blob})[0] for blob in blobs]
    bases = [a.base_offset for a in answers]
    assert [a.error_code for a in answers] == [E.none] * 3, answers[0]
    assert bases == [0, 800, 1600]
    values: list[bytes | None] = []
    for _ in range(10):
        got = parts_of(fetch(raw, topic, {0: len(values)}))[0]
        stored = bytes(got.records or b"")
        values += [r.value for pos, _h in records.split_batches(stored)
                   for r in records.iter_records(stored, pos)]
        if len(values) >= 2400:
            break
    assert values == [bytes([65 + b]) * 1000 + b"%06d" % i for b in range(3) for i in range(800)]
    assert list_offsets(raw, topic, {0: -1})[0].offset == 2400
    raw.close()


def test_an_append_answered_after_its_topic_was_deleted_is_still_none() -> None:
    """The delete applied between the append and its answer: the records were stored, so
    the partition is NONE (log start unknown). The lookup used to raise, which closed the
    client's connection, and librdkafka resent every request in flight on it (duplicates)."""
    from types import SimpleNamespace

    from kmqkafka.kafka import produce as produce_module
    from kmqkafka.store.errors import ChannelNotFound

    class Deleted:
        def bounds(self, channel: str) -> None:
            raise ChannelNotFound(channel)

    result = SimpleNamespace(duplicate=False, first_sequence=8, max_timestamp=5)
    counted: list[int] = []
    metric = SimpleNamespace(inc=counted.append)
    answer = produce_module._appended(result, 0, "kafka.gone", Deleted(), 1234, metric, 99)
    assert answer == (0, ErrorCode.none, 7, -1, 1234, None)
    assert counted == [99]


def test_gather_answers_in_request_order_whatever_order_the_appends_finish() -> None:
    """A many-partition Produce answers its partitions in the request's order, though their
    appends apply in any order; the answer waits for the last one."""
    from twisted.internet.defer import Deferred

    from kmqkafka.kafka.produce import _gather

    appends = [Deferred() for _ in range(4)]
    got: list[list[str]] = []
    _gather(appends).addCallback(got.append)
    for i in (2, 0, 3):
        appends[i].callback(f"p{i}")
    assert got == []
    appends[1].callback("p1")
    assert got == [["p0", "p1", "p2", "p3"]]
    lone: list[list[str]] = []
    only = Deferred()
    _gather([only]).addCallback(lone.append)
    only.callback("p0")
    assert lone == [["p0"]]


@pytest.mark.parametrize("version", [11, 13])
def test_a_topic_deleted_while_a_fetch_waits_fails_every_partition_of_it(raw: Raw,
                                                                         version: int) -> None:
    """Kafka stops hosting all partitions of a deleted topic at once and completes the
    waiting fetch with UNKNOWN_TOPIC_OR_PARTITION for each (at v13 too: the id resolved when
    the request came). The deletion wakes the fetch as its first channel goes; the answer
    must not read the others as if they still existed."""
    topic = unique("gone")
    create_topic(raw, topic, partitions=3)
    produce(raw, topic, {0: batch()})
    (found,) = raw.call(3, 12, topics=[{"name": topic, "topic_id": None}],
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False).topics
    partitions = [{"partition": p, "fetch_offset": 1 if p == 0 else 0,
                   "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                   "last_fetched_epoch": -1, "log_start_offset": -1} for p in range(3)]
    started = time.monotonic()
    raw.send(1, version, replica_id=-1, max_wait=datetime.timedelta(seconds=10), min_bytes=1,
             max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
             topics=[{"topic": topic, "topic_id": found.topic_id, "partitions": partitions}],
             forgotten_topics_data=[], rack_id="")
    admin = Raw.__new__(Raw)
    admin.sock = socket.create_connection(raw.sock.getpeername(), timeout=10)
    admin.correlation = 0
    try:
        deleted = admin.call(20, 6, topics=[{"name": topic, "topic_id": uuid.UUID(int=0)}],
                             timeout=datetime.timedelta(seconds=5))
        assert deleted.responses[0].error_code is E.none
    finally:
        admin.close()
    _c, answer = raw.receive(1, version)
    assert time.monotonic() - started < 5
    got = parts_of(answer)
    assert sorted(got) == [0, 1, 2]
    for p in got.values():
        assert (p.error_code, p.high_watermark) == (E.unknown_topic_or_partition, -1), p
