"""Kafka transactions (KIP-98) on a real 3-process cluster (127.0.0.1).

The transaction coordinator runs on the Raft leader; a transactional producer bootstrapped
on a follower finds it there (FindCoordinator key_type=1) and EndTxn writes the COMMIT/ABORT
markers to every partition of the transaction in one Raft entry. Every node then serves the
same log: the same last stable offset, the same aborted transactions, the same committed
records to read_committed consumers bootstrapped on it.

A transaction left open by a leader that is killed stays open on the next leader (it reloads
the coordinator state from the replicated store): the last stable offset stays at its first
record until a new producer with the same transactional.id fences it with InitProducerId,
which aborts it.

One cluster for the module, its own (separate from test_kafka_cluster's): the tests run in
file order and the last one kills the leader.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.raft.test_kafka_cluster import (
    IDS,
    Cluster,
    ms,
    req,
    topic_listed,
    wait_for,
)
from tests.rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_api = pytest.importorskip("confluent_kafka.admin")

from kio.schema.errors import ErrorCode as E

from kmqkafka import records

PARTITIONS = (0, 1)
READ_COMMITTED, READ_UNCOMMITTED = 1, 0


@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-txn-cluster"))
    try:
        c.leader()
        yield c
    finally:
        c.stop()


# --- helpers -------------------------------------------------------------------------------


def create_topic(cluster: Cluster, via: int, topic: str, partitions: int) -> None:
    admin = admin_api.AdminClient({"bootstrap.servers": cluster.bootstrap(via)})
    admin.create_topics([admin_api.NewTopic(topic, partitions)],
                        request_timeout=20)[topic].result(25)
    for i in cluster.live():
        wait_for(lambda i=i: topic_listed(cluster.kafka_ports[i], topic),
                 what=f"node {i} has {topic}")


def txn_producer(bootstrap: str, transactional_id: str) -> Any:
    return confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "transaction.timeout.ms": 60_000, "linger.ms": 5, "message.timeout.ms": 30_000,
        "socket.connection.setup.timeout.ms": 3_000, "reconnect.backoff.max.ms": 500})


def produce_in_txn(p: Any, topic: str, tag: str, per_partition: int) -> dict[int, list]:
    """Inside the producer's open transaction: ``per_partition`` records to each partition,
    flushed (acknowledged, not committed). Returns {partition: [(offset, value), ...]}."""
    got: dict[int, list] = {q: [] for q in PARTITIONS}
    errors: list = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            got[msg.partition()].append((msg.offset(), msg.value()))

    for q in PARTITIONS:
        for k in range(per_partition):
            p.produce(topic, b"%s-p%d-%d" % (tag.encode(), q, k), partition=q,
                      on_delivery=report)
    assert p.flush(30) == 0
    assert not errors, errors
    return {q: sorted(v) for q, v in got.items()}


def run_txn(p: Any, topic: str, tag: str, per_partition: int, commit: bool) -> dict[int, list]:
    p.begin_transaction()
    got = produce_in_txn(p, topic, tag, per_partition)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)
    return got


def merge(*parts: dict[int, list]) -> dict[int, list]:
    return {q: sorted(r for part in parts for r in part[q]) for q in PARTITIONS}


def list_offsets(port: int, topic: str, isolation: int) -> dict[int, int]:
    """LATEST of each partition from one node (raw ListOffsets v4)."""
    Lo = req("list_offsets", 4, "ListOffsetsRequest")
    Lt = req("list_offsets", 4, "ListOffsetsTopic")
    Lp = req("list_offsets", 4, "ListOffsetsPartition")
    with RawClient(port) as raw:
        r = raw.call(Lo(replica_id=-1, isolation_level=isolation, topics=(Lt(
            name=topic, partitions=tuple(Lp(partition_index=q, current_leader_epoch=-1,
                                            timestamp=-1) for q in PARTITIONS)),)))
    parts = r.topics[0].partitions
    assert all(p.error_code == E.none for p in parts), parts
    return {p.partition_index: p.offset for p in parts}


def ends_are(port: int, topic: str, committed: int, uncommitted: int) -> bool:
    want_c = {q: committed for q in PARTITIONS}
    want_u = {q: uncommitted for q in PARTITIONS}
    got = (list_offsets(port, topic, READ_COMMITTED), list_offsets(port, topic, READ_UNCOMMITTED))
    assert got == (want_c, want_u), got
    return True


def raw_log(port: int, topic: str, partition: int) -> dict[str, Any]:
    """One node's read_committed view of a partition, straight from it (raw Fetch v11 with
    isolation_level=1, from offset 0 up to its last stable offset): high watermark, last
    stable offset, aborted transactions, and every batch (data and markers)."""
    Req = req("fetch", 11, "FetchRequest")
    T = req("fetch", 11, "FetchTopic")
    P = req("fetch", 11, "FetchPartition")
    batches: list[tuple] = []
    aborted: set[tuple[int, int]] = set()
    offset, hwm, lso = 0, None, None
    deadline = time.monotonic() + 20
    with RawClient(port) as raw:
        while lso is None or offset < lso:
            assert time.monotonic() < deadline, (offset, hwm, lso, batches)
            r = raw.call(Req(replica_id=-1, max_wait=ms(100), min_bytes=0, max_bytes=1 << 20,
                             isolation_level=READ_COMMITTED, session_id=0, session_epoch=-1,
                             topics=(T(topic=topic, partitions=(P(
                                 partition=partition, current_leader_epoch=-1,
                                 fetch_offset=offset, log_start_offset=-1,
                                 partition_max_bytes=1 << 20),)),),
                             forgotten_topics_data=(), rack_id=""))
            part = r.responses[0].partitions[0]
            assert part.error_code == E.none, part
            hwm, lso = part.high_watermark, part.last_stable_offset
            aborted |= {(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()}
            data = bytes(part.records or b"")
            for pos, h in (records.split_batches(data) if data else ()):
                if h.last_offset < offset:
                    continue
                if h.is_control:
                    body = ("COMMIT" if records.control_type(data, pos) == 1 else "ABORT",)
                else:
                    body = tuple((r.offset, r.value) for r in records.iter_records(data, pos))
                batches.append((h.base_offset, h.last_offset, h.producer_id, h.producer_epoch,
                                h.is_transactional, body))
                offset = h.last_offset + 1
    return {"hwm": hwm, "lso": lso, "aborted": sorted(aborted), "batches": batches}


def visible(log: dict[str, Any]) -> list[tuple[int, bytes]]:
    """The records a read_committed consumer delivers from ``raw_log``'s answer, skipping the
    aborted transactions' records as clients do (KIP-98)."""
    pending = sorted(log["aborted"], key=lambda a: a[1])
    skipping: set[int] = set()
    out: list[tuple[int, bytes]] = []
    for base, _last, pid, _epoch, transactional, body in log["batches"]:
        while pending and pending[0][1] <= base:
            skipping.add(pending.pop(0)[0])
        if body in (("COMMIT",), ("ABORT",)):
            if body == ("ABORT",):
                skipping.discard(pid)
            continue
        if transactional and pid in skipping:
            continue
        out.extend(body)
    return out


def consume(bootstrap: str, topic: str, isolation: str) -> dict[int, list]:
    """Every record a confluent_kafka consumer bootstrapped on ``bootstrap`` delivers from
    both partitions (assigned explicitly, from the beginning) until it reports the end of
    each (enable.partition.eof): the last stable offset for read_committed."""
    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"txn-check-{uuid.uuid4()}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": isolation, "auto.offset.reset": "earliest"})
    c.assign([confluent_kafka.TopicPartition(topic, q, confluent_kafka.OFFSET_BEGINNING)
              for q in PARTITIONS])
    got: dict[int, list] = {q: [] for q in PARTITIONS}
    eof: set[int] = set()
    deadline = time.monotonic() + 20
    try:
        while eof != set(PARTITIONS):
            assert time.monotonic() < deadline, (isolation, bootstrap, got, eof)
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, m.error()
                eof.add(m.partition())
                continue
            got[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return got


def transactions(port: int) -> dict[str, tuple[int, str]]:
    """{transactional id: (producer id, state)} as the node's coordinator lists them (raw
    ListTransactions v0, relayed to the leader from a follower)."""
    Lt = req("list_transactions", 0, "ListTransactionsRequest")
    with RawClient(port) as raw:
        r = raw.call(Lt(state_filters=(), producer_id_filters=()))
    assert r.error_code == E.none, r
    return {t.transactional_id: (t.producer_id, t.transaction_state)
            for t in r.transaction_states}


def check_every_node(cluster: Cluster, topic: str, nodes: Any, end: int,
                     committed: dict[int, list], everything: dict[int, list],
                     aborted_first: list[int]) -> dict[int, dict[str, Any]]:
    """Each node in ``nodes``: both LATEST offsets are ``end``; its own read_committed Fetch
    names the aborted transactions starting at ``aborted_first`` and leaves exactly
    ``committed``; a read_committed consumer bootstrapped on it alone reads ``committed``,
    a read_uncommitted one ``everything``; and all nodes hold the same batches."""
    logs = {}
    for i in nodes:
        port = cluster.kafka_ports[i]
        wait_for(lambda port=port: ends_are(port, topic, end, end), what=f"node {i} ends at {end}")
        for q in PARTITIONS:
            log = raw_log(port, topic, q)
            assert (log["hwm"], log["lso"]) == (end, end), (i, q, log)
            assert [first for _pid, first in log["aborted"]] == aborted_first, (i, q, log)
            assert visible(log) == committed[q], (i, q, log)
            logs[(i, q)] = log
        assert consume(cluster.bootstrap(i), topic, "read_committed") == committed, f"node {i}"
        assert consume(cluster.bootstrap(i), topic, "read_uncommitted") == everything, \
            f"node {i}"
    for q in PARTITIONS:
        views = [logs[(i, q)] for i in nodes]
        assert all(v == views[0] for v in views), (q, views)
    return {q: logs[(nodes[0], q)] for q in PARTITIONS}


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_producer_on_a_follower_commits_and_aborts_and_every_node_agrees(
        txn_cluster: Cluster):
    cluster = txn_cluster
    topic = "txn-two"
    leader = cluster.leader()
    follower = cluster.follower()
    create_topic(cluster, follower, topic, len(PARTITIONS))
    Fc = req("find_coordinator", 4, "FindCoordinatorRequest")
    with RawClient(cluster.kafka_ports[follower]) as raw:  # the follower names the leader
        (found,) = raw.call(Fc(key_type=1, coordinator_keys=("tx-via-follower",))).coordinators
    assert (found.error_code, found.node_id, found.port) == (
        E.none, leader, cluster.kafka_ports[leader])

    p = txn_producer(cluster.bootstrap(follower), "tx-via-follower")
    p.init_transactions(30)
    first = run_txn(p, topic, "c1", 3, commit=True)
    dropped = run_txn(p, topic, "a1", 2, commit=False)
    second = run_txn(p, topic, "c2", 2, commit=True)
    # Each marker takes an offset: c1 0-2, COMMIT 3, a1 4-5, ABORT 6, c2 7-8, COMMIT 9.
    for q in PARTITIONS:
        assert [o for o, _v in first[q]] == [0, 1, 2]
        assert [o for o, _v in dropped[q]] == [4, 5]
        assert [o for o, _v in second[q]] == [7, 8]

    check_every_node(cluster, topic, IDS, 10, merge(first, second),
                     merge(first, dropped, second), aborted_first=[4])


@pytest.mark.timeout(150)
def test_an_open_transaction_survives_a_leader_kill_and_is_fenced_by_the_next_producer(
        txn_cluster: Cluster):
    cluster = txn_cluster
    topic, tid = "txn-failover", "tx-failover"
    old_leader = cluster.leader()
    follower = cluster.follower()  # survives the kill
    survivors = [i for i in IDS if i != old_leader]
    create_topic(cluster, follower, topic, len(PARTITIONS))

    zombie = txn_producer(cluster.bootstrap(follower), tid)
    zombie.init_transactions(30)
    first = run_txn(zombie, topic, "c1", 2, commit=True)  # 0-1, COMMIT 2
    zombie.begin_transaction()
    left_open = produce_in_txn(zombie, topic, "open", 3)  # 3-5, acknowledged, not ended
    for q in PARTITIONS:
        assert [o for o, _v in left_open[q]] == [3, 4, 5]
    for i in IDS:  # read_committed stops at the open transaction's first record everywhere
        wait_for(lambda i=i: ends_are(cluster.kafka_ports[i], topic, 3, 6),
                 what=f"node {i}: the open transaction holds the last stable offset at 3")
    (pid, state), = [v for k, v in transactions(cluster.kafka_ports[old_leader]).items()
                     if k == tid]
    assert state == "Ongoing"
    open_epoch = raw_log(cluster.kafka_ports[old_leader], topic, 0)["batches"][-1][3]

    cluster.brokers[old_leader].kill()
    new_leader = cluster.leader(not_=old_leader)

    # The new leader reloaded the coordinator state: the transaction is still open there.
    for i in survivors:
        wait_for(lambda i=i: ends_are(cluster.kafka_ports[i], topic, 3, 6),
                 what=f"node {i}: still open after the kill")
    assert wait_for(lambda: transactions(cluster.kafka_ports[new_leader]).get(tid),
                    what="ListTransactions on the new leader") == (pid, "Ongoing")
    for i in survivors:  # a follower relays it to the new leader
        assert transactions(cluster.kafka_ports[i]).get(tid) == (pid, "Ongoing"), f"node {i}"
    for i in survivors:
        assert consume(cluster.bootstrap(i), topic, "read_committed") == first, f"node {i}"

    # The same transactional.id again: InitProducerId aborts the open transaction (ABORT
    # markers at 6, with the epoch bumped) and hands out a newer epoch.
    fencer = txn_producer(cluster.bootstrap(follower), tid)
    fencer.init_transactions(30)
    for i in survivors:
        wait_for(lambda i=i: ends_are(cluster.kafka_ports[i], topic, 7, 7),
                 what=f"node {i}: the open transaction was aborted")
    assert transactions(cluster.kafka_ports[new_leader]).get(tid) in (
        (pid, "Empty"), (pid, "CompleteAbort"))

    # The old producer is a zombie now: it cannot commit what it left open.
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        zombie.commit_transaction(20)
    err = refused.value.args[0]
    assert err.fatal() and err.code() in (confluent_kafka.KafkaError._FENCED,
                                          confluent_kafka.KafkaError.PRODUCER_FENCED,
                                          confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH), err

    second = run_txn(fencer, topic, "c2", 2, commit=True)  # 7-8, COMMIT 9
    for q in PARTITIONS:
        assert [o for o, _v in second[q]] == [7, 8]

    cluster.brokers[old_leader].restart()
    logs = check_every_node(cluster, topic, IDS, 10, merge(first, second),
                            merge(first, left_open, second), aborted_first=[3])
    for q in PARTITIONS:
        # (base, last, producer id, epoch, transactional, body) of every batch: the ABORT
        # marker fences the open transaction's epoch (bumped), the next producer is newer.
        epochs = {(base, body[0] if body in (("COMMIT",), ("ABORT",)) else "data", e)
                  for base, _last, p_id, e, _tx, body in logs[q]["batches"] if p_id == pid}
        marker = [(b, e) for b, kind, e in epochs if kind == "ABORT"]
        assert marker == [(6, open_epoch + 1)], sorted(epochs)
        assert {e for b, kind, e in epochs if b >= 7} == {open_epoch + 2}, sorted(epochs)
        assert {e for b, kind, e in epochs if b < 6} == {open_epoch}, sorted(epochs)
