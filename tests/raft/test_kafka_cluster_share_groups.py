"""KIP-932 share groups on a real 3-process cluster (127.0.0.1).

The Raft leader is the group coordinator and the leader of every partition: a ShareConsumer
bootstrapped on a follower finds it there, and share-group calls reaching a follower are
relayed to it (a ShareFetch parks on the leader). Share-partition state (start offset,
acknowledged ranges, delivery counts) is written through Raft; members and record locks live
in the leader's memory only.

So after a kill -9 of the leader, the next leader knows what was acknowledged (it is never
delivered again) and nothing of the members or their locks: the members join again, and every
record not acknowledged, whether handed out before the kill or not, is delivered again, to a
new consumer or to the same one. A leader that stalls (SIGSTOP) and wakes as a follower takes
nothing for the fetches parked on it.

One cluster for the module, its own: the tests run in file order; the last three change the
leader (two kill it and restart it, one pauses it).
"""
from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.raft.test_kafka_cluster import (
    IDS,
    Cluster,
    metadata,
    ms,
    raft_metric,
    req,
    wait_for,
)
from tests.raft.test_cluster import wait_leader
from tests.raft.test_kafka_cluster_transactions import create_topic
from tests.rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_api = pytest.importorskip("confluent_kafka.admin")
if not hasattr(confluent_kafka, "ShareConsumer"):
    pytest.skip("confluent_kafka has no ShareConsumer", allow_module_level=True)

from kio.schema.errors import ErrorCode as E  # noqa: E402

from kmqkafka import records  # noqa: E402

PARTITIONS = (0, 1)
Record = tuple[int, int]  # (partition, offset)


@pytest.fixture(scope="module")
def share_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-share-cluster"))
    try:
        c.leader()
        yield c
    finally:
        c.stop()


# --- helpers -------------------------------------------------------------------------------


def read_from_earliest(cluster: Cluster, via: int, group: str) -> None:
    """share.auto.offset.reset=earliest for ``group`` (IncrementalAlterConfigs on the group)."""
    admin = admin_api.AdminClient({"bootstrap.servers": cluster.bootstrap(via)})
    resource = admin_api.ConfigResource(
        admin_api.ResourceType.GROUP, group, incremental_configs=[admin_api.ConfigEntry(
            "share.auto.offset.reset", "earliest",
            incremental_operation=admin_api.AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource], request_timeout=20).values():
        f.result(25)


def produce(bootstrap: str, topic: str, tag: str, per_partition: int,
            partitions: tuple[int, ...] = PARTITIONS) -> dict[Record, bytes]:
    """``per_partition`` records to each of ``partitions``, acks=all;
    {(partition, offset): value}."""
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 30_000})
    got: dict[Record, bytes] = {}
    errors: list = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            got[(msg.partition(), msg.offset())] = msg.value()

    for q in partitions:
        for k in range(per_partition):
            p.produce(topic, b"%s-p%d-%d" % (tag.encode(), q, k), partition=q,
                      on_delivery=report)
    assert p.flush(40) == 0
    assert not errors, errors
    assert len(got) == per_partition * len(partitions)
    return got


def share_consumer(bootstrap: str, group: str, topic: str, mode: str = "implicit") -> Any:
    c = confluent_kafka.ShareConsumer({
        "bootstrap.servers": bootstrap, "group.id": group,
        "share.acknowledgement.mode": mode,
        "socket.connection.setup.timeout.ms": 3_000, "reconnect.backoff.max.ms": 500,
        "socket.timeout.ms": 10_000})
    c.subscribe([topic])
    return c


def poll_into(c: Any, got: list[tuple[Record, bytes]], timeout: float = 0.5,
              counts: dict[Record, int] | None = None) -> list[Any]:
    """One poll: appends every record delivered to ``got`` (duplicates included) and, with
    ``counts``, notes each one's delivery count."""
    msgs = c.poll(timeout) or []
    for m in msgs:
        assert m.error() is None, m.error()
        got.append(((m.partition(), m.offset()), m.value()))
        if counts is not None:
            counts[(m.partition(), m.offset())] = m.delivery_count()
    return list(msgs)


def consume(consumers: list[Any], want: int, timeout: float = 30.0, settle: float = 2.0,
            counts: dict[Record, int] | None = None) -> list[tuple[Record, bytes]]:
    """Poll ``consumers`` in turn (implicit acknowledgement: each poll accepts the records of
    the one before) until ``want`` distinct records arrived, then ``settle`` seconds more to
    catch any extra or repeated delivery; a final commit_sync accepts the last polls.
    Returns every delivery, in order."""
    got: list[tuple[Record, bytes]] = []
    deadline = time.monotonic() + timeout
    while len({r for r, _v in got}) < want:
        assert time.monotonic() < deadline, (want, len(got), sorted(got)[-5:])
        for c in consumers:
            poll_into(c, got, 0.3, counts)
    until = time.monotonic() + settle
    while time.monotonic() < until:
        for c in consumers:
            poll_into(c, got, 0.3, counts)
    for c in consumers:
        assert all(e is None for e in c.commit_sync(20).values())
    return got


def describe(port: int, group: str) -> Any:
    """The group as one node describes it (raw ShareGroupDescribe v1, relayed from a
    follower to the leader)."""
    Req = req("share_group_describe", 1, "ShareGroupDescribeRequest")
    with RawClient(port) as raw:
        (g,) = raw.call(Req(group_ids=(group,), include_authorized_operations=False)).groups
    return g


RETRIABLE = (E.coordinator_load_in_progress, E.coordinator_not_available, E.not_coordinator)


def share_requests() -> tuple[Any, ...]:
    """ShareGroupHeartbeat, ShareFetch (request, topic, partition), ShareAcknowledge
    (request, topic, partition, batch) v1."""
    return (req("share_group_heartbeat", 1, "ShareGroupHeartbeatRequest"),
            req("share_fetch", 1, "ShareFetchRequest"), req("share_fetch", 1, "FetchTopic"),
            req("share_fetch", 1, "FetchPartition"),
            req("share_acknowledge", 1, "ShareAcknowledgeRequest"),
            req("share_acknowledge", 1, "AcknowledgeTopic"),
            req("share_acknowledge", 1, "AcknowledgePartition"),
            req("share_acknowledge", 1, "AcknowledgementBatch"))


def described(port: int, group: str, what: str) -> Any:
    """``describe`` once the node answers with something else than a retriable error (a new
    leader loads the groups first; a follower may not know the new leader yet)."""
    def answer() -> Any:
        g = describe(port, group)
        return None if g.error_code in RETRIABLE else g
    return wait_for(answer, what=what)


def restart(cluster: Cluster, node: int, leader: int) -> None:
    """Restart a killed node: it rejoins as a follower of ``leader`` and catches up."""
    cluster.brokers[node].restart()
    caught_up(cluster, node, leader)


def caught_up(cluster: Cluster, node: int, leader: int) -> None:
    lead = cluster.brokers[leader]
    wait_for(lambda: raft_metric(lead, "kmqkafka_raft_peer_up", peer=str(node)) == 1
             and raft_metric(lead, "kmqkafka_raft_peer_lag_entries", peer=str(node)) == 0,
             what=f"node {node} catches up")
    assert raft_metric(cluster.brokers[node], "kmqkafka_raft_role", role="follower") == 1
    assert cluster.leader() == leader


def assignments(g: Any) -> dict[str, set[tuple[str, int]]]:
    return {m.member_id: {(tp.topic_name, q) for tp in m.assignment.topic_partitions
                          for q in tp.partitions} for m in g.members}


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_share_consumer_on_a_follower_gets_every_record_once(share_cluster: Cluster):
    cluster = share_cluster
    topic, group = "share-via-follower", "sg-via-follower"
    leader = cluster.leader()
    follower = cluster.follower()
    create_topic(cluster, follower, topic, len(PARTITIONS))
    read_from_earliest(cluster, follower, group)
    produced = produce(cluster.bootstrap(follower), topic, "a", 100)

    first = share_consumer(cluster.bootstrap(follower), group, topic)
    second = None
    try:
        counts: dict[Record, int] = {}
        got = consume([first], len(produced), counts=counts)
        assert len(got) == len(produced), "a record was delivered twice"
        assert dict(got) == produced and set(counts.values()) == {1}

        # Every node describes the same group: one member, given both partitions.
        for i in IDS:
            g = describe(cluster.kafka_ports[i], group)
            assert (g.error_code, g.group_state) == (E.none, "Stable"), (i, g)
            assert list(assignments(g).values()) == [{(topic, q) for q in PARTITIONS}], (i, g)

        # A second member shares the partitions: nothing left for it, nor for the first.
        second = share_consumer(cluster.bootstrap(follower), group, topic)

        def two_members() -> bool:
            poll_into(second, [], 0.2)  # the client joins while it polls
            g = describe(cluster.kafka_ports[leader], group)
            parts = assignments(g)
            return len(parts) == 2 and set().union(*parts.values()) == {
                (topic, q) for q in PARTITIONS}

        wait_for(two_members, what="two members share the partitions")
        again: list = []
        until = time.monotonic() + 3
        while time.monotonic() < until:
            poll_into(first, again, 0.3)
            poll_into(second, again, 0.3)
        assert again == [], "acknowledged records were delivered again"

        # New records go to one member or the other, each exactly once.
        more = produce(cluster.bootstrap(follower), topic, "b", 20)
        got = consume([first, second], len(more))
        assert len(got) == len(more) and dict(got) == more
    finally:
        first.close()
        if second is not None:
            second.close()

    for i in IDS:  # both left
        wait_for(lambda i=i: describe(cluster.kafka_ports[i], group).group_state == "Empty",
                 what=f"node {i} describes the group empty")


@pytest.mark.timeout(60)
def test_raw_share_calls_sent_to_a_follower_are_relayed_to_the_leader(share_cluster: Cluster):
    """A client with stale metadata sends everything to a follower: the member joins there,
    a ShareFetch parks on the leader (relayed) until records arrive, and the acknowledgement
    and the session close reach the leader too."""
    cluster = share_cluster
    topic, group, member = "share-raw", "sg-raw", "raw-member-0000000000"
    leader = cluster.leader()
    follower = cluster.follower()
    port = cluster.kafka_ports[follower]
    create_topic(cluster, follower, topic, 1)
    read_from_earliest(cluster, follower, group)
    topic_id = metadata(port, (topic,)).topics[0].topic_id

    Hb, Sf, Ft, Fp, Sa, At, Ap, Ab = share_requests()
    with RawClient(port, timeout=20) as raw:
        hb = raw.call(Hb(group_id=group, member_id=member, member_epoch=0, rack_id=None,
                         subscribed_topic_names=(topic,)))
        assert (hb.error_code, hb.member_epoch) == (E.none, 1), hb
        assert [(tp.topic_id, tuple(tp.partitions))
                for tp in hb.assignment.topic_partitions] == [(topic_id, (0,))], hb
        g = describe(cluster.kafka_ports[leader], group)
        assert [m.member_id for m in g.members] == [member], g

        # Nothing yet: the fetch parks on the leader until the records come.
        fetch = Sf(group_id=group, member_id=member, share_session_epoch=0, max_wait=ms(10_000),
                   min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
                   topics=(Ft(topic_id=topic_id, partitions=(
                       Fp(partition_index=0, acknowledgement_batches=()),)),),
                   forgotten_topics_data=())
        raw.send(fetch)
        time.sleep(0.5)
        t0 = time.monotonic()
        produced = produce(cluster.bootstrap(follower), topic, "r", 3, partitions=(0,))
        r = raw.receive(fetch)
        assert time.monotonic() - t0 < 8, "the parked fetch did not wake for the records"
        assert r.error_code == E.none, r
        (part,) = r.responses[0].partitions
        assert (part.error_code, part.current_leader.leader_id) == (E.none, leader), part
        assert [(a.first_offset, a.last_offset, a.delivery_count)
                for a in part.acquired_records] == [(0, 2, 1)], part
        data = bytes(part.records)
        assert {(0, rec.offset): rec.value for pos, _h in records.split_batches(data)
                for rec in records.iter_records(data, pos)} == produced

        ack = raw.call(Sa(group_id=group, member_id=member, share_session_epoch=1, topics=(
            At(topic_id=topic_id, partitions=(Ap(partition_index=0, acknowledgement_batches=(
                Ab(first_offset=0, last_offset=2, acknowledge_types=(1,)),)),)),)))
        assert ack.error_code == E.none and [
            p.error_code for t in ack.responses for p in t.partitions] == [E.none], ack
        close = raw.call(Sf(group_id=group, member_id=member, share_session_epoch=-1,
                            max_wait=ms(0), min_bytes=1, max_bytes=1 << 20, max_records=100,
                            batch_size=100, topics=(), forgotten_topics_data=()))
        assert close.error_code == E.none, close
        bye = raw.call(Hb(group_id=group, member_id=member, member_epoch=-1, rack_id=None,
                          subscribed_topic_names=None))
        assert (bye.error_code, bye.member_epoch) == (E.none, -1), bye
    g = describe(cluster.kafka_ports[leader], group)
    assert (g.group_state, g.members) == ("Empty", ()), g

    # Accepted on the leader: a share consumer of the group gets only what comes next.
    more = produce(cluster.bootstrap(follower), topic, "s", 2, partitions=(0,))
    c = share_consumer(cluster.bootstrap(follower), group, topic)
    try:
        got = consume([c], len(more))
    finally:
        c.close()
    assert dict(got) == more and len(got) == len(more)


@pytest.mark.timeout(120)
def test_acknowledged_records_stay_done_and_the_rest_come_back_after_a_leader_kill(
        share_cluster: Cluster):
    cluster = share_cluster
    topic, group = "share-failover", "sg-failover"
    old_leader = cluster.leader()
    follower = cluster.follower()  # survives the kill
    survivors = [i for i in IDS if i != old_leader]
    create_topic(cluster, follower, topic, len(PARTITIONS))
    read_from_earliest(cluster, follower, group)
    produced = produce(cluster.bootstrap(follower), topic, "a", 50)

    # Explicit acknowledgement: of the records of the first poll that brings any, accept
    # the even offsets below 30 and hold the others (a poll must not follow: explicit mode
    # refuses one while records of the last are not acknowledged).
    holder = share_consumer(cluster.bootstrap(follower), group, topic, mode="explicit")
    first: list[tuple[Record, bytes]] = []
    counts: dict[Record, int] = {}
    deadline = time.monotonic() + 30
    while not (msgs := poll_into(holder, first, 0.5, counts)):
        assert time.monotonic() < deadline, "nothing delivered"
    assert len(first) == len({r for r, _v in first}) and set(counts.values()) == {1}
    assert dict(first).items() <= produced.items()
    accepted = {r for r, _v in first if r[1] % 2 == 0 and r[1] < 30}
    held = {r for r, _v in first} - accepted
    assert accepted and held
    for m in msgs:
        if (m.partition(), m.offset()) in accepted:
            holder.acknowledge(m)
    result = holder.commit_sync(20)
    assert result and all(e is None for e in result.values()), result

    for i in IDS:  # the member, with both partitions, as every node describes it
        g = describe(cluster.kafka_ports[i], group)
        assert (g.error_code, g.group_state, len(g.members)) == (E.none, "Stable", 1), (i, g)

    # The leader dies holding the locks of the records not accepted.
    cluster.brokers[old_leader].kill()
    t0 = time.monotonic()
    new_leader = cluster.leader(not_=old_leader)
    holder.close()  # its leader is gone: nothing to release, nothing to leave
    for i in survivors:  # the new leader knows the group (from its share-partition state)
        g = described(cluster.kafka_ports[i], group, f"node {i} describes the group")
        assert (g.error_code, g.group_state, g.members) == (E.none, "Empty", ()), (i, g)
    later = produce(cluster.bootstrap(follower), topic, "b", 10)

    # A new member gets every record not accepted, the held ones at once (no lock to wait
    # for: the locks died with the old leader), and none of the accepted ones.
    left = {r: v for r, v in {**produced, **later}.items() if r not in accepted}
    taker = share_consumer(cluster.bootstrap(follower), group, topic)
    counts.clear()
    try:
        got = consume([taker], len(left), counts=counts)
    finally:
        taker.close()
    assert time.monotonic() - t0 < 25, "the held records waited for their locks"
    assert not {r for r, _v in got} & accepted, "an accepted record was delivered again"
    assert dict(got) == left and len(got) == len(left)
    # Delivered before the kill: a second delivery (Kafka's own leader may have lost the
    # first with the locks, it does not write an acquisition); never delivered: the first.
    assert {r: n for r, n in counts.items() if n != 1}.keys() <= held, counts
    assert all(counts[r] in (1, 2) for r in held), counts

    # The old leader rejoins as a follower, catches up and serves the group: a consumer
    # bootstrapped on it alone gets only what was produced since.
    restart(cluster, old_leader, new_leader)
    g = described(cluster.kafka_ports[old_leader], group, f"node {old_leader} describes it")
    assert (g.error_code, g.group_state) == (E.none, "Empty"), g
    last = produce(cluster.bootstrap(old_leader), topic, "c", 5)
    back = share_consumer(cluster.bootstrap(old_leader), group, topic)
    try:
        got = consume([back], len(last))
    finally:
        back.close()
    assert dict(got) == last and len(got) == len(last)


@pytest.mark.timeout(120)
def test_a_share_consumer_that_stays_through_a_leader_kill_rejoins_and_resumes(
        share_cluster: Cluster):
    """The same consumer, implicit acknowledgement, kept across the kill: it finds the new
    leader, is told its member is unknown there and joins again; the records of its last poll
    (their acknowledgement went nowhere) come again, the ones it accepted before never."""
    cluster = share_cluster
    topic, group = "share-stay", "sg-stay"
    old_leader = cluster.leader()
    follower = cluster.follower()  # survives the kill
    create_topic(cluster, follower, topic, len(PARTITIONS))
    read_from_earliest(cluster, follower, group)
    done = produce(cluster.bootstrap(follower), topic, "a", 20)

    stayer = share_consumer(cluster.bootstrap(follower), group, topic)
    try:
        got = consume([stayer], len(done), settle=0.5)  # ends with commit_sync: all accepted
        assert dict(got) == done and len(got) == len(done)
        pending = produce(cluster.bootstrap(follower), topic, "b", 10)
        last: list[tuple[Record, bytes]] = []
        deadline = time.monotonic() + 20
        while not poll_into(stayer, last, 0.5):  # one poll, not acknowledged yet
            assert time.monotonic() < deadline, "nothing delivered"
        assert dict(last).items() <= pending.items()

        cluster.brokers[old_leader].kill()
        new_leader = cluster.leader(not_=old_leader)
        later = produce(cluster.bootstrap(follower), topic, "c", 5)
        want = {**pending, **later}
        counts: dict[Record, int] = {}
        got = consume([stayer], len(want), counts=counts)
    finally:
        stayer.close()
    assert not {r for r, _v in got} & done.keys(), "an accepted record was delivered again"
    assert dict(got) == want and len(got) == len(want)
    assert set(counts.values()) <= {1, 2}, counts
    for i in (i for i in IDS if i != old_leader):
        g = described(cluster.kafka_ports[i], group, f"node {i} describes the group")
        assert (g.error_code, g.group_state) == (E.none, "Empty"), (i, g)

    restart(cluster, old_leader, new_leader)
    g = described(cluster.kafka_ports[old_leader], group, f"node {old_leader} describes it")
    assert (g.error_code, g.group_state) == (E.none, "Empty"), g


@pytest.mark.timeout(90)
def test_a_fetch_parked_on_a_stalled_leader_takes_nothing_once_another_leads(
        share_cluster: Cluster):
    """A leader paused (SIGSTOP) with a ShareFetch parked on it wakes as a follower, on the
    new leader's log: the fetch must not acquire those records (the new leader hands them to
    the group's members) but answer NOT_LEADER_OR_FOLLOWER, naming the new leader. It used to
    answer with the records acquired, delivered a second time by the new leader."""
    cluster = share_cluster
    topic, group, member = "share-stall", "sg-stall", "stalled-member-000000"
    old_leader = cluster.leader()
    follower = cluster.follower()
    create_topic(cluster, follower, topic, 1)
    read_from_earliest(cluster, follower, group)
    topic_id = metadata(cluster.kafka_ports[follower], (topic,)).topics[0].topic_id
    Hb, Sf, Ft, Fp, *_ = share_requests()
    paused = cluster.brokers[old_leader].proc
    with RawClient(cluster.kafka_ports[old_leader], timeout=30) as raw:
        hb = raw.call(Hb(group_id=group, member_id=member, member_epoch=0, rack_id=None,
                         subscribed_topic_names=(topic,)))
        assert hb.error_code == E.none, hb
        fetch = Sf(group_id=group, member_id=member, share_session_epoch=0,
                   max_wait=ms(20_000), min_bytes=1, max_bytes=1 << 20, max_records=100,
                   batch_size=100, topics=(Ft(topic_id=topic_id, partitions=(
                       Fp(partition_index=0, acknowledgement_batches=()),)),),
                   forgotten_topics_data=())
        raw.send(fetch)  # parks: nothing to acquire
        time.sleep(0.5)
        paused.send_signal(signal.SIGSTOP)
        try:
            others = {i: b for i, b in cluster.brokers.items() if i != old_leader}
            new_leader = wait_leader(others, not_=old_leader)
            produced = produce(cluster.bootstrap(follower), topic, "x", 2, partitions=(0,))
        finally:
            paused.send_signal(signal.SIGCONT)
        r = raw.receive(fetch)
    assert r.error_code == E.none, r
    (part,) = r.responses[0].partitions
    assert part.acquired_records == (), part
    assert part.error_code == E.not_leader_or_follower, part
    assert part.current_leader.leader_id in (new_leader, -1), part
    if part.current_leader.leader_id == new_leader:  # where the client finds it (Kafka's)
        assert [(e.node_id, e.port) for e in r.node_endpoints] == [
            (new_leader, cluster.kafka_ports[new_leader])], r

    c = share_consumer(cluster.bootstrap(follower), group, topic)
    counts: dict[Record, int] = {}
    try:
        got = consume([c], len(produced), counts=counts)
    finally:
        c.close()
    assert dict(got) == produced and len(got) == len(produced)
    assert set(counts.values()) == {1}, counts
    caught_up(cluster, old_leader, new_leader)
