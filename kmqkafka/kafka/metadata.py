"""Metadata (key 3): brokers, cluster id, and topics with their partitions.

Topics are auto-created here when the client allows it and the broker's
``CONNECTORS_KAFKA_AUTO_CREATE_TOPICS`` is on; the response waits for the
creation to be durable so the client sees a usable topic on its first try.
Brokers are the live Raft members with their advertised Kafka endpoints (``identity.brokers``:
this node, the leader and the peers it has a working Raft link to; this node alone on a lone
broker), as Apache Kafka lists only live brokers. The leader of every partition, and the
controller, is the Raft leader; replicas are all members, the ISR the listed ones, and the
others are offline replicas (v5+). A node that knows no leader answers
LEADER_NOT_AVAILABLE for each partition (leader -1) and names itself controller (it forwards
admin commands to the leader once there is one; ``identity.controller``). Topics and partition
counts come from this node's applied state, so a follower may be behind but never ahead.
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, gatherResults, succeed

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import identity
from kmqkafka.kafka.acl import CLUSTER_OPERATIONS, TOPIC_OPERATIONS, operations
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import KafkaError, error_code_for
from kmqkafka.kafka.topics import INTERNAL_TOPICS, Topic, TopicCatalog, validate_topic_name
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 13  # v13 (KIP-1102) adds only a top-level error code
_ZERO_UUID = uuid.UUID(int=0)


def catalog(ctx: RequestContext) -> TopicCatalog:
    return ctx.broker.extras["topics"]


def handle(request: Any, ctx: RequestContext) -> Deferred:
    broker = ctx.broker
    topics = catalog(ctx)
    auto_create = broker.settings.kafka_auto_create_topics and getattr(
        request, "allow_auto_topic_creation", True
    )
    wanted = request.topics
    if wanted is None or (ctx.api_version == 0 and not wanted):
        entries: list[Deferred] = [succeed((t.name, t, None)) for t in topics.all()]
    else:
        entries = [_resolve(topics, t, auto_create) for t in wanted]
    d = gatherResults(entries, consumeErrors=True)
    return d.addCallback(_respond, request, ctx)


def _resolve(topics: TopicCatalog, req: Any, auto_create: bool) -> Deferred:
    """(name, Topic or None, error) for one requested topic, creating it if allowed."""
    name = getattr(req, "name", None)
    topic_id = getattr(req, "topic_id", None)
    if name is None and topic_id not in (None, _ZERO_UUID):
        found = topics.by_id(topic_id)
        if found is None:
            return succeed((None, None, KafkaError(ErrorCode.unknown_topic_id)))
        return succeed((found.name, found, None))
    try:
        validate_topic_name(name)
    except KafkaError as exc:
        return succeed((name, None, exc))
    found = topics.get(name)
    if found is not None:
        return succeed((name, found, None))
    if not auto_create or name in INTERNAL_TOPICS:
        return succeed((name, None, KafkaError(ErrorCode.unknown_topic_or_partition)))
    try:
        d = topics.create(name)
    except KafkaError as exc:  # e.g. the name collides with an existing one ('.' vs '_')
        return succeed((name, None, exc))
    d.addCallback(lambda created: (name, created, None))
    # A concurrent create of the same name is not an error for Metadata.
    d.addErrback(lambda f: (name, topics.get(name), None) if topics.get(name) is not None
                 else (name, None, f.value))
    return d


def _respond(resolved: list[tuple[str | None, Topic | None, Exception | None]],
             request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    brokers = identity.brokers(ctx.broker, ctx.listener)
    leader = identity.leader(ctx.broker)
    # One leader epoch, 0, for every partition forever (stamped into stored batches too): a
    # committed Raft entry is never truncated, so a client never needs an epoch change to
    # detect a truncated log (KIP-320); a new leader serves the very same offsets.
    epoch = 0
    replicas, isr, offline = identity.replicas(ctx.broker, brokers)
    part_error = ErrorCode.none if leader is not None else ErrorCode.leader_not_available
    topic_ops = operations(getattr(request, "include_topic_authorized_operations", False),
                           TOPIC_OPERATIONS)
    out = []
    for name, topic, error in resolved:
        if topic is None:
            code = error_code_for(error) if error is not None else ErrorCode.unknown_topic_or_partition
            if name is None and ctx.api_version < 12:  # the name is nullable from v12 only
                name = ""
            out.append(make(t.MetadataResponseTopic, error_code=code, name=name,
                            topic_id=_ZERO_UUID, is_internal=False, partitions=()))
            continue
        partitions = tuple(
            make(t.MetadataResponsePartition, error_code=part_error, partition_index=p,
                 leader_id=leader if leader is not None else -1, leader_epoch=epoch,
                 replica_nodes=replicas, isr_nodes=isr, offline_replicas=offline)
            for p in range(topic.partitions)
        )
        out.append(make(t.MetadataResponseTopic, error_code=ErrorCode.none, name=topic.name,
                        topic_id=topic.topic_id, is_internal=topic.name in INTERNAL_TOPICS,
                        partitions=partitions,
                        topic_authorized_operations=topic_ops))
    return make(
        ctx.response_type,
        throttle_time=NO_THROTTLE,
        brokers=tuple(make(t.MetadataResponseBroker, node_id=node, host=host, port=port, rack=None)
                      for node, host, port in brokers),
        cluster_id=identity.cluster_id(ctx.broker),
        controller_id=identity.controller(ctx.broker),
        topics=tuple(out),
        error_code=ErrorCode.none,
        cluster_authorized_operations=operations(
            getattr(request, "include_cluster_authorized_operations", False), CLUSTER_OPERATIONS),
    )


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(API_KEY, identity.settled_first(handle), MIN_VERSION, MAX_VERSION)
