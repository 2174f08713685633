"""Who this broker is: node id, cluster id, and the endpoint each listener advertises."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any, Callable

from kmqkafka.kafka.context import Broker
from kmqkafka.store.fsutil import write_atomic

_CLUSTER_ID_FILE = "cluster_id"


def cluster_id(broker: Broker) -> str:
    """A stable cluster id (Kafka's 22-char base64 UUID), created once in the data dir.

    In a cluster every node must report the same id (clients refuse to mix clusters): it is
    derived from the member ids and their Kafka endpoints, which every node lists alike (Raft
    addresses may differ per node, e.g. behind proxies or NAT)."""
    cached = broker.extras.get("cluster_id")
    if cached:
        return cached
    ms = members(broker)
    if len(ms) > 1:
        text = ",".join(f"{m.node_id}={m.kafka_host}:{m.kafka_port}"
                        for m in sorted(ms, key=lambda m: m.node_id))
        derived = uuid.uuid5(uuid.NAMESPACE_URL, "kmqkafka-cluster:" + text)
        value = base64.urlsafe_b64encode(derived.bytes).decode().rstrip("=")
        broker.extras["cluster_id"] = value
        return value
    path = Path(broker.settings.data_dir) / _CLUSTER_ID_FILE
    if path.exists():
        value = path.read_text().strip()
    else:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, value.encode())
    broker.extras["cluster_id"] = value
    return value


def node_id(broker: Broker) -> int:
    return broker.settings.node_id


def advertised(broker: Broker, listener: str) -> tuple[str, int]:
    """(host, port) clients should use on ``listener`` ("PLAINTEXT" or "SSL")."""
    s = broker.settings
    if listener == "SSL":
        return s.kafka_advertised_host, s.kafka_tls_port
    return s.kafka_advertised_host, s.kafka_advertised_port or s.kafka_port


# --- the cluster as Kafka sees it -------------------------------------------------------


def _proposer(broker: Broker) -> object | None:
    store = broker.store
    return getattr(store, "proposer", None) if store is not None else None


def members(broker: Broker) -> list:
    """The Raft members (``kmqkafka.raft.proposer.Member``), by node id; [] on a lone node."""
    get = getattr(_proposer(broker), "member_list", None)
    return list(get()) if get is not None else []


def clustered(broker: Broker) -> bool:
    """Whether this node is one of several Raft members."""
    return len(members(broker)) > 1


def live_members(broker: Broker) -> list:
    """The members to list as brokers, by node id: this node, the Raft leader (clients must
    reach the partition leader and coordinator), and every peer the Raft transport has a
    working link to that serves clients (``RaftTransport.serving_peers`` within one election
    timeout: not a restarted node still catching up before its listeners open). Apache Kafka
    lists only live, unfenced brokers, and clients such as kafka-python fail rather than
    retry when they pick a dead one. Without a transport (a lone node, tests) every member is
    listed."""
    ms = members(broker)
    transport = getattr(_proposer(broker), "transport", None)
    if len(ms) <= 1 or transport is None:
        return ms
    s = broker.settings
    serving = getattr(transport, "serving_peers", transport.live_peers)
    live = serving(s.raft_tick_ms * s.raft_election_ticks / 1000)
    live.add(node_id(broker))
    lead = leader(broker)
    if lead is not None:
        live.add(lead)
    return [m for m in ms if m.node_id in live]


def _endpoint(broker: Broker, m: Any, listener: str) -> tuple[int, str, int]:
    """``(node_id, host, port)`` of member ``m``: this node's own advertised endpoint, the
    others' from ``--peers`` (on SSL the TLS port their entry names, else this node's)."""
    if m.node_id == node_id(broker):
        return (m.node_id, *advertised(broker, listener))
    if listener == "SSL":
        return m.node_id, m.kafka_host, m.kafka_tls_port or broker.settings.kafka_tls_port
    return m.node_id, m.kafka_host, m.kafka_port


def brokers(broker: Broker, listener: str) -> list[tuple[int, str, int]]:
    """``(node_id, host, port)`` of every live node (``live_members``) for ``listener``."""
    out = [_endpoint(broker, m, listener) for m in live_members(broker)]
    return out or [(node_id(broker), *advertised(broker, listener))]


def replica_ids(broker: Broker) -> tuple[int, ...]:
    """The replicas of every partition: each Raft member (this node alone without peers)."""
    return tuple(m.node_id for m in members(broker)) or (node_id(broker),)


def replicas(broker: Broker, listed: list[tuple[int, str, int]],
             ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(replicas, isr, offline)`` of every partition, given the ``brokers`` listed in the
    same response: every member is a replica (Kafka keeps offline replicas in the list), the
    listed ones are in sync, the rest are offline.

    The leader comes first. Kafka's preferred replica is the first one, and a balanced Kafka
    cluster has it lead (its controller moves leadership back to it); leadership here cannot
    move to another member, so the one that leads is listed as preferred, and ElectLeaders'
    ELECTION_NOT_NEEDED holds. By id order, a new leader looked unbalanced for good."""
    everyone = replica_ids(broker)
    lead = leader(broker)
    if lead in everyone:
        everyone = (lead, *(i for i in everyone if i != lead))
    live = {node for node, _host, _port in listed}
    return (everyone, tuple(i for i in everyone if i in live),
            tuple(i for i in everyone if i not in live))


def endpoint(broker: Broker, node: int, listener: str) -> tuple[str, int] | None:
    """Where clients reach ``node``, live or not (a follower may name the new leader as
    coordinator before its own link to it is up)."""
    for m in members(broker):
        if m.node_id == node:
            return _endpoint(broker, m, listener)[1:]
    return advertised(broker, listener) if node == node_id(broker) else None


def leader(broker: Broker) -> int | None:
    """The node that leads every partition and coordinates every group: the Raft leader
    (this node on a lone broker); None while no leader is known."""
    if not clustered(broker):
        return node_id(broker)
    store = broker.store
    return store.leader_id() if store is not None else None


def controller(broker: Broker) -> int:
    """The controller id clients are given: the Raft leader while this node's own link to it
    is up; otherwise (an election, or a leader just killed that is still the known leader
    for an election timeout) this node, which forwards admin commands to whichever leader
    comes (as KRaft brokers do, any broker may be named). librdkafka waits for the named
    controller until its request times out and does not ask again: naming a dead leader
    stalled every admin call for the whole timeout (20 s), and -1 stops it asking too."""
    lead = leader(broker)
    me = node_id(broker)
    if lead is None or lead == me:
        return me
    transport = getattr(_proposer(broker), "transport", None)
    if transport is not None and lead not in transport.live_peers(0.0):
        return me
    return lead


def is_leader(broker: Broker) -> bool:
    if not clustered(broker):
        return True
    return bool(broker.store.is_leader())


def term(broker: Broker) -> int:
    """The current Raft term (0 when unknown or on a lone broker)."""
    driver = getattr(_proposer(broker), "driver", None)
    node = getattr(driver, "node", None)
    return int(getattr(node, "term", 0) or 0) if clustered(broker) else 0


def leader_epoch(broker: Broker) -> int:
    """The leader epoch of every partition: the Raft term. Kafka bumps a partition's epoch at
    every leader change and clients order what they hear by it (librdkafka ignores metadata
    with an older epoch, a fetch with an older one is FENCED_LEADER_EPOCH); each Raft election
    starts a new term, agreed by every node that knows the leader. 0 on a lone broker. Stored
    batches keep epoch 0 (``store/log.py``): no committed record is ever truncated, so the
    records of every term form one epoch-0 range (``positions.epoch_end``)."""
    return term(broker)


SETTLE_S = 1.0
"""Longest a follower holds a metadata read for its own apply to catch up."""


def settled_first(handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Run a metadata read (Metadata, DescribeConfigs, DescribeTopicPartitions) once this
    node has applied all it knows to be committed: admin clients create a topic through the
    controller and at once describe it through any node, which must not call it unknown."""

    def run(request: Any, ctx: Any) -> Any:
        if not clustered(ctx.broker):
            return handler(request, ctx)
        d = ctx.broker.store.settled(SETTLE_S)
        if d.called:
            return handler(request, ctx)
        return d.addCallback(lambda _: handler(request, ctx))

    run.__name__ = getattr(handler, "__name__", "settled")
    return run
