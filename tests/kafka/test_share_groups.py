"""Share groups (KIP-932, "queues for Kafka") with librdkafka's ShareConsumer: every record goes
to one member of the group at a time and is done once acknowledged; a released record comes
back with a higher delivery count until the delivery limit archives it; a rejected one never
comes back; records a member held when it closed go to another member; a new group starts at
the log end unless ``share.auto.offset.reset`` says earliest; all of it survives kill -9. Raw
ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and ShareAcknowledge requests check the
error codes Kafka gives for what real clients never send.
"""
from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import pytest
from conftest import BrokerProcess, start_broker
from kio.schema.errors import ErrorCode as E
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.share_acknowledge.v1.request import (
    AcknowledgementBatch as AckBatch, AcknowledgePartition, AcknowledgeTopic,
    ShareAcknowledgeRequest,
)
from kio.schema.share_fetch.v1.request import (
    AcknowledgementBatch as FetchAckBatch, FetchPartition, FetchTopic, ShareFetchRequest,
)
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
if not hasattr(confluent_kafka, "ShareConsumer"):
    pytest.skip("confluent-kafka has no ShareConsumer", allow_module_level=True)
from confluent_kafka import (  # noqa: E402
    AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition,
)
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType,
)

ACCEPT, RELEASE, REJECT = 1, 2, 3  # AcknowledgeTypes on the wire

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def shared(shared_broker: BrokerProcess) -> Iterator[BrokerProcess]:
    yield shared_broker
    assert "Traceback" not in shared_broker.log()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def set_group_configs(bootstrap: str, group: str, **settings: str) -> None:
    """Set share-group configs (``share_auto_offset_reset="earliest"`` is
    ``share.auto.offset.reset``) with IncrementalAlterConfigs on the GROUP resource."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name.replace("_", "."), value,
                    incremental_operation=AlterConfigOpType.SET)
        for name, value in settings.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


class Sent(NamedTuple):
    partition: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


class Got(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    delivery_count: int | None


def produce(bootstrap: str, topic: str, prefix: str, n: int, partitions: int = 1) -> list[Sent]:
    """``n`` records ``prefix-i`` spread round-robin over ``partitions``, each with a key and
    two headers; returns what was sent."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = []
    for i in range(n):
        s = Sent(i % partitions, f"{prefix}-k{i}".encode(), f"{prefix}-{i}".encode(),
                 [("seq", str(i).encode()), ("from", prefix.encode())])
        p.produce(topic, key=s.key, value=s.value, headers=s.headers, partition=s.partition)
        sent.append(s)
    assert p.flush(30) == 0
    return sent


def share_consumer(bootstrap: str, group: str, topic: str, *, explicit: bool = False,
                   **conf: Any) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit" if explicit else "implicit",
                       **conf})
    c.subscribe([topic])
    return c


def got(m: Any) -> Got:
    assert m.error() is None, m.error()
    return Got(m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.delivery_count())


def collect(consumers: list[ShareConsumer], enough: Callable[[list[list[Got]]], bool],
            timeout: float = 20.0) -> list[list[Got]]:
    """Poll every consumer in turn (implicit acknowledgement: each poll accepts the
    previous one's records) until ``enough(per_consumer)`` or ``timeout``."""
    out: list[list[Got]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while not enough(out) and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            out[i] += [got(m) for m in c.poll(0.2)]
    return out


def drain(c: ShareConsumer, n: int, timeout: float = 20.0, settle: float = 0.0) -> list[Got]:
    """Poll one consumer until it has ``n`` records (fails if it gets fewer in time), then
    for ``settle`` seconds more, so that anything beyond the ``n`` shows too."""
    (records,) = collect([c], lambda out: len(out[0]) >= n, timeout)
    assert len(records) >= n, f"{len(records)} of {n} records in {timeout}s: {records}"
    return records + quiet(c, settle) if settle else records


def acknowledge_each(c: ShareConsumer, kind: Callable[[int], Any], n: int,
                     timeout: float = 20.0) -> list[tuple[int, int]]:
    """Explicit acknowledgement: acknowledge every record polled as ``kind(offset)`` says and
    commit, until ``n`` deliveries; returns (offset, delivery count) of each delivery."""
    deliveries: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(deliveries) < n:
        batch = c.poll(0.5)
        for m in batch:
            deliveries.append((m.offset(), got(m).delivery_count))
            c.acknowledge(m, kind(m.offset()))
        if batch:
            results = c.commit_sync(10)
            assert results and all(e is None for e in results.values()), results
    return deliveries


def quiet(c: ShareConsumer, seconds: float) -> list[Got]:
    """Everything one consumer receives in ``seconds``."""
    (records,) = collect([c], lambda _out: False, seconds)
    return records


def closing(*consumers: ShareConsumer) -> None:
    for c in consumers:
        c.close()


def topic_id(port: int, topic: str) -> uuid.UUID:
    with RawClient(port) as raw:
        (t,) = raw.call(MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)).topics
    assert t.error_code is E.none
    return t.topic_id


def describe(port: int, *groups: str) -> Any:
    with RawClient(port) as raw:
        return raw.call(ShareGroupDescribeRequest(group_ids=groups,
                                                  include_authorized_operations=False)).groups


def wait_stable(port: int, group: str, consumers: list[ShareConsumer], members: int,
                timeout: float = 15.0, every: bool = True) -> Any:
    """Poll the consumers (nothing may arrive) until the group has ``members`` members, each
    (``every``; else at least the newest) holding a non-empty assignment at the group's
    epoch, so it has heard its assignment. Older members hear of a change with their next
    heartbeat, up to share.heartbeat.interval.ms (5 s at least) later."""
    deadline = time.monotonic() + timeout
    while True:
        for c in consumers:
            assert not list(c.poll(0.1)), "records arrived before any were produced"
        (g,) = describe(port, group)
        heard = [m for m in g.members
                 if m.member_epoch == g.group_epoch and m.assignment.topic_partitions]
        settled = len(heard) == members if every else bool(heard)
        if g.error_code is E.none and len(g.members) == members and settled:
            return g
        assert time.monotonic() < deadline, f"the share group never settled: {g}"


def by_value(sent: Iterable[Sent]) -> dict[bytes, Sent]:
    return {s.value: s for s in sent}


def classic_read(bootstrap: str, topic: str, partitions: int, n: int) -> list[bytes]:
    """Values a plain (classic-group) consumer reads from the start of every partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("plain"),
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(values) < n and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                values.append(m.value())
        return sorted(values)
    finally:
        c.close()


# --- delivery and acknowledgement -------------------------------------------------------


def test_every_record_is_delivered_once_and_acknowledged_records_stay_done(
        shared: BrokerProcess):
    bs, topic, group = shared.bootstrap, unique("basic"), unique("sg")
    create(bs, topic, 3)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    sent = produce(bs, topic, "a", 60, partitions=3)

    c = share_consumer(bs, group, topic)
    try:
        records = drain(c, 60)  # each poll accepted the previous one's records
        # In implicit mode commit_sync accepts the last poll's records (close would release
        # them, as the Java client's does).
        results = c.commit_sync(10)
        assert results and all(e is None for e in results.values()), results
    finally:
        c.close()
    assert len(records) == 60
    assert len({(r.partition, r.offset) for r in records}) == 60
    expected = by_value(sent)
    for r in records:
        s = expected[r.value]
        assert (r.partition, r.key, r.headers, r.delivery_count) == (
            s.partition, s.key, s.headers, 1)
    assert sorted(r.offset for r in records if r.partition == 0) == list(range(20))

    # A new member of the group finds nothing left; records produced now are delivered to it.
    c = share_consumer(bs, group, topic)
    try:
        assert quiet(c, 2.0) == []
        more = produce(bs, topic, "b", 6, partitions=3)
        records = drain(c, 6, settle=0.5)
    finally:
        c.close()
    assert sorted(r.value for r in records) == sorted(s.value for s in more)
    # The share group consumed nothing for anyone else: a plain consumer reads everything.
    assert classic_read(bs, topic, 3, 66) == sorted(s.value for s in sent + more)


def test_a_new_group_starts_at_the_log_end_by_default(shared: BrokerProcess):
    bs, port, topic, group = shared.bootstrap, shared.kafka_port, unique("latest"), unique("sg")
    create(bs, topic, 2)
    produce(bs, topic, "old", 8, partitions=2)
    c = share_consumer(bs, group, topic)
    try:
        wait_stable(port, group, [c], 1)  # the share-partitions start at the log end now
        assert quiet(c, 1.0) == []
        new = produce(bs, topic, "new", 8, partitions=2)
        records = drain(c, 8, settle=0.5)
    finally:
        c.close()
    assert sorted(r.value for r in records) == sorted(s.value for s in new)
    assert sorted((r.partition, r.offset) for r in records) == [
        (p, o) for p in range(2) for o in range(4, 8)]


@pytest.mark.parametrize("partitions,members", [(1, 3), (4, 2)])
def test_members_of_a_group_share_the_records_without_duplicates(
        shared: BrokerProcess, partitions: int, members: int):
    """With fewer partitions than members they read the same share-partition, records locked
    one by one; with more, the simple assignor splits the partitions and each member gets
    work. Either way every record is delivered once in total."""
    bs, port = shared.bootstrap, shared.kafka_port
    topic, group, n = unique("shared"), unique("sg"), 200
    create(bs, topic, partitions)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    consumers = [share_consumer(bs, group, topic) for _ in range(members)]
    try:
        g = wait_stable(port, group, consumers, members)
        assigned = [sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions)
                    for m in g.members]
        if partitions >= members:
            assert sorted(p for ps in assigned for p in ps) == list(range(partitions))
        else:
            assert assigned == [[0]] * members
        sent = []
        for round_ in range(4):  # several produce requests, so several stored batches
            sent += produce(bs, topic, f"r{round_}", n // 4, partitions)
        per_member = collect(consumers, lambda out: sum(map(len, out)) >= n)
        for i, c in enumerate(consumers):
            per_member[i] += quiet(c, 0.3)
    finally:
        closing(*consumers)
    everything = [r for rs in per_member for r in rs]
    counts = collections.Counter((r.partition, r.offset) for r in everything)
    assert len(everything) == n and set(counts.values()) == {1}, (
        f"{len(everything)} deliveries of {n}, duplicated: "
        f"{[k for k, v in counts.items() if v > 1]}")
    assert sorted(r.value for r in everything) == sorted(s.value for s in sent)
    if partitions >= members:
        assert all(per_member), [len(rs) for rs in per_member]
    # Every delivery was accepted: a new member of the group finds nothing.
    c = share_consumer(bs, group, topic)
    try:
        assert quiet(c, 1.5) == []
    finally:
        c.close()


def test_release_redelivers_reject_archives_and_the_delivery_limit_archives(
        shared: BrokerProcess):
    """Explicit acknowledgement: a RELEASEd record comes back with its delivery count one
    higher until its fifth delivery (Kafka's default group.share.delivery.count.limit),
    after which releasing it archives it; a REJECTed record never comes back."""
    bs, topic, group = shared.bootstrap, unique("explicit"), unique("sg")
    create(bs, topic)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, "x", 3)
    kind = {0: AcknowledgeType.RELEASE, 1: AcknowledgeType.REJECT, 2: AcknowledgeType.ACCEPT}
    c = share_consumer(bs, group, topic, explicit=True)
    try:
        deliveries = acknowledge_each(c, lambda offset: kind[offset], 7)
        later = quiet(c, 1.5)  # nothing left: offset 0 was archived at its limit
    finally:
        c.close()
    assert sorted(deliveries) == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 1), (2, 1)]
    assert [n for o, n in deliveries if o == 0] == [1, 2, 3, 4, 5]
    assert later == []
    c = share_consumer(bs, group, topic)
    try:
        assert quiet(c, 1.0) == []
        produce(bs, topic, "y", 1)
        (r,) = drain(c, 1)
    finally:
        c.close()
    assert (r.offset, r.value, r.delivery_count) == (3, b"y-0", 1)


def test_acknowledgements_sent_by_close_are_kept(shared: BrokerProcess):
    """librdkafka's close sends its final ShareAcknowledge (with what the application
    acknowledged since its last commit) and its leave heartbeat at the same time, on two
    connections; whichever the broker sees first, the acknowledgements count. A record
    acknowledged but handed out again would come back in the next round."""
    bs, topic, group = shared.bootstrap, unique("close-acks"), unique("sg")
    create(bs, topic)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    for round_ in range(4):
        sent = produce(bs, topic, f"round{round_}", 3)
        c = share_consumer(bs, group, topic, explicit=True)
        try:
            batch = []
            deadline = time.monotonic() + 10
            while not batch and time.monotonic() < deadline:
                batch = list(c.poll(0.2))
            records = [got(m) for m in batch]
            for m in batch:
                c.acknowledge(m, AcknowledgeType.ACCEPT)
        finally:
            c.close()
        assert [(r.value, r.delivery_count) for r in records] == [
            (s.value, 1) for s in sent], f"round {round_}"
    c = share_consumer(bs, group, topic)
    try:
        assert quiet(c, 1.0) == []
    finally:
        c.close()


def test_records_a_member_held_when_it_closed_go_to_another_member(shared: BrokerProcess):
    bs, port, topic, group = shared.bootstrap, shared.kafka_port, unique("handover"), unique("sg")
    create(bs, topic)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    sent = produce(bs, topic, "h", 10)
    first = share_consumer(bs, group, topic, explicit=True)
    second = None
    try:
        held = drain(first, 10)  # one poll: acquired, never acknowledged
        assert len(held) == 10 and {r.delivery_count for r in held} == {1}
        second = share_consumer(bs, group, topic)
        wait_stable(port, group, [second], 2, every=False)
        assert quiet(second, 1.0) == []  # locked by the first member
        first.close()
        first = None
        records = drain(second, 10, timeout=10)
        records += quiet(second, 0.5)
    finally:
        closing(*(c for c in (first, second) if c is not None))
    assert sorted(r.value for r in records) == sorted(s.value for s in sent)
    assert {r.delivery_count for r in records} == {2}


# --- durability -------------------------------------------------------------------------


def test_share_state_survives_kill_9(tmp_path: Path):
    """Acknowledged records are not delivered again after kill -9 and a restart on the same
    data; records acquired but not acknowledged when it died are delivered again."""
    b = start_broker(tmp_path)
    topic, group = "durable-share", "durable-sg"
    try:
        bs = b.bootstrap
        create(bs, topic, 2)
        set_group_configs(bs, group, share_auto_offset_reset="earliest")
        done = produce(bs, topic, "done", 12, partitions=2)
        # A short socket timeout: this client closes while its broker is down.
        holder = share_consumer(bs, group, topic, explicit=True,
                                **{"socket.timeout.ms": 3000})
        try:
            seen: list[Got] = []
            deadline = time.monotonic() + 20
            while len(seen) < 12 and time.monotonic() < deadline:
                batch = holder.poll(0.5)
                for m in batch:
                    seen.append(got(m))
                    holder.acknowledge(m, AcknowledgeType.ACCEPT)
                if batch:
                    results = holder.commit_sync(10)  # durable once answered
                    assert all(e is None for e in results.values()), results
            assert sorted(r.value for r in seen) == sorted(s.value for s in done)
            pending = produce(bs, topic, "pending", 8, partitions=1)
            held = drain(holder, 1)  # acquired, not acknowledged
            assert {r.value for r in held} <= {s.value for s in pending}
            b.kill()
        finally:
            t0 = time.monotonic()
            holder.close()  # the broker is gone: it cannot acknowledge or release anything
            assert time.monotonic() - t0 < 15
        b.restart()
        bs = b.bootstrap
        c = share_consumer(bs, group, topic)
        try:
            records = drain(c, 8, settle=1.0)
        finally:
            c.close()
        # Every pending record comes (back): none was acknowledged. Kafka writes a record's
        # delivery count only when its state changes, so those acquired after the last write
        # may come back with a count of 1.
        assert sorted(r.value for r in records) == sorted(s.value for s in pending)
        assert {r.offset for r in held} <= {r.offset for r in records}
        # Plain producers and consumers are served as before.
        after = produce(bs, topic, "after", 2, partitions=2)
        assert classic_read(bs, topic, 2, 22) == sorted(
            s.value for s in done + pending + after)
        assert "Traceback" not in b.log()
    finally:
        b.stop()


# --- the protocol, raw ------------------------------------------------------------------


def test_raw_share_requests_get_kafkas_errors(shared: BrokerProcess):
    bs, port = shared.bootstrap, shared.kafka_port
    topic, group = unique("raw"), unique("sg")
    create(bs, topic, 2)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, "r", 4)  # all in partition 0, offsets 0..3
    tid = topic_id(port, topic)
    member = uuid.uuid4().hex

    with RawClient(port) as raw:
        def heartbeat(member_id: str, epoch: int, topics: tuple[str, ...] | None) -> Any:
            return raw.call(ShareGroupHeartbeatRequest(
                group_id=group, member_id=member_id, member_epoch=epoch, rack_id=None,
                subscribed_topic_names=topics))

        def fetch(epoch: int, acks: dict[int, list[tuple[int, int, int]]] | None = None,
                  partitions: tuple[int, ...] = (0, 1)) -> Any:
            acks = acks or {}
            return raw.call(ShareFetchRequest(
                group_id=group, member_id=member, share_session_epoch=epoch,
                max_wait=_ms(200), min_bytes=1, max_bytes=1 << 20, max_records=100,
                batch_size=100, forgotten_topics_data=(), topics=(FetchTopic(
                    topic_id=tid, partitions=tuple(FetchPartition(
                        partition_index=p, acknowledgement_batches=tuple(
                            FetchAckBatch(first_offset=f, last_offset=last,
                                          acknowledge_types=(k,))
                            for f, last, k in acks.get(p, ())))
                        for p in partitions)),)))

        def acknowledge(epoch: int, acks: dict[int, list[tuple[int, int, int]]]
                        ) -> tuple[E, dict[int, E]]:
            r = raw.call(ShareAcknowledgeRequest(
                group_id=group, member_id=member, share_session_epoch=epoch,
                topics=(AcknowledgeTopic(topic_id=tid, partitions=tuple(
                    AcknowledgePartition(partition_index=p, acknowledgement_batches=tuple(
                        AckBatch(first_offset=f, last_offset=last, acknowledge_types=(k,))
                        for f, last, k in batches))
                    for p, batches in acks.items())),)))
            return r.error_code, {p.partition_index: p.error_code
                                  for t in r.responses for p in t.partitions}

        def acquired(r: Any) -> dict[int, list[tuple[int, int, int]]]:
            assert r.error_code is E.none, r
            return {p.partition_index: [(a.first_offset, a.last_offset, a.delivery_count)
                                        for a in p.acquired_records]
                    for t in r.responses for p in t.partitions if p.acquired_records}

        # ShareGroupHeartbeat
        assert heartbeat(member, 0, None).error_code is E.invalid_request
        joined = heartbeat(member, 0, (topic,))
        assert joined.error_code is E.none and joined.member_epoch >= 1
        assert [(tp.topic_id, tp.partitions) for tp in joined.assignment.topic_partitions] == [
            (tid, (0, 1))]
        epoch = joined.member_epoch
        assert heartbeat(uuid.uuid4().hex, epoch, None).error_code is E.unknown_member_id
        assert heartbeat(member, epoch + 5, None).error_code is E.fenced_member_epoch
        again = heartbeat(member, epoch, None)
        assert (again.error_code, again.member_epoch, again.assignment) == (E.none, epoch, None)

        # ShareGroupDescribe
        (g, missing) = describe(port, group, unique("nobody"))
        assert (g.error_code, g.group_state, g.assignor_name, g.group_epoch) == (
            E.none, "Stable", "simple", epoch)
        (m,) = g.members
        assert (m.member_id, m.member_epoch, m.subscribed_topic_names) == (
            member, epoch, (topic,))
        assert [(tp.topic_id, tp.topic_name, tp.partitions)
                for tp in m.assignment.topic_partitions] == [(tid, topic, (0, 1))]
        assert missing.error_code is E.group_id_not_found

        # Share sessions: 0 opens one, then each request carries the next epoch.
        assert fetch(5).error_code is E.share_session_not_found
        assert acknowledge(0, {0: [(0, 0, ACCEPT)]})[0] is E.invalid_share_session_epoch
        assert acquired(fetch(0)) == {0: [(0, 3, 1)]}
        assert fetch(3).error_code is E.invalid_share_session_epoch
        # Per partition: what this member did not acquire is INVALID_RECORD_STATE.
        assert acknowledge(1, {0: [(0, 1, ACCEPT)], 1: [(0, 0, ACCEPT)]}) == (
            E.none, {0: E.none, 1: E.invalid_record_state})
        assert acknowledge(2, {0: [(0, 0, ACCEPT)]}) == (E.none, {0: E.invalid_record_state})
        assert acknowledge(3, {0: [(2, 2, RELEASE), (3, 3, REJECT)]}) == (E.none, {0: E.none})
        assert acquired(fetch(4)) == {0: [(2, 2, 2)]}  # released: delivered again
        # Acknowledging in a ShareFetch; then the closing epoch ends the session.
        r = fetch(5, {0: [(2, 2, ACCEPT)]})
        assert r.error_code is E.none and acquired(r) == {}
        assert [p.acknowledge_error_code for t in r.responses for p in t.partitions
                if p.partition_index == 0] == [E.none]
        assert acknowledge(-1, {0: [(2, 2, ACCEPT)]}) == (E.none, {0: E.invalid_record_state})
        assert fetch(6).error_code is E.share_session_not_found
        assert heartbeat(member, -1, None).error_code is E.none
        (g,) = describe(port, group)
        assert (g.error_code, g.group_state, g.members) == (E.none, "Empty", ())


def test_a_classic_consumer_groups_id_is_not_a_share_group(shared: BrokerProcess):
    bs, port, topic, group = shared.bootstrap, shared.kafka_port, unique("classic"), unique("cg")
    create(bs, topic)
    produce(bs, topic, "c", 1)
    plain = Consumer({"bootstrap.servers": bs, "group.id": group,
                      "auto.offset.reset": "earliest"})
    try:
        plain.subscribe([topic])
        m = None
        deadline = time.monotonic() + 20
        while m is None and time.monotonic() < deadline:
            m = plain.poll(0.2)
        assert m is not None and m.error() is None and m.value() == b"c-0"
        with RawClient(port) as raw:
            r = raw.call(ShareGroupHeartbeatRequest(
                group_id=group, member_id=uuid.uuid4().hex, member_epoch=0, rack_id=None,
                subscribed_topic_names=(topic,)))
        assert (r.error_code, r.error_message) == (
            E.group_id_not_found, f"Group {group} is not a share group.")
        (g,) = describe(port, group)
        assert (g.error_code, g.error_message) == (
            E.group_id_not_found, f"Group {group} is not a share group.")
    finally:
        plain.close()


def test_a_share_groups_id_takes_no_consumer_group_member(shared: BrokerProcess):
    """The other way round: a classic JoinGroup for a share group's id gets
    INCONSISTENT_GROUP_PROTOCOL and a KIP-848 heartbeat GROUP_ID_NOT_FOUND, and the share
    group carries on."""
    bs, topic, group = shared.bootstrap, unique("sharedid"), unique("sg")
    create(bs, topic)
    sc = share_consumer(bs, group, topic)
    try:
        sc.poll(1.0)  # joined
        seen: dict[str, str] = {}
        for protocol in ("classic", "consumer"):
            c = Consumer({"bootstrap.servers": bs, "group.id": group,
                          "group.protocol": protocol})
            try:
                c.subscribe([topic])
                deadline = time.monotonic() + 10
                while protocol not in seen and time.monotonic() < deadline:
                    m = c.poll(0.2)
                    if m is not None and m.error() is not None:
                        seen[protocol] = m.error().str()
            finally:
                c.close()
        assert "Inconsistent group protocol" in seen["classic"], seen
        assert "group id does not exist" in seen["consumer"], seen
        produce(bs, topic, "after", 3)
        assert sorted(g.value for g in drain(sc, 3)) == [b"after-0", b"after-1", b"after-2"]
    finally:
        closing(sc)


def _ms(n: int) -> Any:
    import datetime

    return datetime.timedelta(milliseconds=n)
