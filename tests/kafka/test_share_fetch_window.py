"""ShareFetch edge cases with raw requests. A full in-flight window: one member holds every
lock the share-partition allows (2,000 records), so another member's ShareFetch takes nothing
and waits out its max_wait (it must neither spin nor answer at once), and gets the records as
soon as the first member releases them. A closed session: a ShareFetch parked when its
member's final ShareAcknowledge closed the session takes nothing when data arrives."""
from __future__ import annotations

import datetime
import threading
import time
import uuid

import pytest
from conftest import BrokerProcess
from kio.schema.errors import ErrorCode as E
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.share_acknowledge.v1.request import (
    AcknowledgementBatch, AcknowledgePartition, AcknowledgeTopic, ShareAcknowledgeRequest,
)
from kio.schema.share_fetch.v1.request import FetchPartition, FetchTopic, ShareFetchRequest
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType,
)

RELEASE = 2


def join(raw: RawClient, group: str, member: str, topic: str) -> None:
    r = raw.call(ShareGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=0,
                                            rack_id=None, subscribed_topic_names=(topic,)))
    assert r.error_code is E.none, r


def share_fetch(raw: RawClient, group: str, member: str, topic_id: uuid.UUID, epoch: int,
                max_wait_ms: int, max_records: int) -> object:
    return raw.call(ShareFetchRequest(
        group_id=group, member_id=member, share_session_epoch=epoch,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=50 << 20,
        max_records=max_records, batch_size=max_records,
        topics=(FetchTopic(topic_id=topic_id, partitions=(
            FetchPartition(partition_index=0, acknowledgement_batches=()),)),),
        forgotten_topics_data=()))


def acquired(response: object) -> list[tuple[int, int, int]]:
    return [(a.first_offset, a.last_offset, a.delivery_count)
            for t in response.responses for p in t.partitions for a in p.acquired_records]


def test_a_full_window_waits_for_releases(broker: BrokerProcess) -> None:
    topic, group = f"win-{uuid.uuid4().hex[:6]}", f"wg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    entry = ConfigEntry("share.auto.offset.reset", "earliest",
                        incremental_operation=AlterConfigOpType.SET)
    for f in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                  "batch.num.messages": 100})  # batches of 100: the window cuts between them
    for i in range(2500):
        p.produce(topic, b"r%d" % i)
    assert p.flush(30) == 0
    with RawClient(broker.kafka_port) as raw:
        meta = raw.call(MetadataRequest(topics=(MetadataRequestTopic(topic_id=None,
                                                                     name=topic),),
                                        allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False))
    topic_id = meta.topics[0].topic_id

    with RawClient(broker.kafka_port) as a, RawClient(broker.kafka_port) as b:
        join(a, group, "member-a", topic)
        join(b, group, "member-b", topic)
        got_a = acquired(share_fetch(a, group, "member-a", topic_id, 0, 0, 5000))
        held = sum(last - first + 1 for first, last, _n in got_a)
        assert got_a[0][0] == 0 and 2000 <= held <= 2100  # whole batches, up to the limit

        start = time.monotonic()
        r = share_fetch(b, group, "member-b", topic_id, 0, 700, 5000)
        waited = time.monotonic() - start
        assert r.error_code is E.none and acquired(r) == []
        assert 0.6 <= waited < 3.0, waited  # waited out max_wait: no spin, no early answer

        # b parks again; a releasing everything it holds wakes b at once.
        answer: list[object] = []
        waiter = threading.Thread(target=lambda: answer.append(
            share_fetch(b, group, "member-b", topic_id, 1, 10_000, 5000)))
        waiter.start()
        time.sleep(0.3)
        start = time.monotonic()
        ack = a.call(ShareAcknowledgeRequest(
            group_id=group, member_id="member-a", share_session_epoch=1,
            topics=(AcknowledgeTopic(topic_id=topic_id, partitions=(AcknowledgePartition(
                partition_index=0, acknowledgement_batches=(AcknowledgementBatch(
                    first_offset=0, last_offset=held - 1, acknowledge_types=(RELEASE,)),)),)),)))
        assert ack.error_code is E.none
        assert [p.error_code for t in ack.responses for p in t.partitions] == [E.none]
        waiter.join(15)
        assert answer and time.monotonic() - start < 5.0
        again = acquired(answer[0])
        assert again and again[0][0] == 0 and again[0][2] == 2  # redelivered, second time


def test_a_fetch_parked_when_its_session_closed_takes_nothing(broker: BrokerProcess) -> None:
    """librdkafka closes a share consumer with its final ShareAcknowledge (epoch -1) on one
    connection while a ShareFetch may still be parked on another: records arriving after the
    close must not be locked for the closed session, or they wait out a lock duration."""
    topic, group = f"cls-{uuid.uuid4().hex[:6]}", f"cg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    with RawClient(broker.kafka_port) as raw:
        meta = raw.call(MetadataRequest(topics=(MetadataRequestTopic(topic_id=None,
                                                                     name=topic),),
                                        allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False))
    topic_id = meta.topics[0].topic_id
    with RawClient(broker.kafka_port) as a, RawClient(broker.kafka_port) as a2, \
            RawClient(broker.kafka_port) as b:
        join(a, group, "member-a", topic)
        assert acquired(share_fetch(a, group, "member-a", topic_id, 0, 0, 500)) == []
        parked: list[object] = []
        waiter = threading.Thread(target=lambda: parked.append(
            share_fetch(a, group, "member-a", topic_id, 1, 8_000, 500)))
        waiter.start()
        time.sleep(0.3)
        closed = a2.call(ShareAcknowledgeRequest(group_id=group, member_id="member-a",
                                                 share_session_epoch=-1, topics=()))
        assert closed.error_code is E.none
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(5):
            p.produce(topic, b"late%d" % i)
        assert p.flush(30) == 0
        waiter.join(15)
        assert parked and acquired(parked[0]) == []
        join(b, group, "member-b", topic)
        got = acquired(share_fetch(b, group, "member-b", topic_id, 0, 3_000, 500))
        # The five records may reach the log as one batch or several: one run or more.
        assert [(o, n) for first, last, n in got for o in range(first, last + 1)] == [
            (o, 1) for o in range(5)]
