"""DescribeQuorum on a lone node: its own one-voter quorum; other topics are unknown."""
from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from conftest import BrokerProcess
from test_admin import call, nested


@pytest.mark.parametrize("version", [0, 1, 2])
def test_lone_node_is_a_one_voter_quorum(shared_broker: BrokerProcess, version: int) -> None:
    Topic = nested(55, version, "TopicData")
    Part = nested(55, version, "PartitionData")
    r = call(shared_broker, 55, version, topics=(
        Topic(topic_name="__cluster_metadata", partitions=(Part(partition_index=0),)),
        Topic(topic_name="other", partitions=(Part(partition_index=0),))))
    assert r.error_code == ErrorCode.none
    meta, other = r.topics
    (p,) = meta.partitions
    assert (p.error_code, p.leader_id, p.leader_epoch) == (ErrorCode.none, 1, 0)
    assert [v.replica_id for v in p.current_voters] == [1]
    if version >= 1:  # KRaft's leader reports itself fetched and caught up as it answers
        now_ms = time.time() * 1000
        (me,) = p.current_voters
        assert abs(me.last_fetch_timestamp - now_ms) < 10_000, me
        assert me.last_caught_up_timestamp == me.last_fetch_timestamp
    assert other.partitions[0].error_code == ErrorCode.unknown_topic_or_partition
