"""Runtime configuration on a 3-node cluster: the cluster-wide broker default of a log config
and a client quota, changed through a follower, hold on every node; a per-broker log default is
refused there (every node holds every partition, so one broker's value could not differ)."""
from __future__ import annotations

import time
from typing import Iterator

import pytest
from kio.schema.errors import ErrorCode as E
from kio.static.primitive import f64, i8

from tests.raft.test_kafka_cluster import IDS, Cluster, req
from tests.rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import (  # noqa: E402
    AdminClient, ConfigResource, ConfigSource, NewTopic,
)

WAIT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("config-cluster"))
    try:
        c.leader()
        yield c
    finally:
        c.stop()


def eventually(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _retention(client: AdminClient) -> tuple[str, int]:
    (future,) = client.describe_configs([ConfigResource("topic", "cfg-cluster")]).values()
    entry = future.result(WAIT)["retention.ms"]
    return entry.value, entry.source


def alter_broker(port: int, broker: str, name: str, value: str) -> tuple[E, str | None]:
    Request = req("incremental_alter_configs", 1, "IncrementalAlterConfigsRequest")
    Resource = req("incremental_alter_configs", 1, "AlterConfigsResource")
    Config = req("incremental_alter_configs", 1, "AlterableConfig")
    with RawClient(port) as raw:
        answer = raw.call(Request(resources=(Resource(
            resource_type=i8(4), resource_name=broker, configs=(Config(
                name=name, config_operation=i8(0), value=value),)),), validate_only=False))
    result = answer.responses[0]
    return result.error_code, result.error_message


def test_a_cluster_wide_default_set_through_a_follower_holds_on_every_node(cluster: Cluster):
    leader, follower = cluster.leader(), cluster.follower()
    creator = AdminClient({"bootstrap.servers": cluster.bootstrap(leader)})
    creator.create_topics([NewTopic("cfg-cluster", 1)])["cfg-cluster"].result(WAIT)
    assert alter_broker(cluster.kafka_ports[follower], "", "log.retention.ms",
                        "3600000") == (E.none, None)
    for node in IDS:  # a node applies the change a moment after the one that answered
        client = AdminClient({"bootstrap.servers": cluster.bootstrap(node)})
        want = ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert eventually(lambda: _retention(client) == want), (node, _retention(client))
    code, message = alter_broker(cluster.kafka_ports[follower], str(follower),
                                 "log.retention.ms", "60000")
    assert code == E.invalid_request and "cluster-wide" in message


def test_a_client_quota_set_through_a_follower_is_described_by_every_node(cluster: Cluster):
    Alter = req("alter_client_quotas", 1, "AlterClientQuotasRequest")
    Entry = req("alter_client_quotas", 1, "EntryData")
    Entity = req("alter_client_quotas", 1, "EntityData")
    Op = req("alter_client_quotas", 1, "OpData")
    Describe = req("describe_client_quotas", 1, "DescribeClientQuotasRequest")
    Component = req("describe_client_quotas", 1, "ComponentData")
    follower = cluster.follower()
    with RawClient(cluster.kafka_ports[follower]) as raw:
        answer = raw.call(Alter(entries=(Entry(
            entity=(Entity(entity_type="user", entity_name=None),),
            ops=(Op(key="consumer_byte_rate", value=f64(5e6), remove=False),)),),
            validate_only=False))
    assert answer.entries[0].error_code == E.none
    def quotas(node: int) -> list:
        with RawClient(cluster.kafka_ports[node]) as raw:
            described = raw.call(Describe(components=(Component(
                entity_type="user", match_type=i8(1), match=None),), strict=True))
        return [(e.entity[0].entity_name, e.values[0].key, e.values[0].value)
                for e in described.entries]

    for node in IDS:
        assert eventually(lambda: quotas(node) == [(None, "consumer_byte_rate", 5e6)]), node
