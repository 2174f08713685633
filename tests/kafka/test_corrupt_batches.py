"""Batches whose CRC is right but whose records are not: refused, never stored.

Kafka's LogValidator decompresses every compressed batch a client sends and reads its records,
so a payload that does not decompress, or holds fewer or more records than the header counts,
is refused (CORRUPT_MESSAGE) and nothing reaches the log. Stored, such a batch stopped every
consumer of the partition at its offset (librdkafka retried it forever as _BAD_COMPRESSION).
"""
from __future__ import annotations

import gzip
import struct
import time

import lz4.frame
import pytest
import zstandard
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode as E

from kmqkafka import records
from tests.raft.test_kafka_cluster import ms, req
from tests.rawkafka import RawClient

TOPIC = "corrupt"


def _batch(codec: int, payload: bytes, count: int) -> bytes:
    """A batch of ``count`` records whose records section is ``payload``, with a right CRC."""
    now = int(time.time() * 1000)
    head = struct.pack(">hiqqqhii", codec, count - 1, now, now, -1, -1, -1, count)
    body = head + payload
    crc = records.crc32c(body)
    return struct.pack(">qiibI", 0, len(body) + 9, 0, 2, crc) + body


def _produce(raw: RawClient, batch: bytes) -> tuple[int, int]:
    Pr = req("produce", 9, "ProduceRequest")
    Td = req("produce", 9, "TopicProduceData")
    Pd = req("produce", 9, "PartitionProduceData")
    r = raw.call(Pr(transactional_id=None, acks=-1, timeout=ms(10000), topic_data=(
        Td(name=TOPIC, partition_data=(Pd(index=0, records=batch),)),)))
    p = r.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


# The records section of three uncompressed records (after the 61-byte batch header).
THREE = records.build_batch([records.NewRecord(value=b"v%d" % i) for i in range(3)],
                            now_ms=int(time.time() * 1000))[records.HEADER_SIZE:]
CASES = {
    "gzip that does not inflate": (1, b"\x1f\x8b\x08\x00not-deflate-at-all" * 3, 3),
    "gzip cut short": (1, gzip.compress(THREE)[:-10], 3),
    "snappy garbage": (2, b"\xff\xff\xff\xffgarbage" * 3, 3),
    "lz4 garbage": (3, b"\x04\x22\x4d\x18garbage-frame" * 2, 3),
    "zstd garbage": (4, b"\x28\xb5\x2f\xfdgarbage" * 3, 3),
    "fewer records than counted": (1, gzip.compress(THREE), 4),
    "bytes after the records": (3, lz4.frame.compress(THREE + b"\x99\x99junk"), 3),
    "a record longer than the rest": (4, zstandard.compress(THREE[:-4]), 3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_compressed_batch_with_broken_records_is_refused(broker, case) -> None:
    codec, payload, count = CASES[case]
    with RawClient(broker.kafka_port) as raw:
        assert _produce(raw, _batch(1, gzip.compress(THREE), 3)) == (E.none, 0)
        assert _produce(raw, _batch(codec, payload, count))[0] == E.corrupt_message
        # The same connection goes on, and nothing was stored in between.
        assert _produce(raw, _batch(3, lz4.frame.compress(THREE), 3)) == (E.none, 3)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        got, deadline = [], time.monotonic() + 15
        while len(got) < 6 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
        assert got == [(i, b"v%d" % (i % 3)) for i in range(6)]
    finally:
        c.close()
