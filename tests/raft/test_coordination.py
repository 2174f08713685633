"""``kmqkafka.kafka.groups.Coordination`` without processes: the Raft leader serves groups only
after its barrier write, and a node that stops leading drops coordinator state (parked calls
get NOT_COORDINATOR). Plus the forwarded client-id wrapping."""
from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v9.request import JoinGroupRequest
from kio.static.primitive import i32, i32Timedelta
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kmqkafka.config import Settings
from kmqkafka.coordinators.group import JoinRequest
from kmqkafka.coordinators.offsets import CommittedOffset
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import groups, identity
from kmqkafka.kafka.context import Broker, RequestContext
from kmqkafka.metrics import Metrics
from kmqkafka.net.forward import unwrap, wrap
from kmqkafka.raft.proposer import Member


class FakeStore:
    started = True

    def __init__(self) -> None:
        members = {i: Member(i, "127.0.0.1", 1000 + i, "127.0.0.1", 9000 + i) for i in (1, 2, 3)}
        self.proposer = SimpleNamespace(member_list=lambda: [members[i] for i in sorted(members)],
                                        driver=SimpleNamespace(node=SimpleNamespace(term=1)))
        self.leader: int | None = None
        self.barriers: list[Deferred] = []
        self.data: dict[str, dict[bytes, bytes]] = {"groups": {}, "offsets": {}}

    def is_leader(self) -> bool:
        return self.leader == 1

    def leader_id(self) -> int | None:
        return self.leader

    def keyed_items(self, family: str, prefix: bytes = b""):
        return [(k, v) for k, v in sorted(self.data[family].items()) if k.startswith(prefix)]

    def keyed_put(self, family: str, pairs) -> Deferred:
        pairs = list(pairs)
        for k, v in pairs:
            if v is None:
                self.data[family].pop(k, None)
            else:
                self.data[family][k] = v
        d: Deferred = Deferred()
        if not pairs:
            self.barriers.append(d)
        else:
            d.callback(len(pairs))
        return d


def make_broker() -> tuple[Broker, FakeStore, Clock]:
    clock, store = Clock(), FakeStore()
    broker = Broker(settings=Settings(), reactor=clock, metrics=Metrics(CollectorRegistry()),
                    store=store)
    groups.install(broker)
    return broker, store, clock


def join_request(member_id: str = "") -> JoinRequest:
    return JoinRequest(group_id="g", member_id=member_id, group_instance_id=None,
                       protocol_type="consumer", protocols=(("range", b"m"),),
                       session_timeout_ms=10000, rebalance_timeout_ms=10000, client_id="c",
                       client_host="/h", require_known_member_id=False,
                       supports_skip_assignment=False)


def test_leader_serves_only_after_its_barrier_and_a_deposed_leader_releases_parked_calls():
    broker, store, clock = make_broker()
    coordination = broker.extras["coordination"]
    assert identity.clustered(broker) and identity.leader(broker) is None
    assert not coordination.serving()

    store.leader = 1
    clock.advance(0.1)
    assert len(store.barriers) == 1 and not coordination.serving()  # loading
    store.barriers[0].callback(0)
    assert coordination.serving() and broker.extras["groups"].loaded

    c = broker.extras["groups"]
    first = c.join(join_request())
    result = []
    first.addCallback(result.append)
    clock.advance(Settings().kafka_group_initial_rebalance_delay_ms / 1000)  # a new group waits
    joined = result[0]
    assert joined.error is ErrorCode.none
    # A second member parks until the first rejoins.
    parked = []
    c.join(join_request()).addCallback(parked.append)
    assert not parked

    c.commit_offsets("other", [("t", 0, CommittedOffset(offset=7, leader_epoch=-1,
                                                        metadata="", commit_ms=0))])
    store.leader = 2
    clock.advance(0.1)
    assert not coordination.serving() and not broker.extras["groups"].loaded
    assert parked and parked[0].error is ErrorCode.not_coordinator

    # Leading again (new term): reload from the store once the new barrier passes.
    store.proposer.driver.node.term = 3
    store.leader = 1
    clock.advance(0.1)
    assert not coordination.serving()
    store.barriers[-1].callback(0)
    assert coordination.serving()
    assert broker.extras["groups"].fetch_offsets("other")[("t", 0)].offset == 7


def test_a_loading_leader_answers_heartbeat_none_and_join_load_in_progress():
    """Kafka's coordinators answer a Heartbeat "blindly" with NONE while the group loads
    (aiokafka's consumer dies of COORDINATOR_LOAD_IN_PROGRESS there); JoinGroup and the
    others get COORDINATOR_LOAD_IN_PROGRESS and are retried."""
    broker, store, clock = make_broker()
    dispatcher = Dispatcher()
    groups.register(dispatcher)
    store.leader = 1
    clock.advance(0.1)
    assert not broker.extras["coordination"].serving()  # its barrier has not passed

    def call(api_key: int, version: int, request: object) -> object:
        ctx = RequestContext(api_key=api_key, api_version=version, correlation_id=1,
                             client_id="c", response_type=dispatcher.response_type(api_key, version),
                             broker=broker)
        return dispatcher.lookup(api_key).handler(request, ctx)

    beat = call(groups.HEARTBEAT, 4, HeartbeatRequest(
        group_id="g", generation_id=i32(1), member_id="m", group_instance_id=None))
    assert beat.error_code is ErrorCode.none
    join = call(groups.JOIN_GROUP, 9, JoinGroupRequest(
        group_id="g", session_timeout=i32Timedelta.parse(timedelta(seconds=10)),
        rebalance_timeout=i32Timedelta.parse(timedelta(seconds=10)), member_id="",
        group_instance_id=None, protocol_type="consumer", protocols=(), reason=None))
    assert join.error_code is ErrorCode.coordinator_load_in_progress


def test_find_coordinator_and_metadata_name_the_raft_leader():
    broker, store, _clock = make_broker()
    assert identity.brokers(broker, "PLAINTEXT")[1] == (2, "127.0.0.1", 9002)
    store.leader = 3
    assert identity.leader(broker) == 3
    assert identity.endpoint(broker, 3, "PLAINTEXT") == ("127.0.0.1", 9003)
    assert len(identity.cluster_id(broker)) == 22


def test_forwarded_client_id_round_trips():
    assert unwrap(wrap("10.0.0.1:5555", "User:alice", "app")) == (
        "10.0.0.1:5555", "User:alice", "app")
    assert unwrap(wrap("h:1", "User:ANONYMOUS", None)) == ("h:1", "User:ANONYMOUS", None)
    odd = "User:CN=a|b,O=x%y"  # a certificate's name may hold the separator
    assert unwrap(wrap("h:1", odd, "c|d")) == ("h:1", odd, "c|d")
    assert unwrap("app") is None and unwrap(None) is None
