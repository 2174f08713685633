"""The hand-written Fetch response encoder gives exactly kio's bytes, in every version, and
leaves stored batches uncopied."""
from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kmqkafka.kafka import fetch_response
from kmqkafka.kafka.wire import make
from kmqkafka.net import fast_bodies
from kmqkafka.net.chunks import RecordChain
from kmqkafka.net.protocol import KafkaProtocol
from tests.rawkafka import build_topics, kio_response_frame, response_types, topic_lists

fetch_response.install()

VERSIONS = range(fetch_response.FIRST_VERSION, fetch_response.LAST_VERSION + 1)

# records: None, bytes, or several pieces (a RecordChain), small and large
pieces = st.lists(st.binary(min_size=1, max_size=64).map(lambda b: b * 400), min_size=1,
                  max_size=3)
records = st.one_of(st.none(), st.binary(max_size=100), pieces)
partitions = st.fixed_dictionaries({
    "partition_index": st.integers(0, 2**31 - 1),
    "error_code": st.sampled_from([ErrorCode.none, ErrorCode.offset_out_of_range,
                                   ErrorCode.unknown_topic_or_partition]),
    "high_watermark": st.integers(-1, 2**63 - 1),
    "last_stable_offset": st.integers(-1, 2**63 - 1),
    "log_start_offset": st.integers(-1, 2**63 - 1),
    "aborted": st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 2**63 - 1),
                                                       st.integers(0, 2**63 - 1)), max_size=2)),
    "preferred_read_replica": st.integers(-1, 5),
    "records": records,
    "tagged": st.sampled_from([None, "diverging_epoch", "current_leader", "snapshot_id"]),
})
topics = topic_lists(partitions)


def build(version: int, data: list, throttle_ms: int, session_id: int, endpoints: bool,
          chained: bool) -> object:
    rt, t = response_types(1, version)

    def partition(fields: dict) -> object:
        aborted, tagged, value = fields.pop("aborted"), fields.pop("tagged"), \
            fields.pop("records")
        fields["aborted_transactions"] = None if aborted is None else tuple(
            t.AbortedTransaction(producer_id=a, first_offset=b) for a, b in aborted)
        if isinstance(value, list):
            value = RecordChain([memoryview(v) for v in value]) if chained \
                else b"".join(value)
        fields["records"] = value
        if tagged is not None and version >= 12:
            fields[tagged] = {
                "diverging_epoch": lambda: t.EpochEndOffset(epoch=3, end_offset=9),
                "current_leader": lambda: t.LeaderIdAndEpoch(leader_id=2, leader_epoch=1),
                "snapshot_id": lambda: t.SnapshotId(end_offset=5, epoch=1),
            }[tagged]()
        return make(t.PartitionData, **fields)

    out = build_topics(data, partition, lambda name, topic_id, parts: make(
        t.FetchableTopicResponse, topic=name, topic_id=topic_id, partitions=parts))
    extra = {}
    if endpoints and version >= 16:
        extra["node_endpoints"] = (t.NodeEndpoint(node_id=1, host="h", port=9092, rack=None),)
    return make(rt, throttle_time=datetime.timedelta(milliseconds=throttle_ms),
                error_code=ErrorCode.none, session_id=session_id, responses=out,
                **extra)


@settings(max_examples=60, deadline=None)
@given(data=topics, throttle_ms=st.integers(0, 2**31 - 1),
       session_id=st.integers(0, 2**31 - 1), endpoints=st.booleans(),
       correlation_id=st.integers(-2**31, 2**31 - 1))
def test_every_version_encodes_as_kio_does(data, throttle_ms, session_id, endpoints,
                                           correlation_id) -> None:
    for version in VERSIONS:
        header_version = 1 if version >= 12 else 0
        ours = KafkaProtocol._encode(
            correlation_id, build(version, data, throttle_ms, session_id, endpoints, True),
            header_version)
        reference = build(version, data, throttle_ms, session_id, endpoints, False)
        assert b"".join(bytes(p) for p in ours) == \
            kio_response_frame(correlation_id, reference, header_version), version


def test_stored_batches_stay_uncopied() -> None:
    """A large records value reaches the pieces as the very objects the store read."""
    stored = [memoryview(bytes([i]) * 40_000) for i in range(3)]
    for version in VERSIONS:
        response = build(version, [("t", None, [{
            "partition_index": 0, "error_code": ErrorCode.none, "high_watermark": 9,
            "last_stable_offset": 9, "log_start_offset": 0, "aborted": None,
            "preferred_read_replica": -1, "records": [b"x"], "tagged": None}])],
            0, 0, False, True)
        part = response.responses[0].partitions[0]
        object.__setattr__(part, "records", RecordChain(stored))
        body = fast_bodies.body(response)
        assert body is not None, version
        assert [p for p in body if p in stored] == stored
        assert all(any(p is s for p in body) for s in stored)
