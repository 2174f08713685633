"""No authorizer, as Apache Kafka answers without one: every operation is authorized, the ACL
APIs answer SECURITY_DISABLED, no SCRAM users exist, and ElectLeaders finds nothing to elect.
Driven through confluent-kafka's AdminClient (kafka-python for DescribeAcls), against a real
daemon."""
from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import (
    Consumer, ElectionType, KafkaException, TopicCollection, TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic,
    ResourcePatternType, ResourceType,
)

from conftest import BrokerProcess

WAIT = 15.0


@pytest.fixture(scope="module")
def admin(shared_broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": shared_broker.bootstrap})


def failure(future: Any) -> Any:
    with pytest.raises(KafkaException) as info:
        future.result(WAIT)
    return info.value.args[0]


def test_acl_apis_answer_security_disabled(shared_broker: BrokerProcess,
                                           admin: AdminClient) -> None:
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    match_all = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                 AclOperation.ANY, AclPermissionType.ANY)
    err = failure(admin.create_acls([binding])[binding])
    assert err.code() == 54 and "No Authorizer" in err.str()  # SECURITY_DISABLED
    assert failure(admin.delete_acls([match_all])[match_all]).code() == 54
    # librdkafka drops DescribeAcls' top-level error (it returns []); kafka-python raises it.
    from kafka.admin import (
        ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
        ResourcePatternFilter, ResourceType as KResourceType,
    )
    from kafka.errors import SecurityDisabledError

    k = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        with pytest.raises(SecurityDisabledError):
            k.describe_acls(ACLFilter(
                principal=None, host="*", operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(KResourceType.ANY, None,
                                                       ACLResourcePatternType.ANY)))
    finally:
        k.close()


def test_authorized_operations_are_every_operation_when_asked(admin: AdminClient) -> None:
    topic = f"ops-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 1)])[topic].result(WAIT)
    described = admin.describe_topics(TopicCollection([topic]),
                                      include_authorized_operations=True)[topic].result(WAIT)
    ops = {op.name for op in described.authorized_operations or ()}
    assert {"READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"} <= ops
    plain = admin.describe_topics(TopicCollection([topic]))[topic].result(WAIT)
    assert plain.authorized_operations is None

    group = f"g-{topic}"
    c = Consumer({"bootstrap.servers": admin_bootstrap(admin), "group.id": group})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(0.2)
        (future,) = admin.describe_consumer_groups(
            [group], include_authorized_operations=True).values()
        desc = future.result(WAIT)
        # Kafka 4's AclEntry: a group also has DESCRIBE_CONFIGS and ALTER_CONFIGS.
        assert {op.name for op in desc.authorized_operations or ()} == {
            "READ", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
    finally:
        c.close()


def admin_bootstrap(admin: AdminClient) -> str:
    broker = next(iter(admin.list_topics(timeout=WAIT).brokers.values()))
    return f"{broker.host}:{broker.port}"


def test_no_scram_users(admin: AdminClient) -> None:
    assert admin.describe_user_scram_credentials().result(WAIT) == {}
    (future,) = admin.describe_user_scram_credentials(["bob"]).values()
    assert failure(future).code() == 91  # RESOURCE_NOT_FOUND


def test_a_user_named_twice_is_one_duplicate_resource_row(shared_broker: BrokerProcess) -> None:
    from kio.schema.describe_user_scram_credentials.v0 import request as m
    from rawkafka import RawClient

    with RawClient(shared_broker.kafka_port) as raw:
        answer = raw.call(m.DescribeUserScramCredentialsRequest(users=(
            m.UserName(name="alice"), m.UserName(name="alice"), m.UserName(name="bob"))))
    assert [(r.user, r.error_code) for r in answer.results] == [("alice", 92), ("bob", 91)]


def test_elect_leaders_finds_nothing_to_elect(admin: AdminClient) -> None:
    topic = f"elect-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 2)])[topic].result(WAIT)
    wanted = [TopicPartition(topic, 0), TopicPartition(topic, 1), TopicPartition(topic, 9)]
    result = admin.elect_leaders(ElectionType.PREFERRED, wanted).result(WAIT)
    codes = {tp.partition: err.code() if err else None for tp, err in result.items()}
    assert codes == {0: 84, 1: 84, 9: 3}  # ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION


def test_cluster_operations_are_kafkas_seven(shared_broker: BrokerProcess) -> None:
    """With no authorizer Kafka reports AclEntry.supportedOperations(CLUSTER): seven
    operations, without the token ones (those belong to the USER resource type)."""
    from kafka.admin import KafkaAdminClient

    k = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=10000)
    try:
        ops = k.describe_cluster()["authorized_operations"]
    finally:
        k.close()
    assert set(ops) == {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS",
                        "ALTER_CONFIGS", "IDEMPOTENT_WRITE"}
