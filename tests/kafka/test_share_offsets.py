"""Share-group offset admin (DescribeShareGroupOffsets, AlterShareGroupOffsets,
DeleteShareGroupOffsets) against a share group that a real confluent-kafka ShareConsumer
read: the start offsets and lag it reports, refusals while the group has members, and a
consumer reading again from where Alter moved the group; ``/metrics`` shows the same lag."""
from __future__ import annotations

import time
import uuid

import pytest
from conftest import BrokerProcess, http_get
from kio.schema.alter_share_group_offsets.v0.request import (
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsRequestPartition,
    AlterShareGroupOffsetsRequestTopic,
)
from kio.schema.delete_share_group_offsets.v0.request import (
    DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsRequestTopic,
)
from kio.schema.describe_share_group_offsets.v1.request import (
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsRequestGroup,
    DescribeShareGroupOffsetsRequestTopic,
)
from kio.schema.errors import ErrorCode as E
from rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType,
)


def consume(bootstrap: str, group: str, topic: str, want: int, timeout: float = 20.0
            ) -> tuple[ShareConsumer, list[tuple[int, int]]]:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    c.subscribe([topic])
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [(m.partition(), m.offset()) for m in c.poll(0.5) if not m.error()]
    return c, got


def describe(port: int, group: str, topics: list[tuple[str, list[int]]] | None = None) -> dict:
    wanted = None if topics is None else tuple(
        DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=tuple(ps))
        for t, ps in topics)
    with RawClient(port) as raw:
        r = raw.call(DescribeShareGroupOffsetsRequest(groups=(
            DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=wanted),)))
    g = r.groups[0]
    return {"error": g.error_code,
            "rows": {(t.topic_name, p.partition_index): (p.start_offset, p.lag, p.error_code)
                     for t in g.topics for p in t.partitions}}


def alter(port: int, group: str, topic: str, starts: dict[int, int]) -> tuple:
    with RawClient(port) as raw:
        r = raw.call(AlterShareGroupOffsetsRequest(group_id=group, topics=(
            AlterShareGroupOffsetsRequestTopic(topic_name=topic, partitions=tuple(
                AlterShareGroupOffsetsRequestPartition(partition_index=p, start_offset=o)
                for p, o in starts.items())),)))
    return r.error_code, [p.error_code for t in r.responses for p in t.partitions]


def test_describe_alter_and_delete_share_group_offsets(broker: BrokerProcess) -> None:
    topic, group = f"so-{uuid.uuid4().hex[:6]}", f"sg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    port = broker.kafka_port
    assert describe(port, group)["error"] is E.group_id_not_found

    # 10 records in each partition, read from the start and accepted.
    entry = ConfigEntry("share.auto.offset.reset", "earliest",
                        incremental_operation=AlterConfigOpType.SET)
    for f in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])]).values():
        f.result(30)
    c, got = consume(broker.bootstrap, group, topic, 0, timeout=0)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        p.produce(topic, b"x", partition=i % 2)
    assert p.flush(30) == 0
    deadline = time.monotonic() + 20
    while len(got) < 20 and time.monotonic() < deadline:
        got += [(m.partition(), m.offset()) for m in c.poll(0.5) if not m.error()]
    assert sorted(got) == sorted((i % 2, i // 2) for i in range(20))
    c.commit_sync()
    d = describe(port, group)
    assert d["error"] is E.none
    assert d["rows"] == {(topic, 0): (10, 0, E.none), (topic, 1): (10, 0, E.none)}
    assert describe(port, group, [(topic, [1, 5])])["rows"] == {
        (topic, 1): (10, 0, E.none), (topic, 5): (-1, -1, E.unknown_topic_or_partition)}

    # Alter and Delete need an empty group.
    assert alter(port, group, topic, {0: 4})[0] is E.non_empty_group
    c.close()
    assert alter(port, group, topic, {0: 4, 7: 0}) == (E.none, [E.none,
                                                                E.unknown_topic_or_partition])
    assert describe(port, group)["rows"][(topic, 0)] == (4, 6, E.none)
    metrics = http_get(broker.http_port, "/metrics").decode()
    for p_, lag in ((0, 6), (1, 0)):
        line = (f'kmqkafka_share_group_lag{{group="{group}",partition="{p_}",'
                f'topic="{topic}"}} {float(lag)}')
        assert line in metrics, [m for m in metrics.splitlines() if "share_group" in m]
    c, again = consume(broker.bootstrap, group, topic, 6)
    assert sorted(again) == [(0, o) for o in range(4, 10)]  # from where Alter put it
    c.commit_sync()
    c.close()

    with RawClient(port) as raw:
        r = raw.call(DeleteShareGroupOffsetsRequest(group_id=group, topics=(
            DeleteShareGroupOffsetsRequestTopic(topic_name=topic),
            DeleteShareGroupOffsetsRequestTopic(topic_name="no-such-topic"))))
    assert r.error_code is E.none
    assert [t.error_code for t in r.responses] == [E.none, E.unknown_topic_or_partition]
    assert describe(port, group)["rows"] == {}
