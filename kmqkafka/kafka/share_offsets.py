"""Share-group offset admin (KIP-932): DescribeShareGroupOffsets (90, v0-v1),
AlterShareGroupOffsets (91, v0) and DeleteShareGroupOffsets (92, v0).

A share group's "offset" in a partition is its share-partition start offset (SPSO): every
record below it is done. Describe answers it (-1 where the group has never read the partition)
and, from v1, the lag: records at or above it that are not done yet. Alter moves it (the
in-flight window starts afresh there) and Delete forgets a topic's share-partitions; both only
while the group has no members, as Kafka requires (NON_EMPTY_GROUP otherwise).

ACLs, as Kafka's KafkaApis: Describe needs DESCRIBE on the group and on each named topic
(TOPIC_AUTHORIZATION_FAILED per partition; describing every topic leaves the others out);
Alter needs READ on the group and on each topic; Delete needs DELETE on the group and READ on
each topic. A refused group answers GROUP_AUTHORIZATION_FAILED.
"""
from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, succeed

from kmqkafka.coordinators.share_group import ShareGroupCoordinator
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, groups
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.share_groups import coordinator
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

DESCRIBE_OFFSETS, ALTER_OFFSETS, DELETE_OFFSETS = 90, 91, 92
_TOPIC_DENIED = "Topic authorization failed."


def describe_offsets(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    c = coordinator(ctx.broker)
    catalog = ctx.broker.extras["topics"]
    out = []
    for g in request.groups:
        if not authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, g.group_id):
            out.append(make(t.DescribeShareGroupOffsetsResponseGroup, group_id=g.group_id,
                            topics=(), error_code=ErrorCode.group_authorization_failed,
                            error_message=None))
            continue
        if g.group_id not in c.groups:
            out.append(make(t.DescribeShareGroupOffsetsResponseGroup, group_id=g.group_id,
                            topics=(), error_code=ErrorCode.group_id_not_found,
                            error_message=f"Group {g.group_id} not found."))
            continue
        if g.topics is not None:
            wanted = [(tp.topic_name, tuple(tp.partitions)) for tp in g.topics]
            visible = set(authz.filtered(ctx, authz.DESCRIBE, authz.TOPIC,
                                         sorted({name for name, _ in wanted})))
        else:  # every topic: those the principal may not describe are left out
            wanted = sorted(c.partitions_of(g.group_id).items())
            visible = set(authz.filtered(ctx, authz.DESCRIBE, authz.TOPIC,
                                         [name for name, _ in wanted]))
            wanted = [(name, parts) for name, parts in wanted if name in visible]
        topics = []
        for name, parts in wanted:
            denied = name not in visible
            topic = None if denied else catalog.get(name)
            rows = []
            for p in parts:
                message = None
                if denied:
                    code, start, lag = ErrorCode.topic_authorization_failed, -1, -1
                    message = _TOPIC_DENIED
                elif topic is None or not 0 <= p < topic.partitions:
                    code, start, lag = ErrorCode.unknown_topic_or_partition, -1, -1
                else:
                    code = ErrorCode.none
                    start, lag = c.start_and_lag(g.group_id, name, p)
                fields: dict[str, Any] = dict(partition_index=p, start_offset=start,
                                              leader_epoch=-1, error_code=code,
                                              error_message=message)
                if ctx.api_version >= 1:
                    fields["lag"] = lag
                rows.append(make(t.DescribeShareGroupOffsetsResponsePartition, **fields))
            topics.append(make(t.DescribeShareGroupOffsetsResponseTopic, topic_name=name,
                               topic_id=topic.topic_id if topic is not None else None,
                               partitions=tuple(rows)))
        out.append(make(t.DescribeShareGroupOffsetsResponseGroup, group_id=g.group_id,
                        topics=tuple(topics), error_code=ErrorCode.none, error_message=None))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(out))


def _empty_group_error(c: ShareGroupCoordinator, group_id: str) -> ErrorCode | None:
    group = c.groups.get(group_id)
    if group is None:
        return ErrorCode.group_id_not_found
    if group.members:
        return ErrorCode.non_empty_group
    return None


def alter_offsets(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.READ, authz.GROUP, request.group_id):
        return _top_error(request, ctx, ErrorCode.group_authorization_failed)
    c = coordinator(ctx.broker)
    catalog = ctx.broker.extras["topics"]
    top = _empty_group_error(c, request.group_id)
    if top is not None:
        return _top_error(request, ctx, top)
    out = []
    moves: dict[tuple[str, int], int] = {}
    for tp in request.topics:
        denied = not authz.allowed(ctx, authz.READ, authz.TOPIC, tp.topic_name)
        topic = None if denied else catalog.get(tp.topic_name)
        rows = []
        for p in tp.partitions:
            code = ErrorCode.none
            if denied:
                code = ErrorCode.topic_authorization_failed
            elif topic is None or not 0 <= p.partition_index < topic.partitions:
                code = ErrorCode.unknown_topic_or_partition
            elif p.start_offset < 0:
                code = ErrorCode.invalid_request
            else:
                moves[(tp.topic_name, int(p.partition_index))] = int(p.start_offset)
            rows.append(make(t.AlterShareGroupOffsetsResponsePartition,
                             partition_index=p.partition_index, error_code=code,
                             error_message=None))
        out.append(make(t.AlterShareGroupOffsetsResponseTopic, topic_name=tp.topic_name,
                        topic_id=topic.topic_id if topic is not None else None,
                        partitions=tuple(rows)))
    written = c.move_starts(request.group_id, moves) if moves else succeed(None)
    return written.addCallback(lambda _: make(
        ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        error_message=None, responses=tuple(out)))


def delete_offsets(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.DELETE, authz.GROUP, request.group_id):
        return _top_error(request, ctx, ErrorCode.group_authorization_failed)
    c = coordinator(ctx.broker)
    catalog = ctx.broker.extras["topics"]
    top = _empty_group_error(c, request.group_id)
    if top is not None:
        return _top_error(request, ctx, top)
    out = []
    writes: list[Deferred] = []
    for tp in request.topics:
        if not authz.allowed(ctx, authz.READ, authz.TOPIC, tp.topic_name):
            out.append(make(t.DeleteShareGroupOffsetsResponseTopic, topic_name=tp.topic_name,
                            topic_id=None, error_code=ErrorCode.topic_authorization_failed,
                            error_message=_TOPIC_DENIED))
            continue
        topic = catalog.get(tp.topic_name)
        code = ErrorCode.none if topic is not None else ErrorCode.unknown_topic_or_partition
        if topic is not None:
            writes.append(c.forget_group_topic(request.group_id, tp.topic_name))
        out.append(make(t.DeleteShareGroupOffsetsResponseTopic, topic_name=tp.topic_name,
                        topic_id=topic.topic_id if topic is not None else None,
                        error_code=code, error_message=None))
    d: Deferred = succeed(None)
    for w in writes:
        d.addCallback(lambda _, w=w: w)
    return d.addCallback(lambda _: make(
        ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        error_message=None, responses=tuple(out)))


def _describe_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(
        make(t.DescribeShareGroupOffsetsResponseGroup, group_id=g.group_id, topics=(),
             error_code=code, error_message=None) for g in request.groups))


def _top_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                error_message=None, responses=())


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(DESCRIBE_OFFSETS, groups.coordinated(describe_offsets, _describe_error),
                        0, 1)
    dispatcher.register(ALTER_OFFSETS, groups.coordinated(alter_offsets, _top_error), 0, 0)
    dispatcher.register(DELETE_OFFSETS, groups.coordinated(delete_offsets, _top_error), 0, 0)


__all__ = ["register"]
