"""Which Raft members Kafka lists as brokers: the transport's view of live peers (a frame heard
within the window, or the outgoing link up and the peer heard within FROZEN_S: every node
pings every peer) and ``identity``'s rule on top of it (this node and the known leader always,
the rest only when live; replicas stay all members)."""
from __future__ import annotations

import random
from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from kmqkafka.config import Settings
from kmqkafka.kafka import identity
from kmqkafka.kafka.context import Broker
from kmqkafka.metrics import Metrics
from kmqkafka.raft.messages import HeartbeatResp, encode
from kmqkafka.raft.proposer import Member
from kmqkafka.raft.transport import (
    FORWARD_OK, FROZEN_S, RAFT, STARTING, RaftTransport, _HEAD,
)

PEERS = {1: ("127.0.0.1", 1001), 2: ("127.0.0.1", 1002), 3: ("127.0.0.1", 1003)}


def started_transport() -> tuple[RaftTransport, MemoryReactorClock]:
    reactor = MemoryReactorClock()
    t = RaftTransport(1, PEERS[1], PEERS, reactor, random.Random(0), run_io=None)
    t.start(SimpleNamespace(receive=lambda m: None))
    return t, reactor


def dial(reactor: MemoryReactorClock, port: int) -> object:
    """Complete the transport's pending outgoing connection to ``port``; the link."""
    factory = next(f for _h, p, f, *_ in reactor.tcpClients if p == port)
    link = factory.buildProtocol(None)
    link.makeConnection(StringTransport())
    return link


def test_a_peer_is_live_while_the_outgoing_link_to_it_is_up():
    t, reactor = started_transport()
    assert t.live_peers(1.0) == set()
    link = dial(reactor, 1002)
    assert t.live_peers(1.0) == {2}
    link.connectionLost(Failure(ConnectionLost()))  # kill -9: the kernel closes the socket
    assert t.live_peers(1.0) == set()


def test_a_peer_heard_on_its_own_link_is_live_for_the_window():
    """Raft messages arrive on the sender's own link (our incoming one): hearing a peer
    there keeps it live even while our dial to it is down, until it has been quiet for the
    window."""
    t, reactor = started_transport()
    server_factory = reactor.tcpServers[0][1]
    incoming = server_factory.buildProtocol(None)
    incoming.makeConnection(StringTransport())
    payload = encode(HeartbeatResp(frm=3, to=1, term=1))
    incoming.dataReceived(_HEAD.pack(len(payload) + 1, RAFT) + payload)
    assert t.live_peers(1.0) == {3}
    reactor.advance(0.9)
    assert t.live_peers(1.0) == {3}
    reactor.advance(0.2)
    assert t.live_peers(1.0) == set()  # quiet for longer than the window


def test_a_node_pings_every_peer_it_has_a_link_to():
    t, reactor = started_transport()
    to_2 = dial(reactor, 1002)
    reactor.advance(0.25)
    # A FORWARD_OK for request id 0 (none has it), naming the sender: older nodes ignore it.
    assert to_2.transport.value() == _HEAD.pack(25, FORWARD_OK) + b"".join(
        n.to_bytes(8, "big") for n in (0, 1, 0))


def ping(sender: int, term: int = 0) -> bytes:
    return _HEAD.pack(25, FORWARD_OK) + b"".join(n.to_bytes(8, "big") for n in (0, sender, term))


def test_a_node_not_serving_clients_says_so_in_its_pings():
    """The daemon starts its transport not serving and sets it once its listeners are open;
    the change goes out at once, not a ping interval later."""
    reactor = MemoryReactorClock()
    t = RaftTransport(1, PEERS[1], PEERS, reactor, random.Random(0), run_io=None, serving=False)
    t.start(SimpleNamespace(receive=lambda m: None))
    to_2 = dial(reactor, 1002)
    reactor.advance(0.25)
    assert to_2.transport.value() == ping(1, STARTING)
    to_2.transport.clear()
    t.serving = True
    assert to_2.transport.value() == ping(1)


def test_a_restarted_peer_is_live_but_not_serving_until_its_ping_says_so():
    """Kafka lists a restarted broker only once it has caught up. A peer is met, its process
    dies (the link goes) and a new one speaks on a new link within FROZEN_S: live for Raft,
    left out of ``serving_peers`` until a PING of its own says it serves clients."""
    t, reactor = started_transport()
    old = reactor.tcpServers[0][1].buildProtocol(None)
    old.makeConnection(StringTransport())
    old.dataReceived(ping(2))
    assert t.serving_peers(1.0) == {2}
    old.connectionLost(Failure(ConnectionLost()))
    reactor.advance(1.0)
    new = reactor.tcpServers[0][1].buildProtocol(None)
    new.makeConnection(StringTransport())
    payload = encode(HeartbeatResp(frm=2, to=1, term=1))
    new.dataReceived(_HEAD.pack(len(payload) + 1, RAFT) + payload)
    assert t.live_peers(1.0) == {2} and t.serving_peers(1.0) == set()
    new.dataReceived(ping(2, STARTING))  # catching up, listeners not open yet
    assert t.serving_peers(1.0) == set()
    new.dataReceived(ping(2))
    assert t.serving_peers(1.0) == {2}
    new.dataReceived(ping(2, STARTING))  # stopping: dropped before it goes
    assert t.live_peers(1.0) == {2} and t.serving_peers(1.0) == set()


def test_a_hung_peer_whose_link_stays_up_drops_out_after_frozen_s():
    """A SIGSTOPped process keeps its TCP connections open: only its silence shows it."""
    t, reactor = started_transport()
    dial(reactor, 1002)
    incoming = reactor.tcpServers[0][1].buildProtocol(None)
    incoming.makeConnection(StringTransport())
    ping_from_2 = _HEAD.pack(25, FORWARD_OK) + b"".join(n.to_bytes(8, "big") for n in (0, 2, 0))
    for _ in range(20):  # pinging: live all along
        reactor.advance(0.25)
        incoming.dataReceived(ping_from_2)
        assert t.live_peers(0.0) == {2}
    reactor.advance(FROZEN_S - 0.1)  # frozen: its link stays up, nothing arrives
    assert t.live_peers(0.0) == {2}
    reactor.advance(0.2)
    assert t.live_peers(0.0) == set() and t.live_peers(1.0) == set()
    incoming.dataReceived(ping_from_2)  # thawed
    assert t.live_peers(0.0) == {2}


def test_an_unknown_frame_kind_is_ignored_not_a_reason_to_drop_the_link():
    t, reactor = started_transport()
    incoming = reactor.tcpServers[0][1].buildProtocol(None)
    incoming.makeConnection(StringTransport())
    incoming.dataReceived(_HEAD.pack(4, 99) + b"new")
    assert not incoming.transport.disconnecting


class _Store:
    def __init__(self, leader: int | None, linked: set[int] | None) -> None:
        ms = {i: Member(i, "127.0.0.1", 1000 + i, "127.0.0.1", 9000 + i) for i in (1, 2, 3)}
        transport = (None if linked is None
                     else SimpleNamespace(live_peers=lambda s: set(linked)))
        self.proposer = SimpleNamespace(member_list=lambda: [ms[i] for i in sorted(ms)],
                                        transport=transport)
        self.leader = leader

    def leader_id(self) -> int | None:
        return self.leader


def make_broker(leader: int | None, linked: set[int] | None) -> Broker:
    broker = Broker(settings=Settings(node_id=1), reactor=MemoryReactorClock(),
                    metrics=Metrics(CollectorRegistry()), store=_Store(leader, linked))
    return broker


def listed(broker: Broker) -> list[int]:
    return [node for node, _h, _p in identity.brokers(broker, "PLAINTEXT")]


def test_only_this_node_the_leader_and_linked_peers_are_listed():
    assert listed(make_broker(leader=None, linked=set())) == [1]
    assert listed(make_broker(leader=3, linked=set())) == [1, 3]  # leader even when unlinked
    assert listed(make_broker(leader=1, linked={2})) == [1, 2]
    assert listed(make_broker(leader=2, linked={2, 3})) == [1, 2, 3]


def test_replicas_stay_every_member_and_the_unlisted_are_offline():
    broker = make_broker(leader=1, linked={3})
    assert identity.replicas(broker, identity.brokers(broker, "PLAINTEXT")) == (
        (1, 2, 3), (1, 3), (2,))
    assert identity.endpoint(broker, 2, "PLAINTEXT") == ("127.0.0.1", 9002)  # still reachable


def test_without_a_transport_every_member_is_listed_and_the_cluster_id_ignores_liveness():
    assert listed(make_broker(leader=None, linked=None)) == [1, 2, 3]
    assert (identity.cluster_id(make_broker(leader=1, linked=set()))
            == identity.cluster_id(make_broker(leader=1, linked={2, 3})))


def test_controller_is_the_leader_or_this_node_while_none_is_known():
    assert identity.controller(make_broker(leader=3, linked={2, 3})) == 3
    assert identity.controller(make_broker(leader=None, linked=set())) == 1
