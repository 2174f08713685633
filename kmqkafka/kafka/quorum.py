"""DescribeQuorum (key 55): the Raft quorum, as KRaft reports its metadata quorum.

Tools such as ``kafka-metadata-quorum`` and kafka-python's ``describe_metadata_quorum`` ask for
partition 0 of ``__cluster_metadata``. Here that names the Raft log every command goes through:
leader and epoch (the Raft term), high watermark (the commit index), and each voter's log end as
the leader knows it (its own last index, the others' replicated match), and, as KRaft's leader
reports them, each voter's last fetch and last caught-up times in ms: the leader's own are the
time of the answer, a follower's when it last answered the leader in this term and when it last
answered holding the leader's whole log (-1 until then). Only the leader knows
the others' progress, so a follower relays the request there (``leader_routed``); a node that
knows no leader answers NOT_LEADER_OR_FOLLOWER for the partition, as a KRaft voter does. A lone
node without peers is its own one-voter quorum at epoch 0 with an empty log, fetched and
caught up at the time of the answer. ``nodes`` (v2)
gives each voter's Raft address as its ``CONTROLLER`` listener. With ACLs on it needs DESCRIBE on
the cluster (else a bare CLUSTER_AUTHORIZATION_FAILED), as in Kafka.
"""
from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.groups import leader_routed
from kmqkafka.kafka.wire import make, types_of

API_KEY = 55
MIN_VERSION = 0
MAX_VERSION = 2
METADATA_TOPIC = "__cluster_metadata"
_ZERO_UUID = uuid.UUID(int=0)


def _driver(ctx: RequestContext) -> Any:
    proposer = getattr(ctx.broker.store, "proposer", None)
    return getattr(proposer, "driver", None) if identity.clustered(ctx.broker) else None


def handle(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.DESCRIBE, authz.CLUSTER, authz.CLUSTER_NAME):
        return make(ctx.response_type, error_code=ErrorCode.cluster_authorization_failed,
                    error_message=None, topics=(), nodes=())
    driver = _driver(ctx)
    me = identity.node_id(ctx.broker)
    topics = []
    for td in request.topics:
        parts = []
        for pd in td.partitions:
            if td.topic_name != METADATA_TOPIC or pd.partition_index != 0:
                parts.append(_partition(t, pd.partition_index,
                                        ErrorCode.unknown_topic_or_partition))
            elif driver is None:
                now = ctx.broker.reactor.seconds()
                parts.append(_partition(t, 0, ErrorCode.none, leader=me, epoch=0, hw=0,
                                        voters=[_replica(t, me, 0, (now, now))]))
            elif not driver.is_leader():
                parts.append(_partition(t, 0, ErrorCode.not_leader_or_follower))
            else:
                node = driver.node
                ends = {**node.match_indexes(), node.id: node.last_index}
                now = driver.now()
                voters = [_replica(t, v, ends.get(v, 0),
                                   (now, now) if v == node.id else driver.replica_times(v))
                          for v in sorted(node.voters)]
                parts.append(_partition(t, 0, ErrorCode.none, leader=node.id, epoch=node.term,
                                        hw=node.commit_index, voters=voters))
        topics.append(make(t.TopicData, topic_name=td.topic_name, partitions=tuple(parts)))
    return make(ctx.response_type, error_code=ErrorCode.none, error_message=None,
                 topics=tuple(topics), nodes=_nodes(t, ctx) if hasattr(t, "Node") else ())


def _partition(t: Any, index: int, error: ErrorCode, *, leader: int = -1, epoch: int = -1,
               hw: int = -1, voters: list[Any] | None = None) -> Any:
    return make(t.PartitionData, partition_index=index, error_code=error, error_message=None,
                leader_id=leader, leader_epoch=epoch, high_watermark=hw,
                current_voters=tuple(voters or ()), observers=())


def _replica(t: Any, node: int, log_end: int,
             times: tuple[float | None, float | None] = (None, None)) -> Any:
    """``times``: (last fetch, last caught up) in seconds, None when not known."""
    fetched, caught_up = (-1 if s is None else int(s * 1000) for s in times)
    return make(t.ReplicaState, replica_id=node, replica_directory_id=_ZERO_UUID,
                log_end_offset=log_end, last_fetch_timestamp=fetched,
                last_caught_up_timestamp=caught_up)


def _nodes(t: Any, ctx: RequestContext) -> tuple[Any, ...]:
    members = identity.members(ctx.broker)
    if not members:
        return ()
    return tuple(
        make(t.Node, node_id=m.node_id, listeners=(
            make(t.Listener, name="CONTROLLER", host=m.raft_host, port=m.raft_port),))
        for m in members)


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(API_KEY, leader_routed(handle), MIN_VERSION, MAX_VERSION)
