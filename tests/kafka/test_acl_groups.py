"""ACLs on the group, offset, share-group and transaction APIs, through real clients against a
daemon with the authorizer on (``acl_support``): each test sees the exact error Kafka answers
when a right is missing (GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then grants the right and sees the same call succeed.
Transaction listing and describing go through the raw client: confluent-kafka has no admin call
for them.
"""
from __future__ import annotations

import datetime
import time
import uuid
from contextlib import closing
from typing import Any, Callable

import pytest
from confluent_kafka import (
    Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, ShareConsumer,
    TopicPartition,
)
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kio.schema.add_partitions_to_txn.v3.request import (
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
)
from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode as E
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_transactions.v1.request import ListTransactionsRequest

from acl_support import (  # noqa: F401 -- acl_broker is a fixture
    CLUSTER, CLUSTER_NAME, WAIT, AclOperation, ResourcePatternType, ResourceType, acl_broker,
    admin_client, allow, grant, revoke_all, sasl,
)
from conftest import BrokerProcess
from rawkafka import RawClient

pytestmark = pytest.mark.timeout(60)

ALICE = "User:alice"
READ, WRITE, DESCRIBE, DELETE = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE,
                                 AclOperation.DELETE)
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def topic_with(b: BrokerProcess, n: int = 3, partitions: int = 1) -> str:
    """A new topic holding ``n`` records, made as the super user."""
    topic = unique("acl-t")
    admin = admin_client(b)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(WAIT)
    p = Producer({**sasl(b, "admin"), "linger.ms": 1})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    assert p.flush(WAIT) == 0
    return topic


def commit_as_admin(b: BrokerProcess, group: str, *offsets: tuple[str, int]) -> None:
    """Create ``group`` (empty, as a standalone commit does) with committed offsets."""
    c = Consumer({**sasl(b, "admin"), "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(t, 0, o) for t, o in offsets], asynchronous=False)
    finally:
        c.close()


def consumer(b: BrokerProcess, user: str, group: str, **conf: Any) -> Consumer:
    return Consumer({**sasl(b, user), "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500, **conf})


def first_error(c: Any, timeout: float = 15.0) -> KafkaError:
    """The first error the consumer's poll surfaces (a record instead fails the test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is not None, f"read {m.value()!r} without the right"
        return m.error()
    raise AssertionError("no error surfaced")


def read_all(c: Any, n: int, timeout: float = 20.0) -> list[bytes]:
    """``n`` record values; errors other than a partition EOF fail the test."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m.value())
    return got


def failure(call: Callable[[], Any]) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        call()
    return info.value.args[0]


def raw(b: BrokerProcess, user: str) -> RawClient:
    client = RawClient(b.kafka_port)
    assert client.authenticate("PLAIN", user, f"{user}-secret").error_code == 0
    return client


# --- classic consumer groups ------------------------------------------------------------


@pytest.mark.parametrize("pattern", [ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED])
def test_a_consumer_needs_read_on_its_group_to_join_read_and_commit(acl_broker, pattern):
    topic = topic_with(acl_broker)
    group = unique("cg")
    grant(acl_broker, allow(TOPIC, topic, ALICE, READ))
    c = consumer(acl_broker, "alice", group)
    c.subscribe([topic])
    try:
        assert first_error(c).code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        c.close()

    name = group if pattern == ResourcePatternType.LITERAL else group[:4]
    grant(acl_broker, allow(GROUP, name, ALICE, READ, pattern))
    c = consumer(acl_broker, "alice", group)
    c.subscribe([topic])
    try:
        assert read_all(c, 3) == [b"v0", b"v1", b"v2"]
        c.commit(asynchronous=False)
        assert [tp.offset for tp in c.committed([TopicPartition(topic, 0)], WAIT)] == [3]
    finally:
        c.close()


def test_describe_on_the_group_finds_its_coordinator_but_neither_joins_nor_commits(acl_broker):
    topic = topic_with(acl_broker)
    group = unique("describe-only")
    grant(acl_broker, allow(TOPIC, topic, ALICE, READ), allow(GROUP, group, ALICE, DESCRIBE))
    c = consumer(acl_broker, "alice", group)
    try:
        c.subscribe([topic])
        assert first_error(c).code() == KafkaError.GROUP_AUTHORIZATION_FAILED  # JoinGroup
        c.unsubscribe()
        err = failure(lambda: c.commit(offsets=[TopicPartition(topic, 0, 1)],
                                       asynchronous=False))
        assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED  # OffsetCommit
    finally:
        c.close()


def test_a_commit_to_a_topic_without_read_is_refused_for_that_topic(acl_broker):
    readable, other = topic_with(acl_broker), topic_with(acl_broker)
    group = unique("commit")
    grant(acl_broker, allow(GROUP, group, ALICE, READ), allow(TOPIC, readable, ALICE, READ),
          allow(TOPIC, other, ALICE, DESCRIBE))
    c = consumer(acl_broker, "alice", group)
    try:
        err = failure(lambda: c.commit(offsets=[TopicPartition(other, 0, 2)],
                                       asynchronous=False))
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        done = c.commit(offsets=[TopicPartition(readable, 0, 1)], asynchronous=False)
        assert [(tp.offset, tp.error) for tp in done] == [(1, None)]

        grant(acl_broker, allow(TOPIC, other, ALICE, READ))
        done = c.commit(offsets=[TopicPartition(other, 0, 2)], asynchronous=False)
        assert [(tp.offset, tp.error) for tp in done] == [(2, None)]
    finally:
        c.close()


def test_kafka_python_consumer_needs_read_on_its_group(acl_broker):
    from kafka import KafkaConsumer, TopicPartition as KTopicPartition
    from kafka.errors import GroupAuthorizationFailedError

    topic = topic_with(acl_broker)
    group = unique("kp")
    grant(acl_broker, allow(TOPIC, topic, ALICE, READ))
    settings = dict(bootstrap_servers=f"127.0.0.1:{acl_broker.kafka_port}",
                    security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                    sasl_plain_username="alice", sasl_plain_password="alice-secret",
                    group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                    consumer_timeout_ms=10000, request_timeout_ms=10000)
    c = KafkaConsumer(topic, **settings)
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            c.poll(timeout_ms=5000)
    finally:
        c.close()

    grant(acl_broker, allow(GROUP, group, ALICE, READ))
    c = KafkaConsumer(topic, **settings)
    try:
        values = []
        for m in c:
            values.append(m.value)
            if len(values) == 3:
                break
        assert values == [b"v0", b"v1", b"v2"]
        c.commit()
        assert c.committed(KTopicPartition(topic, 0)) == 3
    finally:
        c.close()


# --- group administration ---------------------------------------------------------------


def test_list_consumer_groups_shows_only_the_groups_the_principal_may_describe(acl_broker):
    topic = topic_with(acl_broker, 1)
    mine, theirs = unique("list-mine"), unique("list-theirs")
    for g in (mine, theirs):
        commit_as_admin(acl_broker, g, (topic, 1))
    grant(acl_broker, allow(GROUP, mine, ALICE, DESCRIBE))

    admins = {user: admin_client(acl_broker, user) for user in ("admin", "alice")}

    def listed(user: str) -> set[str]:
        found = admins[user].list_consumer_groups().result(WAIT)
        assert not found.errors, found.errors
        return {g.group_id for g in found.valid}

    assert {mine, theirs} <= listed("admin")
    alice_sees = listed("alice")
    assert mine in alice_sees and theirs not in alice_sees
    grant(acl_broker, allow(CLUSTER, CLUSTER_NAME, ALICE, DESCRIBE))
    assert {mine, theirs} <= listed("alice")


def _admins_group_seen_by_alice(acl_broker, prefix: str) -> tuple[str, Any]:
    """A new group holding an offset committed by the admin, and alice's admin client."""
    group = unique(prefix)
    commit_as_admin(acl_broker, group, (topic_with(acl_broker, 1), 1))
    return group, admin_client(acl_broker, "alice")


def test_describe_consumer_groups_needs_describe_on_the_group(acl_broker):
    group, alice = _admins_group_seen_by_alice(acl_broker, "desc")
    err = failure(lambda: alice.describe_consumer_groups([group])[group].result(WAIT))
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    grant(acl_broker, allow(GROUP, group, ALICE, DESCRIBE))
    described = alice.describe_consumer_groups(
        [group], include_authorized_operations=True)[group].result(WAIT)
    assert described.group_id == group
    assert described.authorized_operations == [AclOperation.DESCRIBE]


def test_delete_consumer_groups_needs_delete_on_the_group(acl_broker):
    group, alice = _admins_group_seen_by_alice(acl_broker, "del")
    err = failure(lambda: alice.delete_consumer_groups([group])[group].result(WAIT))
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    admin = admin_client(acl_broker)
    assert group in {g.group_id for g in admin.list_consumer_groups().result(WAIT).valid}

    grant(acl_broker, allow(GROUP, group, ALICE, DELETE))
    alice.delete_consumer_groups([group])[group].result(WAIT)
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(WAIT).valid}


def test_listing_offsets_hides_topics_the_principal_may_not_describe(acl_broker):
    seen, hidden = topic_with(acl_broker, 1), topic_with(acl_broker, 1)
    group = unique("offsets")
    commit_as_admin(acl_broker, group, (seen, 1), (hidden, 1))
    alice = admin_client(acl_broker, "alice")
    every = ConsumerGroupTopicPartitions(group)
    err = failure(lambda: alice.list_consumer_group_offsets([every])[group].result(WAIT))
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    grant(acl_broker, allow(GROUP, group, ALICE, DESCRIBE), allow(TOPIC, seen, ALICE, DESCRIBE))
    listed = alice.list_consumer_group_offsets([every])[group].result(WAIT)
    assert [(tp.topic, tp.offset) for tp in listed.topic_partitions] == [(seen, 1)]
    named = ConsumerGroupTopicPartitions(group, [TopicPartition(hidden, 0)])
    listed = alice.list_consumer_group_offsets([named])[group].result(WAIT)
    assert [tp.error.code() for tp in listed.topic_partitions] == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED]


# --- KIP-848 consumer groups ------------------------------------------------------------


def test_a_kip848_consumer_needs_read_on_its_group(acl_broker):
    topic = topic_with(acl_broker)
    group = unique("kip848")
    grant(acl_broker, allow(TOPIC, topic, ALICE, READ))

    def consumer() -> Consumer:
        c = Consumer({**sasl(acl_broker, "alice"), "group.id": group,
                      "group.protocol": "consumer", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe([topic])
        return c

    with closing(consumer()) as c:
        assert first_error(c).code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    grant(acl_broker, allow(GROUP, group, ALICE, READ))
    with closing(consumer()) as c:
        assert read_all(c, 3) == [b"v0", b"v1", b"v2"]
        c.commit(asynchronous=False)


def test_a_kip848_heartbeat_naming_a_hidden_topic_is_refused(acl_broker):
    visible, hidden = topic_with(acl_broker, 0), topic_with(acl_broker, 0)
    group = unique("kip848-raw")
    grant(acl_broker, allow(GROUP, group, ALICE, READ), allow(TOPIC, visible, ALICE, DESCRIBE))

    def beat(*topics: str) -> Any:
        with raw(acl_broker, "alice") as client:
            return client.call(ConsumerGroupHeartbeatRequest(
                group_id=group, member_id="", member_epoch=0, instance_id=None, rack_id=None,
                rebalance_timeout=datetime.timedelta(seconds=30),
                subscribed_topic_names=topics, server_assignor=None, topic_partitions=()))

    refused = beat(visible, hidden)
    assert refused.error_code == E.topic_authorization_failed
    assert refused.assignment is None
    joined = beat(visible)
    assert joined.error_code == E.none and joined.member_epoch > 0


def test_a_kip848_regex_subscribes_a_member_only_to_topics_it_may_describe(acl_broker):
    """Kafka resolves a member's regex against the topics its principal may describe: alice's
    regex matches two topics but she is assigned only the one she may see; the super user's
    member with the same regex in another group gets both."""
    from kio.schema.consumer_group_heartbeat.v1.request import (
        ConsumerGroupHeartbeatRequest as Heartbeat,
    )

    prefix = unique("rx").replace("-", "")
    seen, unseen = f"{prefix}-seen", f"{prefix}-unseen"
    admin = admin_client(acl_broker)
    for name in (seen, unseen):
        admin.create_topics([NewTopic(name, 2, 1)])[name].result(WAIT)
    group = unique("rx-group")
    grant(acl_broker, allow(GROUP, group, ALICE, READ), allow(TOPIC, seen, ALICE, DESCRIBE))

    def assigned(user: str, group_id: str) -> int:
        """Partitions the member is assigned once its regex is resolved."""
        member = uuid.uuid4().hex
        with raw(acl_broker, user) as client:
            first = client.call(Heartbeat(
                group_id=group_id, member_id=member, member_epoch=0,
                rebalance_timeout=datetime.timedelta(seconds=30),
                subscribed_topic_regex=f"{prefix}-.*", topic_partitions=()))
            assert first.error_code == E.none, first
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                time.sleep(0.2)
                r = client.call(Heartbeat(group_id=group_id, member_id=member,
                                          member_epoch=first.member_epoch, topic_partitions=()))
                assert r.error_code in (E.none, E.fenced_member_epoch), r
                if r.assignment is not None and r.assignment.topic_partitions:
                    return sum(len(tp.partitions) for tp in r.assignment.topic_partitions)
                if r.error_code is E.none:
                    first = r
        raise AssertionError("no assignment")

    assert assigned("alice", group) == 2  # the two partitions of the topic she may describe
    assert assigned("admin", unique("rx-admin")) == 4


# --- share groups -----------------------------------------------------------------------


def test_a_share_consumer_needs_read_on_its_group(acl_broker):
    topic = topic_with(acl_broker)
    group = unique("share")
    admin = admin_client(acl_broker)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(WAIT)
    grant(acl_broker, allow(TOPIC, topic, ALICE, DESCRIBE))

    def share_consumer() -> ShareConsumer:
        c = ShareConsumer({**sasl(acl_broker, "alice"), "group.id": group})
        c.subscribe([topic])
        return c

    def poll(c: ShareConsumer, timeout: float = 15.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [m for m in c.poll(0.5) if m is not None]
            if got:
                return got
        return []

    def refusal() -> Any:
        """The error a fresh share consumer's poll fails with."""
        with closing(share_consumer()) as c:
            return failure(lambda: poll(c)).code()

    assert refusal() == KafkaError.GROUP_AUTHORIZATION_FAILED
    grant(acl_broker, allow(GROUP, group, ALICE, READ))
    # The group may be read, the topic not: ShareFetch refuses its partitions.
    assert refusal() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    grant(acl_broker, allow(TOPIC, topic, ALICE, READ))
    with closing(share_consumer()) as c:
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(values) < 3 and time.monotonic() < deadline:
            for m in poll(c, 2):
                assert m.error() is None, m.error()
                values.append(m.value())
        assert sorted(values) == [b"v0", b"v1", b"v2"]


# --- transactions -----------------------------------------------------------------------


def test_a_transactional_producer_needs_read_on_the_group_it_sends_offsets_for(acl_broker):
    source, sink = topic_with(acl_broker, 1), topic_with(acl_broker, 0)
    group, tid = unique("txn-group"), unique("txn")
    producer_conf = {**sasl(acl_broker, "alice"), "transactional.id": tid, "linger.ms": 1}

    refused = Producer(producer_conf)
    err = failure(lambda: refused.init_transactions(WAIT))
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    grant(acl_broker, allow(TXN, tid, ALICE, WRITE), allow(TOPIC, sink, ALICE, WRITE),
          allow(TOPIC, source, ALICE, READ))
    p = Producer(producer_conf)
    p.init_transactions(WAIT)
    metadata = consumer(acl_broker, "alice", group)
    try:
        p.begin_transaction()
        p.produce(sink, value=b"out")
        err = failure(lambda: p.send_offsets_to_transaction(
            [TopicPartition(source, 0, 1)], metadata.consumer_group_metadata(), WAIT))
        assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        p.abort_transaction(WAIT)

        grant(acl_broker, allow(GROUP, group, ALICE, READ))
        p.begin_transaction()
        p.produce(sink, value=b"out")
        p.send_offsets_to_transaction([TopicPartition(source, 0, 1)],
                                      metadata.consumer_group_metadata(), WAIT)
        p.commit_transaction(WAIT)
        assert [tp.offset for tp in metadata.committed([TopicPartition(source, 0)], WAIT)] == [1]
    finally:
        metadata.close()


def test_adding_a_topic_without_write_to_a_transaction_adds_none_of_its_partitions(acl_broker):
    writable, other = topic_with(acl_broker, 0), topic_with(acl_broker, 0)
    tid, stranger = unique("txn-add"), unique("txn-stranger")
    grant(acl_broker, allow(TXN, tid, ALICE, WRITE), allow(TOPIC, writable, ALICE, WRITE))
    with raw(acl_broker, "alice") as client:
        init = client.call(InitProducerIdRequest(
            transactional_id=tid, transaction_timeout=datetime.timedelta(minutes=1),
            producer_id=-1, producer_epoch=-1))
        assert init.error_code == E.none
        refused = client.call(InitProducerIdRequest(
            transactional_id=stranger, transaction_timeout=datetime.timedelta(minutes=1),
            producer_id=-1, producer_epoch=-1))
        assert refused.error_code == E.transactional_id_authorization_failed

        def add(*topics: str) -> dict[str, E]:
            r = client.call(AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=init.producer_id,
                v3_and_below_producer_epoch=init.producer_epoch, v3_and_below_topics=tuple(
                    AddPartitionsToTxnTopic(name=t, partitions=(0,)) for t in topics)))
            return {t.name: t.results_by_partition[0].partition_error_code
                    for t in r.results_by_topic_v3_and_below}

        assert add(writable, other) == {writable: E.operation_not_attempted,
                                         other: E.topic_authorization_failed}
        grant(acl_broker, allow(TOPIC, other, ALICE, WRITE))
        assert add(writable, other) == {writable: E.none, other: E.none}

        def end(transactional_id: str) -> E:
            return client.call(EndTxnRequest(
                transactional_id=transactional_id, producer_id=init.producer_id,
                producer_epoch=init.producer_epoch, committed=False)).error_code

        assert end(stranger) == E.transactional_id_authorization_failed
        assert end(tid) == E.none


def test_transactions_are_listed_and_described_only_to_who_may_describe_them(acl_broker):
    topic = topic_with(acl_broker, 0)
    shown, hidden = unique("tx-shown"), unique("tx-hidden")
    producers = []
    for tid in (shown, hidden):  # left open, so each still names its partition
        p = Producer({**sasl(acl_broker, "admin"), "transactional.id": tid, "linger.ms": 1})
        p.init_transactions(WAIT)
        p.begin_transaction()
        p.produce(topic, value=tid.encode())
        assert p.flush(WAIT) == 0
        producers.append(p)
    grant(acl_broker, allow(TXN, shown, ALICE, DESCRIBE))

    def listed(client: RawClient) -> set[str]:
        r = client.call(ListTransactionsRequest(state_filters=(), producer_id_filters=(),
                                                duration_filter=-1))
        assert r.error_code == E.none
        return {s.transactional_id for s in r.transaction_states}

    def described(client: RawClient) -> dict[str, Any]:
        r = client.call(DescribeTransactionsRequest(transactional_ids=(shown, hidden)))
        return {s.transactional_id: s for s in r.transaction_states}

    try:
        with raw(acl_broker, "alice") as client:
            assert listed(client) & {shown, hidden} == {shown}
            states = described(client)
            assert states[hidden].error_code == E.transactional_id_authorization_failed
            assert states[shown].error_code == E.none
            assert states[shown].transaction_state == "Ongoing"
            assert states[shown].topics == ()  # alice may not describe the topic

        grant(acl_broker, allow(TOPIC, topic, ALICE, DESCRIBE),
              allow(TXN, hidden, ALICE, DESCRIBE))
        with raw(acl_broker, "alice") as client:
            assert listed(client) >= {shown, hidden}
            states = described(client)
            assert [s.error_code for s in states.values()] == [E.none, E.none]
            assert [t.topic for t in states[shown].topics] == [topic]
    finally:
        for p in producers:
            p.abort_transaction(WAIT)


@pytest.fixture(autouse=True)
def _no_acls_left(acl_broker: BrokerProcess) -> None:
    """Every test starts from no bindings (the module shares one daemon)."""
    revoke_all(acl_broker)
