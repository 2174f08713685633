"""Replica placement and config-resource listing with kafka-python's admin client: every node
holds every partition, so only no-op moves succeed, and nothing is ever being reassigned."""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import TopicPartitionReplica
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from conftest import BrokerProcess
from rawkafka import RawClient


@pytest.fixture
def admin(shared_broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    a = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    yield a
    a.close()


def _topic(admin: KafkaAdminClient, name: str, partitions: int = 2) -> str:
    admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def test_reassignment_to_the_current_replicas_only(admin: KafkaAdminClient) -> None:
    topic = _topic(admin, "placed")
    me = [b.node_id for b in admin._manager.cluster.brokers()]
    assert admin.alter_partition_reassignments({TopicPartition(topic, 0): me}) == {
        TopicPartition(topic, 0): None}
    refused = {(TopicPartition(topic, 1), (me[0] + 7,)): "InvalidReplicationAssignmentError",
               (TopicPartition(topic, 1), (me[0], me[0])): "InvalidReplicationAssignmentError",
               (TopicPartition(topic, 5), tuple(me)): "UnknownTopicOrPartitionError",
               (TopicPartition(topic, 0), None): "NoReassignmentInProgressError"}
    for (tp, target), error in refused.items():
        result = admin.alter_partition_reassignments({tp: None if target is None
                                                      else list(target)})
        assert result[tp].__name__ == error
    assert admin.list_partition_reassignments() == {}
    assert admin.list_partition_reassignments([TopicPartition(topic, 0)]) == {}


def test_log_dir_move_only_to_the_dir_it_is_in(admin: KafkaAdminClient) -> None:
    topic = _topic(admin, "moved")
    described = admin.describe_log_dirs()
    here, broker = described[0]["log_dirs"][0]["log_dir"], described[0]["broker"]
    tpr = TopicPartitionReplica(topic, 0, broker)
    result = admin.alter_replica_log_dirs({tpr: here})
    assert result[tpr].__name__ == "NoError"
    result = admin.alter_replica_log_dirs({tpr: here + "-elsewhere"})
    assert result[tpr].__name__ == "LogDirNotFoundError"


def test_list_config_resources_by_type(shared_broker: BrokerProcess,
                                       admin: KafkaAdminClient) -> None:
    topic = _topic(admin, "listed", 1)
    c = KafkaConsumer(topic, bootstrap_servers=shared_broker.bootstrap, group_id="listed-group",
                      consumer_timeout_ms=2000, auto_offset_reset="earliest")
    list(c)
    c.close()
    listed = admin.list_config_resources()
    assert topic in listed["topic"] and "listed-group" in listed["group"]
    assert listed["broker"] == ["1"]
    assert set(admin.list_config_resources(["BROKER"])) == {"broker"}

    def raw(version: int, **fields: Any) -> Any:
        with RawClient(shared_broker.kafka_port) as r:
            return r.call(load_request_schema(74, version)(**fields))

    assert (raw(0).error_code, raw(0).config_resources) == (ErrorCode.none, ())
    refused = raw(1, resource_types=(8,))  # BROKER_LOGGER: DescribeConfigs does not serve it
    assert (refused.error_code, refused.config_resources) == (ErrorCode.unsupported_version, ())
