"""Consumer-group APIs: FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13),
SyncGroup (14), DescribeGroups (15), ListGroups (16), DeleteGroups (42).

Thin handlers over ``kmqkafka.coordinators.group.GroupCoordinator``: they turn kio requests into
coordinator calls and results into kio responses of the request's version. The coordinator
lives at ``broker.extras["groups"]`` (``coordinator(broker)`` creates it on first use and
registers the lag collector; ``install(broker)`` does that eagerly from the tap). It loads its
durable state on first use after the store has recovered. A LeaveGroup naming a KIP-848 group
(admin tools removing members) goes to ``broker.extras["consumer_groups"]``. The
CreatePartitions handler calls
``broker.extras["groups"].rebalance_groups_subscribed_to(topic)``.

Clusters: coordinator state lives in memory on one node, so the Raft leader coordinates every
group. FindCoordinator answers with the leader (COORDINATOR_NOT_AVAILABLE while none is known);
and every transactional id (key type 1; ``transactions.py``); share-group keys get
INVALID_REQUEST.
``Coordination`` (``broker.extras["coordination"]``) follows leadership: when this node
becomes leader it passes a barrier (an empty write through Raft, so everything an
earlier leader committed is applied here), then reloads the coordinators from the replicated
store; until then it answers COORDINATOR_LOAD_IN_PROGRESS. When it stops leading it drops that
state (parked JoinGroup/SyncGroup calls get NOT_COORDINATOR). ``coordinated(handler)`` wraps
every group/offset handler: on the serving leader it runs locally; on a follower the request is
relayed to the leader (``kmqkafka.net.forward``) and its answer returned; a relayed request that
reaches a node that does not serve gets NOT_COORDINATOR.
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import CancelledError, Deferred, gatherResults, maybeDeferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.coordinators.group import (
    ClassicGroup, GroupCoordinator, JoinRequest, JoinResult, SyncResult,
)
from kmqkafka.coordinators.offsets import LagCollector
from kmqkafka.coordinators.group import GROUPS_FAMILY
from kmqkafka.dispatch import Dispatcher, error_response
from kmqkafka.kafka.acl import NOT_REQUESTED, authorized_operations
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.context import Broker, RequestContext
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.errors import StoreStopped

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42
CREATE_PARTITIONS = 37
DELETE_TOPICS = 20
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1
_CHECK_S = 0.1
_FORWARD_TIMEOUT_S = 30.0

log = Logger()


def install(broker: Broker) -> GroupCoordinator:
    """Create the broker's group coordinator (idempotent) and register its lag metric.

    Safe before the store has started: state is loaded on first use.
    """
    existing = broker.extras.get("groups")
    if existing is not None:
        return existing
    coordinator = GroupCoordinator(
        broker.reactor, broker.store, max_groups=broker.settings.kafka_max_groups,
        initial_rebalance_delay_ms=broker.settings.kafka_group_initial_rebalance_delay_ms,
        min_session_timeout_ms=broker.settings.kafka_group_min_session_timeout_ms,
        max_session_timeout_ms=broker.settings.kafka_group_max_session_timeout_ms)
    broker.extras["groups"] = coordinator

    coordination = Coordination(broker)
    broker.extras["coordination"] = coordination
    if coordination.clustered():
        coordination.start()

    def ready() -> bool:
        if not coordination.serving():
            return False
        if not coordinator.loaded and getattr(broker.store, "started", False):
            coordinator.load()
        return coordinator.loaded

    broker.metrics.registry.register(LagCollector(coordinator.offsets, broker.store, ready))
    topics = broker.extras.get("topics")
    if topics is not None:
        # Seed 004: growing a topic rebalances every group subscribed to it.
        topics.on_partitions_added(lambda topic: coordinator.rebalance_groups_subscribed_to(topic.name))
        # Kafka drops a deleted topic's committed offsets. The serving coordinator does it
        # (DeleteTopics is relayed to the leader, see ``register``).
        topics.on_deleted(lambda topic: coordinator.forget_topic(topic.name) if ready() else None)
    _expire_offsets_periodically(broker, coordinator, ready)
    return coordinator


def _expire_offsets_periodically(broker: Broker, coordinator: GroupCoordinator,
                                 ready: Callable[[], bool]) -> None:
    """Kafka's offset clean-up, every ``offsets.retention.check.interval.ms``, run by the
    node that serves the groups (its deletions replicate like any other)."""
    settings = broker.settings
    retention_ms = settings.kafka_offsets_retention_minutes * 60_000

    def run() -> None:
        if getattr(broker.store, "started", False) and ready():
            coordinator.expire_offsets(retention_ms).addErrback(
                lambda f: log.warn("offset expiry failed: {error}", error=f.getErrorMessage()))

    loop = LoopingCall(run)
    loop.clock = broker.reactor
    loop.start(settings.kafka_offsets_retention_check_interval_ms / 1000, now=False)
    broker.extras["offset_expiry"] = loop


class Coordination:
    """Whether this node coordinates groups now, and the transitions when leadership moves.

    On a lone node it always serves (and nothing here runs). In a cluster a check every
    ``_CHECK_S`` (and on every routed request) compares Raft leadership with what it serves.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.ready_term: int | None = None  # the term whose coordinator state is loaded
        self._loading_term: int | None = None
        self._timer: Any = None
        self.forwarder: Any = None
        self.reloads = 0
        self._leader: int | None = None  # the leader forwarded calls last went to

    def clustered(self) -> bool:
        return identity.clustered(self.broker)

    def serving(self) -> bool:
        """This node answers coordinator calls itself."""
        if not self.clustered():
            return True
        self.check()
        return self.ready_term is not None

    def start(self) -> None:
        if self._timer is None:
            self._timer = self.broker.reactor.callLater(_CHECK_S, self._tick)

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self.forwarder is not None:
            self.forwarder.close()

    def _tick(self) -> None:
        self._timer = None
        try:
            self.check()
        finally:
            self._timer = self.broker.reactor.callLater(_CHECK_S, self._tick)

    def check(self) -> None:
        broker = self.broker
        if not self.clustered() or not getattr(broker.store, "started", False):
            return
        term = identity.term(broker)
        self._follow_leader()
        if broker.store.is_leader():
            if self.ready_term == term or self._loading_term == term:
                return
            if self.ready_term is not None:
                self.unload("a new term began")
            self._loading_term = term
            log.info("node became raft leader (term {term}): loading group coordinator",
                     term=term)
            try:
                barrier = broker.store.keyed_put(GROUPS_FAMILY, [])
            except Exception as exc:  # a stopping store raises
                self._loading_term = None
                if not isinstance(exc, StoreStopped):
                    log.warn("coordinator barrier failed: {error}", error=exc)
                return
            barrier.addCallbacks(self._barrier_passed, self._barrier_failed,
                                 callbackArgs=(term,), errbackArgs=(term,))
        elif self.ready_term is not None or self._loading_term is not None:
            self._loading_term = None
            if self.ready_term is not None:
                self.unload("this node is no longer the raft leader")

    def _follow_leader(self) -> None:
        """When another node leads now, calls forwarded to the old leader are cut off (they
        fail retriably, and the client asks again, reaching the new leader)."""
        leader = self.broker.store.leader_id()
        if leader == self._leader or leader is None:
            return
        self._leader = leader
        if self.forwarder is None:
            return
        mine = leader == identity.node_id(self.broker)
        where = None if mine else identity.endpoint(self.broker, leader, "PLAINTEXT")
        if self.forwarder.leader_moved(where):
            log.info("raft leader is now node {leader}: calls forwarded to the old leader "
                     "were cut off", leader=leader)

    def _barrier_passed(self, _: object, term: int) -> None:
        if self._loading_term != term:
            return
        self._loading_term = None
        if not self.broker.store.is_leader() or identity.term(self.broker) != term:
            return
        self.unload("reloading")
        coordinator_now(self.broker)
        self.ready_term = term
        self.reloads += 1
        log.info("group coordinator serving for term {term}", term=term)

    def _barrier_failed(self, failure: Failure, term: int) -> None:
        if self._loading_term == term:
            self._loading_term = None  # the next check tries again
        if failure.check(StoreStopped):  # shutting down: nothing to load any more
            return
        log.warn("coordinator barrier failed (term {term}): {error}", term=term,
                 error=failure.getErrorMessage())

    def unload(self, reason: str) -> None:
        """Forget in-memory coordinator state: cancel timers, release parked calls (a
        JoinGroup or SyncGroup waiting for its rebalance is answered NOT_COORDINATOR, so
        its client looks for the coordinator again). Also at shut-down, as Kafka's
        controlled shutdown unloads the groups it coordinates."""
        self.ready_term = None
        broker = self.broker
        txn = broker.extras.get("transactions")
        if txn is not None:
            txn.unload()
        share = broker.extras.get("share_groups")
        if share is not None:
            share.unload()
        classic = broker.extras.get("groups")
        cg = broker.extras.get("consumer_groups")
        if cg is not None:
            if cg.loaded:
                cg.stop()
            cg.groups.clear()
            cg.loaded = False
        if classic is not None:
            if classic.loaded:
                classic.stop()
                for group in classic.groups.values():
                    for m in group.members.values():
                        join, m.join_waiter = m.join_waiter, None
                        sync, m.sync_waiter = m.sync_waiter, None
                        m.awaiting_join = False
                        if join is not None and not join.called:
                            join.callback(JoinResult(ErrorCode.not_coordinator, m.member_id))
                        if sync is not None and not sync.called:
                            sync.callback(SyncResult(ErrorCode.not_coordinator))
            classic.groups.clear()
            classic.offsets._by_group.clear()
            classic.loaded = False
        log.info("group coordinator state dropped: {reason}", reason=reason)

    def forward(self, request: Any, ctx: RequestContext) -> Deferred | None:
        """Relay ``request`` to the leader's Kafka listener; None when no leader is known."""
        from kmqkafka.net.forward import Forwarder, wrap

        leader = self.broker.store.leader_id()
        if leader is None or leader == identity.node_id(self.broker):
            return None
        where = identity.endpoint(self.broker, leader, "PLAINTEXT")
        if where is None:
            return None
        if self.forwarder is None:
            sasl = self.broker.extras.get("sasl")
            self.forwarder = Forwarder(
                self.broker.reactor,
                credentials=None if sasl is None else sasl.node_credentials)
        parked = ctx.api_key in (JOIN_GROUP, SYNC_GROUP)
        timeout = _FORWARD_TIMEOUT_S
        if ctx.api_key == JOIN_GROUP:
            timeout = max(timeout, _ms(getattr(request, "rebalance_timeout",
                                               request.session_timeout)) / 1000 + 10)
        return self.forwarder.call(where[0], where[1], request, wrap(ctx.peer, ctx.principal, ctx.client_id),
                                   exclusive=parked, timeout_s=timeout)


ErrorBuilder = Callable[[Any, RequestContext, ErrorCode], Any]


def top_level_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    response = error_response(ctx.response_type, code)
    if response is None:
        raise TypeError(f"{ctx.response_type.__name__} has no top-level error code")
    return response


def _relayed_ctx(ctx: RequestContext) -> tuple[RequestContext, bool]:
    """A relayed request's context as its client sent it: the original peer and client id,
    and, when the relaying connection is another node's, the original principal (authorized
    by ACLs here). A connection that merely claims to relay keeps its own principal."""
    from kmqkafka.net.forward import unwrap

    original = unwrap(ctx.client_id)
    if original is None:
        return ctx, False
    peer, principal, client_id = original
    if not _relays_for_nodes(ctx):
        principal = ctx.principal
    return dataclasses.replace(ctx, peer=peer, principal=principal, client_id=client_id), True


def _relays_for_nodes(ctx: RequestContext) -> bool:
    """Does this connection come from a node of the cluster? With SASL it authenticated as the
    user nodes relay as (``SaslUsers.node_credentials``); without, it comes from a peer's
    configured host (or loopback, for peers named by a loopback address)."""
    broker = ctx.broker
    sasl = broker.extras.get("sasl")
    if sasl is not None:
        node = sasl.node_credentials
        return node is not None and ctx.principal == f"User:{node[1]}"
    from kmqkafka.kafka.authz import host_of

    hosts = {p.kafka_host for p in broker.settings.peers} | {
        p.raft_host for p in broker.settings.peers}
    if hosts & {"localhost", "127.0.0.1", "::1"}:
        hosts |= {"127.0.0.1", "::1", "localhost"}
    return host_of(ctx.peer) in hosts


def coordinated(handler: Callable[[Any, RequestContext], Any],
                on_error: ErrorBuilder = top_level_error) -> Callable[[Any, RequestContext], Any]:
    """Wrap a group/offset handler so that only the serving leader runs it (see module doc)."""

    def routed(request: Any, ctx: RequestContext) -> Any:
        ctx, relayed = _relayed_ctx(ctx)
        coordination: Coordination | None = ctx.broker.extras.get("coordination")
        if coordination is None or not coordination.clustered():
            return handler(request, ctx)
        if coordination.serving():
            return handler(request, ctx)
        store = ctx.broker.store
        if store.is_leader():
            return on_error(request, ctx, ErrorCode.coordinator_load_in_progress)
        if relayed:
            return on_error(request, ctx, ErrorCode.not_coordinator)
        d = coordination.forward(request, ctx)
        if d is None:
            return on_error(request, ctx, ErrorCode.coordinator_not_available)

        def unreachable(f: Failure) -> Any:
            if f.check(CancelledError):
                return f
            log.info("forwarding {api} to the leader failed: {error}", api=ctx.api_key,
                     error=f.getErrorMessage())
            return on_error(request, ctx, ErrorCode.coordinator_not_available)

        return d.addErrback(unreachable)

    routed.__name__ = getattr(handler, "__name__", "routed")
    return routed


def leader_routed(handler: Callable[[Any, RequestContext], Any]
                  ) -> Callable[[Any, RequestContext], Any]:
    """Run an admin handler on the leader when one is known (its side effects, such as the
    rebalance CreatePartitions triggers, belong to the coordinator there); otherwise locally
    (the store forwards its commands itself)."""

    def routed(request: Any, ctx: RequestContext) -> Any:
        ctx, relayed = _relayed_ctx(ctx)
        coordination: Coordination | None = ctx.broker.extras.get("coordination")
        if (relayed or coordination is None or not coordination.clustered()
                or ctx.broker.store.is_leader()):
            return handler(request, ctx)
        d = coordination.forward(request, ctx)
        if d is None:
            return handler(request, ctx)
        return d.addErrback(lambda f: f if f.check(CancelledError) else
                            maybeDeferred(handler, request, ctx))

    routed.__name__ = getattr(handler, "__name__", "routed")
    return routed


def coordinator_now(broker: Broker) -> GroupCoordinator:
    """Load both coordinators from the store (classic first)."""
    c = coordinator(broker)
    cg = broker.extras.get("consumer_groups")
    if cg is not None and not cg.loaded:
        cg.load()
    txn = broker.extras.get("transactions")
    if txn is not None and not txn.loaded:
        txn.load()
    return c


def coordinator(broker: Broker) -> GroupCoordinator:
    """The loaded group coordinator of ``broker`` (created on first use)."""
    c = broker.extras.get("groups") or install(broker)
    if not c.loaded:
        c.load()
    return c


def _consumer_groups(broker: Broker) -> Any:
    """The loaded KIP-848 coordinator (``kmqkafka.kafka.consumer_groups``), or None."""
    cg = broker.extras.get("consumer_groups")
    if cg is not None and not cg.loaded:
        coordinator(broker)
        cg.load()
    return cg


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def _client_host(ctx: RequestContext) -> str:
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    return f"/{host}" if host else ""


# --- FindCoordinator --------------------------------------------------------------------


def find_coordinator(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    key_type = int(getattr(request, "key_type", 0))
    # The Raft leader coordinates every group (this node on a lone broker).
    leader = identity.leader(ctx.broker)
    where = identity.endpoint(ctx.broker, leader, ctx.listener) if leader is not None else None
    me, (host, port) = (leader, where) if where is not None else (-1, ("", -1))
    topics = ctx.broker.extras.get("topics")
    keys = [request.key] if ctx.api_version < 4 else list(request.coordinator_keys)
    if (key_type == KEY_TYPE_GROUP and where is not None and topics is not None
            and any(_may_find(ctx, key_type, k) for k in keys)):
        topics.ensure_offsets_topic()  # Kafka creates it now; the answer need not wait

    def answer(key: str) -> tuple[ErrorCode, str | None]:
        if key_type in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
            if not _may_find(ctx, key_type, key):
                # Kafka checks before looking anything up: a key the principal may not
                # describe learns nothing, not even where its coordinator is.
                if key_type == KEY_TYPE_GROUP:
                    return ErrorCode.group_authorization_failed, _GROUP_DENIED
                return ErrorCode.transactional_id_authorization_failed, _TXN_DENIED
            if where is None:
                return ErrorCode.coordinator_not_available, "no raft leader is known"
            return ErrorCode.none, None
        return ErrorCode.invalid_request, f"unsupported key type {key_type}"

    if ctx.api_version < 4:
        code, message = answer(request.key)
        ok = code is ErrorCode.none
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                    error_message=message, node_id=me if ok else -1, host=host if ok else "",
                    port=port if ok else -1)
    out = []
    for key in request.coordinator_keys:
        code, message = answer(key)
        ok = code is ErrorCode.none
        out.append(make(t.Coordinator, key=key, node_id=me if ok else -1,
                        host=host if ok else "", port=port if ok else -1, error_code=code,
                        error_message=message))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, coordinators=tuple(out))


_GROUP_DENIED = "Group authorization failed."
_TXN_DENIED = "Transactional Id authorization failed."


def _may_find(ctx: RequestContext, key_type: int, key: str) -> bool:
    """FindCoordinator needs DESCRIBE on the group or transactional id it names."""
    if key_type == KEY_TYPE_GROUP:
        return authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, key)
    if key_type == KEY_TYPE_TRANSACTION:
        return authz.allowed(ctx, authz.DESCRIBE, authz.TRANSACTIONAL_ID, key)
    return True


def may_read_group(ctx: RequestContext, group_id: str) -> bool:
    """READ on the group: what a member needs to join, sync, heartbeat, leave and commit."""
    return authz.allowed(ctx, authz.READ, authz.GROUP, group_id)


# --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ------------------------------------


def join_group(request: Any, ctx: RequestContext) -> Deferred | Any:
    if not may_read_group(ctx, request.group_id):
        return _join_response(JoinResult(ErrorCode.group_authorization_failed), ctx)
    session_ms = _ms(request.session_timeout)
    rebalance_ms = _ms(getattr(request, "rebalance_timeout", session_ms))
    if rebalance_ms < 0:
        rebalance_ms = session_ms
    req = JoinRequest(
        group_id=request.group_id, member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
        client_id=ctx.client_id or "", client_host=_client_host(ctx),
        require_known_member_id=ctx.api_version >= 4,
        supports_skip_assignment=ctx.api_version >= 9)
    if request.group_id in dict(share_group_states(ctx.broker)):
        # A share group takes no classic members (as Kafka refuses a consumer group's).
        return _join_response(JoinResult(ErrorCode.inconsistent_group_protocol,
                                         request.member_id), ctx)
    d = coordinator(ctx.broker).join(req)
    return d.addCallback(_join_response, ctx)


def _join_response(result: JoinResult, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    members = tuple(make(t.JoinGroupResponseMember, member_id=m.member_id,
                         group_instance_id=m.group_instance_id, metadata=m.metadata)
                    for m in result.members)
    protocol_name = result.protocol_name
    if protocol_name is None and ctx.api_version < 7:
        protocol_name = ""  # a non-nullable string before v7
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=result.error,
                generation_id=result.generation_id, protocol_type=result.protocol_type,
                protocol_name=protocol_name, leader=result.leader,
                skip_assignment=result.skip_assignment, member_id=result.member_id,
                members=members)


def sync_group(request: Any, ctx: RequestContext) -> Deferred | Any:
    if not may_read_group(ctx, request.group_id):
        return _sync_response(SyncResult(ErrorCode.group_authorization_failed), ctx)
    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
    d = coordinator(ctx.broker).sync(
        request.group_id, request.member_id, getattr(request, "group_instance_id", None),
        int(request.generation_id), getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None), assignments)
    return d.addCallback(_sync_response, ctx)


def _sync_response(result: SyncResult, ctx: RequestContext) -> Any:
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=result.error,
                protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                assignment=result.assignment)


def heartbeat(request: Any, ctx: RequestContext) -> Any:
    if not may_read_group(ctx, request.group_id):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.group_authorization_failed)
    code = coordinator(ctx.broker).heartbeat(
        request.group_id, request.member_id, getattr(request, "group_instance_id", None),
        int(request.generation_id))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code)


def leave_group(request: Any, ctx: RequestContext) -> Deferred | Any:
    if ctx.api_version < 3:
        wanted: list[tuple[str, str | None]] = [(request.member_id, None)]
    else:
        wanted = [(m.member_id, m.group_instance_id) for m in request.members]
    if not may_read_group(ctx, request.group_id):
        return _leave_response(ctx, wanted, ErrorCode.group_authorization_failed, [])
    c = coordinator(ctx.broker)
    cg = _consumer_groups(ctx.broker)
    if cg is not None and cg.owns(request.group_id):
        # Admin tools remove members of a KIP-848 group with a classic LeaveGroup too.
        errors, written = cg.leave_members(request.group_id, wanted)
        return written.addCallbacks(
            lambda _: _leave_response(ctx, wanted, ErrorCode.none, errors),
            lambda f: _leave_response(ctx, wanted, ErrorCode.coordinator_not_available, []))
    top, errors = c.leave(request.group_id, wanted)
    return _leave_response(ctx, wanted, top, errors)


def _leave_response(ctx: RequestContext, wanted: list[tuple[str, str | None]], top: ErrorCode,
                    errors: list[ErrorCode]) -> Any:
    if ctx.api_version < 3:
        code = top if top is not ErrorCode.none else errors[0]
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code)
    t = types_of(ctx)
    members = () if top is not ErrorCode.none else tuple(
        make(t.MemberResponse, member_id=member_id, group_instance_id=instance_id,
             error_code=code)
        for (member_id, instance_id), code in zip(wanted, errors))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=top, members=members)


# --- DescribeGroups / ListGroups / DeleteGroups -----------------------------------------


def describe_groups(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    c = coordinator(ctx.broker)
    cg = _consumer_groups(ctx.broker)
    out = []
    requested = bool(getattr(request, "include_authorized_operations", False))
    for group_id in request.groups:
        if not authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, group_id):
            out.append(make(t.DescribedGroup, error_code=ErrorCode.group_authorization_failed,
                            error_message=_GROUP_DENIED if ctx.api_version >= 6 else None,
                            group_id=group_id, group_state="", protocol_type="",
                            protocol_data="", members=(),
                            authorized_operations=NOT_REQUESTED))
            continue
        # A consumer (KIP-848) group is not a classic group: Kafka describes it Dead, with
        # GROUP_ID_NOT_FOUND from v6 on (ConsumerGroupDescribe describes it).
        not_classic = cg is not None and cg.describe(group_id) is not None
        described = None if not_classic else c.describe(group_id)
        if described is None:
            code = ErrorCode.group_id_not_found if ctx.api_version >= 6 else ErrorCode.none
            why = "is not a classic group" if not_classic else "not found"
            out.append(make(t.DescribedGroup, error_code=code,
                            error_message=f"Group {group_id} {why}." if ctx.api_version >= 6
                            else None,
                            group_id=group_id, group_state="Dead", protocol_type="",
                            protocol_data="", members=(),
                            authorized_operations=NOT_REQUESTED))
            continue
        members = tuple(
            make(t.DescribedGroupMember, member_id=m.member_id,
                 group_instance_id=m.group_instance_id, client_id=m.client_id,
                 client_host=m.client_host, member_metadata=m.metadata,
                 member_assignment=m.assignment)
            for m in described.members)
        out.append(make(t.DescribedGroup, error_code=ErrorCode.none, error_message=None,
                        group_id=group_id, group_state=described.state,
                        protocol_type=described.protocol_type,
                        protocol_data=described.protocol_name, members=members,
                        authorized_operations=authorized_operations(
                            ctx, requested, authz.GROUP, group_id)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(out))


def listed_by_coordinator(handler: Callable[[Any, RequestContext], Any]
                          ) -> Callable[[Any, RequestContext], Any]:
    """ListGroups: a Kafka broker lists the groups it coordinates, and admin clients ask every
    broker and merge the answers. Here the Raft leader coordinates every group, so another
    member of a cluster lists none (relaying to the leader made kafka-python's
    ``list_groups`` name each group once per node)."""
    routed = coordinated(handler)

    def listed(request: Any, ctx: RequestContext) -> Any:
        coordination: Coordination | None = ctx.broker.extras.get("coordination")
        if (coordination is not None and coordination.clustered()
                and not coordination.serving() and not ctx.broker.store.is_leader()):
            return make(ctx.response_type, throttle_time=NO_THROTTLE,
                        error_code=ErrorCode.none, groups=())
        return routed(request, ctx)

    listed.__name__ = getattr(handler, "__name__", "listed")
    return listed


def group_ids(broker: Broker) -> list[str]:
    """Every group this node coordinates, classic and KIP-848, sorted."""
    ids = [g for g, _kind, _state in coordinator(broker).list_groups()]
    cg = _consumer_groups(broker)
    if cg is not None:
        ids += [g for g, _state in cg.list_groups()]
    ids += [g for g, _state in share_group_states(broker)]
    return sorted(set(ids))


def share_group_states(broker: Broker) -> list[tuple[str, str]]:
    """``(group_id, state)`` of every KIP-932 share group this node serves."""
    sc = broker.extras.get("share_groups")
    if sc is None:
        return []
    if not sc.loaded:
        sc.load()
    return sc.list_groups()


def list_groups(request: Any, ctx: RequestContext) -> Any:
    """Every group for a principal that may DESCRIBE the cluster; otherwise only the groups
    it may DESCRIBE (Kafka lists, never refuses)."""
    t = types_of(ctx)
    states = {s.lower() for s in getattr(request, "states_filter", ())}
    types = {s.lower() for s in getattr(request, "types_filter", ())}
    out = []
    everything = authz.allowed(ctx, authz.DESCRIBE, authz.CLUSTER, authz.CLUSTER_NAME)

    def visible(group_id: str) -> bool:
        return everything or authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, group_id)

    for group_id, protocol_type, state in coordinator(ctx.broker).list_groups():
        if states and state.lower() not in states:
            continue
        if (types and "classic" not in types) or not visible(group_id):
            continue
        out.append(make(t.ListedGroup, group_id=group_id, protocol_type=protocol_type,
                        group_state=state, group_type="classic"))
    cg = _consumer_groups(ctx.broker)
    for group_id, state in cg.list_groups() if cg is not None else ():
        if ((states and state.lower() not in states) or (types and "consumer" not in types)
                or not visible(group_id)):
            continue
        out.append(make(t.ListedGroup, group_id=group_id, protocol_type="consumer",
                        group_state=state, group_type="consumer"))
    for group_id, state in share_group_states(ctx.broker):
        if ((states and state.lower() not in states) or (types and "share" not in types)
                or not visible(group_id)):
            continue
        out.append(make(t.ListedGroup, group_id=group_id, protocol_type="share",
                        group_state=state, group_type="share"))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                groups=tuple(out))


def delete_groups(request: Any, ctx: RequestContext) -> Deferred:
    """Delete the named groups the principal may DELETE; the others answer
    GROUP_AUTHORIZATION_FAILED and are left alone."""
    t = types_of(ctx)
    denied = {g: ErrorCode.group_authorization_failed for g in request.groups_names
              if not authz.allowed(ctx, authz.DELETE, authz.GROUP, g)}
    names = [g for g in request.groups_names if g not in denied]
    c = coordinator(ctx.broker)
    cg = _consumer_groups(ctx.broker)
    consumer: dict[str, ErrorCode] = {}
    consumer_written: Deferred | None = None
    if cg is not None:
        consumer, consumer_written = cg.delete_groups(names)
        deleted = [g for g, code in consumer.items() if code is ErrorCode.none]
        if deleted:  # their offsets go through the classic coordinator's offset store
            c.groups.update({g: ClassicGroup(g) for g in deleted})
    sc = ctx.broker.extras.get("share_groups")
    share: dict[str, ErrorCode] = {}
    share_written: list[Deferred] = []
    if sc is not None:
        if not sc.loaded:
            sc.load()
        for g in names:
            if g in sc.groups and g not in consumer:
                share[g], written = sc.delete_group(g)
                share_written.append(written)
    consumer.update(share)
    if share_written:
        consumer_written = gatherResults(
            share_written + ([consumer_written] if consumer_written is not None else []),
            consumeErrors=True)
    d = c.delete_groups([g for g in names if g not in consumer or
                         (consumer[g] is ErrorCode.none and g not in share)])
    if consumer_written is not None:
        d.addCallback(lambda results: consumer_written.addCallback(lambda _: results))
    d.addCallback(lambda results: {**results, **{g: e for g, e in consumer.items()
                                                  if e is not ErrorCode.none or g in share},
                                   **denied})
    return d.addCallback(lambda results: make(
        ctx.response_type, throttle_time=NO_THROTTLE,
        results=tuple(make(t.DeletableGroupResult, group_id=g, error_code=results[g])
                      for g in dict.fromkeys(request.groups_names))))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(FIND_COORDINATOR, find_coordinator, 0, 6)
    dispatcher.register(JOIN_GROUP, coordinated(join_group), 0, 9, wait_only=True)
    dispatcher.register(HEARTBEAT, coordinated(heartbeat, _heartbeat_error), 0, 4)
    dispatcher.register(LEAVE_GROUP, coordinated(leave_group), 0, 5)
    dispatcher.register(SYNC_GROUP, coordinated(sync_group), 0, 5, wait_only=True)
    dispatcher.register(DESCRIBE_GROUPS, coordinated(describe_groups, _describe_error), 0, 6)
    dispatcher.register(LIST_GROUPS, listed_by_coordinator(list_groups), 0, 5)
    dispatcher.register(DELETE_GROUPS, coordinated(delete_groups, _delete_error), 0, 2)
    # Growing a topic rebalances the groups subscribed to it, and deleting one drops its
    # committed offsets: both belong on the coordinator.
    dispatcher.wrap(CREATE_PARTITIONS, leader_routed)
    dispatcher.wrap(DELETE_TOPICS, leader_routed)


def _heartbeat_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    """A new leader still loading its groups answers a Heartbeat with NONE, as Kafka's
    coordinators do ("respond blindly"): kafka-python and aiokafka have no case for
    COORDINATOR_LOAD_IN_PROGRESS there, and aiokafka's consumer dies of it."""
    if code is ErrorCode.coordinator_load_in_progress:
        code = ErrorCode.none
    return top_level_error(request, ctx, code)


def _describe_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(
        make(t.DescribedGroup, error_code=code, error_message=None, group_id=g,
             group_state="", protocol_type="", protocol_data="", members=(),
             authorized_operations=NOT_REQUESTED)
        for g in request.groups))


def _delete_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(
        make(t.DeletableGroupResult, group_id=g, error_code=code)
        for g in dict.fromkeys(request.groups_names)))


__all__ = ["Coordination", "coordinated", "coordinator", "install", "leader_routed", "register"]
