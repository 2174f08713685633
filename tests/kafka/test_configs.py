"""Config APIs against a real daemon: DescribeConfigs, AlterConfigs, IncrementalAlterConfigs.

Topic configs are served in full and reach the store: after a change, every partition
channel's persisted LogConfig (``channels/<dir>/config.json`` under the data dir) carries
it. Broker configs are described read-only; altering them is INVALID_REQUEST.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

from conftest import BrokerProcess, start_broker
from kmqkafka.store.names import channel_for, dir_name

WAIT = 15.0
# confluent-kafka deprecates the legacy AlterConfigs; it is still an API clients use.
pytestmark = pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")


@pytest.fixture(scope="module")
def kafka(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


@pytest.fixture(scope="module")
def admin(kafka: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap})


def make_topic(admin: AdminClient, name: str, partitions: int = 1,
               config: dict[str, str] | None = None) -> None:
    admin.create_topics([NewTopic(name, partitions, config=config or {})])[name].result(WAIT)


def describe(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    (future,) = admin.describe_configs([ConfigResource("topic", name)]).values()
    return future.result(WAIT)


def failure(future: Any) -> tuple[int, str]:
    with pytest.raises(KafkaException) as info:
        future.result(WAIT)
    err = info.value.args[0]
    return err.code(), err.str()


def channel_config(kafka: BrokerProcess, topic: str, partition: int,
                   **want: Any) -> dict[str, Any]:
    """The LogConfig the store persisted for one partition's channel. A change is written by
    the store's next flush (within a second of it on a lone node), so this waits up to
    ``WAIT`` for the fields named in ``want`` to reach the file; the caller asserts."""
    path = kafka.data_dir / "channels" / dir_name(channel_for(topic, partition)) / "config.json"
    deadline = time.monotonic() + WAIT
    while True:
        stored = json.loads(Path(path).read_text())
        if all(stored.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
            return stored
        time.sleep(0.05)


def restarted(b: BrokerProcess, topic: str, *, crash: bool) -> tuple[AdminClient, dict]:
    """Stop (or kill -9) and restart ``b``; a new admin client and ``topic``'s configs."""
    b.kill() if crash else b.stop()
    b.restart()
    client = AdminClient({"bootstrap.servers": b.bootstrap})
    return client, describe(client, topic)


# --- DescribeConfigs --------------------------------------------------------------------


def test_describe_topic_configs_sources_and_defaults(kafka: BrokerProcess,
                                                     admin: AdminClient) -> None:
    make_topic(admin, "dc", 2, {"retention.bytes": "100000", "cleanup.policy": "compact"})
    configs = describe(admin, "dc")
    rb = configs["retention.bytes"]
    assert (rb.value, rb.source, rb.is_default) == ("100000",
                                                    ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
                                                    False)
    rm = configs["retention.ms"]
    assert (rm.value, rm.source, rm.is_default) == ("604800000", ConfigSource.DEFAULT_CONFIG.value,
                                                    True)
    assert configs["cleanup.policy"].value == "compact"
    assert not any(e.is_read_only for e in configs.values())
    # Created configs reach both partition channels.
    for p in (0, 1):
        stored = channel_config(kafka, "dc", p)
        assert stored["retention_bytes"] == 100000 and stored["cleanup_policy"] == "compact"


def test_describe_synonyms_and_name_filter(kafka: BrokerProcess) -> None:
    from kio.schema.describe_configs.v4.request import DescribeConfigsResource
    from test_admin import call, create  # the raw kio helpers

    create(kafka, "dc-syn", 1)
    response = call(kafka, 32, 4, include_synonyms=True, include_documentation=True, resources=(
        DescribeConfigsResource(resource_type=2, resource_name="dc-syn",
                                configuration_keys=("retention.ms", "segment.bytes", "nope")),
        DescribeConfigsResource(resource_type=2, resource_name="dc-missing",
                                configuration_keys=None)))
    found, missing = response.results
    assert [c.name for c in found.configs] == ["retention.ms", "segment.bytes"]
    retention = found.configs[0]
    # Kafka's broker default is log.retention.hours=168 (log.retention.ms is null, and only
    # synonyms with a value are listed)
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("log.retention.hours", "168", 5)]
    assert retention.config_type == 5  # LONG
    assert retention.documentation
    assert missing.error_code == 3


def test_empty_key_list_means_every_config_as_in_kafka(kafka: BrokerProcess) -> None:
    from kio.schema.describe_configs.v4.request import DescribeConfigsResource
    from test_admin import call, create

    create(kafka, "dc-empty", 1)
    every = call(kafka, 32, 4, include_synonyms=False, include_documentation=False, resources=(
        DescribeConfigsResource(resource_type=2, resource_name="dc-empty",
                                configuration_keys=None),
        DescribeConfigsResource(resource_type=4, resource_name="1", configuration_keys=None)))
    empty = call(kafka, 32, 4, include_synonyms=False, include_documentation=False, resources=(
        DescribeConfigsResource(resource_type=2, resource_name="dc-empty",
                                configuration_keys=()),
        DescribeConfigsResource(resource_type=4, resource_name="1", configuration_keys=())))
    for a, b in zip(every.results, empty.results):
        assert len(a.configs) > 5
        assert [c.name for c in a.configs] == [c.name for c in b.configs]


def test_describe_configs_v1_for_older_clients(kafka: BrokerProcess) -> None:
    """librdkafka 2.0 (kcat) speaks DescribeConfigs v1: sources and synonyms, no types."""
    from kio.schema.describe_configs.v1.request import DescribeConfigsResource
    from test_admin import call, create

    create(kafka, "dc-v1", 1)
    response = call(kafka, 32, 1, include_synonyms=True, resources=(
        DescribeConfigsResource(resource_type=2, resource_name="dc-v1",
                                configuration_keys=("cleanup.policy",)),))
    (entry,) = response.results[0].configs
    assert (entry.name, entry.value, entry.config_source) == ("cleanup.policy", "delete", 5)
    assert [s.name for s in entry.synonyms] == ["log.cleanup.policy"]


def test_describe_unknown_topic_and_broker(admin: AdminClient) -> None:
    (future,) = admin.describe_configs([ConfigResource("topic", "dc-never")]).values()
    assert failure(future)[0] == 3
    (future,) = admin.describe_configs([ConfigResource("broker", "1")]).values()
    broker = future.result(WAIT)
    assert broker["message.max.bytes"].value == "1048576"
    assert broker["broker.id"].value == "1"
    # Only the log defaults can change at runtime (test_broker_configs), as in Kafka.
    assert broker["broker.id"].is_read_only and not broker["message.max.bytes"].is_read_only
    assert {e.name for e in broker.values() if not e.is_read_only} <= {
        "log.cleanup.policy", "compression.type", "message.max.bytes", "min.insync.replicas",
        "unclean.leader.election.enable", "compression.gzip.level", "compression.lz4.level",
        "compression.zstd.level"} | {e.name for e in broker.values()
                                     if e.name.startswith(("log.", "message."))}


# --- AlterConfigs (replace) and IncrementalAlterConfigs ------------------------------------


def test_alter_configs_replaces_whole_set_and_reaches_store(kafka: BrokerProcess,
                                                            admin: AdminClient) -> None:
    make_topic(admin, "ac", 2, {"retention.ms": "1000"})
    resource = ConfigResource("topic", "ac", set_config={"segment.bytes": "1048576",
                                                         "retention.bytes": "5000"})
    (future,) = admin.alter_configs([resource]).values()
    future.result(WAIT)
    configs = describe(admin, "ac")
    assert configs["segment.bytes"].value == "1048576"
    assert configs["retention.bytes"].value == "5000"
    assert configs["retention.ms"].is_default  # not named: back to the default
    for p in (0, 1):
        stored = channel_config(kafka, "ac", p, segment_bytes=1048576, retention_bytes=5000,
                                retention_ms=604800000)
        assert stored["segment_bytes"] == 1048576 and stored["retention_bytes"] == 5000
        assert stored["retention_ms"] == 604800000


def test_alter_configs_validate_only_and_bad_values(admin: AdminClient) -> None:
    make_topic(admin, "ac-dry")
    dry = ConfigResource("topic", "ac-dry", set_config={"retention.ms": "42"})
    (future,) = admin.alter_configs([dry], validate_only=True).values()
    future.result(WAIT)
    assert describe(admin, "ac-dry")["retention.ms"].is_default
    bad = ConfigResource("topic", "ac-dry", set_config={"retention.ms": "-7"})
    (future,) = admin.alter_configs([bad]).values()
    assert failure(future)[0] == 40
    unknown = ConfigResource("topic", "ac-dry", set_config={"no.such": "1"})
    (future,) = admin.alter_configs([unknown]).values()
    assert failure(future) == (40, "Unknown topic config name: no.such")
    missing = ConfigResource("topic", "ac-never", set_config={"retention.ms": "1"})
    (future,) = admin.alter_configs([missing]).values()
    assert failure(future)[0] == 3


def test_every_kafka_topic_config_is_accepted_and_numbers_parse_as_java_does(
        admin: AdminClient) -> None:
    """Configs tools set on real Kafka topics (codec levels, tiered storage, throttles) are
    accepted and described; numbers are Java longs, so '1_000' is not one."""
    settings = {"compression.zstd.level": "5", "compression.gzip.level": "9",
                "local.retention.ms": "-2", "remote.storage.enable": "false",
                "follower.replication.throttled.replicas": "*",
                "retention.ms": " +5000 "}
    make_topic(admin, "kafka-configs", config=settings)
    described = describe(admin, "kafka-configs")
    for name, value in settings.items():
        assert described[name].value == value and not described[name].is_default, name
    assert described["compression.lz4.level"].value == "9"  # Kafka's default
    bad = {"retention.ms": "1_000", "segment.bytes": "1_048_576", "retention.bytes": "１２",
           "compression.gzip.level": "12", "compression.lz4.level": "0",
           "remote.storage.enable": "yes", "max.message.bytes": "2147483648"}
    for name, value in bad.items():
        fs = admin.create_topics([NewTopic("kafka-configs-bad", 1, config={name: value})])
        code, message = failure(fs["kafka-configs-bad"])
        assert code == 40 and name in message, (name, message)  # INVALID_CONFIG
    # Kafka 4's smallest segment is 1 MiB (KIP-1030).
    fs = admin.create_topics([NewTopic("kafka-configs-bad", 1,
                                       config={"segment.bytes": "1048575"})])
    assert failure(fs["kafka-configs-bad"]) == (
        40, "Invalid value 1048575 for configuration segment.bytes: "
            "Value must be at least 1048576")


def test_min_insync_replicas_above_the_live_members_refuses_acks_all(
        kafka: BrokerProcess, admin: AdminClient) -> None:
    from confluent_kafka import Producer

    make_topic(admin, "min-isr", config={"min.insync.replicas": "2"})
    outcomes: dict[str, Any] = {}
    for acks in ("all", "1"):
        p = Producer({"bootstrap.servers": kafka.bootstrap, "acks": acks,
                      "message.timeout.ms": 3000, "retries": 0})
        p.produce("min-isr", b"v", on_delivery=lambda err, _m, a=acks: outcomes.__setitem__(a, err))
        p.flush(WAIT)
    assert outcomes["all"] is not None and outcomes["all"].code() == 19  # NOT_ENOUGH_REPLICAS
    assert outcomes["1"] is None  # Kafka checks min.insync.replicas for acks=all only


def test_incremental_set_delete_append_subtract(kafka: BrokerProcess, admin: AdminClient) -> None:
    make_topic(admin, "iac", 1, {"retention.ms": "1000"})

    def alter(*entries: ConfigEntry, validate_only: bool = False) -> Any:
        resource = ConfigResource("topic", "iac", incremental_configs=list(entries))
        (future,) = admin.incremental_alter_configs([resource],
                                                    validate_only=validate_only).values()
        return future

    alter(ConfigEntry("max.message.bytes", "2000000",
                      incremental_operation=AlterConfigOpType.SET)).result(WAIT)
    configs = describe(admin, "iac")
    assert configs["max.message.bytes"].value == "2000000"
    assert configs["retention.ms"].value == "1000"  # untouched by an incremental change
    assert channel_config(kafka, "iac", 0, max_message_bytes=2000000)["max_message_bytes"] == 2000000

    alter(ConfigEntry("cleanup.policy", "compact",
                      incremental_operation=AlterConfigOpType.APPEND)).result(WAIT)
    assert describe(admin, "iac")["cleanup.policy"].value == "delete,compact"
    assert channel_config(kafka, "iac", 0, cleanup_policy="compact,delete")["cleanup_policy"] == "compact,delete"
    alter(ConfigEntry("cleanup.policy", "delete",
                      incremental_operation=AlterConfigOpType.SUBTRACT)).result(WAIT)
    assert describe(admin, "iac")["cleanup.policy"].value == "compact"
    assert channel_config(kafka, "iac", 0, cleanup_policy="compact")["cleanup_policy"] == "compact"

    alter(ConfigEntry("retention.ms", None,
                      incremental_operation=AlterConfigOpType.DELETE)).result(WAIT)
    assert describe(admin, "iac")["retention.ms"].is_default
    assert channel_config(kafka, "iac", 0, retention_ms=604800000)["retention_ms"] == 604800000

    not_list = alter(ConfigEntry("retention.ms", "5",
                                 incremental_operation=AlterConfigOpType.APPEND))
    assert failure(not_list) == (40, "Can't APPEND to key retention.ms because its type is "
                                     "not LIST.")
    dry = alter(ConfigEntry("segment.ms", "1000", incremental_operation=AlterConfigOpType.SET),
                validate_only=True)
    dry.result(WAIT)
    assert describe(admin, "iac")["segment.ms"].is_default


def test_broker_configs_other_than_log_defaults_are_read_only(admin: AdminClient) -> None:
    resource = ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("num.io.threads", "1", incremental_operation=AlterConfigOpType.SET)])
    (future,) = admin.incremental_alter_configs([resource]).values()
    code, message = failure(future)
    assert code == 42 and "Cannot update these configs dynamically" in message


# --- kafka-python -------------------------------------------------------------------------


def test_kafka_python_describe_and_alter(kafka: BrokerProcess, admin: AdminClient) -> None:
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    make_topic(admin, "kp-cfg", 1, {"retention.bytes": "7777"})
    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10000)
    try:
        described = client.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp-cfg")],
                                            config_filter="all")
        flat = json.dumps(described, default=str)
        assert "retention.bytes" in flat and "7777" in flat
        result = client.alter_configs([KpResource(ConfigResourceType.TOPIC, "kp-cfg",
                                                  {"retention.ms": "86400000"})])
        assert "OK" in json.dumps(result)
        client.alter_configs([KpResource(ConfigResourceType.TOPIC, "kp-cfg",
                                         {"retention.ms": "3600000"})], incremental=False)
    finally:
        client.close()
    configs = describe(admin, "kp-cfg")
    assert configs["retention.ms"].value == "3600000"
    # kafka-python's legacy path re-sends the modified keys, so the replace kept this one.
    assert configs["retention.bytes"].value == "7777"
    assert channel_config(kafka, "kp-cfg", 0, retention_ms=3600000)["retention_ms"] == 3600000


def test_aiokafka_describe_configs(kafka: BrokerProcess, admin: AdminClient) -> None:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource as AioResource
    from aiokafka.admin.config_resource import ConfigResourceType as AioType

    make_topic(admin, "aio-cfg", 1, {"segment.bytes": "2097152"})

    async def run() -> Any:
        client = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10000)
        await client.start()
        try:
            return await client.describe_configs([AioResource(AioType.TOPIC, "aio-cfg")])
        finally:
            await client.close()

    responses = asyncio.run(asyncio.wait_for(run(), WAIT * 2))
    assert "2097152" in repr(responses)


def test_topic_configs_and_partitions_survive_restart(tmp_path: Path) -> None:
    b = start_broker(tmp_path)
    try:
        client = AdminClient({"bootstrap.servers": b.bootstrap})
        make_topic(client, "durable-cfg", 1, {"retention.bytes": "12345"})
        client.create_partitions([NewPartitions("durable-cfg", 3)])["durable-cfg"].result(WAIT)
        resource = ConfigResource("topic", "durable-cfg", incremental_configs=[
            ConfigEntry("segment.bytes", "2000000", incremental_operation=AlterConfigOpType.SET)])
        (future,) = client.incremental_alter_configs([resource]).values()
        future.result(WAIT)
        client, configs = restarted(b, "durable-cfg", crash=False)
        assert configs["retention.bytes"].value == "12345"
        assert configs["segment.bytes"].value == "2000000"
        md = client.list_topics("durable-cfg", timeout=WAIT)
        assert len(md.topics["durable-cfg"].partitions) == 3
        # The grown partition got the topic's configs too.
        assert channel_config(b, "durable-cfg", 2)["retention_bytes"] == 12345
        assert channel_config(b, "durable-cfg", 2)["segment_bytes"] == 2000000
    finally:
        b.stop()


def test_every_config_is_documented_when_asked(kafka: BrokerProcess) -> None:
    """Kafka documents every config it describes (include_documentation): topic and broker
    resources alike, and none when not asked."""
    from kio.schema.describe_configs.v4.request import DescribeConfigsResource
    from test_admin import call, create

    create(kafka, "dc-docs", 1)
    resources = (DescribeConfigsResource(resource_type=2, resource_name="dc-docs",
                                         configuration_keys=None),
                 DescribeConfigsResource(resource_type=4, resource_name="1",
                                         configuration_keys=None))
    asked = call(kafka, 32, 4, include_synonyms=False, include_documentation=True,
                 resources=resources)
    for result in asked.results:
        undocumented = [c.name for c in result.configs if not c.documentation]
        assert result.configs and undocumented == []
    plain = call(kafka, 32, 4, include_synonyms=False, include_documentation=False,
                 resources=resources)
    assert all(c.documentation is None for r in plain.results for c in r.configs)


def _alter_request(*changes: tuple[str, str, str | None], incremental: bool = True) -> Any:
    """One IncrementalAlterConfigs (SET) or AlterConfigs request: (topic, key, value) each its
    own resource entry."""
    from kio.static.primitive import i8

    if incremental:
        from kio.schema.incremental_alter_configs.v1 import request as m
        return m.IncrementalAlterConfigsRequest(validate_only=False, resources=tuple(
            m.AlterConfigsResource(resource_type=i8(2), resource_name=topic, configs=(
                m.AlterableConfig(name=key, config_operation=i8(0), value=value),))
            for topic, key, value in changes))
    from kio.schema.alter_configs.v2 import request as m
    return m.AlterConfigsRequest(validate_only=False, resources=tuple(
        m.AlterConfigsResource(resource_type=i8(2), resource_name=topic, configs=(
            m.AlterableConfig(name=key, value=value),))
        for topic, key, value in changes))


def test_concurrent_changes_to_one_topic_all_apply(kafka: BrokerProcess,
                                                   admin: AdminClient) -> None:
    """Kafka's controller applies them one after the other; here a change whose catalog write
    lost the race runs again on the new state (it used to be UNKNOWN_SERVER_ERROR)."""
    from rawkafka import RawClient

    make_topic(admin, "ac-race")
    clients = [RawClient(kafka.kafka_port) for _ in range(3)]
    try:
        for i in range(5):
            keys = ("retention.ms", "retention.bytes", "segment.ms")
            requests = [_alter_request(("ac-race", key, str(100000 + i))) for key in keys]
            for c, r in zip(clients, requests):
                c.send(r)  # all in flight at once
            answers = [c.receive(r).responses[0] for c, r in zip(clients, requests)]
            assert [a.error_code for a in answers] == [0, 0, 0], answers
            configs = describe(admin, "ac-race")
            assert {configs[k].value for k in keys} == {str(100000 + i)}
    finally:
        for c in clients:
            c.close()


def test_a_resource_named_twice_and_legacy_nulls_change_nothing(kafka: BrokerProcess,
                                                                admin: AdminClient) -> None:
    from rawkafka import RawClient

    make_topic(admin, "ac-dup", config={"cleanup.policy": "compact"})
    with RawClient(kafka.kafka_port) as c:
        for incremental in (True, False):
            twice = _alter_request(("ac-dup", "retention.ms", "1111"),
                                   ("ac-dup", "retention.bytes", "2222"),
                                   incremental=incremental)
            assert [(r.error_code, r.error_message) for r in c.call(twice).responses] == [
                (42, "Each resource must appear at most once.")] * 2
        null = _alter_request(("ac-dup", "retention.ms", None), incremental=False)
        assert c.call(null).responses[0].error_code == 42  # it would drop every other config
    configs = describe(admin, "ac-dup")
    assert configs["retention.ms"].is_default and configs["retention.bytes"].is_default
    assert configs["cleanup.policy"].value == "compact"


def test_group_configs_describe_alter_and_reach_the_coordinator(kafka: BrokerProcess,
                                                                admin: AdminClient) -> None:
    """Kafka 4's GROUP config resource: defaults for any group, per-group overrides set and
    deleted incrementally, bad names and values refused, and a member's next heartbeat
    answer carries the overridden interval."""
    import datetime
    import uuid

    from confluent_kafka.admin import ResourceType

    from kio.static.primitive import i32, i32Timedelta
    from test_admin import call

    group = f"cfg-group-{uuid.uuid4().hex[:8]}"
    res = ConfigResource(ResourceType.GROUP, group)
    described = admin.describe_configs([res])[res].result(WAIT)
    assert described["consumer.session.timeout.ms"].value == "45000"
    assert described["consumer.heartbeat.interval.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    def alter(*entries: ConfigEntry) -> None:
        target = ConfigResource(ResourceType.GROUP, group, incremental_configs=list(entries))
        admin.incremental_alter_configs([target])[target].result(WAIT)

    alter(ConfigEntry("consumer.heartbeat.interval.ms", "7000",
                      incremental_operation=AlterConfigOpType.SET))
    described = admin.describe_configs([res])[res].result(WAIT)
    assert described["consumer.heartbeat.interval.ms"].value == "7000"
    assert described["consumer.heartbeat.interval.ms"].source == 8  # DYNAMIC_GROUP_CONFIG
    for name, value in (("consumer.session.timeout.ms", "1000"), ("no.such.config", "1"),
                        ("consumer.heartbeat.interval.ms", "x")):
        with pytest.raises(KafkaException) as err:
            alter(ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET))
        assert err.value.args[0].name() == "INVALID_CONFIG", name

    hb = call(kafka, 68, 0, group_id=group, member_id=str(uuid.uuid4()), member_epoch=i32(0),
              instance_id=None, rack_id=None,
              rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
              subscribed_topic_names=("cfg-group-topic",), server_assignor=None,
              topic_partitions=())
    assert hb.error_code == 0 and hb.heartbeat_interval == datetime.timedelta(seconds=7)

    alter(ConfigEntry("consumer.heartbeat.interval.ms", None,
                      incremental_operation=AlterConfigOpType.DELETE))
    described = admin.describe_configs([res])[res].result(WAIT)
    assert described["consumer.heartbeat.interval.ms"].value == "5000"


def test_a_topic_created_and_altered_just_before_kill_9_is_whole_after_restart(
        tmp_path: Path) -> None:
    """Both changes are in the Raft log, not yet in a checkpoint: replay makes them again.
    config.json is rewritten by a later flush, so the change comes back from the Raft log.
    The replayed create used to fail its catalog check against the altered entry, leaving
    the topic listed with no partitions behind it (produce hung)."""
    b = start_broker(tmp_path)
    try:
        client = AdminClient({"bootstrap.servers": b.bootstrap})
        make_topic(client, "crash-cfg", 4)
        resources = [ConfigResource("topic", "crash-cfg", incremental_configs=[
            ConfigEntry("retention.ms", "4242424", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", "compact",
                        incremental_operation=AlterConfigOpType.SET)])]
        for future in client.incremental_alter_configs(resources).values():
            future.result(WAIT)
        _client, configs = restarted(b, "crash-cfg", crash=True)
        assert configs["retention.ms"].value == "4242424"
        assert configs["cleanup.policy"].value == "compact"
        for p in range(4):
            stored = channel_config(b, "crash-cfg", p, retention_ms=4242424)
            assert stored["retention_ms"] == 4242424 and stored["cleanup_policy"] == "compact"
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                             "message.timeout.ms": 10_000})
        offsets: list[Any] = []
        for p in range(4):
            producer.produce("crash-cfg", key=b"k", value=b"v", partition=p,
                             on_delivery=lambda err, msg: offsets.append(
                                 (err, msg.partition(), msg.offset())))
        assert producer.flush(WAIT) == 0
        assert sorted(offsets) == [(None, p, 0) for p in range(4)]
    finally:
        b.stop()


# --- Kafka's validation of topic config values ------------------------------------------

# What a Kafka 3.x/4.x broker answers for each bad value: ConfigDef's wording, with the value
# as it was parsed ("2.0", a list in brackets) where the validator saw the parsed one.
_KAFKA_WORDING = {
    ("cleanup.policy", "foo"):
        "Invalid value foo for configuration cleanup.policy: String must be one of: compact, "
        "delete",
    ("compression.type", "brotli"):
        "Invalid value brotli for configuration compression.type: String must be one of: "
        "uncompressed, zstd, lz4, snappy, gzip, producer",
    ("message.timestamp.type", "Foo"):
        "Invalid value Foo for configuration message.timestamp.type: String must be one of: "
        "CreateTime, LogAppendTime",
    ("preallocate", "yes"):
        "Invalid value yes for configuration preallocate: Expected value to be either true or "
        "false",
    ("min.cleanable.dirty.ratio", "2"):
        "Invalid value 2.0 for configuration min.cleanable.dirty.ratio: Value must be no more "
        "than 1",
    ("min.cleanable.dirty.ratio", "half"):
        "Invalid value half for configuration min.cleanable.dirty.ratio: Not a number of type "
        "DOUBLE",
    ("compression.gzip.level", "0"):
        "Invalid value 0 for configuration compression.gzip.level: Value must be between 1 and "
        "9 or equal to -1",
    ("segment.bytes", " 100 "):
        "Invalid value 100 for configuration segment.bytes: Value must be at least 1048576",
    ("leader.replication.throttled.replicas", "0:1,1:x"):
        "Invalid value [0:1, 1:x] for configuration leader.replication.throttled.replicas: "
        "leader.replication.throttled.replicas must be the literal '*' or a list of replicas "
        "in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...",
    ("remote.storage.enable", "true"):
        "Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
        "with remote log storage.",
}


def test_bad_config_values_are_worded_as_kafka_words_them(admin: AdminClient) -> None:
    """INVALID_CONFIG carries ConfigDef's reason after the value; tiered storage is refused
    as by a Kafka broker without it, and gzip level 0 is not a level Kafka takes."""
    topics = [NewTopic(f"wording-{i}", 1, config={name: value})
              for i, (name, value) in enumerate(_KAFKA_WORDING)]
    futures = admin.create_topics(topics)
    for topic, expected in zip(topics, _KAFKA_WORDING.values()):
        assert failure(futures[topic.topic]) == (40, expected)


def test_negative_retention_bytes_and_an_empty_cleanup_policy_are_valid(
        kafka: BrokerProcess, admin: AdminClient) -> None:
    """Kafka puts no bound on retention.bytes (any negative size is no limit) and takes an
    empty cleanup.policy list: segments are then neither deleted nor compacted."""
    make_topic(admin, "kafka-valid", config={"retention.bytes": "-2", "cleanup.policy": ""})
    described = describe(admin, "kafka-valid")
    assert described["retention.bytes"].value == "-2"
    assert described["cleanup.policy"].value == ""
    stored = channel_config(kafka, "kafka-valid", 0)
    assert stored["retention_bytes"] is None and stored["cleanup_policy"] == ""


def test_incremental_delete_of_an_unknown_name_changes_nothing(admin: AdminClient) -> None:
    """Kafka's controller answers NONE for DELETE of a config that is not set (even one it
    does not know), says "type is not LIST" to APPEND on an unknown name, and accepts a
    SUBTRACT that empties cleanup.policy."""
    make_topic(admin, "iac-unknown", config={"cleanup.policy": "delete"})

    def alter(name: str, value: str | None, op: AlterConfigOpType) -> Any:
        resource = ConfigResource("topic", "iac-unknown", incremental_configs=[
            ConfigEntry(name, value, incremental_operation=op)])
        (future,) = admin.incremental_alter_configs([resource]).values()
        return future

    alter("no.such.config", None, AlterConfigOpType.DELETE).result(WAIT)
    assert failure(alter("no.such.config", "x", AlterConfigOpType.APPEND)) == (
        40, "Can't APPEND to key no.such.config because its type is not LIST.")
    alter("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT).result(WAIT)
    assert describe(admin, "iac-unknown")["cleanup.policy"].value == ""


def test_broker_describes_the_kafka_settings_it_has(admin: AdminClient) -> None:
    """Kafka describes every broker config; tools commonly read these, and this broker has
    each of them (offsets.topic.num.partitions is how __consumer_offsets is shown)."""
    (future,) = admin.describe_configs([ConfigResource("broker", "1")]).values()
    configs = future.result(WAIT)
    assert configs["delete.topic.enable"].value == "true"
    assert configs["offsets.topic.num.partitions"].value == "50"
    for name, value in {"connections.max.idle.ms": "600000",
                        "group.initial.rebalance.delay.ms": "3000",
                        "group.consumer.session.timeout.ms": "45000",
                        "group.consumer.heartbeat.interval.ms": "5000",
                        "group.consumer.migration.policy": "bidirectional"}.items():
        assert configs[name].value == value and configs[name].is_read_only, name
    # Kafka's default: records stamped long ago stay readable for as long as against Kafka
    # (librdkafka's 0059_bsearch writes 1970 timestamps and reads them back a minute later).
    check = configs["log.retention.check.interval.ms"]
    assert check.value == "300000" and check.source == ConfigSource.DEFAULT_CONFIG.value
