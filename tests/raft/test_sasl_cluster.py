"""SASL on a 3-node cluster: clients authenticate with any node, and the group calls a
follower relays to the leader travel on a connection that authenticates too (as the first
configured user), so nothing is refused for want of credentials between the nodes."""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.raft.test_kafka_cluster import Cluster, commit_and_fetch
from tests.conftest import round_trip

confluent_kafka = pytest.importorskip("confluent_kafka")

from kio.schema.errors import ErrorCode as E  # noqa: E402

USERS = "relay:relay-secret,carol:carol-secret"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("sasl-cluster"), env={
        "CONNECTORS_KAFKA_SASL_MECHANISMS": "SCRAM-SHA-256",
        "CONNECTORS_KAFKA_SASL_USERS": USERS,
        "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    try:
        c.leader()
        yield c
    finally:
        c.stop()


def test_group_calls_a_follower_relays_authenticate_with_the_leader(cluster: Cluster):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.all(), "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "carol",
                         "sasl.password": "carol-secret"})
    admin.create_topics([NewTopic("st", 1)])["st"].result(30)
    follower = cluster.follower()
    committed, fetched = commit_and_fetch(cluster.kafka_ports[follower], "SCRAM-SHA-256",
                                          "carol", "carol-secret", "sg", "st", 7)
    assert committed.topics[0].partitions[0].error_code == E.none
    assert fetched.topics[0].partitions[0].committed_offset == 7
    leader_log = cluster.brokers[cluster.leader()].log()
    assert "before SASL authentication" not in leader_log


def test_a_consumer_group_through_a_follower_bootstrap(cluster: Cluster):
    common = {"bootstrap.servers": cluster.bootstrap(cluster.follower()),
              "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256",
              "sasl.username": "carol", "sasl.password": "carol-secret"}
    assert round_trip(common, "sasl-cluster", 10) == [b"v%d" % i for i in range(10)]
