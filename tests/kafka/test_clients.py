"""Real client libraries against a real daemon: confluent-kafka, kafka-python, aiokafka, kcat.

Every codec, produced with one library and consumed with every other, must round-trip byte for
byte (keys, values, headers, timestamps, offsets). Also: 50,000 records in order with dense
offsets, ListOffsets/seek through the clients' own APIs, end-to-end latency with client defaults
(printed; run with -s to see the numbers), and broker-side produce errors as clients see them.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import BrokerProcess, start_broker

from kmqkafka import records

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
KCAT = shutil.which("kcat")
N_PER_TOPIC = 25
TS0 = 1_700_000_000_000

# (offset, key, value, headers, timestamp_ms)
Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]


@pytest.fixture(scope="module")
def broker(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


def payloads(tag: str, binary: bool) -> list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]:
    """Records for one topic; kcat-bound ones stay printable (its output is line based)."""
    out = []
    for i in range(N_PER_TOPIC):
        if binary:
            value = bytes((i * 7 + j) % 256 for j in range(50 + i * 13))
            key = b"\x00key\xff" + bytes([i])
        else:
            # Padded so that even a batch of one record shrinks when compressed: librdkafka
            # sends a batch its codec does not shrink uncompressed.
            value = (f"{tag}-value-{i}-" + "x" * (64 + i * 11)).encode()
            key = f"{tag}-key-{i}".encode()
        headers = [("h1", f"v{i}".encode()), ("bin", bytes([i, 0, 255]))] if binary else []
        out.append((key, value, headers, TS0 + i * 1000))
    return out


# --- producers --------------------------------------------------------------------------------


def produce_confluent(bootstrap: str, topic: str, codec: str, rows: list) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20,
                  "acks": "all", "enable.idempotence": True})
    errors: list[Any] = []
    for key, value, headers, ts in rows:
        p.produce(topic, value=value, key=key, headers=headers, timestamp=ts,
                  on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(15) == 0 and not errors, errors


def produce_kafka_python(bootstrap: str, topic: str, codec: str, rows: list) -> None:
    from kafka import KafkaProducer

    # kafka-python 3 is idempotent by default: its batches carry a producer id and sequence.
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all",
                      compression_type=None if codec == "none" else codec)
    try:
        futures = [p.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
                   for k, v, h, ts in rows]
        p.flush(15)
        for f in futures:
            f.get(timeout=5)
    finally:
        p.close(5)


def produce_aiokafka(bootstrap: str, topic: str, codec: str, rows: list) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all",
                             compression_type=None if codec == "none" else codec)
        await p.start()
        try:
            futures = [await p.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
                       for k, v, h, ts in rows]
            await asyncio.wait_for(asyncio.gather(*futures), 15)
        finally:
            await p.stop()

    asyncio.run(run())


def produce_kcat(bootstrap: str, topic: str, codec: str, rows: list) -> None:
    lines = b"".join(k + b"\t" + v + b"\n" for k, v, _h, _ts in rows)
    subprocess.run([KCAT, "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-z", codec,
                    "-X", "linger.ms=20"],
                   input=lines, check=True, timeout=30, capture_output=True)


# --- consumers --------------------------------------------------------------------------------


def consume_confluent(bootstrap: str, topics: dict[str, int]) -> dict[str, list[Row]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    out: dict[str, list[Row]] = {t: [] for t in topics}
    try:
        c.assign([TopicPartition(t, 0, 0) for t in topics])
        deadline = time.monotonic() + 30
        while any(len(out[t]) < n for t, n in topics.items()) and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert m.error() is None, m.error()
                out[m.topic()].append((m.offset(), m.key(), m.value(),
                                       list(m.headers() or []), m.timestamp()[1]))
    finally:
        c.close()
    return out


def consume_kafka_python(bootstrap: str, topics: dict[str, int]) -> dict[str, list[Row]]:
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest", group_id=None)
    out: dict[str, list[Row]] = {t: [] for t in topics}
    try:
        parts = [KTP(t, 0) for t in topics]
        c.assign(parts)
        for tp in parts:
            c.seek(tp, 0)
        deadline = time.monotonic() + 30
        while any(len(out[t]) < n for t, n in topics.items()) and time.monotonic() < deadline:
            for tp, msgs in c.poll(timeout_ms=500, max_records=1000).items():
                for m in msgs:
                    out[tp.topic].append((m.offset, m.key, m.value, list(m.headers),
                                          m.timestamp))
    finally:
        c.close()
    return out


def consume_aiokafka(bootstrap: str, topics: dict[str, int]) -> dict[str, list[Row]]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    out: dict[str, list[Row]] = {t: [] for t in topics}

    async def run() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", group_id=None)
        await c.start()
        try:
            parts = [ATP(t, 0) for t in topics]
            c.assign(parts)
            for tp in parts:
                c.seek(tp, 0)
            deadline = time.monotonic() + 30
            while (any(len(out[t]) < n for t, n in topics.items())
                   and time.monotonic() < deadline):
                batches = await c.getmany(timeout_ms=500, max_records=1000)
                for tp, msgs in batches.items():
                    for m in msgs:
                        out[tp.topic].append((m.offset, m.key, m.value, list(m.headers),
                                              m.timestamp))
        finally:
            await c.stop()

    asyncio.run(run())
    return out


def consume_kcat(bootstrap: str, topics: dict[str, int]) -> dict[str, list[Row]]:
    """Length-prefixed output (``%K``/``%S``) so binary keys and values compare exactly."""
    out: dict[str, list[Row]] = {}
    for topic, n in topics.items():
        proc = subprocess.run(
            [KCAT, "-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
             "-c", str(n), "-f", "%o %T %K %S\n%k%s"],
            check=True, timeout=30, capture_output=True)
        data, pos, rows = proc.stdout, 0, []
        while pos < len(data):
            end = data.index(b"\n", pos)
            offset, ts, klen, vlen = (int(x) for x in data[pos:end].split())
            pos = end + 1
            key = data[pos:pos + klen] if klen >= 0 else None
            pos += max(klen, 0)
            value = data[pos:pos + vlen] if vlen >= 0 else None
            pos += max(vlen, 0)
            rows.append((offset, key, value, [], ts))
        out[topic] = rows
    return out


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python,
             "aiokafka": produce_aiokafka, "kcat": produce_kcat}
CONSUMERS = {"confluent": consume_confluent, "kafka-python": consume_kafka_python,
             "aiokafka": consume_aiokafka, "kcat": consume_kcat}


def kafka_python_has(codec: str) -> bool:
    from kafka import codec as kc

    return {"none": True, "gzip": kc.has_gzip(), "snappy": kc.has_snappy(),
            "lz4": kc.has_lz4(), "zstd": kc.has_zstd()}[codec]


@pytest.fixture(scope="module")
def produced(broker: BrokerProcess) -> dict[tuple[str, str], tuple[str, list]]:
    """One topic per (producer, codec), produced once for every consumer test."""
    out = {}
    for name, produce in PRODUCERS.items():
        for codec in CODECS:
            if name == "kcat" and KCAT is None:
                continue
            if name == "kafka-python" and not kafka_python_has(codec):
                continue
            topic = f"rt-{name}-{codec}-{uuid.uuid4().hex[:6]}"
            rows = payloads(topic, binary=name != "kcat")  # kcat -P reads text lines
            produce(broker.bootstrap, topic, codec, rows)
            out[(name, codec)] = (topic, rows)
    return out


@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_every_codec_round_trips_across_libraries(broker: BrokerProcess, produced: dict,
                                                  consumer: str) -> None:
    if consumer == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed")
    topics = {topic: len(rows) for topic, rows in produced.values()}
    got = CONSUMERS[consumer](broker.bootstrap, topics)
    for (producer, codec), (topic, rows) in produced.items():
        seen = got[topic]
        where = (producer, codec, consumer)
        assert [r[0] for r in seen] == list(range(len(rows))), where
        for (offset, key, value, headers, ts), (k, v, h, t) in zip(seen, rows):
            assert (key, value) == (k, v), (where, offset)
            if consumer != "kcat":  # kcat's %h is not binary safe
                assert headers == h, (where, offset)
            if producer != "kcat":  # kcat cannot set a timestamp
                assert ts == t, (where, offset)
            else:
                assert ts > TS0


CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def test_every_producer_really_compresses_with_the_codec_asked_for(
        broker: BrokerProcess, produced: dict) -> None:
    """The stored batches carry the codec: a client that quietly sent them uncompressed (as
    librdkafka < 2.10 does when Produce is not listed from v0) would still round-trip."""
    from test_produce_fetch import Raw, fetch, parts_of

    raw = Raw(broker)
    try:
        for (producer, codec), (topic, _rows) in produced.items():
            blob = bytes(parts_of(fetch(raw, topic, {0: 0}))[0].records or b"")
            batches = [h for _pos, h in records.split_batches(blob)]
            assert batches, (producer, codec)
            kinds = {h.compression for h in batches}
            # librdkafka sends a batch its codec would not shrink as it is (none).
            assert CODEC_IDS[codec] in kinds and kinds <= {0, CODEC_IDS[codec]}, (
                producer, codec, kinds)
    finally:
        raw.close()


def test_fifty_thousand_records_in_order_with_dense_offsets(broker: BrokerProcess) -> None:
    topic = f"bulk-{uuid.uuid4().hex[:6]}"
    n = 50_000
    value = os.urandom(1024)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "all",
                  "batch.size": 1_000_000})
    offsets: list[int] = []
    started = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, key=b"%d" % i,
                          on_delivery=lambda err, m: offsets.append(-1 if err else m.offset()))
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    assert p.flush(60) == 0
    produce_s = time.monotonic() - started
    assert sorted(offsets) == list(range(n))
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bulk",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    started = time.monotonic()
    expected = 0
    try:
        deadline = time.monotonic() + 60
        while expected < n and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                assert m.error() is None, m.error()
                assert m.offset() == expected and m.key() == b"%d" % expected
                expected += 1
    finally:
        c.close()
    consume_s = time.monotonic() - started
    assert expected == n
    print(f"\n1 KiB records: produce {n / produce_s:,.0f} msg/s "
          f"({n * 1024 / produce_s / 2**20:.1f} MiB/s), consume {n / consume_s:,.0f} msg/s "
          f"({n * 1024 / consume_s / 2**20:.1f} MiB/s)")


def test_list_offsets_and_seek_through_client_apis(broker: BrokerProcess) -> None:
    topic = f"seek-{uuid.uuid4().hex[:6]}"
    rows = [(b"k%d" % i, b"v%d" % i, [], TS0 + i * 1000) for i in range(10)]
    produce_confluent(broker.bootstrap, topic, "none", rows)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "seek",
                  "enable.auto.commit": False})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 10)
        (found,) = c.offsets_for_times([TopicPartition(topic, 0, TS0 + 4500)], timeout=5)
        assert found.offset == 5
        (none,) = c.offsets_for_times([TopicPartition(topic, 0, TS0 + 99_000)], timeout=5)
        assert none.offset == -1  # no such record: end (-1), as Kafka answers
        c.assign([TopicPartition(topic, 0, 7)])
        m = c.poll(5)
        assert m is not None and m.offset() == 7 and m.value() == b"v7"
        c.seek(TopicPartition(topic, 0, 2))
        m = c.poll(5)
        assert m is not None and m.offset() == 2
    finally:
        c.close()

    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KTP

    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        tp = KTP(topic, 0)
        assert k.beginning_offsets([tp]) == {tp: 0}
        assert k.end_offsets([tp]) == {tp: 10}
        found = k.offsets_for_times({tp: TS0 + 3000})[tp]
        assert (found.offset, found.timestamp) == (3, TS0 + 3000)
    finally:
        k.close()


def test_records_carry_the_leader_epoch_through_commit_and_resume(broker: BrokerProcess) -> None:
    """Fetched batches carry leader epoch 0, as Kafka stamps them; a group commits with that
    epoch, and a new member resumes there after the client validates its position
    (OffsetForLeaderEpoch, KIP-320)."""
    topic = f"epoch-{uuid.uuid4().hex[:6]}"
    rows = [(b"k%d" % i, b"v%d" % i, [], TS0 + i) for i in range(6)]
    produce_confluent(broker.bootstrap, topic, "none", rows)
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    c = Consumer(conf)
    try:
        c.subscribe([topic])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m)
        assert [m.offset() for m in got] == [0, 1, 2]
        assert {m.leader_epoch() for m in got} == {0}
        c.commit(message=got[-1], asynchronous=False)
        (committed,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        assert (committed.offset, committed.leader_epoch) == (3, 0)
    finally:
        c.close()
    c = Consumer(conf)
    try:
        c.subscribe([topic])
        m = None
        deadline = time.monotonic() + 20
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            m = m if m is not None and m.error() is None else None
        assert m is not None and (m.offset(), m.value(), m.leader_epoch()) == (3, b"v3", 0)
    finally:
        c.close()

    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KTP

    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                      consumer_timeout_ms=5000)
    try:
        k.assign([KTP(topic, 0)])
        k.seek_to_beginning()
        first = next(k)
        assert (first.offset, first.leader_epoch) == (0, 0)
    finally:
        k.close()


def test_long_poll_latency_with_client_defaults(broker: BrokerProcess) -> None:
    """End-to-end produce→consume latency with confluent-kafka defaults (printed)."""
    topic = f"lat-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topic, value=b"warm-up")
    p.flush(10)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lat",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 1)])
    try:
        c.poll(1.0)  # settle: the consumer is now long-polling at offset 1
        latencies = []
        for i in range(100):
            sent = time.monotonic()
            p.produce(topic, value=b"%d" % i)
            p.poll(0)
            m = None
            deadline = sent + 5
            while m is None and time.monotonic() < deadline:
                m = c.poll(0.5)
            assert m is not None and m.error() is None and m.value() == b"%d" % i
            latencies.append(time.monotonic() - sent)
        p.flush(5)
    finally:
        c.close()
    latencies.sort()
    p50, p99 = latencies[49] * 1000, latencies[98] * 1000
    print(f"\nend-to-end latency (confluent defaults): p50={p50:.1f}ms p99={p99:.1f}ms "
          f"max={latencies[-1] * 1000:.1f}ms")
    assert p50 < 50 and p99 < 200


def test_broker_side_produce_errors_reach_the_client(broker: BrokerProcess) -> None:
    topic = f"big-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 4_000_000,
                  "compression.type": "none"})
    errors: list[Any] = []
    p.produce(topic, value=b"x" * (2 * 1024 * 1024),
              on_delivery=lambda err, _m: errors.append(err))
    p.produce(topic, value=b"small", on_delivery=lambda err, _m: errors.append(err))
    p.flush(15)
    codes = sorted((e.code() if e is not None else 0) for e in errors)
    assert codes == sorted([0, KafkaError.MSG_SIZE_TOO_LARGE]), errors
