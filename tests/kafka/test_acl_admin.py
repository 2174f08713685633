"""ACLs on the admin APIs, as Kafka 4 checks them, through real AdminClients (confluent-kafka,
one kafka-python) and, for the fields clients hide, the raw client: each call made as ``alice``
is first refused with Kafka's error code, then, once the right binding is granted, succeeds.

CreateTopics needs CREATE (topic or cluster) and DESCRIBE_CONFIGS to be told the configs;
DeleteTopics and DeleteRecords DELETE; CreatePartitions ALTER; DescribeConfigs
DESCRIBE_CONFIGS and (Incremental)AlterConfigs ALTER_CONFIGS on the topic, the group or (for the
broker) the cluster; the SCRAM, reassignment, log-dir, quorum and config-listing APIs a right on
the cluster. The broker describes its authorizer settings as a Kafka broker does.
"""
from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewPartitions,
    NewTopic, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32

from acl_support import (  # noqa: F401 -- acl_broker is a fixture
    WAIT, AclOperation, ResourcePatternType, ResourceType, acl_broker, admin_client, allow,
    grant, revoke_all, sasl,
)
from conftest import HOST, BrokerProcess, start_broker
from rawkafka import RawClient

CLUSTER = ResourceType.BROKER  # librdkafka's name for Kafka's CLUSTER resource type
CLUSTER_NAME = "kafka-cluster"
ALICE = "User:alice"
TIMEOUT = datetime.timedelta(seconds=10)
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@pytest.fixture
def acls(acl_broker: BrokerProcess) -> BrokerProcess:
    """The shared daemon with no bindings left by an earlier test."""
    revoke_all(acl_broker)
    return acl_broker


def code_of(future: Any) -> int:
    """The Kafka error code a confluent-kafka future failed with."""
    with pytest.raises(KafkaException) as info:
        future.result(WAIT)
    return info.value.args[0].code()


def make_topics(b: BrokerProcess, *names: str, partitions: int = 1) -> None:
    admin = admin_client(b)
    for f in admin.create_topics([NewTopic(n, partitions) for n in names]).values():
        f.result(WAIT)


def raw(b: BrokerProcess, user: str, *requests: Any) -> list[Any]:
    """Send ``requests`` on one connection authenticated as ``user``; their responses."""
    with RawClient(b.kafka_port, timeout=WAIT) as client:
        assert client.authenticate("PLAIN", user, f"{user}-secret").error_code == 0
        return [client.call(r) for r in requests]


# --- CreateTopics -----------------------------------------------------------------------


def test_create_topics_needs_create_on_the_topic_or_the_cluster(acls):
    alice = admin_client(acls, "alice")
    assert code_of(alice.create_topics([NewTopic("ct-a-1", 1)])["ct-a-1"]) == (
        ErrorCode.topic_authorization_failed)
    grant(acls, allow(ResourceType.TOPIC, "ct-a-", ALICE, AclOperation.CREATE,
                      ResourcePatternType.PREFIXED))
    alice.create_topics([NewTopic("ct-a-1", 2)])["ct-a-1"].result(WAIT)
    assert len(admin_client(acls).list_topics("ct-a-1", timeout=WAIT)
               .topics["ct-a-1"].partitions) == 2
    # Outside the prefix: refused, until CREATE on the cluster covers every name.
    assert code_of(alice.create_topics([NewTopic("ct-b-1", 1)])["ct-b-1"]) == (
        ErrorCode.topic_authorization_failed)
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.CREATE))
    alice.create_topics([NewTopic("ct-b-1", 1)])["ct-b-1"].result(WAIT)


def test_created_topic_configs_need_describe_configs(acls):
    """The topic is created either way; without DESCRIBE_CONFIGS the answer carries
    TOPIC_AUTHORIZATION_FAILED as its config error and no configs, partition count or
    replication factor, as Kafka's controller answers."""
    from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest

    grant(acls, allow(ResourceType.TOPIC, "ctc-", ALICE, AclOperation.CREATE,
                      ResourcePatternType.PREFIXED))

    def create(name: str) -> Any:
        topic = CreatableTopic(name=name, num_partitions=i32(3), replication_factor=i16(-1),
                               assignments=(), configs=())
        (response,) = raw(acls, "alice", CreateTopicsRequest(topics=(topic,), timeout=TIMEOUT))
        return response.topics[0]

    hidden = create("ctc-hidden")
    assert hidden.error_code == ErrorCode.none and hidden.topic_id != uuid.UUID(int=0)
    assert hidden.topic_config_error_code == ErrorCode.topic_authorization_failed
    assert (hidden.num_partitions, hidden.replication_factor, hidden.configs) == (-1, -1, ())
    grant(acls, allow(ResourceType.TOPIC, "ctc-", ALICE, AclOperation.DESCRIBE_CONFIGS,
                      ResourcePatternType.PREFIXED))
    shown = create("ctc-shown")
    assert shown.topic_config_error_code == ErrorCode.none and shown.num_partitions == 3
    assert {c.name for c in shown.configs} >= {"retention.ms", "cleanup.policy"}


def test_kafka_python_create_topics_refused_raises_topic_authorization_failed(acls):
    from kafka.admin import KafkaAdminClient, NewTopic as KPNewTopic
    from kafka.errors import TopicAuthorizationFailedError

    client = KafkaAdminClient(bootstrap_servers=f"{HOST}:{acls.kafka_port}",
                              security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                              sasl_plain_username="alice", sasl_plain_password="alice-secret",
                              request_timeout_ms=10000)
    try:
        topic = KPNewTopic("kp-ct", num_partitions=1, replication_factor=1)
        with pytest.raises(TopicAuthorizationFailedError):
            client.create_topics([topic])
        grant(acls, allow(ResourceType.TOPIC, "kp-ct", ALICE, AclOperation.CREATE))
        client.create_topics([topic])
    finally:
        client.close()
    assert "kp-ct" in admin_client(acls).list_topics("kp-ct", timeout=WAIT).topics


# --- DeleteTopics, CreatePartitions, DeleteRecords --------------------------------------


def test_delete_topics_needs_delete_and_hides_unknown_topics(acls):
    make_topics(acls, "dt-a")
    alice = admin_client(acls, "alice")
    assert code_of(alice.delete_topics(["dt-a"])["dt-a"]) == ErrorCode.topic_authorization_failed
    # A missing topic is only said to be missing to who may describe it.
    assert code_of(alice.delete_topics(["dt-none"])["dt-none"]) == (
        ErrorCode.topic_authorization_failed)
    grant(acls, allow(ResourceType.TOPIC, "dt-none", ALICE, AclOperation.DESCRIBE))
    assert code_of(alice.delete_topics(["dt-none"])["dt-none"]) == (
        ErrorCode.unknown_topic_or_partition)
    grant(acls, allow(ResourceType.TOPIC, "dt-a", ALICE, AclOperation.DELETE))
    alice.delete_topics(["dt-a"])["dt-a"].result(WAIT)
    assert "dt-a" not in admin_client(acls).list_topics(timeout=WAIT).topics


def test_delete_topics_by_id_names_the_topic_only_to_who_may_describe_it(acls):
    from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState

    make_topics(acls, "dti-a")
    admin = admin_client(acls)  # kept: its futures fail once it is gone
    described = admin.describe_topics(TopicCollection(["dti-a"]))["dti-a"].result(WAIT)
    high, low = (described.topic_id.get_most_significant_bits() % 2**64,
                 described.topic_id.get_least_significant_bits() % 2**64)
    topic_id = uuid.UUID(int=high << 64 | low)
    request = DeleteTopicsRequest(topics=(DeleteTopicState(name=None, topic_id=topic_id),),
                                  timeout=TIMEOUT)

    def answer() -> tuple[str | None, int]:
        (response,) = raw(acls, "alice", request)
        r = response.responses[0]
        assert r.topic_id == topic_id
        return r.name, r.error_code

    assert answer() == (None, ErrorCode.topic_authorization_failed)
    grant(acls, allow(ResourceType.TOPIC, "dti-a", ALICE, AclOperation.DESCRIBE))
    assert answer() == ("dti-a", ErrorCode.topic_authorization_failed)
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.DELETE))
    assert answer() == ("dti-a", ErrorCode.none)


def test_create_partitions_needs_alter_on_the_topic(acls):
    make_topics(acls, "cp-a")
    alice = admin_client(acls, "alice")
    assert code_of(alice.create_partitions([NewPartitions("cp-a", 3)])["cp-a"]) == (
        ErrorCode.topic_authorization_failed)
    grant(acls, allow(ResourceType.TOPIC, "cp-a", ALICE, AclOperation.ALTER))
    alice.create_partitions([NewPartitions("cp-a", 3)])["cp-a"].result(WAIT)
    assert len(admin_client(acls).list_topics("cp-a", timeout=WAIT)
               .topics["cp-a"].partitions) == 3


def test_delete_records_needs_delete_on_the_topic(acls):
    make_topics(acls, "dr-a")
    producer = Producer(sasl(acls, "admin"))
    for i in range(4):
        producer.produce("dr-a", b"v%d" % i, partition=0)
    assert producer.flush(WAIT) == 0
    alice = admin_client(acls, "alice")
    tp = TopicPartition("dr-a", 0, 2)
    # librdkafka finds the leader first: without DESCRIBE the Metadata refusal fails the call
    # before any DeleteRecords is sent.
    grant(acls, allow(ResourceType.TOPIC, "dr-a", ALICE, AclOperation.DESCRIBE))
    assert code_of(alice.delete_records([tp])[TopicPartition("dr-a", 0)]) == (
        ErrorCode.topic_authorization_failed)
    grant(acls, allow(ResourceType.TOPIC, "dr-a", ALICE, AclOperation.DELETE))
    assert alice.delete_records([tp])[TopicPartition("dr-a", 0)].result(WAIT).low_watermark == 2


# --- DescribeConfigs, AlterConfigs, IncrementalAlterConfigs -----------------------------


def _incremental(kind: ResourceType, name: str, key: str, value: str) -> ConfigResource:
    return ConfigResource(kind, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_topic_configs_need_describe_configs_and_alter_configs(acls):
    make_topics(acls, "cfg-a")
    alice = admin_client(acls, "alice")
    topic = ConfigResource(ResourceType.TOPIC, "cfg-a")
    refused = ErrorCode.topic_authorization_failed
    assert code_of(alice.describe_configs([topic])[topic]) == refused
    change = _incremental(ResourceType.TOPIC, "cfg-a", "retention.ms", "7200000")
    assert code_of(alice.incremental_alter_configs([change])[change]) == refused
    replace = ConfigResource(ResourceType.TOPIC, "cfg-a", set_config={"retention.ms": "3600000"})
    assert code_of(alice.alter_configs([replace])[replace]) == refused
    # ALTER_CONFIGS grants DESCRIBE_CONFIGS too.
    grant(acls, allow(ResourceType.TOPIC, "cfg-a", ALICE, AclOperation.ALTER_CONFIGS))
    alice.incremental_alter_configs([change])[change].result(WAIT)
    assert alice.describe_configs([topic])[topic].result(WAIT)["retention.ms"].value == "7200000"
    alice.alter_configs([replace])[replace].result(WAIT)
    assert alice.describe_configs([topic])[topic].result(WAIT)["retention.ms"].value == "3600000"


def test_broker_configs_need_rights_on_the_cluster(acls):
    alice = admin_client(acls, "alice")
    broker = ConfigResource(ResourceType.BROKER, "1")
    refused = ErrorCode.cluster_authorization_failed
    assert code_of(alice.describe_configs([broker])[broker]) == refused
    change = _incremental(ResourceType.BROKER, "1", "num.io.threads", "4")
    assert code_of(alice.incremental_alter_configs([change])[change]) == refused
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.DESCRIBE_CONFIGS))
    assert alice.describe_configs([broker])[broker].result(WAIT)["broker.id"].value == "1"
    assert code_of(alice.incremental_alter_configs([change])[change]) == refused
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.ALTER_CONFIGS))
    # Authorized now: what is left is that this broker setting is read-only here.
    assert code_of(alice.incremental_alter_configs([change])[change]) == (
        ErrorCode.invalid_request)


def test_group_configs_need_rights_on_the_group(acls):
    alice = admin_client(acls, "alice")
    group = ConfigResource(ResourceType.GROUP, "cfg-group")
    assert code_of(alice.describe_configs([group])[group]) == ErrorCode.group_authorization_failed
    change = _incremental(ResourceType.GROUP, "cfg-group", "consumer.heartbeat.interval.ms",
                          "6000")
    assert code_of(alice.incremental_alter_configs([change])[change]) == (
        ErrorCode.group_authorization_failed)
    grant(acls, allow(ResourceType.GROUP, "cfg-group", ALICE, AclOperation.ALTER_CONFIGS))
    alice.incremental_alter_configs([change])[change].result(WAIT)
    described = alice.describe_configs([group])[group].result(WAIT)
    assert described["consumer.heartbeat.interval.ms"].value == "6000"


def test_broker_describes_its_authorizer_settings_as_kafka(acls):
    """authorizer.class.name is a Kafka broker config; super.users and
    allow.everyone.if.no.acl.found are the authorizer's own, which Kafka lists when set but as
    sensitive, without their values."""
    broker = ConfigResource(ResourceType.BROKER, "1")
    admin = admin_client(acls)
    configs = admin.describe_configs([broker])[broker].result(WAIT)
    authorizer = configs["authorizer.class.name"]
    assert authorizer.value == STANDARD_AUTHORIZER and not authorizer.is_sensitive
    assert authorizer.source == ConfigSource.STATIC_BROKER_CONFIG.value
    for name in ("super.users", "allow.everyone.if.no.acl.found"):
        entry = configs[name]
        assert entry.is_sensitive and entry.value is None and entry.is_read_only, name
        assert entry.source == ConfigSource.STATIC_BROKER_CONFIG.value, name


def test_broker_without_acls_describes_an_empty_authorizer(tmp_path):
    b = start_broker(tmp_path)
    try:
        broker = ConfigResource(ResourceType.BROKER, "1")
        admin = AdminClient({"bootstrap.servers": f"{HOST}:{b.kafka_port}"})
        configs = admin.describe_configs([broker])[broker].result(WAIT)
    finally:
        b.stop()
    authorizer = configs["authorizer.class.name"]
    assert authorizer.value == "" and authorizer.source == ConfigSource.DEFAULT_CONFIG.value
    assert "super.users" not in configs and "allow.everyone.if.no.acl.found" not in configs


# --- SCRAM credentials and the cluster-wide admin APIs ----------------------------------


def test_scram_credentials_need_describe_and_alter_on_the_cluster(acls):
    from kio.schema.describe_user_scram_credentials.v0.request import (
        DescribeUserScramCredentialsRequest)

    alice = admin_client(acls, "alice")
    refused = ErrorCode.cluster_authorization_failed
    assert code_of(alice.describe_user_scram_credentials(["bob"])["bob"]) == refused
    # Describing every user: the refusal is the whole answer's (confluent-kafka cannot read
    # that answer, so the raw client checks it).
    (every,) = raw(acls, "alice", DescribeUserScramCredentialsRequest(users=None))
    assert (every.error_code, every.results) == (refused, ())
    upsert = UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-secret")
    assert code_of(alice.alter_user_scram_credentials([upsert])["carol"]) == refused
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.DESCRIBE))
    assert code_of(alice.describe_user_scram_credentials(["carol"])["carol"]) == (
        ErrorCode.resource_not_found)  # described now: carol has no credential yet
    assert code_of(alice.alter_user_scram_credentials([upsert])["carol"]) == refused
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.ALTER))
    alice.alter_user_scram_credentials([upsert])["carol"].result(WAIT)
    described = alice.describe_user_scram_credentials(["carol"])["carol"].result(WAIT)
    assert described.scram_credential_infos[0].iterations == 4096


def test_cluster_admin_apis_need_rights_on_the_cluster(acls):
    """ListPartitionReassignments and DescribeQuorum need DESCRIBE, AlterPartitionReassignments
    and AlterReplicaLogDirs ALTER, ListConfigResources DESCRIBE_CONFIGS, all on the cluster."""
    from kio.schema.alter_partition_reassignments.v0 import request as apr
    from kio.schema.alter_replica_log_dirs.v2 import request as arl
    from kio.schema.describe_quorum.v2 import request as dq
    from kio.schema.list_config_resources.v1.request import ListConfigResourcesRequest
    from kio.schema.list_partition_reassignments.v0.request import (
        ListPartitionReassignmentsRequest)

    make_topics(acls, "pl-a")
    metadata_log = dq.TopicData(topic_name="__cluster_metadata",
                                partitions=(dq.PartitionData(partition_index=i32(0)),))
    requests = (
        ListPartitionReassignmentsRequest(timeout=TIMEOUT, topics=None),
        dq.DescribeQuorumRequest(topics=(metadata_log,)),
        apr.AlterPartitionReassignmentsRequest(timeout=TIMEOUT, topics=(apr.ReassignableTopic(
            name="pl-a", partitions=(apr.ReassignablePartition(partition_index=i32(0),
                                                               replicas=None),)),)),
        arl.AlterReplicaLogDirsRequest(dirs=(arl.AlterReplicaLogDir(
            path="/nowhere", topics=(arl.AlterReplicaLogDirTopic(name="pl-a",
                                                                 partitions=(i32(0),)),)),)),
        ListConfigResourcesRequest(resource_types=(i8(2),)),
    )

    def codes() -> list[Any]:
        listed, quorum, reassigned, moved, resources = raw(acls, "alice", *requests)
        return [listed.error_code, quorum.error_code, reassigned.error_code,
                reassigned.responses[0].partitions[0].error_code,
                moved.results[0].partitions[0].error_code, resources.error_code]

    refused = ErrorCode.cluster_authorization_failed
    assert codes() == [refused] * 6
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.DESCRIBE),
          allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.DESCRIBE_CONFIGS))
    assert codes() == [ErrorCode.none, ErrorCode.none, refused, refused, refused, ErrorCode.none]
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.ALTER))
    # Authorized: each answers what it answers anyone (nothing to cancel; no such dir).
    assert codes() == [ErrorCode.none, ErrorCode.none, ErrorCode.none,
                       ErrorCode.no_reassignment_in_progress, ErrorCode.log_dir_not_found,
                       ErrorCode.none]


def test_client_quotas_need_rights_on_the_cluster(acls):
    """DescribeClientQuotas needs DESCRIBE_CONFIGS on the cluster, AlterClientQuotas
    ALTER_CONFIGS (Kafka's CLUSTER_AUTHORIZATION_FAILED, per entry for the alter)."""
    from kio.schema.alter_client_quotas.v1.request import (
        AlterClientQuotasRequest, EntityData, EntryData, OpData,
    )
    from kio.schema.describe_client_quotas.v1.request import DescribeClientQuotasRequest
    from kio.static.primitive import f64

    alter = AlterClientQuotasRequest(entries=(EntryData(
        entity=(EntityData(entity_type="client-id", entity_name="acl-quota"),),
        ops=(OpData(key="producer_byte_rate", value=f64(1e6), remove=False),)),),
        validate_only=False)
    describe = DescribeClientQuotasRequest(components=(), strict=False)
    refused = ErrorCode.cluster_authorization_failed
    described, altered = raw(acls, "alice", describe, alter)
    assert described.error_code == refused and described.entries is None
    assert altered.entries[0].error_code == refused
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.ALTER_CONFIGS))
    assert raw(acls, "alice", alter)[0].entries[0].error_code == ErrorCode.none
    grant(acls, allow(CLUSTER, CLUSTER_NAME, ALICE, AclOperation.DESCRIBE_CONFIGS))
    (described,) = raw(acls, "alice", describe)
    assert [(e.entity[0].entity_name, e.values[0].value) for e in described.entries] == [
        ("acl-quota", 1e6)]
