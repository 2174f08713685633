"""Network partitions on a real 3-process cluster (issue 4), through ``tests/raft/proxy.py``.

The leader is cut from the other two while clients keep writing:

- writes sent straight to the old leader right after the cut (raw Produce, acks=-1: in its
  log, never on a quorum) are not acknowledged while the partition holds (at least three election
  timeouts), and after the heal they fail (their entries were replaced by the majority's):
  an error, never a base offset;
- the majority elects a new leader within a few election timeouts and keeps acknowledging
  acks=all writes (confluent-kafka bootstrapped on the majority);
- the old leader steps down (check-quorum): its DescribeCluster stops naming it controller and
  its Metadata stops naming it partition leader;
- after the heal the old leader follows the new one (pre-vote: it does not disrupt the
  majority), and every node serves exactly the acknowledged records at the same offsets:
  the minority's unacknowledged writes appear nowhere (the majority's log won).

Run twice: links cut by refusing connections (the dialer sees the drop), and links
blackholed (connections stay up, bytes vanish: the sender sees nothing wrong).
"""
from __future__ import annotations

import select
import time
from typing import Any

import pytest

from tests.raft.proxy import ProxiedCluster
from tests.rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

from kio.schema.errors import ErrorCode as E  # noqa: E402

from kmqkafka import records  # noqa: E402
from tests.raft.test_kafka_cluster import (  # noqa: E402
    _batch, ms, produce_confluent, req, wait_for,
)

TOPIC = "part"


def produce_request(values: list[bytes], topic: str = TOPIC) -> Any:
    Pr = req("produce", 9, "ProduceRequest")
    Td = req("produce", 9, "TopicProduceData")
    Pd = req("produce", 9, "PartitionProduceData")
    return Pr(transactional_id=None, acks=-1, timeout=ms(30000), topic_data=(
        Td(name=topic, partition_data=(Pd(index=0, records=_batch(values)),)),))


def read_node(port: int, topic: str = TOPIC, partition: int = 0
              ) -> tuple[int, list[tuple[int, bytes]]]:
    """Every record of one partition one node serves from its own store (raw Fetch v11, from
    offset 0 up to the high watermark it reports): (high watermark, [(offset, value)])."""
    Req = req("fetch", 11, "FetchRequest")
    T = req("fetch", 11, "FetchTopic")
    P = req("fetch", 11, "FetchPartition")
    out: list[tuple[int, bytes]] = []
    hw = -1
    deadline = time.monotonic() + 15
    with RawClient(port) as raw:
        while time.monotonic() < deadline:
            nxt = out[-1][0] + 1 if out else 0
            r = raw.call(Req(replica_id=-1, max_wait=ms(100), min_bytes=1, max_bytes=8 << 20,
                             isolation_level=0, session_id=0, session_epoch=-1,
                             topics=(T(topic=topic, partitions=(P(
                                 partition=partition, current_leader_epoch=-1,
                                 fetch_offset=nxt,
                                 log_start_offset=-1, partition_max_bytes=8 << 20),)),),
                             forgotten_topics_data=(), rack_id=""))
            part = r.responses[0].partitions[0]
            assert part.error_code == E.none, part
            hw = part.high_watermark
            data = bytes(part.records or b"")
            for pos, _header in (records.split_batches(data) if data else ()):
                for rec in records.iter_records(data, pos):
                    if rec.offset >= nxt:
                        out.append((rec.offset, rec.value))
            if (out[-1][0] + 1 if out else 0) >= hw:
                return hw, out
    raise AssertionError(f"node :{port} did not serve up to its high watermark {hw}")


def controller_seen_by(port: int) -> int:
    Dc = req("describe_cluster", 0, "DescribeClusterRequest")
    with RawClient(port, timeout=5) as raw:
        return raw.call(Dc(include_cluster_authorized_operations=False)).controller_id


def partition_leader_seen_by(port: int) -> tuple[int, int]:
    Req = req("metadata", 12, "MetadataRequest")
    T = req("metadata", 12, "MetadataRequestTopic")
    with RawClient(port, timeout=5) as raw:
        r = raw.call(Req(topics=(T(name=TOPIC, topic_id=None),), allow_auto_topic_creation=False,
                         include_topic_authorized_operations=False))
    part = r.topics[0].partitions[0]
    return part.error_code, part.leader_id


@pytest.mark.timeout(120)
@pytest.mark.parametrize("blackhole", [False, True], ids=["refuse", "blackhole"])
def test_a_partitioned_leader_acknowledges_nothing_and_the_majority_log_wins(tmp_path, blackhole):
    c = ProxiedCluster(tmp_path)
    try:
        leader = c.wait_leader()
        majority = [i for i in c.ids if i != leader]
        acked: list[bytes] = [b"before-%d" % i for i in range(100)]
        assert produce_confluent(c.bootstrap(), TOPIC, acked) == list(range(100))

        # --- partition: the leader alone on one side ------------------------------------
        c.isolate(leader, blackhole=blackhole)
        t_cut = time.monotonic()
        # Straight to the old leader while it still believes it leads: appended to its log,
        # never replicated. Two pipelined requests on one connection, answers read later.
        minority = [[b"minority-%d-%d" % (r, i) for i in range(3)] for r in range(2)]
        raw = RawClient(c.kafka_ports[leader], timeout=25)
        requests = [produce_request(vs) for vs in minority]
        for rq in requests:
            raw.send(rq)

        new = c.wait_leader(among=majority, not_=leader, timeout=15)
        elected_s = time.monotonic() - t_cut
        assert elected_s < 5 * c.election_timeout_s + 1, f"election took {elected_s:.1f}s"

        second = [b"majority-%d" % i for i in range(100)]
        assert produce_confluent(c.bootstrap(*majority), TOPIC, second) == list(range(100, 200))
        acked += second

        # The old leader steps down (check-quorum) and says so to Kafka clients.
        wait_for(lambda: c.last_state(leader) is not None and c.last_state(leader)[0] != "leader",
                 10, f"node {leader} leaves the leader role")
        # It no longer names itself partition leader (while it knows no leader it still
        # names itself controller: it would forward admin calls to whichever leader comes).
        wait_for(lambda: partition_leader_seen_by(c.kafka_ports[leader])[1] != leader, 10,
                 f"node {leader}'s Metadata stops naming itself partition leader")
        code, named = partition_leader_seen_by(c.kafka_ports[leader])
        assert named != leader, (code, named)
        assert controller_seen_by(c.kafka_ports[leader]) in (leader, new)
        for i in majority:
            assert controller_seen_by(c.kafka_ports[i]) == new
            assert partition_leader_seen_by(c.kafka_ports[i]) == (E.none, new)

        # Nothing answers the minority's writes while the partition holds (at least three
        # election timeouts after the cut): no acknowledgement, at most an error.
        answers: list[Any] = []
        quiet_until = t_cut + max(3.0, 3 * c.election_timeout_s)
        while len(answers) < len(requests):
            left = quiet_until - time.monotonic()
            if left <= 0 or not select.select([raw.sock], [], [], left)[0]:
                break
            answers.append(raw.receive(requests[len(answers)]))
        answered_while_cut = len(answers)
        assert all(p.blocked for (a, b), p in c.links.items() if leader in (a, b))

        # --- heal ---------------------------------------------------------------------------
        c.heal()
        assert c.wait_leader(timeout=20) == new  # the old leader rejoins as a follower
        # The old leader's uncommitted entries were replaced by the majority's: their
        # requests now fail (or failed already while cut, by timeout).
        raw.sock.settimeout(20)
        while len(answers) < len(requests):
            answers.append(raw.receive(requests[len(answers)]))
        raw.close()
        for r in answers:
            part = r.responses[0].partition_responses[0]
            assert part.error_code != E.none, f"minority write acknowledged: {part}"
            assert part.error_code in (E.request_timed_out, E.not_leader_or_follower), part
        print(f"election {elected_s:.2f}s; minority answers: {answered_while_cut} while cut, "
              f"codes {[r.responses[0].partition_responses[0].error_code for r in answers]}")
        third = [b"healed-%d" % i for i in range(50)]
        assert produce_confluent(c.bootstrap(), TOPIC, third) == list(range(200, 250))
        acked += third

        expect = list(enumerate(acked))
        for i in c.ids:
            hw, got = wait_for(lambda: (lambda r: r if r[0] == len(expect) else None)(
                read_node(c.kafka_ports[i])), 20, f"node {i} catches up to {len(expect)}")
            assert got == expect, f"node {i} differs"
        flat = {v for vs in minority for v in vs}
        assert not flat & {v for _o, v in expect}
        # Every node names the same leader again.
        for i in c.ids:
            wait_for(lambda: controller_seen_by(c.kafka_ports[i]) == new, 10,
                     f"node {i} names controller {new}")
    finally:
        c.close()


def topic_seen_by(port: int, name: str, auto_create: bool = False) -> tuple[int, int, Any]:
    """(error code, partition count, topic id) in one node's Metadata v12."""
    Req = req("metadata", 12, "MetadataRequest")
    T = req("metadata", 12, "MetadataRequestTopic")
    with RawClient(port, timeout=10) as raw:
        r = raw.call(Req(topics=(T(name=name, topic_id=None),),
                         allow_auto_topic_creation=auto_create,
                         include_topic_authorized_operations=False))
    t = r.topics[0]
    return t.error_code, len(t.partitions), t.topic_id


@pytest.mark.timeout(60)
def test_auto_create_on_a_lagging_follower_does_not_replace_a_created_topic(tmp_path):
    c = ProxiedCluster(tmp_path)
    try:
        leader = c.wait_leader()
        lagging = next(i for i in c.ids if i != leader)
        c.links[leader, lagging].delay(0.5)  # the leader's appends reach it half a second late
        Ct = req("create_topics", 5, "CreateTopicsRequest")
        Ctt = req("create_topics", 5, "CreatableTopic")
        with RawClient(c.kafka_ports[leader]) as raw:
            r = raw.call(Ct(topics=(Ctt(name="two", num_partitions=2, replication_factor=3,
                                        assignments=(), configs=()),),
                            timeout=ms(10000), validate_only=False))
        assert r.topics[0].error_code == E.none and r.topics[0].num_partitions == 2
        created = topic_seen_by(c.kafka_ports[leader], "two")
        assert created[:2] == (E.none, 2)
        # A producer's Metadata (auto-create allowed) reaching the lagging follower.
        topic_seen_by(c.kafka_ports[lagging], "two", auto_create=True)
        c.heal()
        time.sleep(1.0)
        for i in c.ids:
            assert topic_seen_by(c.kafka_ports[i], "two") == created, f"node {i}"
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_auto_create_that_cannot_reach_a_leader_is_leader_not_available(tmp_path):
    """Kafka answers a topic it is still creating with LEADER_NOT_AVAILABLE (retriable):
    an isolated node's auto-create cannot commit, and its Metadata says so per topic rather
    than as a request timeout or a not-leader error for the topic."""
    c = ProxiedCluster(tmp_path)
    try:
        leader = c.wait_leader()
        alone = next(i for i in c.ids if i != leader)
        c.isolate(alone)
        started = time.monotonic()
        code, count, _ = topic_seen_by(c.kafka_ports[alone], "never.made", auto_create=True)
        assert code == E.leader_not_available, E(code)
        assert count == 0
        assert time.monotonic() - started < 60
        # The majority never saw it, and after the heal the topic can still be made.
        assert topic_seen_by(c.kafka_ports[leader], "never.made")[0] == E.unknown_topic_or_partition
        c.heal()
        wait_for(lambda: topic_seen_by(c.kafka_ports[alone], "never.made",
                                       auto_create=True)[0] == E.none, timeout=30)
    finally:
        c.close()
