"""The hand-written Produce response encoder gives exactly kio's bytes, in every version."""
from __future__ import annotations

import datetime
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kmqkafka.kafka import produce_response
from kmqkafka.kafka.wire import make
from kmqkafka.net import fast_bodies
from kmqkafka.net.protocol import KafkaProtocol
from tests.rawkafka import build_topics, kio_response_frame, response_types, topic_lists

produce_response.install()

VERSIONS = range(produce_response.FIRST_VERSION, produce_response.LAST_VERSION + 1)
UTC = datetime.timezone.utc

texts = st.one_of(st.none(), st.text(max_size=40))
times = st.one_of(st.none(), st.integers(0, 4_102_444_800_000).map(
    lambda ms: datetime.datetime.fromtimestamp(ms / 1000, UTC)))
partitions = st.fixed_dictionaries({
    "index": st.integers(0, 2**31 - 1),
    "error_code": st.sampled_from([ErrorCode.none, ErrorCode.not_leader_or_follower,
                                   ErrorCode.message_too_large, ErrorCode.invalid_record]),
    "base_offset": st.integers(-1, 2**63 - 1),
    "log_append_time": times,
    "log_start_offset": st.integers(-1, 2**63 - 1),
    "record_errors": st.lists(st.tuples(st.integers(0, 2**31 - 1), texts), max_size=2),
    "error_message": texts,
    "leader": st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, 9))),
})
topics = topic_lists(partitions)
endpoints = st.lists(st.tuples(st.integers(0, 9), st.text(min_size=1, max_size=10),
                               st.integers(1, 65535)), max_size=1)


def build(version: int, data: list, throttle_ms: int, nodes: list) -> object:
    rt, t = response_types(0, version)

    def partition(fields: dict) -> object:
        leader = fields.pop("leader")
        fields["record_errors"] = tuple(
            make(t.BatchIndexAndErrorMessage, batch_index=i, batch_index_error_message=m)
            for i, m in fields["record_errors"]) if version >= 8 else ()
        if leader is not None and version >= 10:
            fields["current_leader"] = t.LeaderIdAndEpoch(leader_id=leader[0],
                                                          leader_epoch=leader[1])
        return make(t.PartitionProduceResponse, **fields)

    out = build_topics(data, partition, lambda name, topic_id, parts: make(
        t.TopicProduceResponse, name=name, topic_id=topic_id, partition_responses=parts))
    extra = {}
    if version >= 10 and nodes:
        extra["node_endpoints"] = tuple(
            t.NodeEndpoint(node_id=n, host=h, port=port, rack=None) for n, h, port in nodes)
    return rt(responses=out, throttle_time=datetime.timedelta(milliseconds=throttle_ms),
              **extra)


@settings(max_examples=60, deadline=None)
@given(data=topics, throttle_ms=st.integers(0, 2**31 - 1), nodes=endpoints,
       correlation_id=st.integers(-2**31, 2**31 - 1))
def test_every_version_encodes_as_kio_does(data, throttle_ms, nodes, correlation_id) -> None:
    for version in VERSIONS:
        response = build(version, data, throttle_ms, nodes)
        header_version = 1 if version >= 9 else 0
        ours = b"".join(bytes(p) for p in KafkaProtocol._encode(correlation_id, response,
                                                                 header_version))
        assert ours == kio_response_frame(correlation_id, response, header_version), version


def test_the_common_answer_takes_the_hand_written_path() -> None:
    """A plain acknowledgement is encoded by hand; a v10+ answer naming a new leader (a
    tagged field) is left to kio."""
    for version in VERSIONS:
        plain = build(version, [("t", uuid.uuid4(), [{
            "index": 0, "error_code": ErrorCode.none, "base_offset": 7,
            "log_append_time": None, "log_start_offset": 0, "record_errors": [],
            "error_message": None, "leader": None}])], 0, [])
        assert fast_bodies.body(plain) is not None, version
        if version >= 10:
            led = build(version, [("t", uuid.uuid4(), [{
                "index": 0, "error_code": ErrorCode.not_leader_or_follower, "base_offset": -1,
                "log_append_time": None, "log_start_offset": -1, "record_errors": [],
                "error_message": None, "leader": (2, 0)}])], 0, [])
            assert fast_bodies.body(led) is None, version
