"""Cluster views: DescribeCluster (60), DescribeTopicPartitions (75), DescribeLogDirs (35).

Every live Raft member is a broker (``identity.brokers``), every member a replica of every
partition (the live ones in sync, the others offline); the Raft leader is the controller and
the leader of every partition (a lone node is all of these; no known leader: this node is named
controller and forwards, partitions LEADER_NOT_AVAILABLE).

ACLs (as Kafka): DescribeCluster checks nothing but reports the principal's operations on the
cluster (0 without DESCRIBE on it) when asked; DescribeTopicPartitions lists only the topics the
principal may DESCRIBE, and a named one it may not answers TOPIC_AUTHORIZATION_FAILED, listed
after the others; DescribeLogDirs needs DESCRIBE on the cluster (else CLUSTER_AUTHORIZATION_FAILED
and no results; before v3, which has no error code, just no results).
"""

from __future__ import annotations

import shutil
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.acl import NOT_REQUESTED, authorized_operations
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.topics import INTERNAL_TOPICS, Topic, TopicCatalog
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.names import channel_for

DESCRIBE_LOG_DIRS, DESCRIBE_CLUSTER, DESCRIBE_TOPIC_PARTITIONS = 35, 60, 75
_ZERO_UUID = uuid.UUID(int=0)
ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2
MAX_PARTITION_LIMIT = 2000
"""Kafka's ``max.request.partition.size.limit`` default: a response never holds more."""


def _catalog(ctx: RequestContext) -> TopicCatalog:
    return ctx.broker.extras["topics"]


# --- DescribeCluster --------------------------------------------------------------------


def _cluster_brokers(ctx: RequestContext, include_fenced: bool,
                     ) -> list[tuple[int, str, int, bool]]:
    """``(node, host, port, fenced)`` by node id: every live node (``identity.brokers``),
    and with ``include_fenced`` (v2, KIP-1073) the other members too, fenced. A KRaft broker
    that is down or still catching up stays registered, fenced, and Kafka lists it when
    asked (operators find the node to unregister that way; kafka-python always asks)."""
    live = identity.brokers(ctx.broker, ctx.listener)
    out = [(node, host, port, False) for node, host, port in live]
    if include_fenced:
        listed = {node for node, _host, _port in live}
        for m in identity.members(ctx.broker):
            where = identity.endpoint(ctx.broker, m.node_id, ctx.listener)
            if m.node_id not in listed and where is not None:
                out.append((m.node_id, *where, True))
    return sorted(out)


def describe_cluster(request: Any, ctx: RequestContext) -> Any:
    """Every live node as a broker (v2 asking for fenced ones: every member, the others
    fenced), the Raft leader as controller (``identity.controller``)."""
    t = types_of(ctx)
    endpoint_type = getattr(request, "endpoint_type", ENDPOINT_BROKERS)
    if endpoint_type != ENDPOINT_BROKERS:
        # Kafka: a controller-endpoint request sent to a broker is a mismatch; any other
        # type is unsupported.
        mismatch = endpoint_type == ENDPOINT_CONTROLLERS
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.mismatched_endpoint_type if mismatch
                    else ErrorCode.unsupported_endpoint_type,
                    error_message="The request was sent to an endpoint of type BROKER, but we "
                                  "wanted an endpoint of type CONTROLLER" if mismatch else
                                  f"Unsupported endpoint type {endpoint_type}",
                    endpoint_type=endpoint_type, cluster_id=identity.cluster_id(ctx.broker),
                    controller_id=-1, brokers=(), cluster_authorized_operations=NOT_REQUESTED)
    ops = cluster_operations(ctx, request.include_cluster_authorized_operations)
    return make(
        ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        error_message=None, endpoint_type=ENDPOINT_BROKERS,
        cluster_id=identity.cluster_id(ctx.broker),
        controller_id=identity.controller(ctx.broker),
        brokers=tuple(make(t.DescribeClusterBroker, broker_id=node, host=host, port=port,
                           rack=None, is_fenced=fenced)
                      for node, host, port, fenced in _cluster_brokers(
                          ctx, getattr(request, "include_fenced_brokers", False))),
        cluster_authorized_operations=ops,
    )


def cluster_operations(ctx: RequestContext, requested: bool) -> int:
    """The cluster's authorized-operations field (DescribeCluster, Metadata v8-v10): as Kafka,
    0 for a principal that may not DESCRIBE the cluster, "not requested" unless asked."""
    if requested and not authz.allowed(ctx, authz.DESCRIBE, authz.CLUSTER, authz.CLUSTER_NAME):
        return 0
    return authorized_operations(ctx, requested, authz.CLUSTER, authz.CLUSTER_NAME)


# --- DescribeTopicPartitions (KIP-966) --------------------------------------------------


def describe_topic_partitions(request: Any, ctx: RequestContext) -> Any:
    """Topics in name order with their partitions, at most ``response_partition_limit``
    (capped at 2000) partitions per response; ``next_cursor`` names the first partition left
    out. An empty topic list means every topic."""
    t = types_of(ctx)
    topics = _catalog(ctx)
    cursor = request.cursor
    fetch_all = not request.topics
    requested = sorted({rt.name for rt in request.topics})
    if cursor is not None and (cursor.partition_index < 0 or
                               (not fetch_all and cursor.topic_name not in requested)):
        # Kafka fails the whole request: every topic answers INVALID_REQUEST.
        return make(ctx.response_type, throttle_time=NO_THROTTLE, next_cursor=None, topics=tuple(
            make(t.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.invalid_request,
                 name=name, topic_id=_ZERO_UUID, is_internal=False, partitions=(),
                 topic_authorized_operations=NOT_REQUESTED)
            for name in requested))
    names = topics.names() if fetch_all else requested
    start_index = 0
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
        if names and names[0] == cursor.topic_name:
            start_index = cursor.partition_index
    budget = max(1, min(request.response_partition_limit, MAX_PARTITION_LIMIT))
    leader = identity.leader(ctx.broker)
    replicas = identity.replicas(ctx.broker, identity.brokers(ctx.broker, ctx.listener))
    out = []
    unauthorized = []
    next_cursor = None
    for i, name in enumerate(names):
        first = start_index if i == 0 else 0
        if not authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, name):
            # Never says whether it exists; left out of a listing of every topic.
            if not fetch_all:
                unauthorized.append(make(
                    t.DescribeTopicPartitionsResponseTopic,
                    error_code=ErrorCode.topic_authorization_failed, name=name,
                    topic_id=_ZERO_UUID, is_internal=False, partitions=(),
                    topic_authorized_operations=NOT_REQUESTED))
            continue
        topic = topics.get(name)
        if topic is None:
            out.append(make(t.DescribeTopicPartitionsResponseTopic,
                            error_code=ErrorCode.unknown_topic_or_partition, name=name,
                            topic_id=_ZERO_UUID, is_internal=False, partitions=(),
                            topic_authorized_operations=NOT_REQUESTED))
            continue
        if budget == 0:
            next_cursor = make(t.Cursor, topic_name=name, partition_index=first)
            break
        last = min(topic.partitions, first + budget)
        out.append(_topic_entry(t, topic, range(first, last), leader, replicas,
                                identity.leader_epoch(ctx.broker),
                                authorized_operations(ctx, True, authz.TOPIC, topic.name)))
        budget -= last - first
        if last < topic.partitions:
            next_cursor = make(t.Cursor, topic_name=name, partition_index=last)
            break
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(out + unauthorized),
                next_cursor=next_cursor)


def _topic_entry(t: Any, topic: Topic, indexes: range, leader: int | None,
                 replicas: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
                 epoch: int, ops: int) -> Any:
    """``replicas``: ``(replicas, isr, offline)`` from ``identity.replicas``; ``ops`` the
    principal's authorized operations on the topic (Kafka always reports them here)."""
    code = ErrorCode.none if leader is not None else ErrorCode.leader_not_available
    everyone, isr, offline = replicas
    partitions = tuple(
        make(t.DescribeTopicPartitionsResponsePartition, error_code=code,
             partition_index=p, leader_id=leader if leader is not None else -1, leader_epoch=epoch,
             replica_nodes=everyone, isr_nodes=isr, eligible_leader_replicas=(),
             last_known_elr=(),
             offline_replicas=offline)
        for p in indexes
    )
    return make(t.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.none,
                name=topic.name, topic_id=topic.topic_id, is_internal=topic.name in INTERNAL_TOPICS,
                partitions=partitions, topic_authorized_operations=ops)


# --- DescribeLogDirs --------------------------------------------------------------------


def describe_log_dirs(request: Any, ctx: RequestContext) -> Any:
    """One log dir (the store's data dir) with the size of each requested partition.

    ``topics`` null means every topic; unknown topics and partitions are left out, as
    Kafka does. Total and usable bytes come from one statvfs of the data dir.
    """
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.DESCRIBE, authz.CLUSTER, authz.CLUSTER_NAME):
        # The error code field exists from v3; older versions just get no results, as Kafka.
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, results=())
    topics = _catalog(ctx)
    store = ctx.broker.store
    if request.topics is None:
        wanted = [(topic, range(topic.partitions)) for topic in topics.all()]
    else:
        wanted = []
        for rt in request.topics:
            topic = topics.get(rt.topic)
            if topic is not None:
                wanted.append((topic, [p for p in rt.partitions if 0 <= p < topic.partitions]))
    out = []
    for topic, indexes in wanted:
        parts = []
        for p in indexes:
            channel = store.machine.channels.get(channel_for(topic.name, p))
            if channel is None:
                continue
            parts.append(make(t.DescribeLogDirsPartition, partition_index=p,
                              partition_size=channel.size_bytes, offset_lag=0,
                              is_future_key=False))
        if parts:
            out.append(make(t.DescribeLogDirsTopic, name=topic.name, partitions=tuple(parts)))
    try:
        usage = shutil.disk_usage(store.data_dir)
        total, usable = usage.total, usage.free
    except OSError:
        total = usable = -1
    result = make(t.DescribeLogDirsResult, error_code=ErrorCode.none,
                  log_dir=str(store.data_dir.resolve()), topics=tuple(out), total_bytes=total,
                  usable_bytes=usable, is_cordoned=False)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                results=(result,))


def register(dispatcher: Dispatcher) -> None:
    """Register DescribeCluster, DescribeTopicPartitions and DescribeLogDirs."""
    dispatcher.register(DESCRIBE_LOG_DIRS, describe_log_dirs, 1, 4)
    dispatcher.register(DESCRIBE_CLUSTER, describe_cluster, 0, 2)
    dispatcher.register(DESCRIBE_TOPIC_PARTITIONS, identity.settled_first(describe_topic_partitions),
                        0, 0)
