"""The preferred replica on a real 3-process cluster (127.0.0.1).

Kafka's preferred replica is the first one a partition lists: a balanced Kafka cluster has it
lead (the controller moves leadership back to it), and ElectLeaders PREFERRED answers
ELECTION_NOT_NEEDED only when it already leads. Here the Raft leader leads every partition and
leadership cannot move to another member, so every node lists the leader first, also after a
leader change; listed by id, a leader other than the lowest id looked unbalanced for good while
ElectLeaders said no election was needed.
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.raft.test_kafka_cluster import IDS, Cluster, metadata, produce_confluent, wait_for

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402

from kio.schema.errors import ErrorCode as E  # noqa: E402


def test_the_leader_is_listed_first_and_a_preferred_election_is_not_needed(tmp_path: Any):
    cluster = Cluster(tmp_path)
    try:
        lowest = min(IDS)
        leader = cluster.leader()
        if leader == lowest:  # by id it would be first anyway: move leadership elsewhere
            cluster.brokers[lowest].kill()
            leader = cluster.leader(not_=lowest)
            cluster.brokers[lowest].restart()
            leader = cluster.leader()
        topic = "preferred"
        produce_confluent(cluster.all(), topic, [b"x"])

        for i in IDS:
            def leader_first() -> bool:
                for part in metadata(cluster.kafka_ports[i], (topic,)).topics[0].partitions:
                    assert part.error_code == E.none and part.leader_id == leader
                    assert part.replica_nodes[0] == leader, part
                    assert sorted(part.replica_nodes) == list(IDS)
                    assert part.isr_nodes[0] == leader, part
                return True
            wait_for(leader_first, what=f"node {i} lists leader {leader} first")

        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.all()})
        described = admin.describe_topics(
            confluent_kafka.TopicCollection([topic]))[topic].result(20)
        partitions = described.partitions
        assert partitions and all(p.leader.id == p.replicas[0].id == leader for p in partitions)
        elected = admin.elect_leaders(
            confluent_kafka.ElectionType.PREFERRED,
            [confluent_kafka.TopicPartition(topic, p.id) for p in partitions]).result(20)
        assert {tp.partition for tp in elected} == {p.id for p in partitions}
        assert {err.code() for err in elected.values()} == {
            confluent_kafka.KafkaError.ELECTION_NOT_NEEDED}
    finally:
        cluster.stop()
