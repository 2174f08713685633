"""A share group's own configs (the GROUP config resource) as librdkafka's ShareConsumer meets
them: ``share.isolation.level=read_committed`` delivers committed transactions only and holds
back an open one until its commit, ``share.delivery.count.limit`` archives a record released
that many times, ``share.auto.offset.reset=by_duration:`` starts at the first record young
enough; and the values Kafka refuses are refused.
"""
from __future__ import annotations

import time
import uuid

import pytest
from conftest import BrokerProcess
from test_share_groups import (
    acknowledge_each, create, drain, produce, quiet, set_group_configs, share_consumer, unique,
)

from confluent_kafka import AcknowledgeType, KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType,
)

pytestmark = pytest.mark.timeout(90)


def _transaction(producer: Producer, topic: str, values: list[bytes], *, commit: bool | None
                 ) -> None:
    """One transaction of ``values``; ``commit`` None leaves it open."""
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, value=v)
    producer.flush(30)
    if commit is True:
        producer.commit_transaction(30)
    elif commit is False:
        producer.abort_transaction(30)


def test_read_committed_share_groups_skip_aborted_and_wait_for_open_transactions(
        shared_broker: BrokerProcess):
    bs, topic = shared_broker.bootstrap, unique("share-txn")
    committed_group, uncommitted_group = unique("sg-rc"), unique("sg-ru")
    create(bs, topic)
    set_group_configs(bs, committed_group, share_auto_offset_reset="earliest",
                      share_isolation_level="read_committed")
    set_group_configs(bs, uncommitted_group, share_auto_offset_reset="earliest")
    txp = Producer({"bootstrap.servers": bs, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                    "linger.ms": 5})
    txp.init_transactions(30)
    _transaction(txp, topic, [b"c-0", b"c-1"], commit=True)
    _transaction(txp, topic, [b"a-0", b"a-1", b"a-2"], commit=False)
    produce(bs, topic, "p", 2)  # not transactional: both levels see it
    _transaction(txp, topic, [b"o-0", b"o-1"], commit=None)
    produce(bs, topic, "late", 1)  # behind the open transaction: held back with it

    rc = share_consumer(bs, committed_group, topic)
    ru = share_consumer(bs, uncommitted_group, topic)
    try:
        before = drain(rc, 4, settle=1.5)
        everything = drain(ru, 10, settle=0.5)
        txp.commit_transaction(30)
        after = drain(rc, 3, settle=0.5)
    finally:
        rc.close()
        ru.close()
    assert [r.value for r in before] == [b"c-0", b"c-1", b"p-0", b"p-1"]
    assert sorted(r.value for r in after) == [b"late-0", b"o-0", b"o-1"]
    assert sorted(r.value for r in everything) == sorted(
        [b"c-0", b"c-1", b"a-0", b"a-1", b"a-2", b"p-0", b"p-1", b"o-0", b"o-1", b"late-0"])


def test_the_groups_delivery_count_limit_archives_a_released_record(
        shared_broker: BrokerProcess):
    bs, topic, group = shared_broker.bootstrap, unique("share-limit"), unique("sg")
    create(bs, topic)
    set_group_configs(bs, group, share_auto_offset_reset="earliest",
                      share_delivery_count_limit="2")
    produce(bs, topic, "x", 1)
    c = share_consumer(bs, group, topic, explicit=True)
    try:
        deliveries = acknowledge_each(c, lambda _offset: AcknowledgeType.RELEASE, 2)
        later = quiet(c, 1.5)
    finally:
        c.close()
    assert deliveries == [(0, 1), (0, 2)] and later == []


def test_by_duration_starts_a_new_group_at_the_first_record_young_enough(
        shared_broker: BrokerProcess):
    bs, topic, group = shared_broker.bootstrap, unique("share-age"), unique("sg")
    create(bs, topic)
    produce(bs, topic, "old", 3)
    time.sleep(2.5)
    recent = produce(bs, topic, "new", 2)
    set_group_configs(bs, group, share_auto_offset_reset="by_duration:PT1.5S")
    c = share_consumer(bs, group, topic)
    try:
        records = drain(c, 2, settle=0.5)
    finally:
        c.close()
    assert [r.value for r in records] == [s.value for s in recent]
    assert [r.offset for r in records] == [3, 4]


def test_share_group_config_values_kafka_refuses_are_refused(shared_broker: BrokerProcess):
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    group = unique("sg-cfg")
    res = ConfigResource(ResourceType.GROUP, group)
    described = admin.describe_configs([res])[res].result(30)
    assert {name: described[name].value for name in (
        "share.isolation.level", "share.delivery.count.limit",
        "share.partition.max.record.locks", "share.auto.offset.reset")} == {
        "share.isolation.level": "read_uncommitted", "share.delivery.count.limit": "5",
        "share.partition.max.record.locks": "2000", "share.auto.offset.reset": "latest"}
    for name, value in (("share.isolation.level", "serializable"),
                        ("share.delivery.count.limit", "1"),
                        ("share.delivery.count.limit", "11"),
                        ("share.partition.max.record.locks", "99"),
                        ("share.auto.offset.reset", "by_duration:-PT1S"),
                        ("share.auto.offset.reset", "by_duration:"),
                        ("share.auto.offset.reset", "by_duration")):
        target = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as err:
            admin.incremental_alter_configs([target])[target].result(30)
        assert err.value.args[0].name() == "INVALID_CONFIG", (name, value)
    set_group_configs(shared_broker.bootstrap, group, share_isolation_level="read_committed",
                      share_auto_offset_reset="by_duration:P1DT2H")
    described = admin.describe_configs([res])[res].result(30)
    assert described["share.isolation.level"].value == "read_committed"
    assert described["share.auto.offset.reset"].value == "by_duration:P1DT2H"
