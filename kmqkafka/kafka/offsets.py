"""Committed-offset APIs: OffsetCommit (8), OffsetFetch (9), OffsetDelete (47).

Group validation and storage live in ``kmqkafka.coordinators.group.GroupCoordinator``; this
module checks what is per partition (topic exists, partition in range, metadata size) and builds
responses. Commits answer only once durable. Per-partition errors never fail the whole request.

* OffsetCommit v2–v9: partitions of unknown topics answer UNKNOWN_TOPIC_OR_PARTITION before
  the group is consulted (a commit naming only those neither fails on nor creates a group,
  as in Kafka, whose KafkaApis filters them out). A generation of -1 with no member id is a
  standalone ("simple") commit, accepted only while the group has no members; otherwise the
  member and generation must match
  (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS while
  completing a rebalance). v10 (topic ids, KIP-848 era) is not offered.
* OffsetFetch v1–v9: all committed partitions when ``topics`` is null (v2+), several groups per
  request from v8. RequireStable (v7+) answers UNSTABLE_OFFSET_COMMIT for partitions an open
  transaction holds an offset for (``TxnOffsetCommit``, ``transactions.py``).
* KIP-848 consumer groups (``broker.extras["consumer_groups"]``): OffsetCommit's generation is
  the member epoch (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH; an empty group
  takes epoch -1 commits); OffsetFetch v9 naming a member checks its epoch the same way.
* OffsetDelete v0: GROUP_SUBSCRIBED_TO_TOPIC for topics an active consumer group subscribes to.

ACLs (Kafka's KafkaApis): OffsetCommit needs READ on the group (else every partition answers
GROUP_AUTHORIZATION_FAILED) and READ on each topic (else its partitions answer
TOPIC_AUTHORIZATION_FAILED, left out of the commit like unknown ones). OffsetFetch needs
DESCRIBE on the group and on each named topic; fetching every topic silently leaves out those
the principal may not describe. OffsetDelete needs DELETE on the group and READ on each topic.
"""
from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred

from kmqkafka.coordinators.group import valid_group_id
from kmqkafka.coordinators.offsets import MAX_METADATA_BYTES, CommittedOffset
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.groups import coordinated, coordinator, may_read_group, top_level_error
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

OFFSET_COMMIT, OFFSET_FETCH, OFFSET_DELETE = 8, 9, 47


def _unreadable(ctx: RequestContext, topics: Any) -> set[str]:
    """The request's topic names the principal may not READ (checked once per name)."""
    names = {topic.name for topic in topics}
    return names - set(authz.filtered(ctx, authz.READ, authz.TOPIC, sorted(names)))


def _partition_error(ctx: RequestContext, topic: str, partition: int) -> ErrorCode:
    found = ctx.broker.extras["topics"].get(topic)
    if found is None or not 0 <= partition < found.partitions:
        return ErrorCode.unknown_topic_or_partition
    return ErrorCode.none


# --- OffsetCommit -----------------------------------------------------------------------


def offset_commit(request: Any, ctx: RequestContext) -> Deferred | Any:
    t = types_of(ctx)
    if not may_read_group(ctx, request.group_id):
        return _commit_error(request, ctx, ErrorCode.group_authorization_failed)
    c = coordinator(ctx.broker)
    # As Kafka's KafkaApis: partitions of unreadable or unknown topics are answered before
    # the coordinator sees the request, so their error wins over the group's, and a request
    # naming nothing else never reaches it (it neither fails on the group nor creates one).
    denied = _unreadable(ctx, request.topics)
    unknown = {(topic.name, int(p.partition_index))
               for topic in request.topics for p in topic.partitions
               if topic.name in denied
               or _partition_error(ctx, topic.name, int(p.partition_index))
               is not ErrorCode.none}
    group_error = ErrorCode.none
    if any((topic.name, int(p.partition_index)) not in unknown
           for topic in request.topics for p in topic.partitions):
        group_error = _validate_commit(request, ctx, c)
    now_ms = int(ctx.broker.reactor.seconds() * 1000)
    results: list[tuple[str, list[tuple[int, ErrorCode]]]] = []
    commits: list[tuple[str, int, CommittedOffset]] = []
    for topic in request.topics:
        row: list[tuple[int, ErrorCode]] = []
        for p in topic.partitions:
            code = group_error
            if topic.name in denied:
                code = ErrorCode.topic_authorization_failed
            elif (topic.name, int(p.partition_index)) in unknown:
                code = ErrorCode.unknown_topic_or_partition
            # Kafka stores a null metadata as "" (OffsetAndMetadata.NO_METADATA), so
            # OffsetFetch never answers null for a committed partition.
            metadata = p.committed_metadata or ""
            if code is ErrorCode.none and _java_length(metadata) > MAX_METADATA_BYTES:
                code = ErrorCode.offset_metadata_too_large
            if code is ErrorCode.none:
                commits.append((topic.name, int(p.partition_index), CommittedOffset(
                    offset=int(p.committed_offset),
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                    metadata=metadata, commit_ms=now_ms)))
            row.append((int(p.partition_index), code))
        results.append((topic.name, row))

    def respond(stored_error: ErrorCode) -> Any:
        topics = []
        for name, row in results:
            parts = tuple(make(t.OffsetCommitResponsePartition, partition_index=index,
                               error_code=stored_error if code is ErrorCode.none else code)
                          for index, code in row)
            topics.append(make(t.OffsetCommitResponseTopic, name=name, partitions=parts))
        return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(topics))

    if not commits:
        return respond(ErrorCode.none)
    d = c.commit_offsets(request.group_id, commits)
    d.addCallbacks(lambda _: respond(ErrorCode.none),
                   lambda f: respond(ErrorCode.coordinator_not_available))
    return d


def _validate_commit(request: Any, ctx: RequestContext, c: Any) -> ErrorCode:
    """The group's verdict on an OffsetCommit (the coordinator may create a simple group)."""
    generation = int(getattr(request, "generation_id_or_member_epoch", -1))
    cg = _consumer_groups(ctx)
    if cg is not None and cg.owns(request.group_id):
        # KIP-848 group: the generation field carries the member epoch.
        return cg.validate_commit(request.group_id, request.member_id, generation,
                                  ctx.api_version)
    error, _ = c.validate_commit(request.group_id, generation, request.member_id,
                                 getattr(request, "group_instance_id", None), ctx.api_version)
    return error


def _java_length(text: str) -> int:
    """``String.length()`` in Java (UTF-16 code units): Kafka bounds commit metadata by it,
    so 4096 'é' fit although they take 8192 bytes of UTF-8."""
    return len(text.encode("utf-16-le")) // 2


# --- OffsetFetch ------------------------------------------------------------------------


def _consumer_groups(ctx: RequestContext) -> Any:
    """The loaded KIP-848 coordinator, or None when it is not installed."""
    cg = ctx.broker.extras.get("consumer_groups")
    if cg is not None and not cg.loaded:
        coordinator(ctx.broker)
        cg.load()
    return cg


def _fetch_group(ctx: RequestContext, group_id: str,
                 topics: list[tuple[str, list[int]]] | None, member_id: str | None = None,
                 member_epoch: int = -1
                 ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, CommittedOffset | None]]]]]:
    if not valid_group_id(group_id, allow_empty=True):
        return ErrorCode.invalid_group_id, []
    cg = _consumer_groups(ctx)
    if cg is not None and cg.owns(group_id):
        error = cg.validate_fetch(group_id, member_id, member_epoch)
        if error is not ErrorCode.none:
            return error, []
    committed = coordinator(ctx.broker).fetch_offsets(group_id)
    if topics is None:
        by_topic: dict[str, list[tuple[int, CommittedOffset | None]]] = {}
        for (topic, partition), c in sorted(committed.items()):
            by_topic.setdefault(topic, []).append((partition, c))
        return ErrorCode.none, list(by_topic.items())
    return ErrorCode.none, [
        (name, [(p, committed.get((name, p))) for p in partitions]) for name, partitions in topics
    ]


def _fetch_authorized(ctx: RequestContext, group_id: str,
                      topics: list[tuple[str, list[int]]] | None, member_id: str | None = None,
                      member_epoch: int = -1
                      ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, Any]]]]]:
    """``_fetch_group`` under the ACLs: GROUP_AUTHORIZATION_FAILED without DESCRIBE on the
    group; a named topic the principal may not describe answers TOPIC_AUTHORIZATION_FAILED
    on each partition (a ``TOPIC_DENIED`` row); an all-topics fetch leaves such topics out."""
    if not authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, group_id):
        return ErrorCode.group_authorization_failed, []
    if topics is None:
        error, rows = _fetch_group(ctx, group_id, None, member_id, member_epoch)
        allowed = set(authz.filtered(ctx, authz.DESCRIBE, authz.TOPIC, [n for n, _ in rows]))
        return error, [(name, parts) for name, parts in rows if name in allowed]
    allowed = set(authz.filtered(ctx, authz.DESCRIBE, authz.TOPIC,
                                 sorted({name for name, _ in topics})))
    error, rows = _fetch_group(ctx, group_id, [(n, ps) for n, ps in topics if n in allowed],
                               member_id, member_epoch)
    if error is not ErrorCode.none:
        return error, rows
    # As Kafka: the refused topics follow the others.
    return error, rows + [(name, [(p, TOPIC_DENIED) for p in partitions])
                          for name, partitions in topics if name not in allowed]


TOPIC_DENIED = object()  # a partition row of a topic the principal may not describe


def offset_fetch(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    # RequireStable (v7+): a partition an open transaction holds an offset for answers
    # UNSTABLE_OFFSET_COMMIT, and the client asks again (KIP-447).
    unstable = _unstable_check(request, ctx)
    if ctx.api_version >= 8:
        groups = []
        for g in request.groups:
            wanted = None if g.topics is None else [
                (tp.name, [int(i) for i in tp.partition_indexes]) for tp in g.topics]
            error, rows = _fetch_authorized(ctx, g.group_id, wanted,
                                            getattr(g, "member_id", None),
                                            int(getattr(g, "member_epoch", -1)))
            topics = tuple(
                make(t.OffsetFetchResponseTopics, name=name, partitions=tuple(
                    _fetched(t.OffsetFetchResponsePartitions, index, c,
                             unstable(g.group_id, name, index)) for index, c in parts))
                for name, parts in rows)
            groups.append(make(t.OffsetFetchResponseGroup, group_id=g.group_id, topics=topics,
                               error_code=error))
        return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(groups))
    wanted = None if request.topics is None else [
        (tp.name, [int(i) for i in tp.partition_indexes]) for tp in request.topics]
    error, rows = _fetch_authorized(ctx, request.group_id, wanted)
    if error is not ErrorCode.none and ctx.api_version < 2 and wanted is not None:
        # v1 has no top-level error: report it on every partition.
        topics = tuple(
            make(t.OffsetFetchResponseTopic, name=name, partitions=tuple(
                make(t.OffsetFetchResponsePartition, partition_index=p, committed_offset=-1,
                     metadata="", error_code=error) for p in partitions))
            for name, partitions in wanted)
    else:
        topics = tuple(
            make(t.OffsetFetchResponseTopic, name=name, partitions=tuple(
                _fetched(t.OffsetFetchResponsePartition, index, c,
                         unstable(request.group_id, name, index)) for index, c in parts))
            for name, parts in rows)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=topics, error_code=error)


def _unstable_check(request: Any, ctx: RequestContext) -> Any:
    txn = ctx.broker.extras.get("transactions")
    if not getattr(request, "require_stable", False) or txn is None or not txn.loaded:
        return lambda _group, _topic, _partition: False
    return txn.unstable


def _fetched(cls: type, index: int, c: Any, unstable: bool = False) -> Any:
    """One partition of an OffsetFetch answer: its committed offset (``c``: a
    ``CommittedOffset``, None when nothing is committed, or ``TOPIC_DENIED``)."""
    if c is TOPIC_DENIED:
        return make(cls, partition_index=index, committed_offset=-1, committed_leader_epoch=-1,
                    metadata="", error_code=ErrorCode.topic_authorization_failed)
    if unstable:
        return make(cls, partition_index=index, committed_offset=-1, committed_leader_epoch=-1,
                    metadata="", error_code=ErrorCode.unstable_offset_commit)
    if c is None:
        return make(cls, partition_index=index, committed_offset=-1, committed_leader_epoch=-1,
                    metadata="", error_code=ErrorCode.none)
    # "" for commits stored with a null metadata before it was normalised on commit.
    return make(cls, partition_index=index, committed_offset=c.offset,
                committed_leader_epoch=c.leader_epoch, metadata=c.metadata or "",
                error_code=ErrorCode.none)


# --- OffsetDelete -----------------------------------------------------------------------


def offset_delete(request: Any, ctx: RequestContext) -> Deferred | Any:
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.DELETE, authz.GROUP, request.group_id):
        return make(ctx.response_type, error_code=ErrorCode.group_authorization_failed,
                    throttle_time=NO_THROTTLE, topics=())
    denied = _unreadable(ctx, request.topics)
    wanted: list[tuple[str, int]] = []
    unknown: set[tuple[str, int]] = set()
    for topic in request.topics:
        for p in topic.partitions:
            tp = (topic.name, int(p.partition_index))
            wanted.append(tp)
            if topic.name in denied or _partition_error(ctx, *tp) is not ErrorCode.none:
                unknown.add(tp)
    _consumer_groups(ctx)  # loaded, so a KIP-848 group is known as one
    d = coordinator(ctx.broker).delete_offsets(
        request.group_id, [tp for tp in wanted if tp not in unknown])

    def respond(outcome: tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]) -> Any:
        top, per = outcome
        if top is not ErrorCode.none:
            return make(ctx.response_type, error_code=top, throttle_time=NO_THROTTLE,
                        topics=())
        by_topic: dict[str, list[Any]] = {}
        for tp in wanted:
            code = (ErrorCode.topic_authorization_failed if tp[0] in denied
                    else ErrorCode.unknown_topic_or_partition if tp in unknown else per[tp])
            by_topic.setdefault(tp[0], []).append(
                make(t.OffsetDeleteResponsePartition, partition_index=tp[1], error_code=code))
        return make(ctx.response_type, error_code=ErrorCode.none, throttle_time=NO_THROTTLE,
                    topics=tuple(make(t.OffsetDeleteResponseTopic, name=name,
                                      partitions=tuple(parts))
                                 for name, parts in by_topic.items()))

    d.addCallbacks(respond, lambda f: respond((ErrorCode.coordinator_not_available, {})))
    return d


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(OFFSET_COMMIT, coordinated(offset_commit, _commit_error), 2, 9)
    dispatcher.register(OFFSET_FETCH, coordinated(offset_fetch, _fetch_error), 1, 9)
    dispatcher.register(OFFSET_DELETE, coordinated(offset_delete), 0, 0)


# --- answers when this node does not coordinate (see ``groups.coordinated``) -------------


def _commit_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(
        make(t.OffsetCommitResponseTopic, name=topic.name, partitions=tuple(
            make(t.OffsetCommitResponsePartition, partition_index=int(p.partition_index),
                 error_code=code) for p in topic.partitions))
        for topic in request.topics))


def _fetch_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    if ctx.api_version >= 8:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(
            make(t.OffsetFetchResponseGroup, group_id=g.group_id, topics=(), error_code=code)
            for g in request.groups))
    if ctx.api_version >= 2:
        return top_level_error(request, ctx, code)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code, topics=tuple(
        make(t.OffsetFetchResponseTopic, name=tp.name, partitions=tuple(
            make(t.OffsetFetchResponsePartition, partition_index=int(p), committed_offset=-1,
                 metadata="", error_code=code) for p in tp.partition_indexes))
        for tp in request.topics or ()))


__all__ = ["register"]
