"""Topic administration: CreateTopics (19), DeleteTopics (20), DeleteRecords (21),
CreatePartitions (37).

Every handler answers per topic (or per partition): one bad entry never fails the
request. Topic changes go through the ``TopicCatalog`` (``ctx.broker.extras["topics"]``),
which raises ``KafkaError`` synchronously for bad input and returns a Deferred that
fires once the change is durable. DeleteRecords goes to the store directly
(Kafka offset = Sequence - 1).

Every Raft member holds every partition: the replication factor is the member count (a
higher one cannot be met), and a manual assignment must list each member once, in any order.

With ACLs on (``kafka.authz``) each topic is authorized as Kafka 4's controller does:
CreateTopics needs CREATE on the cluster or on the topic (and DESCRIBE_CONFIGS on it to be told
its configs), DeleteTopics DELETE (on the cluster or the topic), CreatePartitions ALTER and
DeleteRecords DELETE on the topic; a refused topic is TOPIC_AUTHORIZATION_FAILED and the others
go on. A topic the principal may not DESCRIBE is never said to be missing.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Callable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.configs import (
    broker_topic_defaults, dynamic_synonyms, topic_config_entries,
)
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import KafkaError, error_code_for
from kmqkafka.kafka.topics import Topic, TopicCatalog, log_config_for, validate_topic_name
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.names import channel_for

log = Logger()

CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, CREATE_PARTITIONS = 19, 20, 21, 37
_ZERO_UUID = uuid.UUID(int=0)

Outcome = tuple[ErrorCode, "str | None", Any]
"""(error code, error message, value on success) for one entry of a request."""


def _catalog(ctx: RequestContext) -> TopicCatalog:
    return ctx.broker.extras["topics"]


def _outcome(work: Callable[[], Any]) -> Deferred:
    """Run ``work`` (sync result, Deferred, or KafkaError raised) and fire with an Outcome."""
    d = maybeDeferred(work)
    d.addCallbacks(lambda value: (ErrorCode.none, None, value), _as_outcome)
    return d


def _as_outcome(failure: Failure) -> Outcome:
    exc = failure.value
    code = error_code_for(exc)
    if code is ErrorCode.unknown_server_error:
        log.failure("admin operation failed", failure)
        return code, "Unexpected error; see the broker log", None
    message = exc.message if isinstance(exc, KafkaError) else str(exc)
    return code, message, None


def _error(code: ErrorCode, message: str | None = None) -> Deferred:
    return succeed((code, message, None))


def _duplicates(names: list[Any]) -> set[Any]:
    return {n for n, k in Counter(names).items() if k > 1}


def _may(ctx: RequestContext, operation: int, topic: str) -> bool:
    return authz.allowed(ctx, operation, authz.TOPIC, topic)


def _may_on_cluster(ctx: RequestContext, operation: int) -> bool:
    return authz.allowed(ctx, operation, authz.CLUSTER, authz.CLUSTER_NAME)


def _topic_refused(message: str | None = None) -> Deferred:
    return _error(ErrorCode.topic_authorization_failed, message)


# --- CreateTopics -----------------------------------------------------------------------


def create_topics(request: Any, ctx: RequestContext) -> Deferred:
    """Create each topic; answers per topic with partitions, replication factor and configs
    (v5+) and the topic id (v7+). ``validate_only`` reports the same outcome, changing nothing.
    CREATE on the cluster, or else on each topic, is needed (checked before anything about the
    topic, so a refused name reveals nothing)."""
    topics = _catalog(ctx)
    everyone = identity.replica_ids(ctx.broker)
    dup = _duplicates([t.name for t in request.topics])
    on_cluster = _may_on_cluster(ctx, authz.CREATE)
    names: list[str] = []
    work: list[Deferred] = []
    for t in request.topics:
        if t.name in names:
            continue  # a duplicated name is answered once
        names.append(t.name)
        if t.name in dup:
            work.append(_error(ErrorCode.invalid_request, "Duplicate topic name."))  # KRaft's
        elif not (on_cluster or _may(ctx, authz.CREATE, t.name)):
            work.append(_topic_refused("Authorization failed."))  # Kafka's controller's words
        else:
            work.append(_outcome(lambda t=t: _create_one(topics, t, everyone,
                                                         request.validate_only)))
    d = gatherResults(work, consumeErrors=True)
    return d.addCallback(lambda outcomes: _create_response(ctx, names, outcomes,
                                                           request.validate_only))


def _create_one(topics: TopicCatalog, t: Any, everyone: tuple[int, ...],
                validate_only: bool) -> Deferred:
    """One topic, checked in the order of Kafka's controller (ReplicationControlManager): an
    existing topic, its name, its configs, then the assignment or the counts."""
    if topics.get(t.name) is not None:
        raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{t.name}' already exists.")
    validate_topic_name(t.name)
    nulls = [c.name for c in t.configs if c.value is None]
    if nulls:
        raise KafkaError(ErrorCode.invalid_config,
                         f"Null value not supported for topic configs: {','.join(nulls)}")
    configs = {c.name: c.value for c in t.configs}
    log_config_for(configs)  # INVALID_CONFIG comes before any partition or replica error
    partitions = t.num_partitions
    assignments = t.assignments or ()
    if assignments:
        if t.replication_factor != -1:
            raise KafkaError(ErrorCode.invalid_request,
                             "A manual partition assignment was specified, but replication "
                             "factor was not set to -1.")
        if t.num_partitions != -1:
            raise KafkaError(ErrorCode.invalid_request,
                             "A manual partition assignment was specified, but numPartitions "
                             "was not set to -1.")
        partitions = _check_assignment(assignments, everyone)
    elif t.replication_factor == 0 or t.replication_factor < -1:
        raise KafkaError(ErrorCode.invalid_replication_factor,
                         "Replication factor must be larger than 0, or -1 to use the default "
                         "value.")
    elif t.num_partitions == 0 or t.num_partitions < -1:
        raise KafkaError(ErrorCode.invalid_partitions,
                         "Number of partitions was set to an invalid non-positive value.")
    elif t.replication_factor > len(everyone):
        raise KafkaError(ErrorCode.invalid_replication_factor,
                         f"Unable to replicate the partition {t.replication_factor} time(s): "
                         f"The target replication factor of {t.replication_factor} cannot be "
                         f"reached because only {len(everyone)} broker(s) are registered.")
    return topics.create(t.name, partitions, configs, validate_only=validate_only)


def _check_assignment(assignments: Any, everyone: tuple[int, ...]) -> int:
    """Partition count of a manual assignment, with Kafka's checks in Kafka's order: a
    partition named twice, each partition's replica list (every node, here), then indexes
    that are not 0, 1, 2 ..."""
    seen: set[int] = set()
    for a in assignments:
        if a.partition_index in seen:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"Found multiple manual partition assignments for partition "
                             f"{a.partition_index}")
        seen.add(a.partition_index)
        _check_replicas(list(a.broker_ids), everyone, a.partition_index)
    if seen != set(range(len(seen))):
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         "partitions should be a consecutive 0-based integer sequence")
    return len(seen)


def _check_replicas(ids: list[int], everyone: tuple[int, ...], partition: int) -> None:
    """A partition's manual replica list, with Kafka's messages: every node replicates every
    partition here, so the only placement there is lists each node once, in any order."""
    if not ids:
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         "The manual partition assignment includes an empty replica list.")
    for b in ids:
        if b not in everyone:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"The manual partition assignment includes broker {b}, but no "
                             f"such broker is registered.")
        if ids.count(b) > 1:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"The manual partition assignment includes the broker {b} more "
                             f"than once.")
    if len(ids) != len(everyone):
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         f"The manual partition assignment includes a partition with "
                         f"{len(ids)} replica(s), but this is not consistent with previous "
                         f"partitions, which have {len(everyone)} replica(s): every node holds "
                         f"every partition here (partition {partition}).")


def _create_response(ctx: RequestContext, names: list[str], outcomes: list[Outcome],
                     validate_only: bool) -> Any:
    t = types_of(ctx)
    results = []
    for name, (code, message, topic) in zip(names, outcomes):
        if topic is None:
            results.append(make(t.CreatableTopicResult, name=name, topic_id=_ZERO_UUID,
                                error_code=code, error_message=message, num_partitions=-1,
                                replication_factor=-1, configs=None))
            continue
        topic_id = _ZERO_UUID if validate_only else topic.topic_id
        if not _may(ctx, authz.DESCRIBE_CONFIGS, name):
            # Created, but its configs (and, as Kafka's controller leaves them, partition count
            # and replication factor) are not told to who may not describe them.
            results.append(make(
                t.CreatableTopicResult, name=name, topic_id=topic_id, error_code=ErrorCode.none,
                error_message=None,
                topic_config_error_code=ErrorCode.topic_authorization_failed,
                num_partitions=-1, replication_factor=-1, configs=()))
            continue
        configs = None
        if hasattr(t, "CreatableTopicConfigs"):  # v5+
            configs = tuple(
                make(t.CreatableTopicConfigs, name=e.name, value=e.value,
                     read_only=e.read_only, config_source=e.source, is_sensitive=False)
                for e in topic_config_entries(topic, None, broker_topic_defaults(ctx),
                                              dynamic_synonyms(ctx.broker.extras["topics"]))
            )
        results.append(make(
            t.CreatableTopicResult, name=name, topic_id=topic_id,
            error_code=ErrorCode.none, error_message=None, num_partitions=topic.partitions,
            replication_factor=len(identity.replica_ids(ctx.broker)), configs=configs))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(results))


# --- DeleteTopics -----------------------------------------------------------------------


def delete_topics(request: Any, ctx: RequestContext) -> Deferred:
    """Delete topics by name (all versions) or by topic id (v6+), answering per topic. DELETE
    on the cluster, or else on each topic, is needed; a refused topic known by id is named only
    to who may DESCRIBE it, and an unknown name is UNKNOWN_TOPIC_OR_PARTITION only to them."""
    topics = _catalog(ctx)
    on_cluster = _may_on_cluster(ctx, authz.DELETE)
    if hasattr(request, "topic_names"):
        wanted = [(name, None) for name in request.topic_names]
    else:
        wanted = [(s.name, s.topic_id if s.topic_id != _ZERO_UUID else None)
                  for s in request.topics]
    dup_names = _duplicates([n for n, i in wanted if n is not None and i is None])
    dup_ids = _duplicates([i for n, i in wanted if n is None and i is not None])
    entries: list[tuple[str | None, uuid.UUID | None]] = []
    work: list[Deferred] = []
    for name, topic_id in wanted:
        entries.append((name, topic_id))
        if name is not None and topic_id is not None:
            work.append(_error(ErrorCode.invalid_request,
                               "You may not specify both topic name and topic id."))
        elif name is None and topic_id is None:
            work.append(_error(ErrorCode.invalid_request,
                               "Neither topic name nor id were specified."))
        elif name in dup_names:
            work.append(_error(ErrorCode.invalid_request, "Duplicate topic name."))
        elif topic_id in dup_ids:
            work.append(_error(ErrorCode.invalid_request, "Duplicate topic id."))
        elif on_cluster:
            work.append(_outcome(lambda n=name, i=topic_id: _delete_retrying(topics, n, i)))
        elif name is None:
            found = topics.by_id(topic_id)
            if found is not None and not _may(ctx, authz.DELETE, found.name):
                if _may(ctx, authz.DESCRIBE, found.name):
                    entries[-1] = (found.name, topic_id)
                work.append(_topic_refused())
            else:  # an unknown id is UNKNOWN_TOPIC_ID, which reveals no name
                work.append(_outcome(lambda i=topic_id: _delete_retrying(topics, None, i)))
        elif not _may(ctx, authz.DELETE, name) and (
                topics.get(name) is not None or not _may(ctx, authz.DESCRIBE, name)):
            work.append(_topic_refused())
        else:
            work.append(_outcome(lambda n=name: _delete_retrying(topics, n, None)))
    d = gatherResults(work, consumeErrors=True)
    return d.addCallback(lambda outcomes: _delete_response(ctx, entries, outcomes))


def _delete_one(topics: TopicCatalog, name: str | None, topic_id: uuid.UUID | None) -> Deferred:
    if name is None:
        found = topics.by_id(topic_id)
        if found is None:
            raise KafkaError(ErrorCode.unknown_topic_id,
                             "This server does not host this topic ID.")
        name = found.name
    return topics.delete(name)


def _delete_retrying(topics: TopicCatalog, name: str | None,
                     topic_id: uuid.UUID | None) -> Deferred:
    return topics.retrying(lambda: _delete_one(topics, name, topic_id))


def _delete_response(ctx: RequestContext, entries: list[tuple[str | None, uuid.UUID | None]],
                     outcomes: list[Outcome]) -> Any:
    t = types_of(ctx)
    results = []
    for (name, topic_id), (code, message, topic) in zip(entries, outcomes):
        if topic is not None:
            name, topic_id = topic.name, topic.topic_id
        results.append(make(t.DeletableTopicResult, name=name, topic_id=topic_id or _ZERO_UUID,
                            error_code=code, error_message=message))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, responses=tuple(results))


# --- CreatePartitions -------------------------------------------------------------------


def create_partitions(request: Any, ctx: RequestContext) -> Deferred:
    """Grow topics under the seed's increase-only rules (1..256; equal, smaller and > 256 are
    INVALID_PARTITIONS with the seed's messages). Assignments, when given, must name one new
    partition each, listing every member. ``validate_only`` reports the same outcome, changing
    nothing. ALTER on the topic is needed."""
    topics = _catalog(ctx)
    everyone = identity.replica_ids(ctx.broker)
    dup = _duplicates([t.name for t in request.topics])
    names: list[str] = []
    work = []
    for t in request.topics:
        if t.name in names:
            continue  # a duplicated name is answered once
        names.append(t.name)
        if t.name in dup:
            work.append(_error(ErrorCode.invalid_request, "Duplicate topic name."))
        elif not _may(ctx, authz.ALTER, t.name):
            work.append(_topic_refused())
        else:
            work.append(_outcome(lambda t=t: topics.retrying(
                lambda: _grow_one(topics, t, everyone, request.validate_only))))
    d = gatherResults(work, consumeErrors=True)
    return d.addCallback(lambda outcomes: _partitions_response(ctx, names, outcomes))


def _grow_one(topics: TopicCatalog, t: Any, everyone: tuple[int, ...],
              validate_only: bool) -> Deferred:
    current = topics.require(t.name).partitions
    # The seed's count rules come first: checking them is what validate_only promises.
    d = topics.add_partitions(t.name, t.count, validate_only=True)
    if t.assignments is not None:
        added = t.count - current
        if len(t.assignments) != added:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"Attempted to add {added} additional partition(s), but only "
                             f"{len(t.assignments)} assignment(s) were specified.")
        for i, a in enumerate(t.assignments):
            _check_replicas(list(a.broker_ids), everyone, current + i)
    if validate_only:
        return d
    return topics.add_partitions(t.name, t.count)


def _partitions_response(ctx: RequestContext, names: list[str], outcomes: list[Outcome]) -> Any:
    t = types_of(ctx)
    results = tuple(
        make(t.CreatePartitionsTopicResult, name=name, error_code=code, error_message=message)
        for name, (code, message, _v) in zip(names, outcomes)
    )
    return make(ctx.response_type, throttle_time=NO_THROTTLE, results=results)


# --- DeleteRecords ----------------------------------------------------------------------


def delete_records(request: Any, ctx: RequestContext) -> Deferred:
    """Move each partition's log start up to the requested offset; answers the new low
    watermark. Offset -1 means the high watermark; past it is OFFSET_OUT_OF_RANGE; a
    compact-only topic is POLICY_VIOLATION, as in Kafka. DELETE on the topic is needed (every
    partition of a refused topic is TOPIC_AUTHORIZATION_FAILED)."""
    topics = _catalog(ctx)
    store = ctx.broker.store
    shape: list[tuple[str, list[int]]] = []
    work: list[Deferred] = []
    for rt in request.topics:
        topic = topics.get(rt.name)
        permitted = _may(ctx, authz.DELETE, rt.name)
        indexes = []
        for rp in rt.partitions:
            indexes.append(rp.partition_index)
            if not permitted:
                work.append(_topic_refused())
                continue
            work.append(_outcome(lambda topic=topic, rp=rp: _truncate(store, topic, rp)))
        shape.append((rt.name, indexes))
    d = gatherResults(work, consumeErrors=True)
    return d.addCallback(lambda outcomes: _records_response(ctx, shape, outcomes))


def _truncate(store: Any, topic: Topic | None, rp: Any) -> Deferred:
    if topic is None or not 0 <= rp.partition_index < topic.partitions:
        raise KafkaError(ErrorCode.unknown_topic_or_partition)
    channel = channel_for(topic.name, rp.partition_index)
    if not store.config(channel).delete:
        raise KafkaError(ErrorCode.policy_violation,
                         f"Records of partition {topic.name}-{rp.partition_index} can not be "
                         "deleted due to the configured policy")
    bounds = store.bounds(channel)
    high = bounds.high_watermark - 1  # Kafka offsets
    offset = high if rp.offset == -1 else rp.offset
    if offset < 0 or offset > high:
        raise KafkaError(ErrorCode.offset_out_of_range)
    if offset + 1 <= bounds.log_start:
        return succeed(bounds.log_start - 1)  # already gone: nothing to do
    return store.truncate_prefix(channel, offset + 1).addCallback(lambda start: start - 1)


def _records_response(ctx: RequestContext, shape: list[tuple[str, list[int]]],
                      outcomes: list[Outcome]) -> Any:
    t = types_of(ctx)
    it = iter(outcomes)
    out = []
    for name, indexes in shape:
        parts = []
        for index in indexes:
            code, _message, low = next(it)
            parts.append(make(t.DeleteRecordsPartitionResult, partition_index=index,
                              low_watermark=-1 if low is None else low, error_code=code))
        out.append(make(t.DeleteRecordsTopicResult, name=name, partitions=tuple(parts)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(out))


def register(dispatcher: Dispatcher) -> None:
    """Register CreateTopics, DeleteTopics, DeleteRecords and CreatePartitions."""
    dispatcher.register(CREATE_TOPICS, create_topics, 2, 7)
    dispatcher.register(DELETE_TOPICS, delete_topics, 1, 6)
    dispatcher.register(DELETE_RECORDS, delete_records, 0, 2)
    dispatcher.register(CREATE_PARTITIONS, create_partitions, 0, 3)
