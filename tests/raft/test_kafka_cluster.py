"""Kafka on a real 3-process cluster (127.0.0.1): metadata lists every live node with the Raft
leader as partition leader and controller, and drops a killed node until it restarts; produce,
admin and group calls reaching a follower are answered correctly (the store forwards commands,
group/offset requests are relayed to the leader, which coordinates every group); a consumer
group survives a kill -9 of the leader; after the old leader restarts every node serves the
same records at the same offsets.

One cluster for the module: the tests run in file order and the last one kills the leader.
"""
from __future__ import annotations

import datetime
import importlib
import io
import signal
import struct
import time
from typing import Any, Iterator

import pytest

from tests.conftest import _wait_healthy, free_port, http_get, peak_rss_kb, start_broker
from tests.raft.test_cluster import wait_leader
from tests.rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402
kafka = pytest.importorskip("kafka")

from kio.schema.consumer_protocol_subscription.v1.data import (  # noqa: E402
    ConsumerProtocolSubscription,
)
from kio.schema.errors import ErrorCode as E  # noqa: E402
from kio.serial import entity_writer  # noqa: E402

from kmqkafka import records  # noqa: E402

IDS = (1, 2, 3)


def req(api: str, version: int, name: str) -> Any:
    return getattr(importlib.import_module(f"kio.schema.{api}.v{version}.request"), name)


def commit_and_fetch(port: int, mechanism: str, user: str, password: str, group: str,
                     topic: str, offset: int) -> tuple[Any, Any]:
    """As ``user`` (SASL ``mechanism``) on ``port``: OffsetCommit v7 of ``offset`` for
    partition 0 of ``topic`` in ``group``, then OffsetFetch v7 of it; both responses."""
    Oc = req("offset_commit", 7, "OffsetCommitRequest")
    Oct = req("offset_commit", 7, "OffsetCommitRequestTopic")
    Ocp = req("offset_commit", 7, "OffsetCommitRequestPartition")
    Of = req("offset_fetch", 7, "OffsetFetchRequest")
    Oft = req("offset_fetch", 7, "OffsetFetchRequestTopic")
    with RawClient(port) as raw:
        assert raw.authenticate(mechanism, user, password).error_code == E.none
        committed = raw.call(Oc(
            group_id=group, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, topics=(Oct(name=topic, partitions=(Ocp(
                partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=""),)),)))
        fetched = raw.call(Of(group_id=group, topics=(Oft(name=topic, partition_indexes=(0,)),),
                              require_stable=False))
    return committed, fetched


def ms(n: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=n)


class Cluster:
    def __init__(self, tmp_path: Any, prefix: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        """Three nodes on 127.0.0.1 (``prefix``: a wrapper command every node runs under;
        ``env``: settings every node gets)."""
        self.raft_ports = {i: free_port() for i in IDS}
        self.kafka_ports = {i: free_port() for i in IDS}
        peers = ",".join(f"{i}=127.0.0.1:{self.raft_ports[i]}/127.0.0.1:{self.kafka_ports[i]}"
                         for i in IDS)
        self.brokers: dict[int, Any] = {}
        for i in IDS:
            d = tmp_path / f"n{i}"
            d.mkdir()
            self.brokers[i] = start_broker(d, env={
                "KMQKAFKA_NODE_ID": str(i), "KMQKAFKA_PEERS": peers,
                "CONNECTORS_KAFKA_PORT": str(self.kafka_ports[i]),
                "KMQKAFKA_RAFT_TICK_MS": "50", **(env or {})}, wait=False, prefix=prefix)
        try:
            for b in self.brokers.values():
                _wait_healthy(b, 60)
        except BaseException:
            self.stop()  # the fixture's finally never sees a Cluster that failed to start
            raise

    def live(self) -> dict[int, Any]:
        return {i: b for i, b in self.brokers.items() if b.proc.poll() is None}

    def leader(self, not_: int | None = None) -> int:
        return wait_leader(self.live(), not_=not_)

    def follower(self, not_: int | None = None) -> int:
        leader = self.leader(not_=not_)
        return next(i for i in self.live() if i != leader)

    def bootstrap(self, *nodes: int) -> str:
        return ",".join(self.brokers[i].bootstrap for i in nodes)

    def all(self) -> str:
        return self.bootstrap(*self.live())

    def stop(self) -> None:
        for b in self.brokers.values():
            if b.proc.poll() is None:
                b.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The default spare-file preparation runs here (start_broker turns it off elsewhere).
    c = Cluster(tmp_path_factory.mktemp("kafka-cluster"),
                env={"KMQKAFKA_RAFT_PREALLOCATE": "true"})
    try:
        c.leader()
        yield c
    finally:
        c.stop()


def metadata(port: int, topics: tuple[str, ...] | None = None) -> Any:
    Req = req("metadata", 12, "MetadataRequest")
    T = req("metadata", 12, "MetadataRequestTopic")
    with RawClient(port) as raw:
        return raw.call(Req(
            topics=None if topics is None else tuple(T(name=t, topic_id=None) for t in topics),
            allow_auto_topic_creation=True, include_topic_authorized_operations=False))


def wait_for(check: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached within {timeout}s: {last!r}")


def produce_confluent(bootstrap: str, topic: str, values: list[bytes],
                      partition: int = 0) -> list[int]:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": False, "linger.ms": 5,
                                  "message.timeout.ms": 30000})
    got: dict[bytes, int] = {}
    errors: list = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            got[msg.value()] = msg.offset()

    for v in values:
        p.produce(topic, v, partition=partition, on_delivery=report)
    assert p.flush(40) == 0
    assert not errors, errors
    return [got[v] for v in values]


def fetch_all(port: int, topic: str, upto: int) -> list[tuple[int, bytes]]:
    """Fetch partition 0 from one node directly (raw Fetch v11), offsets 0..upto-1."""
    Req = req("fetch", 11, "FetchRequest")
    T = req("fetch", 11, "FetchTopic")
    P = req("fetch", 11, "FetchPartition")
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 20
    with RawClient(port) as raw:
        while len(out) < upto and time.monotonic() < deadline:
            r = raw.call(Req(replica_id=-1, max_wait=ms(200), min_bytes=1, max_bytes=1 << 20,
                             isolation_level=0, session_id=0, session_epoch=-1,
                             topics=(T(topic=topic, partitions=(P(
                                 partition=0, current_leader_epoch=-1, fetch_offset=len(out),
                                 log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                             forgotten_topics_data=(), rack_id=""))
            part = r.responses[0].partitions[0]
            if part.error_code == E.unknown_topic_or_partition and time.monotonic() < deadline - 1:
                time.sleep(0.2)  # a node that just restarted has not replayed the topic yet
                continue
            assert part.error_code == E.none, part
            data = bytes(part.records or b"")
            for pos, _header in (records.split_batches(data) if data else ()):
                for rec in records.iter_records(data, pos):
                    if rec.offset == len(out):
                        out.append((rec.offset, rec.value))
    return out


# --- metadata ---------------------------------------------------------------------------


def test_metadata_from_every_node_lists_three_brokers_and_the_same_leader(cluster: Cluster):
    leader = cluster.leader()
    wanted = {(i, "127.0.0.1", cluster.kafka_ports[i]) for i in IDS}
    produce_confluent(cluster.all(), "meta", [b"x"])
    for i in IDS:
        def same() -> Any:
            r = metadata(cluster.kafka_ports[i], ("meta",))
            assert {(b.node_id, b.host, b.port) for b in r.brokers} == wanted
            assert r.controller_id == leader
            part = r.topics[0].partitions[0]
            assert part.error_code == E.none and part.leader_id == leader
            assert part.leader_epoch == raft_metric(cluster.brokers[leader], "kmqkafka_raft_term")
            assert sorted(part.replica_nodes) == list(IDS)
            return True
        wait_for(same, what=f"metadata of node {i}")

        Dc = req("describe_cluster", 0, "DescribeClusterRequest")
        with RawClient(cluster.kafka_ports[i]) as raw:
            r = raw.call(Dc(include_cluster_authorized_operations=False))
        assert r.controller_id == leader
        assert {(b.broker_id, b.host, b.port) for b in r.brokers} == wanted


def test_every_node_gives_the_leaders_end_offset_right_after_an_ack(cluster: Cluster):
    """Kafka answers a consumer's ListOffsets and OffsetForLeaderEpoch on the partition leader
    only. A follower used to answer from its own applied end, which may still lack records the
    leader just acknowledged (here: a follower paused while the leader and the other follower
    commit): LATEST disagreed between nodes, and the shorter epoch end looks like a truncated
    log to a consumer validating its position (KIP-320)."""
    leader = cluster.leader()
    follower = cluster.follower()
    Pr = req("produce", 9, "ProduceRequest")
    Td = req("produce", 9, "TopicProduceData")
    Pd = req("produce", 9, "PartitionProduceData")
    Lo = req("list_offsets", 7, "ListOffsetsRequest")
    Lt = req("list_offsets", 7, "ListOffsetsTopic")
    Lp = req("list_offsets", 7, "ListOffsetsPartition")
    Oe = req("offset_for_leader_epoch", 4, "OffsetForLeaderEpochRequest")
    Ot = req("offset_for_leader_epoch", 4, "OffsetForLeaderTopic")
    Op = req("offset_for_leader_epoch", 4, "OffsetForLeaderPartition")
    latest = Lo(replica_id=-1, isolation_level=0, topics=(Lt(name="ends", partitions=(
        Lp(partition_index=0, current_leader_epoch=-1, timestamp=-1),)),))
    epoch_end = Oe(replica_id=-1, topics=(Ot(topic="ends", partitions=(
        Op(partition=0, current_leader_epoch=-1, leader_epoch=0),)),))
    produce_confluent(cluster.all(), "ends", [b"first"])
    for i in IDS:
        wait_for(lambda: topic_listed(cluster.kafka_ports[i], "ends"), what=f"node {i} topic")
    raws = {i: RawClient(cluster.kafka_ports[i]) for i in IDS}
    paused = cluster.brokers[follower].proc
    try:
        for k in range(3):
            paused.send_signal(signal.SIGSTOP)
            try:
                r = raws[leader].call(Pr(transactional_id=None, acks=-1, timeout=ms(10000),
                                         topic_data=(Td(name="ends", partition_data=(
                                             Pd(index=0, records=_batch([b"a", b"b"])),)),)))
                raws[follower].send(latest)
                raws[follower].send(epoch_end)
            finally:
                paused.send_signal(signal.SIGCONT)
            part = r.responses[0].partition_responses[0]
            assert part.error_code == E.none, part
            end = part.base_offset + 2
            got = raws[follower].receive(latest).topics[0].partitions[0]
            assert (got.error_code, got.offset) == (E.none, end), f"follower, round {k}"
            got = raws[follower].receive(epoch_end).topics[0].partitions[0]
            assert (got.error_code, got.end_offset) == (E.none, end), f"follower, round {k}"
            for i in IDS:
                got = raws[i].call(latest).topics[0].partitions[0]
                assert (got.error_code, got.offset) == (E.none, end), f"node {i}, round {k}"
    finally:
        paused.send_signal(signal.SIGCONT)
        for raw in raws.values():
            raw.close()


# --- produce / admin through a follower ------------------------------------------------


def test_produce_through_a_follower_bootstrap_and_consume_in_order(cluster: Cluster):
    follower = cluster.follower()
    values = [b"f-%d" % i for i in range(200)]
    assert produce_confluent(cluster.bootstrap(follower), "viaf", values) == list(range(200))

    c = kafka.KafkaConsumer(bootstrap_servers=cluster.all(), auto_offset_reset="earliest",
                            enable_auto_commit=False, consumer_timeout_ms=15000)
    c.assign([kafka.TopicPartition("viaf", 0)])
    got = []
    try:
        for m in c:
            got.append((m.offset, m.value))
            if len(got) == len(values):
                break
    finally:
        c.close()
    assert got == list(enumerate(values))


def test_raw_produce_and_admin_sent_straight_to_a_follower(cluster: Cluster):
    """A client with stale metadata: the follower's store forwards the commands."""
    follower = cluster.follower()
    port = cluster.kafka_ports[follower]
    Ct = req("create_topics", 5, "CreateTopicsRequest")
    Ctt = req("create_topics", 5, "CreatableTopic")
    Cp = req("create_partitions", 1, "CreatePartitionsRequest")
    Cpt = req("create_partitions", 1, "CreatePartitionsTopic")
    with RawClient(port) as raw:
        r = raw.call(Ct(topics=(Ctt(name="adm", num_partitions=2, replication_factor=1,
                                    assignments=(), configs=()),),
                        timeout=ms(10000), validate_only=False))
        assert r.topics[0].error_code == E.none, r
        r = raw.call(Cp(topics=(Cpt(name="adm", count=3, assignments=None),),
                        timeout=ms(10000), validate_only=False))
        assert r.results[0].error_code == E.none, r
        r = raw.call(Cp(topics=(Cpt(name="adm", count=3, assignments=None),),
                        timeout=ms(10000), validate_only=False))
        assert r.results[0].error_code == E.invalid_partitions
        assert r.results[0].error_message == "topic already has 3 partition(s)"

    # Every node reports 3 partitions once applied (never more than the truth).
    for i in IDS:
        wait_for(lambda: len(metadata(cluster.kafka_ports[i], ("adm",)).topics[0].partitions)
                 == 3, what=f"node {i} sees 3 partitions")

    # Produce v9 sent to the follower directly.
    batch = _batch([b"a", b"b", b"c"])
    Pr = req("produce", 9, "ProduceRequest")
    Td = req("produce", 9, "TopicProduceData")
    Pd = req("produce", 9, "PartitionProduceData")
    with RawClient(port) as raw:
        r = raw.call(Pr(transactional_id=None, acks=-1, timeout=ms(10000), topic_data=(
            Td(name="adm", partition_data=(Pd(index=2, records=batch),)),)))
    part = r.responses[0].partition_responses[0]
    assert part.error_code == E.none and part.base_offset == 0, part

    # A large one (read into its own buffer, its batch left there) is forwarded as exactly.
    import os as _os
    big_values = [_os.urandom(1024) for _ in range(400)]
    with RawClient(port) as raw:
        r = raw.call(Pr(transactional_id=None, acks=-1, timeout=ms(10000), topic_data=(
            Td(name="adm", partition_data=(Pd(index=0, records=_batch(big_values)),)),)))
    part = r.responses[0].partition_responses[0]
    assert part.error_code == E.none and part.base_offset == 0, part
    for i in IDS:
        assert [v for _o, v in fetch_all(cluster.kafka_ports[i], "adm", 400)] == big_values

    # InitProducerId through the follower.
    Ip = req("init_producer_id", 4, "InitProducerIdRequest")
    with RawClient(port) as raw:
        r = raw.call(Ip(transactional_id=None, transaction_timeout=ms(60000),
                        producer_id=-1, producer_epoch=-1))
    assert r.error_code == E.none and r.producer_id >= 0


def test_producer_ids_are_unique_across_the_nodes(cluster: Cluster):
    """Each node hands out ids from blocks it claims with a compare-and-set. Each used to
    extend its own block from its own counter: an id handed out by the leader went to a
    producer on a follower too, and the idempotent checks then dropped the second producer's
    acknowledged first batch as a retry of the first's."""
    from kmqkafka.kafka.producers import BLOCK

    Ip = req("init_producer_id", 4, "InitProducerIdRequest")
    leader = cluster.leader()
    follower = cluster.follower()
    given: list[int] = []

    def init(raw: RawClient) -> None:
        r = raw.call(Ip(transactional_id=None, transaction_timeout=ms(60000),
                        producer_id=-1, producer_epoch=-1))
        assert r.error_code == E.none, r
        given.append(r.producer_id)

    with RawClient(cluster.kafka_ports[leader]) as on_leader, \
            RawClient(cluster.kafka_ports[follower]) as on_follower:
        init(on_leader)
        init(on_follower)
        for _ in range(BLOCK):  # past the end of the leader's block
            init(on_leader)
        init(on_follower)
    assert len(set(given)) == len(given), sorted(given)


def test_a_topic_changed_through_the_leader_is_known_at_once_on_every_node(cluster: Cluster):
    """Admin clients create or grow a topic through the controller and at once describe it
    through any node: a follower must not answer with what it held before the change (it
    used to, for up to a Raft tick: aiokafka's and kafka-python's admin suites failed)."""
    leader = cluster.leader()
    followers = [i for i in cluster.live() if i != leader]
    Ct = req("create_topics", 5, "CreateTopicsRequest")
    Ctt = req("create_topics", 5, "CreatableTopic")
    Cp = req("create_partitions", 1, "CreatePartitionsRequest")
    Cpt = req("create_partitions", 1, "CreatePartitionsTopic")
    Cpa = req("create_partitions", 1, "CreatePartitionsAssignment")
    Md = req("metadata", 12, "MetadataRequest")
    Mdt = req("metadata", 12, "MetadataRequestTopic")

    def seen(raw: RawClient, name: str) -> Any:
        r = raw.call(Md(topics=(Mdt(name=name, topic_id=None),),
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False))
        return r.topics[0].error_code, len(r.topics[0].partitions)

    views = {i: RawClient(cluster.kafka_ports[i]) for i in followers}
    try:
        with RawClient(cluster.kafka_ports[leader]) as raw:
            for k in range(8):
                name = f"fresh{k}"
                r = raw.call(Ct(topics=(Ctt(name=name, num_partitions=2, replication_factor=-1,
                                            assignments=(), configs=()),),
                                timeout=ms(10000), validate_only=False))
                assert r.topics[0].error_code == E.none, r
                assert [seen(v, name) for v in views.values()] == [(E.none, 2)] * len(views)
                everyone = [follower for follower in followers] + [leader]
                r = raw.call(Cp(topics=(Cpt(name=name, count=3, assignments=(
                    Cpa(broker_ids=tuple(everyone)),)),), timeout=ms(10000),
                    validate_only=False))
                assert r.results[0].error_code == E.none, r
                assert [seen(v, name) for v in views.values()] == [(E.none, 3)] * len(views)
            # A manual assignment lists every node: one replica alone is not a placement here.
            r = raw.call(Cp(topics=(Cpt(name="fresh0", count=4, assignments=(
                Cpa(broker_ids=(leader,)),)),), timeout=ms(10000), validate_only=False))
            assert r.results[0].error_code == E.invalid_replica_assignment
            assert "which have 3 replica(s)" in r.results[0].error_message
    finally:
        for v in views.values():
            v.close()


def _batch(values: list[bytes]) -> bytes:
    """A record batch as a client builds it (kafka-python's record builder)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i, v in enumerate(values):
        b.append(i, timestamp=int(time.time() * 1000), key=None, value=v, headers=[])
    return bytes(b.build())


# --- group requests relayed from a follower --------------------------------------------


def subscription(*topics: str) -> bytes:
    buf = io.BytesIO()
    entity_writer(ConsumerProtocolSubscription)(
        buf, ConsumerProtocolSubscription(topics=topics, user_data=None, owned_partitions=()))
    return struct.pack(">h", 1) + buf.getvalue()


def test_group_calls_to_a_follower_are_relayed_to_the_leader(cluster: Cluster):
    leader = cluster.leader()
    follower = cluster.follower()
    Fc = req("find_coordinator", 4, "FindCoordinatorRequest")
    with RawClient(cluster.kafka_ports[follower]) as raw:
        r = raw.call(Fc(key_type=0, coordinator_keys=("rg",)))
    assert r.coordinators[0].error_code == E.none
    assert (r.coordinators[0].node_id, r.coordinators[0].port) == (
        leader, cluster.kafka_ports[leader])

    Jg = req("join_group", 5, "JoinGroupRequest")
    Jp = req("join_group", 5, "JoinGroupRequestProtocol")
    Sg = req("sync_group", 3, "SyncGroupRequest")
    Sa = req("sync_group", 3, "SyncGroupRequestAssignment")
    Oc = req("offset_commit", 7, "OffsetCommitRequest")
    Oct = req("offset_commit", 7, "OffsetCommitRequestTopic")
    Ocp = req("offset_commit", 7, "OffsetCommitRequestPartition")
    Of = req("offset_fetch", 7, "OffsetFetchRequest")
    Oft = req("offset_fetch", 7, "OffsetFetchRequestTopic")
    Dg = req("describe_groups", 5, "DescribeGroupsRequest")

    def join(raw: RawClient, member_id: str) -> Any:
        return raw.call(Jg(group_id="rg", session_timeout=ms(10000),
                           rebalance_timeout=ms(10000), member_id=member_id,
                           group_instance_id=None, protocol_type="consumer",
                           protocols=(Jp(name="range", metadata=subscription("viaf")),)))

    with RawClient(cluster.kafka_ports[follower], timeout=20) as raw:
        first = join(raw, "")  # v4+: MEMBER_ID_REQUIRED with an id, answered via the leader
        assert first.error_code == E.member_id_required and first.member_id
        joined = join(raw, first.member_id)  # parked on the leader until the join completes
        assert joined.error_code == E.none and joined.leader == first.member_id
        synced = raw.call(Sg(group_id="rg", generation_id=joined.generation_id,
                             member_id=first.member_id, group_instance_id=None,
                             assignments=(Sa(member_id=first.member_id, assignment=b"A"),)))
        assert synced.error_code == E.none and synced.assignment == b"A"
        r = raw.call(Oc(group_id="rg", generation_id_or_member_epoch=joined.generation_id,
                        member_id=first.member_id, group_instance_id=None, topics=(
                            Oct(name="viaf", partitions=(Ocp(
                                partition_index=0, committed_offset=42,
                                committed_leader_epoch=-1, committed_metadata=""),)),)))
        assert r.topics[0].partitions[0].error_code == E.none
    for i in IDS:  # OffsetFetch and DescribeGroups from every node see the leader's state
        with RawClient(cluster.kafka_ports[i]) as raw:
            r = raw.call(Of(group_id="rg", topics=(Oft(name="viaf", partition_indexes=(0,)),),
                            require_stable=False))
            assert r.error_code == E.none
            assert r.topics[0].partitions[0].committed_offset == 42, f"node {i}"
            d = raw.call(Dg(groups=("rg",), include_authorized_operations=False))
            assert d.groups[0].group_state == "Stable", f"node {i}"
            assert [m.member_id for m in d.groups[0].members] == [first.member_id]
    # ListGroups: a broker lists the groups it coordinates (admin clients ask every broker and
    # merge), so only the leader names "rg"; kafka-python's list_consumer_groups() used to
    # name it once per node.
    Lg = req("list_groups", 4, "ListGroupsRequest")
    for i in IDS:
        with RawClient(cluster.kafka_ports[i]) as raw:
            r = raw.call(Lg(states_filter=()))
        names = [g.group_id for g in r.groups]
        assert r.error_code == E.none and names.count("rg") == (i == leader), f"node {i}: {names}"


# --- only live nodes are brokers ---------------------------------------------------------


def lists_only(port: int, live: set[int], topic: str) -> bool:
    """Metadata v12 from the node on ``port`` lists exactly ``live`` as brokers (and as ISR),
    keeps every member as a replica and names the others offline."""
    r = metadata(port, (topic,))
    part = r.topics[0].partitions[0]
    assert {b.node_id for b in r.brokers} == live, r.brokers
    assert sorted(part.replica_nodes) == list(IDS)
    assert sorted(part.isr_nodes) == sorted(live)
    assert sorted(part.offline_replicas) == sorted(set(IDS) - live)
    return True


def raft_metric(broker: Any, name: str, **labels: str) -> float | None:
    """One sample of the node's /metrics (None when absent)."""
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                   if labels else "")
    for line in http_get(broker.http_port, "/metrics").decode().splitlines():
        key, _, value = line.rpartition(" ")
        if key == want:
            return float(value)
    return None


def test_every_node_prepares_its_raft_log_spare_files(cluster: Cluster):
    """Spare Raft log files of full size (zeros) per node, written in the background at start,
    as many as the log rolls between two compactions (256 MiB / 32 MiB, plus one), so a new
    cluster's first writes reuse blocks and pages as later ones do."""
    deadline = time.monotonic() + 60
    while True:
        sizes = {i: sorted(p.stat().st_size for p in (b.data_dir / "raft").glob("wal-free.*"))
                 for i, b in cluster.live().items()}
        if all(len(s) >= 9 and s[0] == s[-1] == 32 << 20 for s in sizes.values()):
            break
        assert time.monotonic() < deadline, sizes
        time.sleep(0.5)
    assert not any((b.data_dir / "raft" / "wal-free.part").exists()
                   for b in cluster.live().values())


def test_describe_quorum_through_any_node(cluster: Cluster):
    """kafka-python's describe_metadata_quorum (DescribeQuorum v2), sent to whichever node:
    leader, Raft term as epoch, commit index as high watermark, every voter's log end."""
    from kafka.admin import KafkaAdminClient

    produce_confluent(cluster.all(), "quorum", [b"q"])
    leader = cluster.leader()
    for i in IDS:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap(i))
        try:
            q = admin.describe_metadata_quorum()
        finally:
            admin.close()
        (part,) = q["topics"][0]["partitions"]
        assert part["error"] is None
        assert part["leader_id"] == leader
        assert part["leader_epoch"] >= 1
        assert part["high_watermark"] >= 1
        voters = {v["replica_id"]: v["log_end_offset"] for v in part["current_voters"]}
        assert set(voters) == set(IDS)
        assert voters[leader] >= part["high_watermark"]
        assert {n["node_id"] for n in q["nodes"]} == set(IDS)


def test_describe_quorum_gives_each_voters_fetch_and_caught_up_times(cluster: Cluster):
    """KRaft's leader reports when each voter last fetched and was last caught up (itself: the
    time of the answer); every one used to be -1, as if no follower had ever fetched."""
    import kio.schema.describe_quorum.v1.request as q

    produce_confluent(cluster.all(), "quorum-times", [b"q"])
    leader = cluster.leader()
    ask = q.DescribeQuorumRequest(topics=(q.TopicData(
        topic_name="__cluster_metadata", partitions=(q.PartitionData(partition_index=0),)),))
    for i in IDS:
        with RawClient(cluster.kafka_ports[i]) as raw:
            (part,) = raw.call(ask).topics[0].partitions
        now_ms = time.time() * 1000
        assert part.error_code == E.none and part.leader_id == leader
        for v in part.current_voters:
            # Followers answer every heartbeat (a tick here is 50 ms): seconds at most.
            assert abs(v.last_fetch_timestamp - now_ms) < 10_000, (i, v)
            assert abs(v.last_caught_up_timestamp - now_ms) < 10_000, (i, v)
            assert v.last_caught_up_timestamp <= v.last_fetch_timestamp, (i, v)


def test_each_node_describes_the_replication_factor_it_applies(cluster: Cluster):
    """A topic created without a replication factor gets a replica on each of the three
    members, and Kafka describes default.replication.factor as the factor CreateTopics applies
    for -1: every node says 3, set statically (Kafka's own default is 1). __consumer_offsets
    also has three replicas: offsets.topic.replication.factor is 3, Kafka's default. Each
    said 1, as if new topics had one replica."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic

    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": cluster.bootstrap(cluster.follower())})
    admin.create_topics([NewTopic("rf-default", num_partitions=1)])["rf-default"].result(30)
    (part,) = admin.list_topics("rf-default", timeout=10).topics["rf-default"].partitions.values()
    assert sorted(part.replicas) == sorted(IDS)
    for i in IDS:
        res = ConfigResource("BROKER", str(i))
        cfg = admin.describe_configs([res])[res].result(30)
        drf, orf = cfg["default.replication.factor"], cfg["offsets.topic.replication.factor"]
        assert (drf.value, drf.source) == ("3", ConfigSource.STATIC_BROKER_CONFIG.value), i
        assert (orf.value, orf.source) == ("3", ConfigSource.DEFAULT_CONFIG.value), i


def test_a_killed_node_leaves_metadata_until_it_restarts(cluster: Cluster):
    """Apache Kafka lists only live brokers: clients must not be sent to a dead node. Killing a
    follower also checks the follower-to-follower view (no Raft traffic between them, only
    the link)."""
    topic = "alive"
    produce_confluent(cluster.all(), topic, [b"x"])
    leader = cluster.leader()
    victim = cluster.follower()
    survivors = set(IDS) - {victim}
    cluster.brokers[victim].kill()
    for i in survivors:
        wait_for(lambda: lists_only(cluster.kafka_ports[i], survivors, topic), timeout=10,
                 what=f"node {i} drops node {victim}")
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.bootstrap(*survivors)})
    md = admin.list_topics(topic, timeout=10)
    assert set(md.brokers) == survivors
    assert md.controller_id == leader
    assert sorted(md.topics[topic].partitions[0].replicas) == list(IDS)
    assert sorted(md.topics[topic].partitions[0].isrs) == sorted(survivors)
    # The leader's /metrics say the same: its role, the dead link, the others in step.
    lead = cluster.brokers[leader]
    assert raft_metric(lead, "kmqkafka_raft_role", role="leader") == 1
    assert raft_metric(lead, "kmqkafka_raft_leader_id") == leader
    assert raft_metric(lead, "kmqkafka_raft_peer_up", peer=str(victim)) == 0
    other = next(iter(survivors - {leader}))
    assert raft_metric(lead, "kmqkafka_raft_peer_up", peer=str(other)) == 1
    assert raft_metric(lead, "kmqkafka_raft_applied_index") >= 1

    # Changes made while it was down are served by the node from its first answer on:
    # like Kafka's broker, it catches up with the leader before it opens its listeners.
    born = "born-while-down"
    admin.create_topics([confluent_kafka.admin.NewTopic(born, 3, 1)])[born].result(20)
    produce_confluent(cluster.bootstrap(*survivors), born, [b"y"] * 50, partition=2)
    cluster.brokers[victim].restart()
    Req = req("metadata", 12, "MetadataRequest")
    T = req("metadata", 12, "MetadataRequestTopic")
    with RawClient(cluster.kafka_ports[victim]) as raw:
        md = raw.call(Req(topics=(T(name=born, topic_id=None),), allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False))
    assert md.topics[0].error_code == E.none and len(md.topics[0].partitions) == 3
    for i in IDS:
        wait_for(lambda: lists_only(cluster.kafka_ports[i], set(IDS), topic),
                 what=f"node {i} lists node {victim} again")
    wait_for(lambda: raft_metric(lead, "kmqkafka_raft_peer_lag_entries", peer=str(victim)) == 0,
             what=f"node {victim} catches up (leader's lag metric)")
    assert raft_metric(cluster.brokers[victim], "kmqkafka_raft_role", role="follower") == 1


def test_a_restarted_node_is_listed_only_once_it_serves_clients(cluster: Cluster):
    """Kafka keeps a restarting broker fenced, out of Metadata, until it has caught up. A
    restarted node here takes part in Raft while it catches up, before its listeners open:
    the others used to list it (and count it in the ISR) at once, and clients sent there
    met a refused connection."""
    from tests.conftest import _spawn

    leader = cluster.leader()
    victim = cluster.follower()
    node = cluster.brokers[victim]
    node.kill()
    survivors = set(IDS) - {victim}
    for i in survivors:
        wait_for(lambda: lists_only(cluster.kafka_ports[i], survivors, "alive"), timeout=10,
                 what=f"node {i} drops node {victim}")
    # Something to catch up on, so the restarted node spends a while in Raft before serving.
    p = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap(leader), "acks": "all",
                                  "linger.ms": 20, "batch.size": 1 << 20})
    for _ in range(30_000):
        p.produce("catch-up", b"c" * 1024, partition=0)
        p.poll(0)
    assert p.flush(60) == 0

    node.history.append(node.proc)
    node.proc = _spawn(node.cwd, node.env, node.args, node.log_path, node.prefix)
    listed_early = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = {b.node_id for b in metadata(cluster.kafka_ports[leader], ("alive",)).brokers}
        if victim in listed:
            # /health is 200 once the listeners are open (its own port is open from the
            # start: connecting to a closed Kafka port could connect to itself and take it).
            if node.health() == 200:
                break
            listed_early += 1
        assert node.proc.poll() is None, node.log()
        time.sleep(0.01)
    else:
        raise AssertionError(f"node {victim} never listed again")
    assert not listed_early, f"listed before its listeners opened ({listed_early} times)"
    _wait_healthy(node, 30)
    for i in IDS:
        wait_for(lambda: lists_only(cluster.kafka_ports[i], set(IDS), "alive"),
                 what=f"node {i} lists node {victim} again")


# --- consumer group across a leader failover, then every node agrees -------------------


def test_group_resumes_from_committed_offsets_after_the_leader_is_killed(cluster: Cluster):
    topic, group = "fo", "fo-group"
    old_leader = cluster.leader()
    follower = cluster.follower()  # survives the kill
    values = [b"fo-%d" % i for i in range(100)]
    assert produce_confluent(cluster.bootstrap(follower), topic, values) == list(range(100))

    c = confluent_kafka.Consumer({
        "bootstrap.servers": cluster.bootstrap(follower), "group.id": group,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000})
    c.subscribe([topic])
    seen: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 60 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append((m.offset(), m.value()))
        assert len(seen) >= 60, seen[-3:]
        seen = seen[:60]
        c.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 60)], asynchronous=False)
    finally:
        c.close()
    assert seen == list(enumerate(values[:60]))

    cluster.brokers[old_leader].kill()
    t0 = time.monotonic()
    new_leader = cluster.leader(not_=old_leader)
    assert time.monotonic() - t0 < 15
    more = [b"fo-%d" % i for i in range(100, 130)]
    assert produce_confluent(cluster.bootstrap(follower), topic, more) == list(range(100, 130))
    values += more

    # The survivors stop listing the killed node, so clients never pick it (kafka-python 3
    # raises, instead of retrying elsewhere, when FindCoordinator goes to a dead broker).
    survivors = set(IDS) - {old_leader}
    for i in survivors:
        wait_for(lambda: lists_only(cluster.kafka_ports[i], survivors, topic), timeout=10,
                 what=f"node {i} drops node {old_leader}")

    # A kafka-python consumer of the same group, bootstrapped via the surviving follower.
    k = kafka.KafkaConsumer(topic, bootstrap_servers=cluster.bootstrap(follower),
                            group_id=group, enable_auto_commit=False,
                            auto_offset_reset="earliest", consumer_timeout_ms=20000,
                            session_timeout_ms=10000, heartbeat_interval_ms=1000)
    resumed: list[tuple[int, bytes]] = []
    try:
        for m in k:
            resumed.append((m.offset, m.value))
            if len(resumed) == 70:
                break
        k.commit()
        committed = k.committed(kafka.TopicPartition(topic, 0))
    finally:
        k.close()
    assert resumed == [(o, values[o]) for o in range(60, 130)]  # nothing skipped or repeated
    assert committed == 130

    cluster.brokers[old_leader].restart()
    assert new_leader != old_leader
    for i in IDS:
        assert fetch_all(cluster.kafka_ports[i], topic, 130) == list(enumerate(values)), i
    for i in IDS:  # the restarted node agrees on metadata too, and is listed again
        wait_for(lambda: metadata(cluster.kafka_ports[i], (topic,)).topics[0].partitions[0]
                 .leader_id == new_leader, what=f"node {i} names leader {new_leader}")
        wait_for(lambda: lists_only(cluster.kafka_ports[i], set(IDS), topic),
                 what=f"node {i} lists node {old_leader} again")


def fetch_with_epoch(port: int, topic: str, epoch: int) -> Any:
    """Partition 0 of one raw Fetch v11 from offset 0 naming ``epoch`` as current leader epoch."""
    Req = req("fetch", 11, "FetchRequest")
    T = req("fetch", 11, "FetchTopic")
    P = req("fetch", 11, "FetchPartition")
    with RawClient(port) as raw:
        return raw.call(Req(replica_id=-1, max_wait=ms(0), min_bytes=0, max_bytes=1 << 20,
                            isolation_level=0, session_id=0, session_epoch=-1, topics=(T(
                                topic=topic, partitions=(P(
                                    partition=0, current_leader_epoch=epoch, fetch_offset=0,
                                    log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                            forgotten_topics_data=(), rack_id="")).responses[0].partitions[0]


def test_the_leader_epoch_grows_with_a_leader_change_and_fences_the_old_one(cluster: Cluster):
    """Kafka bumps a partition's leader epoch at every leader change; clients order what they
    hear by it (librdkafka ignores metadata older than the epoch it holds) and a fetch naming
    an older epoch is FENCED_LEADER_EPOCH. The epoch used to be 0 forever, so a node that still
    named the old leader looked as current as the one naming the new one."""
    topic = "epochs"
    produce_confluent(cluster.all(), topic, [b"a", b"b"])
    old = cluster.leader()

    def views(nodes: set[int]) -> set[tuple[int, int]]:
        parts = [metadata(cluster.kafka_ports[i], (topic,)).topics[0].partitions[0]
                 for i in nodes]
        return {(p.leader_id, p.leader_epoch) for p in parts}

    (_, before), = wait_for(lambda: len(views(set(IDS))) == 1 and views(set(IDS)),
                            what="one leader and epoch on every node")
    assert fetch_with_epoch(cluster.kafka_ports[old], topic, before).error_code == E.none
    cluster.brokers[old].stop()  # SIGTERM: the leader hands over before it exits
    try:
        new = cluster.leader(not_=old)
        survivors = set(IDS) - {old}
        (_, after), = wait_for(lambda: {lead for lead, _ in views(survivors)} == {new}
                               and len(views(survivors)) == 1 and views(survivors),
                               what="the survivors agree on the new leader")
        assert after > before
        port = cluster.kafka_ports[new]
        assert fetch_with_epoch(port, topic, before).error_code == E.fenced_leader_epoch
        assert fetch_with_epoch(port, topic, after + 1).error_code == E.unknown_leader_epoch
        got = fetch_with_epoch(port, topic, after)
        assert got.error_code == E.none and got.high_watermark == 2

        Oe = req("offset_for_leader_epoch", 4, "OffsetForLeaderEpochRequest")
        Ot = req("offset_for_leader_epoch", 4, "OffsetForLeaderTopic")
        Op = req("offset_for_leader_epoch", 4, "OffsetForLeaderPartition")
        with RawClient(port) as raw:
            r = raw.call(Oe(replica_id=-1, topics=(Ot(topic=topic, partitions=(
                Op(partition=0, current_leader_epoch=after, leader_epoch=0),
                Op(partition=0, current_leader_epoch=after, leader_epoch=after),)),)))
        # The records all carry epoch 0 and nothing was truncated: both end at the log end.
        assert [(p.error_code, p.leader_epoch, p.end_offset) for p in r.topics[0].partitions] \
            == [(E.none, 0, 2), (E.none, after, 2)]
    finally:
        cluster.brokers[old].restart()
    wait_for(lambda: views({old}) == {(new, after)}, what=f"node {old} names epoch {after}")


def test_deleting_a_topic_through_a_follower_drops_its_committed_offsets(cluster: Cluster):
    """DeleteTopics reaching a follower is relayed to the leader, whose group coordinator
    drops the topic's committed offsets, as Kafka does (a recreated topic starts afresh)."""
    topic, group = "dto", "dto-group"
    follower = cluster.follower()
    assert produce_confluent(cluster.bootstrap(follower), topic,
                             [b"v%d" % i for i in range(5)]) == list(range(5))
    c = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap(follower),
                                  "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 3)], asynchronous=False)
    finally:
        c.close()
    # Straight to the follower: admin clients send DeleteTopics to the controller (leader).
    with RawClient(cluster.kafka_ports[follower]) as raw:
        response = raw.call(req("delete_topics", 4, "DeleteTopicsRequest")(
            topic_names=(topic,), timeout=ms(10_000)))
    assert [r.error_code for r in response.responses] == [E.none]
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.bootstrap(follower)})

    def committed() -> list[int]:
        (f,) = admin.list_consumer_group_offsets([confluent_kafka.ConsumerGroupTopicPartitions(
            group, [confluent_kafka.TopicPartition(topic, 0)])]).values()
        return [tp.offset for tp in f.result(10).topic_partitions]

    assert wait_for(lambda: committed() == [-1001], what="offsets dropped")


def test_a_node_restarted_with_an_empty_data_dir_is_caught_up_by_the_same_leader(
        cluster: Cluster):
    """A follower whose data dir was lost comes back under its old id: the leader still
    counted it as holding everything and used to probe it at that point forever (it served
    no topics until another leader took over). Now it is sent the log again, or a snapshot,
    and serves every record at the same offsets without a change of leader."""
    import shutil

    topic = "wiped"
    values = [b"w%d" % i for i in range(300)]
    assert produce_confluent(cluster.all(), topic, values[:200]) == list(range(200))
    leader = cluster.leader()
    victim = cluster.follower()
    b = cluster.brokers[victim]
    b.kill()
    shutil.rmtree(b.data_dir)
    b.restart()
    assert produce_confluent(cluster.bootstrap(leader), topic, values[200:]) == list(
        range(200, 300))
    assert fetch_all(cluster.kafka_ports[victim], topic, 300) == list(enumerate(values))
    assert cluster.leader() == leader


def test_admin_calls_do_not_wait_on_a_killed_leader(cluster: Cluster):
    """Right after kill -9 of the leader the survivors still know it as leader for an election
    timeout. They used to name it controller meanwhile, and librdkafka then waited for it
    until its request timed out (20 s) without asking again. A node whose own link to the
    leader is down names itself, and forwards the admin command to the next leader."""
    leader = cluster.leader()
    survivors = [i for i in IDS if i != leader]
    cluster.brokers[leader].kill()
    time.sleep(0.2)  # the links have dropped; no election timeout has passed yet
    for i in survivors:
        assert metadata(cluster.kafka_ports[i]).controller_id != leader
    # A client that looks the controller up now (as one does after a failure; one that had
    # it cached before the kill waits on librdkafka's own refresh).
    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": cluster.bootstrap(*survivors)})
    started = time.monotonic()
    topic = "after-leader-kill"
    admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 1)],
                        request_timeout=20)[topic].result(25)
    assert time.monotonic() - started < 10
    cluster.brokers[leader].restart()
    for i in IDS:
        wait_for(lambda: topic_listed(cluster.kafka_ports[i], topic), what=f"node {i} has {topic}")


def topic_listed(port: int, topic: str) -> bool:
    md = metadata(port, (topic,))
    return md.topics[0].error_code == E.none


def test_a_follower_fetch_past_its_applied_end_waits_for_the_apply(cluster: Cluster):
    """A follower applies a committed entry a heartbeat after the leader acknowledged it:
    Kafka answers no error for an offset within a replica's log, so a Fetch there waits (up
    to max_wait) instead of answering OFFSET_OUT_OF_RANGE; beyond max_wait it is out of
    range, as for an offset no node has."""
    topic = "follower-ahead"
    leader, follower = cluster.leader(), cluster.follower()
    assert produce_confluent(cluster.bootstrap(leader), topic, [b"a", b"b"]) == [0, 1]
    wait_for(lambda: len(fetch_all(cluster.kafka_ports[follower], topic, 2)) == 2,
             what="the follower applied offsets 0-1")
    Req = req("fetch", 11, "FetchRequest")
    T = req("fetch", 11, "FetchTopic")
    P = req("fetch", 11, "FetchPartition")

    def fetch(offset: int, wait_ms: int) -> Any:
        with RawClient(cluster.kafka_ports[follower], timeout=20) as raw:
            return raw.call(Req(
                replica_id=-1, max_wait=ms(wait_ms), min_bytes=1, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=(T(topic=topic, partitions=(P(
                    partition=0, current_leader_epoch=-1, fetch_offset=offset,
                    log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                forgotten_topics_data=(), rack_id="")).responses[0].partitions[0]

    import threading
    answer: list[Any] = []
    reader = threading.Thread(target=lambda: answer.append(fetch(3, 10_000)))
    reader.start()
    time.sleep(0.3)  # parked on the follower, two offsets past its end
    assert produce_confluent(cluster.bootstrap(leader), topic, [b"c", b"d"]) == [2, 3]
    reader.join(20)
    part = answer[0]
    assert part.error_code == E.none and part.high_watermark >= 4, part
    values = [(r.offset, r.value) for pos, _h in records.split_batches(bytes(part.records))
              for r in records.iter_records(bytes(part.records), pos)]
    assert (3, b"d") in values
    started = time.monotonic()
    assert fetch(1000, 300).error_code == E.offset_out_of_range
    assert time.monotonic() - started >= 0.25


def test_nodes_hold_only_unapplied_raft_entries_in_memory(cluster: Cluster):
    """300 MB through the cluster: no node's memory grows with it. Each used to keep every
    entry since its last snapshot (a compaction every 256 MiB), about 300 MB more each."""
    leader = cluster.leader()
    p = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap(leader), "acks": "all",
                                  "linger.ms": 5, "batch.size": 1_000_000,
                                  "queue.buffering.max.kbytes": 262_144,
                                  "message.timeout.ms": 60_000})
    value = bytes(range(256)) * 4
    failed: list = []
    for _ in range(300_000):
        while True:
            try:
                p.produce("rss", value, partition=0,
                          on_delivery=lambda err, _m: err is None or failed.append(err))
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    assert not failed, failed[:3]
    peaks = {i: peak_rss_kb(b.proc.pid) * 1024 / 1e6 for i, b in cluster.live().items()}
    assert max(peaks.values()) < 240, peaks


def test_calls_forwarded_to_a_stalled_leader_are_cut_off_once_another_leads(cluster: Cluster):
    """A SIGSTOPped leader keeps its connections open: a group call a follower relayed to
    it waited out the 30 s forward timeout though a new leader served after a second or
    two. The follower now cuts such calls off when the leader changes (a retriable error)."""
    import os
    import signal

    Oc = req("offset_commit", 7, "OffsetCommitRequest")
    Oct = req("offset_commit", 7, "OffsetCommitRequestTopic")
    Ocp = req("offset_commit", 7, "OffsetCommitRequestPartition")
    commit = Oc(group_id="stalled", generation_id_or_member_epoch=-1, member_id="",
                group_instance_id=None, topics=(Oct(name="stalled", partitions=(Ocp(
                    partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                    committed_metadata=""),)),))
    leader = cluster.leader()
    follower = cluster.follower()
    pid = cluster.brokers[leader].proc.pid
    metadata(cluster.kafka_ports[leader], ("stalled",))  # auto-creates it
    wait_for(lambda: metadata(cluster.kafka_ports[follower], ("stalled",)).topics[0]
             .error_code == E.none, what="the topic on the follower")
    with RawClient(cluster.kafka_ports[follower], timeout=40) as raw:
        first = raw.call(commit)  # opens the follower's relay connection to the leader
        assert first.topics[0].partitions[0].error_code == E.none
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            answer = raw.call(commit)
            took = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
    assert answer.topics[0].partitions[0].error_code in (
        E.none, E.not_coordinator, E.coordinator_not_available), answer
    assert took < 12, f"the relayed call waited {took:.1f} s"
    cluster.leader()
