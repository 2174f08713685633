"""KIP-848 consumer-group APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

Thin handlers over ``kmqkafka.coordinators.consumer_group.ConsumerGroupCoordinator``, which lives
at ``broker.extras["consumer_groups"]`` (``install(broker)`` creates it beside the classic
coordinator, links the two and subscribes it to partition-count increases; state loads on first
use after the store has recovered). Assignments travel as topic ids; ConsumerGroupDescribe adds
the topic names from ``broker.extras["topics"]``.

Heartbeat v0 lets the coordinator pick the member id when it is empty; v1 (KIP-1082) requires
the client's own id.

ACLs, as Kafka's KafkaApis: a heartbeat needs READ on the group (GROUP_AUTHORIZATION_FAILED),
and DESCRIBE on every topic it names (TOPIC_AUTHORIZATION_FAILED, the member is not changed);
describing needs DESCRIBE on the group, and a group whose members are assigned topics the
principal may not describe answers TOPIC_AUTHORIZATION_FAILED without its members.
"""
from __future__ import annotations

import datetime
import uuid
from typing import Any, Callable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred

from kmqkafka.coordinators.assignors import Assignment
from kmqkafka.coordinators.consumer_group import (
    ConsumerGroupCoordinator, HeartbeatRequest, HeartbeatResult,
)
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka.acl import NOT_REQUESTED, authorized_operations
from kmqkafka.kafka import authz, groups
from kmqkafka.kafka.context import Broker, RequestContext
from kmqkafka.kafka.group_configs import GroupConfigs
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
MEMBER_TYPE_CLASSIC = 0  # ConsumerGroupDescribe v1's MemberType (KAFKA-17750)
MEMBER_TYPE_CONSUMER = 1


def install(broker: Broker) -> ConsumerGroupCoordinator:
    """Create the broker's consumer-group coordinator (idempotent); safe before the store starts."""
    existing = broker.extras.get("consumer_groups")
    if existing is not None:
        return existing
    classic = groups.install(broker)
    settings = broker.settings
    session_ms = getattr(settings, "kafka_consumer_session_timeout_ms", 45000)
    heartbeat_ms = getattr(settings, "kafka_consumer_heartbeat_interval_ms", 5000)
    configs = broker.extras.setdefault("group_configs", GroupConfigs(
        broker.store, session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_ms))
    coordinator = ConsumerGroupCoordinator(
        broker.reactor, broker.store, broker.extras["topics"], classic,
        max_groups=settings.kafka_max_groups, session_timeout_ms=session_ms,
        heartbeat_interval_ms=heartbeat_ms, group_configs=configs)
    classic.consumer_groups = coordinator
    broker.extras["consumer_groups"] = coordinator
    broker.extras["topics"].on_partitions_added(
        lambda topic: coordinator.partitions_added(topic.name) if coordinator.loaded else None)
    return coordinator


def coordinator(broker: Broker) -> ConsumerGroupCoordinator:
    """The loaded consumer-group coordinator (after the classic one has loaded)."""
    c = broker.extras.get("consumer_groups") or install(broker)
    if not c.loaded:
        groups.coordinator(broker)  # loads the classic coordinator first
        c.load()
    return c


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


# --- ConsumerGroupHeartbeat -------------------------------------------------------------


GROUP_DENIED = "Group authorization failed."
TOPICS_DENIED = "The group has described topic(s) that the client is not authorized to describe."


def refused_heartbeat(ctx: RequestContext, group_id: str, names: Any) -> HeartbeatResult | None:
    """A KIP-848 or share heartbeat's ACL verdict, None when allowed: READ on the group, and
    DESCRIBE on every subscribed topic it names (a client may not learn of topics it may not
    describe). Kafka answers these before the coordinator sees the request."""
    if not groups.may_read_group(ctx, group_id):
        return HeartbeatResult(ErrorCode.group_authorization_failed, GROUP_DENIED, None, 0)
    if names and hidden_topics(ctx, names):
        return HeartbeatResult(ErrorCode.topic_authorization_failed, None, None, 0)
    return None


def hidden_topics(ctx: RequestContext, names: Any) -> bool:
    """Is one of ``names`` a topic the principal may not describe?"""
    wanted = sorted(set(names))
    return len(authz.filtered(ctx, authz.DESCRIBE, authz.TOPIC, wanted)) < len(wanted)


def denied_group(t: Any, group_id: str, code: ErrorCode, message: str | None) -> Any:
    """A described group refused by the ACLs: Kafka's answer carries nothing but the id and
    the error (every other field at its schema default)."""
    return make(t.DescribedGroup, error_code=code, error_message=message, group_id=group_id,
                group_state="", group_epoch=0, assignment_epoch=0, assignor_name="",
                members=(), authorized_operations=NOT_REQUESTED)


def heartbeat(request: Any, ctx: RequestContext) -> Deferred | Any:
    refused = refused_heartbeat(ctx, request.group_id, request.subscribed_topic_names)
    if refused is not None:
        return heartbeat_response(refused, ctx)
    owned = None
    if request.topic_partitions is not None:
        owned = {str(tp.topic_id): frozenset(int(p) for p in tp.partitions)
                 for tp in request.topic_partitions if tp.partitions}
    names = request.subscribed_topic_names
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    req = HeartbeatRequest(
        group_id=request.group_id, member_id=request.member_id,
        member_epoch=int(request.member_epoch), instance_id=request.instance_id,
        rack_id=request.rack_id, rebalance_timeout_ms=_ms(request.rebalance_timeout),
        subscribed_topic_names=None if names is None else tuple(names),
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor, owned=owned,
        client_id=ctx.client_id or "", client_host=f"/{host}" if host else "",
        client_generates_id=ctx.api_version >= 1,
        describable=_describable(ctx) if authz.enabled(ctx) else None)
    if request.group_id in dict(groups.share_group_states(ctx.broker)):
        return heartbeat_response(HeartbeatResult(
            ErrorCode.group_id_not_found, f"Group {request.group_id} is not a consumer group.",
            request.member_id, -1, 0, None), ctx)
    return coordinator(ctx.broker).heartbeat(req).addCallback(heartbeat_response, ctx)


def _describable(ctx: RequestContext) -> Callable[[list[str]], list[str]]:
    """The topics a regex may subscribe this member to: those its principal may describe."""
    return lambda names: authz.filtered(ctx, authz.DESCRIBE, authz.TOPIC, names)


def _topic_partitions(cls: type, a: Assignment) -> tuple[Any, ...]:
    return tuple(make(cls, topic_id=uuid.UUID(t), partitions=tuple(sorted(ps)))
                 for t, ps in sorted(a.items()) if ps)


def heartbeat_response(result: HeartbeatResult, ctx: RequestContext) -> Any:
    """The heartbeat answer of a KIP-848 group (or a share group: the same fields, its
    assignment keyed by topic id too)."""
    t = types_of(ctx)
    assignment = None
    if result.assignment is not None:
        assignment = make(t.Assignment,
                          topic_partitions=_topic_partitions(t.TopicPartitions, result.assignment))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=result.error,
                error_message=result.message, member_id=result.member_id,
                member_epoch=result.member_epoch,
                heartbeat_interval=datetime.timedelta(milliseconds=result.heartbeat_interval_ms),
                assignment=assignment)


# --- ConsumerGroupDescribe --------------------------------------------------------------


def describe(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    c = coordinator(ctx.broker)
    catalog = ctx.broker.extras["topics"]
    names: dict[str, str] = {}

    def name_of(topic_id: str) -> str:
        if topic_id not in names:
            topic = catalog.by_id(uuid.UUID(topic_id))
            names[topic_id] = topic.name if topic is not None else ""
        return names[topic_id]

    def assignment(a: Assignment) -> Any:
        return make(t.Assignment, topic_partitions=tuple(
            make(t.TopicPartitions, topic_id=uuid.UUID(tid), topic_name=name_of(tid),
                 partitions=tuple(sorted(ps)))
            for tid, ps in sorted(a.items()) if ps))

    out = []
    requested = bool(getattr(request, "include_authorized_operations", False))
    for group_id in request.group_ids:
        if not authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, group_id):
            out.append(denied_group(t, group_id, ErrorCode.group_authorization_failed, None))
            continue
        view = c.describe(group_id)
        if view is None:
            message = (f"Group {group_id} is not a consumer group."
                       if group_id in groups.coordinator(ctx.broker).groups
                       else f"Group {group_id} not found.")
            out.append(make(t.DescribedGroup, error_code=ErrorCode.group_id_not_found,
                            error_message=message, group_id=group_id, group_state="Dead",
                            group_epoch=-1, assignment_epoch=-1, assignor_name="", members=(),
                            authorized_operations=NOT_REQUESTED))
            continue
        members = tuple(
            make(t.Member, member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                 member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                 subscribed_topic_names=m.topics, subscribed_topic_regex=m.regex,
                 assignment=assignment(m.assignment),
                 target_assignment=assignment(m.target),
                 member_type=MEMBER_TYPE_CLASSIC if m.classic else MEMBER_TYPE_CONSUMER)
            for m in view.members)
        # Kafka hides a group whose (target) assignments name a topic the principal may not
        # describe.
        if hidden_topics(ctx, {tp.topic_name for m in members
                               for tp in m.assignment.topic_partitions
                               + m.target_assignment.topic_partitions} - {""}):
            out.append(denied_group(t, group_id, ErrorCode.topic_authorization_failed,
                                    TOPICS_DENIED))
            continue
        out.append(make(t.DescribedGroup, error_code=ErrorCode.none, error_message=None,
                        group_id=group_id, group_state=view.state, group_epoch=view.epoch,
                        assignment_epoch=view.assignment_epoch, assignor_name=view.assignor,
                        members=members, authorized_operations=authorized_operations(
                            ctx, requested, authz.GROUP, group_id)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(out))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(CONSUMER_GROUP_HEARTBEAT, groups.coordinated(heartbeat), 0, 1)
    dispatcher.register(CONSUMER_GROUP_DESCRIBE, groups.coordinated(describe, describe_error),
                        0, 1)


def describe_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(
        make(t.DescribedGroup, error_code=code, error_message=None, group_id=g,
             group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="",
             members=(), authorized_operations=NOT_REQUESTED)
        for g in request.group_ids))


__all__ = ["coordinator", "denied_group", "describe_error", "heartbeat_response",
           "hidden_topics", "install", "refused_heartbeat", "register"]
