"""The hand-written Produce request reader builds exactly kio's request, in every version, with
the record batches left as views of the frame."""
from __future__ import annotations

import datetime
import importlib
import io
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer

from kmqkafka.kafka import produce
from kmqkafka.net import guard
from kmqkafka.net.fast_requests import read_produce

VERSIONS = range(produce.MIN_VERSION, produce.MAX_VERSION + 1)


def request_type(version: int) -> type:
    return importlib.import_module(f"kio.schema.produce.v{version}.request").ProduceRequest


def build(version: int, txn: str | None, acks: int, timeout_ms: int, topics: list) -> object:
    module = importlib.import_module(f"kio.schema.produce.v{version}.request")
    out = []
    for name, topic_id, parts in topics:
        data = tuple(module.PartitionProduceData(index=i, records=r) for i, r in parts)
        if version >= 13:
            out.append(module.TopicProduceData(topic_id=topic_id, partition_data=data))
        else:
            out.append(module.TopicProduceData(name=name, partition_data=data))
    return module.ProduceRequest(transactional_id=txn, acks=acks,
                                 timeout=datetime.timedelta(milliseconds=timeout_ms),
                                 topic_data=tuple(out))


def encode(version: int, request: object) -> bytes:
    buf = io.BytesIO()
    buf.write(b"HEAD")  # the body does not start at 0 of a frame
    entity_writer(request_type(version))(buf, request)
    return buf.getvalue()


partition_lists = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1),
                                     st.one_of(st.none(), st.binary(max_size=300))), max_size=3)
topic_lists = st.lists(st.tuples(st.text(min_size=1, max_size=20),
                                 st.one_of(st.none(), st.uuids()), partition_lists), max_size=3)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(txn=st.one_of(st.none(), st.text(max_size=30)), acks=st.sampled_from([-1, 0, 1]),
       timeout_ms=st.integers(-2**31, 2**31 - 1), topics=topic_lists)
def test_reads_what_kio_reads(version, txn, acks, timeout_ms, topics):
    rt = request_type(version)
    frame = memoryview(encode(version, build(version, txn, acks, timeout_ms, topics)))
    want, _used = entity_reader(rt)(frame, 4)
    got = read_produce(rt, version, frame, 4)
    assert type(got) is type(want)
    assert (got.transactional_id, got.acks, got.timeout) == (
        want.transactional_id, want.acks, want.timeout)
    assert len(got.topic_data) == len(want.topic_data)
    for g, w in zip(got.topic_data, want.topic_data):
        if version >= 13:
            assert g.topic_id == w.topic_id
        else:
            assert g.name == w.name
        assert [(p.index, None if p.records is None else bytes(p.records))
                for p in g.partition_data] == [(p.index, p.records) for p in w.partition_data]
        for p in g.partition_data:  # views of the frame, not copies
            assert p.records is None or (type(p.records) is memoryview
                                         and p.records.obj is frame.obj)


@pytest.mark.parametrize("version", [3, 9, 13])
def test_a_truncated_body_is_a_value_error(version):
    rt = request_type(version)
    topics = [("t", uuid.uuid4(), [(0, b"x" * 100)])]
    frame = encode(version, build(version, None, -1, 1000, topics))
    for cut in (5, 12, len(frame) - 50):
        with pytest.raises(ValueError):
            read_produce(rt, version, memoryview(frame[:cut]), 4)


def test_guard_still_refuses_lengths_past_the_frame():
    """The protocol runs ``guard.check`` first: a records length past the frame never gets
    here (the reader would stop at it too)."""
    rt = request_type(9)
    frame = bytearray(encode(9, build(9, None, -1, 1000, [("t", None, [(0, b"x" * 100)])])))
    frame[-3 - 100 - 1] = 0x7F  # the compact length byte of the records (101) -> 126
    with pytest.raises(ValueError):
        guard.check(rt, memoryview(bytes(frame)), 4)
    with pytest.raises(ValueError):
        read_produce(rt, 9, memoryview(bytes(frame)), 4)
