"""Metadata (key 3): brokers, cluster id, and topics with their partitions.

Topics are auto-created here when the client allows it and the broker's
``CONNECTORS_KAFKA_AUTO_CREATE_TOPICS`` is on; the response waits for the
creation to be durable so the client sees a usable topic on its first try.
Brokers are the live Raft members with their advertised Kafka endpoints (``identity.brokers``:
this node, the leader and the peers it has a working Raft link to; this node alone on a lone
broker), as Apache Kafka lists only live brokers. The leader of every partition, and the
controller, is the Raft leader, with the Raft term as leader epoch; replicas are all members,
the ISR the listed ones, and the others are offline replicas (v5+). A node that knows no
leader answers LEADER_NOT_AVAILABLE for each partition (leader -1) and names itself controller
(it forwards admin commands to the leader once there is one; ``identity.controller``). Topics
and partition counts come from this node's applied state, so a follower may be behind but
never ahead.

ACLs (as KafkaApis): asked for every topic, the response lists only those the principal may
DESCRIBE; a named topic it may not describe answers TOPIC_AUTHORIZATION_FAILED with no
partitions and a zero id, whether it exists or not, and auto-creating a missing one needs CREATE
on the cluster or the topic (``_resolve``). Authorized operations are the principal's own.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, gatherResults, succeed

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.acl import authorized_operations
from kmqkafka.kafka.cluster import cluster_operations
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import KafkaError, error_code_for
from kmqkafka.kafka.topics import INTERNAL_TOPICS, Topic, TopicCatalog, validate_topic_name
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.net import shared

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 13  # v13 (KIP-1102) adds only a top-level error code
_ZERO_UUID = uuid.UUID(int=0)


def catalog(ctx: RequestContext) -> TopicCatalog:
    return ctx.broker.extras["topics"]


def handle(request: Any, ctx: RequestContext) -> Any:
    broker = ctx.broker
    topics = catalog(ctx)
    wanted = request.topics
    if wanted is None or (ctx.api_version == 0 and not wanted):
        return _all_topics(request, ctx, topics)
    auto_create = broker.settings.kafka_auto_create_topics and getattr(
        request, "allow_auto_topic_creation", True
    )
    entries = [_resolve(ctx, topics, t, auto_create) for t in wanted]
    d = gatherResults(entries, consumeErrors=True)
    return d.addCallback(_respond, request, ctx)


_FULL_CACHE = 8  # full responses kept per catalog: (version, listener, flags) combinations


def _all_topics(request: Any, ctx: RequestContext, topics: TopicCatalog) -> Any:
    """The response for every topic: the same object (encoded once, ``net/shared.py``) for
    as long as the catalog, this node's view of the cluster and the request's options are
    unchanged. Built afresh for 2,000 topics it took 40 ms of the reactor, and a burst of
    clients asking at once stalled the node long enough to cost a Raft leader its term."""
    listed = topics.listing()
    view = _view(ctx)
    key = (ctx.api_version, ctx.listener, view,
           bool(getattr(request, "include_topic_authorized_operations", False)),
           bool(getattr(request, "include_cluster_authorized_operations", False)))
    rules = None
    auth = ctx.broker.extras.get("authorizer")
    if auth is not None:
        # What the principal may describe decides the listing: one entry per principal and
        # address, good for as long as the bindings are the same (``rules`` is replaced
        # whenever they change).
        rules = auth.rules()
        key += (ctx.principal, authz.host_of(ctx.peer))
    cache: OrderedDict = ctx.broker.extras.setdefault("metadata_full", OrderedDict())
    found = cache.get(key)
    if found is not None and found[0] is listed and found[2] is rules:
        cache.move_to_end(key)
        return shared.share(found[1])
    visible = listed if rules is None else [
        t for t in listed if authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, t.name)]
    response = _respond([(t.name, t, None, None) for t in visible], request, ctx, view)
    cache[key] = (listed, response, rules)
    cache.move_to_end(key)
    while len(cache) > _FULL_CACHE:
        cache.popitem(last=False)
    return shared.share(response)


def _view(ctx: RequestContext) -> tuple[Any, ...]:
    """What a response takes from this node's view of the cluster (for ``ctx.listener``)."""
    broker = ctx.broker
    brokers = tuple(identity.brokers(broker, ctx.listener))
    return (brokers, identity.leader(broker), identity.controller(broker),
            identity.replicas(broker, list(brokers)), identity.cluster_id(broker),
            identity.leader_epoch(broker))


_UNAUTHORIZED = KafkaError(ErrorCode.topic_authorization_failed)


def _resolve(ctx: RequestContext, topics: TopicCatalog, req: Any, auto_create: bool
             ) -> Deferred:
    """(name, Topic or None, error, id asked) for one requested topic, creating it if allowed.

    ACLs as Kafka: a topic the principal may not DESCRIBE is TOPIC_AUTHORIZATION_FAILED whether
    it exists or not (named by id: the id is echoed, the name null); a missing one that would
    be auto-created needs CREATE on the cluster or the topic, else TOPIC_AUTHORIZATION_FAILED
    too (Kafka answers so rather than UNKNOWN_TOPIC_OR_PARTITION)."""
    name = getattr(req, "name", None)
    topic_id = getattr(req, "topic_id", None)
    if name is None and topic_id not in (None, _ZERO_UUID):
        found = topics.by_id(topic_id)
        if found is None:
            # Kafka echoes the id it could not find (the name stays null).
            return succeed((None, None, KafkaError(ErrorCode.unknown_topic_id), topic_id))
        if not authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, found.name):
            return succeed((None, None, _UNAUTHORIZED, topic_id))
        return succeed((found.name, found, None, None))
    if name is not None and authz.enabled(ctx):
        if not authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, name):
            return succeed((name, None, _UNAUTHORIZED, None))
        if auto_create and topics.get(name) is None and not (
                authz.allowed(ctx, authz.CREATE, authz.CLUSTER, authz.CLUSTER_NAME)
                or authz.allowed(ctx, authz.CREATE, authz.TOPIC, name)):
            return succeed((name, None, _UNAUTHORIZED, None))
    try:
        validate_topic_name(name)
    except KafkaError as exc:
        return succeed((name, None, exc, None))
    found = topics.get(name)
    if found is not None:
        return succeed((name, found, None, None))
    if not auto_create or name in INTERNAL_TOPICS:
        return succeed((name, None, KafkaError(ErrorCode.unknown_topic_or_partition), None))
    try:
        d = topics.create(name)
    except KafkaError as exc:  # e.g. the name collides with an existing one ('.' vs '_')
        return succeed((name, None, exc, None))
    d.addCallback(lambda created: (name, created, None, None))
    # A concurrent create of the same name is not an error for Metadata.
    d.addErrback(lambda f: (name, topics.get(name), None, None) if topics.get(name) is not None
                 else (name, None, _create_failure(f.value), None))
    return d


_CREATE_PENDING = frozenset({
    ErrorCode.request_timed_out, ErrorCode.not_leader_or_follower, ErrorCode.not_controller,
})


def _create_failure(exc: BaseException) -> BaseException:
    """What Metadata says of an auto-create that did not complete: a create that timed out
    or lost its leader may still land, which Kafka reports as LEADER_NOT_AVAILABLE (the topic
    is being created; clients retry), never as a request-level timeout for one topic."""
    if error_code_for(exc) in _CREATE_PENDING:
        return KafkaError(ErrorCode.leader_not_available, "the topic is being created")
    return exc


def _respond(resolved: list[tuple[str | None, Topic | None, Exception | None,
                                  uuid.UUID | None]],
             request: Any, ctx: RequestContext, view: tuple[Any, ...] | None = None) -> Any:
    t = types_of(ctx)
    brokers, leader, controller, (replicas, isr, offline), cluster, epoch = view or _view(ctx)
    # The Raft term (``identity.leader_epoch``): it grows with every leader change, as a Kafka
    # partition's epoch does, and every node that knows the leader gives the same one.
    part_error = ErrorCode.none if leader is not None else ErrorCode.leader_not_available
    ops_asked = bool(getattr(request, "include_topic_authorized_operations", False))
    # Without ACLs every topic reports the same operations: computed once.
    per_topic_ops = ops_asked and authz.enabled(ctx)
    topic_ops = 0 if per_topic_ops else authorized_operations(ctx, ops_asked, authz.TOPIC, "")
    # Partition entries depend only on the index here: built once per index, shared by
    # every topic of the response.
    built: list[Any] = []
    out = []
    for name, topic, error, asked_id in resolved:
        if topic is None:
            code = error_code_for(error) if error is not None else ErrorCode.unknown_topic_or_partition
            if name is None and ctx.api_version < 12:  # the name is nullable from v12 only
                name = ""
            out.append(make(t.MetadataResponseTopic, error_code=code, name=name,
                            topic_id=asked_id or _ZERO_UUID, is_internal=False,
                            partitions=()))
            continue
        while len(built) < topic.partitions:
            built.append(make(t.MetadataResponsePartition, error_code=part_error,
                              partition_index=len(built),
                              leader_id=leader if leader is not None else -1,
                              leader_epoch=epoch, replica_nodes=replicas, isr_nodes=isr,
                              offline_replicas=offline))
        partitions = tuple(built[:topic.partitions])
        out.append(make(t.MetadataResponseTopic, error_code=ErrorCode.none, name=topic.name,
                        topic_id=topic.topic_id, is_internal=topic.name in INTERNAL_TOPICS,
                        partitions=partitions,
                        topic_authorized_operations=authorized_operations(
                            ctx, True, authz.TOPIC, topic.name) if per_topic_ops
                        else topic_ops))
    return make(
        ctx.response_type,
        throttle_time=NO_THROTTLE,
        brokers=tuple(make(t.MetadataResponseBroker, node_id=node, host=host, port=port, rack=None)
                      for node, host, port in brokers),
        cluster_id=cluster,
        controller_id=controller,
        topics=tuple(out),
        error_code=ErrorCode.none,
        cluster_authorized_operations=cluster_operations(
            ctx, bool(getattr(request, "include_cluster_authorized_operations", False))),
    )


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(API_KEY, identity.settled_first(handle), MIN_VERSION, MAX_VERSION)
