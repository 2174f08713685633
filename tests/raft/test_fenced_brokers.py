"""DescribeCluster v2 on a real 3-process cluster (127.0.0.1): a member that is down is listed,
fenced, when the client asks for fenced brokers (KIP-1073), as Kafka lists a KRaft broker
that shut down (still registered, fenced); without the flag, and in Metadata, only live nodes.

kafka-python's ``describe_cluster()`` always asks for fenced brokers (v2).
"""
from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests.raft.test_kafka_cluster import IDS, Cluster, wait_for
from tests.rawkafka import RawClient

kafka = pytest.importorskip("kafka")


def describe_cluster(port: int, include_fenced: bool) -> dict[int, bool]:
    """node id -> is_fenced, as one node answers DescribeCluster v2."""
    mod = importlib.import_module("kio.schema.describe_cluster.v2.request")
    with RawClient(port) as raw:
        r = raw.call(mod.DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                endpoint_type=1,
                                                include_fenced_brokers=include_fenced))
    assert r.error_code == 0, r
    return {b.broker_id: b.is_fenced for b in r.brokers}


def test_a_member_that_is_down_is_listed_fenced_when_asked(tmp_path: Any):
    cluster = Cluster(tmp_path)
    try:
        leader = cluster.leader()
        victim = cluster.follower()
        survivors = sorted(set(IDS) - {victim})
        all_live = {i: False for i in IDS}
        assert describe_cluster(cluster.kafka_ports[leader], True) == all_live

        cluster.brokers[victim].kill()
        for i in survivors:
            port = cluster.kafka_ports[i]
            wait_for(lambda: describe_cluster(port, False) == {s: False for s in survivors},
                     timeout=10, what=f"node {i} drops node {victim}")
            assert describe_cluster(port, True) == {**all_live, victim: True}

        admin = kafka.KafkaAdminClient(bootstrap_servers=cluster.bootstrap(*survivors))
        try:
            described = admin.describe_cluster()
        finally:
            admin.close()
        brokers = {b["broker_id"]: b for b in described["brokers"]}
        assert sorted(brokers) == list(IDS)
        assert brokers[victim]["is_fenced"] is True
        assert brokers[victim]["port"] == cluster.kafka_ports[victim]
        assert all(brokers[s]["is_fenced"] is False for s in survivors)

        cluster.brokers[victim].restart()
        for i in IDS:
            port = cluster.kafka_ports[i]
            wait_for(lambda: describe_cluster(port, True) == all_live,
                     what=f"node {i} lists node {victim} unfenced again")
    finally:
        cluster.stop()
