"""KIP-932 share groups: ShareGroupHeartbeat (76), ShareGroupDescribe (77), ShareFetch (78)
and ShareAcknowledge (79), version 1 (Kafka 4.1's, which librdkafka's share consumer speaks).

Thin handlers over ``kmqkafka.coordinators.share_group.ShareGroupCoordinator`` at
``broker.extras["share_groups"]``. The group coordinator and every partition leader are the
same node here (the Raft leader), so ShareFetch and ShareAcknowledge run where the state is;
every handler is ``coordinated`` (relayed to the leader from a follower).

ShareFetch: acknowledgements first (made durable before the answer), then, for each partition
of the share session, records are acquired for the member: AVAILABLE ones below the
partition's ``next`` (redeliveries) and new ones past it, whole stored batches at a time, up to
``max_records`` and ``max_bytes``. The stored batches go out as they are, with the acquired
ranges and their delivery counts; a client delivers only records inside them. With nothing to
acquire the request parks until data arrives, a lock runs out, a record is released, or
``max_wait`` passes.

ACLs, as Kafka's KafkaApis: heartbeats need READ on the group and DESCRIBE on the topics they
name; describing needs DESCRIBE on the group (a group assigned topics the principal may not
describe answers TOPIC_AUTHORIZATION_FAILED). ShareFetch and ShareAcknowledge need READ on the
group (top-level GROUP_AUTHORIZATION_FAILED) and READ on each topic: the partitions of other
topics answer TOPIC_AUTHORIZATION_FAILED, acquire nothing, and their acknowledgements are not
applied.
"""
from __future__ import annotations

import datetime
import uuid
from dataclasses import replace
from typing import Any, Hashable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.logger import Logger

from kmqkafka import records as rec
from kmqkafka.coordinators.share_group import (
    ShareGroupCoordinator, ShareHeartbeat, ShareLagCollector, ShareResult,
)
from kmqkafka.coordinators.share_partition import AckError, SharePartition
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, consumer_groups, groups, identity
from kmqkafka.kafka.acl import NOT_REQUESTED, authorized_operations
from kmqkafka.kafka.context import Broker, RequestContext
from kmqkafka.kafka.group_configs import GroupConfigs
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.names import channel_for
from kmqkafka.store.txn_state import AbortedIndex, index_aborted, is_aborted

log = Logger()

SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79
DEFAULT_MAX_RECORDS = 500
NEVER = 1 << 62  # a Sequence no channel reaches
READ_CHUNK = 1 << 20  # bytes read from a partition at a time: max_records usually binds first


def install(broker: Broker) -> ShareGroupCoordinator:
    """Create the broker's share-group coordinator (idempotent); state loads on first use."""
    existing = broker.extras.get("share_groups")
    if existing is not None:
        return existing
    settings = broker.settings
    configs = broker.extras.setdefault("group_configs", GroupConfigs(
        broker.store,
        session_timeout_ms=getattr(settings, "kafka_consumer_session_timeout_ms", 45000),
        heartbeat_interval_ms=getattr(settings, "kafka_consumer_heartbeat_interval_ms", 5000)))

    def other_group(group_id: str) -> bool:
        classic = groups.coordinator(broker)
        cg = broker.extras.get("consumer_groups")
        return group_id in classic.groups or (cg is not None and group_id in cg.groups)

    coordinator = ShareGroupCoordinator(broker.reactor, broker.store, broker.extras["topics"],
                                        configs, other_group=other_group)
    broker.extras["share_groups"] = coordinator

    def serving() -> ShareGroupCoordinator | None:
        coordination = broker.extras.get("coordination")
        if not getattr(broker.store, "started", False) or (
                coordination is not None and not coordination.serving()):
            return None
        if not coordinator.loaded:
            coordinator.load()
        return coordinator

    broker.metrics.registry.register(ShareLagCollector(serving))
    broker.extras["topics"].on_deleted(
        lambda topic: coordinator.forget_topic(topic.name) if coordinator.loaded else None)
    return coordinator


def coordinator(broker: Broker) -> ShareGroupCoordinator:
    c = broker.extras.get("share_groups") or install(broker)
    if not c.loaded:
        c.load()
    return c


# --- ShareGroupHeartbeat ----------------------------------------------------------------


def heartbeat(request: Any, ctx: RequestContext) -> Deferred | Any:
    refused = consumer_groups.refused_heartbeat(ctx, request.group_id,
                                                request.subscribed_topic_names)
    if refused is not None:
        return consumer_groups.heartbeat_response(refused, ctx)
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    names = request.subscribed_topic_names
    req = ShareHeartbeat(
        group_id=request.group_id, member_id=request.member_id,
        member_epoch=int(request.member_epoch), rack_id=request.rack_id,
        subscribed_topic_names=None if names is None else tuple(names),
        client_id=ctx.client_id or "", client_host=f"/{host}" if host else "")
    return coordinator(ctx.broker).heartbeat(req).addCallback(_heartbeat_response, ctx)


def _heartbeat_response(result: ShareResult, ctx: RequestContext) -> Any:
    """The coordinator assigns by topic name; the wire carries topic ids."""
    if result.assignment is not None:
        catalog = ctx.broker.extras["topics"]
        by_id = {}
        for name, ps in result.assignment.items():
            topic = catalog.get(name)
            if topic is not None and ps:
                by_id[str(topic.topic_id)] = frozenset(ps)
        result = replace(result, assignment=by_id)
    return consumer_groups.heartbeat_response(result, ctx)


# --- ShareGroupDescribe -----------------------------------------------------------------


def describe(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    c = coordinator(ctx.broker)
    catalog = ctx.broker.extras["topics"]
    requested = bool(getattr(request, "include_authorized_operations", False))
    out = []
    for group_id in request.group_ids:
        if not authz.allowed(ctx, authz.DESCRIBE, authz.GROUP, group_id):
            out.append(consumer_groups.denied_group(
                t, group_id, ErrorCode.group_authorization_failed, None))
            continue
        group = c.groups.get(group_id)
        if group is None:
            message = (f"Group {group_id} is not a share group." if c.other_group(group_id)
                       else f"Group {group_id} not found.")
            out.append(make(t.DescribedGroup, error_code=ErrorCode.group_id_not_found,
                            error_message=message, group_id=group_id, group_state="Dead",
                            group_epoch=-1, assignment_epoch=-1, assignor_name="", members=(),
                            authorized_operations=NOT_REQUESTED))
            continue
        if consumer_groups.hidden_topics(ctx, {name for m in group.members.values()
                                               for name in m.assignment
                                               if catalog.get(name) is not None}):
            out.append(consumer_groups.denied_group(
                t, group_id, ErrorCode.topic_authorization_failed,
                consumer_groups.TOPICS_DENIED))
            continue
        members = []
        for m in group.members.values():
            tps = []
            for name, ps in sorted(m.assignment.items()):
                topic = catalog.get(name)
                if topic is not None:
                    tps.append(make(t.TopicPartitions, topic_id=topic.topic_id,
                                    topic_name=name, partitions=tuple(ps)))
            members.append(make(t.Member, member_id=m.member_id, rack_id=m.rack_id,
                                member_epoch=m.epoch, client_id=m.client_id,
                                client_host=m.client_host, subscribed_topic_names=m.topics,
                                assignment=make(t.Assignment, topic_partitions=tuple(tps))))
        out.append(make(t.DescribedGroup, error_code=ErrorCode.none, error_message=None,
                        group_id=group_id, group_state=group.state(), group_epoch=group.epoch,
                        assignment_epoch=group.assignment_epoch, assignor_name="simple",
                        members=tuple(members), authorized_operations=authorized_operations(
                            ctx, requested, authz.GROUP, group_id)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, groups=tuple(out))


# --- acknowledgements (ShareFetch and ShareAcknowledge) -----------------------------------


PartitionRef = tuple[uuid.UUID, int]


def _readable(ctx: RequestContext, topic: str) -> bool:
    """READ on the topic: what a share consumer needs to fetch and acknowledge its records."""
    return authz.allowed(ctx, authz.READ, authz.TOPIC, topic)


def _acknowledge(c: ShareGroupCoordinator, ctx: RequestContext, group_id: str, member_id: str,
                 topics: Any) -> tuple[dict[PartitionRef, ErrorCode], Deferred]:
    """Apply every acknowledgement batch of a request; returns per-partition results and the
    Deferred of the state write (it must be durable before the answer)."""
    catalog = ctx.broker.extras["topics"]
    results: dict[PartitionRef, ErrorCode] = {}
    touched = []
    now = c.now_ms()
    lock_ms = c.lock_ms(group_id)
    for t in topics:
        topic = catalog.by_id(t.topic_id)
        for p in t.partitions:
            ref = (t.topic_id, int(p.partition_index))
            if not p.acknowledgement_batches:
                continue
            if topic is not None and not _readable(ctx, topic.name):
                results[ref] = ErrorCode.topic_authorization_failed
                continue
            if topic is None or not 0 <= ref[1] < topic.partitions:
                results[ref] = (ErrorCode.unknown_topic_id if topic is None
                                else ErrorCode.unknown_topic_or_partition)
                continue
            sp = c.partition(group_id, topic.name, ref[1])
            if sp is None:
                results[ref] = ErrorCode.unknown_topic_or_partition
                continue
            code = ErrorCode.none
            for b in p.acknowledgement_batches:
                try:
                    sp.acknowledge(member_id, int(b.first_offset), int(b.last_offset),
                                   [int(k) for k in b.acknowledge_types], now, lock_ms)
                except AckError as exc:
                    code = (ErrorCode.invalid_request if exc.invalid_request
                            else ErrorCode.invalid_record_state)
            results[ref] = code
            touched.append((group_id, topic.name, ref[1]))
    if not touched:
        return results, succeed(None)
    c.wake()
    return results, c.save(touched)


# --- ShareFetch -------------------------------------------------------------------------


def share_fetch(request: Any, ctx: RequestContext) -> Any:
    c = coordinator(ctx.broker)
    group_id, member_id = request.group_id or "", request.member_id or ""
    lock_ms = c.lock_ms(group_id) if group_id else 30000

    def top_error(code: ErrorCode, message: str | None = None) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                    error_message=message,
                    acquisition_lock_timeout=datetime.timedelta(milliseconds=lock_ms),
                    responses=(), node_endpoints=())

    if not groups.may_read_group(ctx, group_id):
        return top_error(ErrorCode.group_authorization_failed)
    if not group_id or not member_id:
        return top_error(ErrorCode.invalid_request, "GroupId and MemberId must be set.")
    epoch = int(request.share_session_epoch)
    if epoch != -1 and not c.is_member(group_id, member_id):
        return top_error(ErrorCode.unknown_member_id)
    session, code = c.session(group_id, member_id, epoch)
    if session is None:
        return top_error(code)
    for f in request.forgotten_topics_data:
        for p in f.partitions:
            session.partitions.pop((str(f.topic_id), int(p)), None)
    for tp in request.topics:
        for p in tp.partitions:
            session.partitions.setdefault((str(tp.topic_id), int(p.partition_index)), None)
    acks, written = _acknowledge(c, ctx, group_id, member_id, request.topics)
    if epoch == -1:
        fetch = _ShareFetch(request, ctx, c, session, acks, lock_ms, closing=True)
        return written.addCallback(lambda _: c.close_session(group_id, member_id)).addCallback(
            lambda _: fetch.respond([]))
    fetch = _ShareFetch(request, ctx, c, session, acks, lock_ms, closing=False)
    return written.addCallback(lambda _: fetch.start())


class _ShareFetch:
    """One ShareFetch after its acknowledgements: acquire, maybe park, answer."""

    def __init__(self, request: Any, ctx: RequestContext, c: ShareGroupCoordinator,
                 session: Any, acks: dict[PartitionRef, ErrorCode], lock_ms: int,
                 closing: bool) -> None:
        self.request = request
        self.ctx = ctx
        self.c = c
        self.session = session
        self.acks = acks
        self.lock_ms = lock_ms
        self.closing = closing
        self.group_id = request.group_id
        self.member_id = request.member_id
        self.deadline = ctx.broker.reactor.seconds() + max(
            0.0, request.max_wait.total_seconds())
        self.max_records = int(request.max_records) if int(request.max_records) > 0 \
            else DEFAULT_MAX_RECORDS
        self.deferred: Deferred | None = None
        self.wait: Deferred | None = None
        self.full = int(request.share_session_epoch) == 0
        self.committed = c.read_committed(self.group_id)

    def start(self) -> Any:
        if not _serving(self.ctx):
            return self._not_leader()
        got = self._acquire()
        if any(r[2] for r in got) or self._done() or _only_denied(got):
            return self.respond(got)
        self.deferred = Deferred(self._cancel)
        self._park()
        return self.deferred

    def _done(self) -> bool:
        return (self.ctx.broker.reactor.seconds() >= self.deadline or not self.session.partitions
                or any(code is not ErrorCode.none for code in self.acks.values()))

    def _acquire(self) -> list[tuple[PartitionRef, ErrorCode, list, list]]:
        """(partition, error, batches, acquired runs) for every session partition."""
        catalog = self.ctx.broker.extras["topics"]
        store = self.ctx.broker.store
        c = self.c
        out = []
        left_records = self.max_records
        left_bytes = max(int(self.request.max_bytes), 1)
        deadline_ms = c.now_ms() + self.lock_ms
        for (tid, p) in list(self.session.partitions):
            ref = (uuid.UUID(tid), p)
            topic = catalog.by_id(ref[0])
            if topic is not None and not _readable(self.ctx, topic.name):
                out.append((ref, ErrorCode.topic_authorization_failed, [], []))
                continue
            if topic is None or not 0 <= p < topic.partitions:
                out.append((ref, ErrorCode.unknown_topic_id if topic is None
                            else ErrorCode.unknown_topic_or_partition, [], []))
                continue
            sp = c.partition(self.group_id, topic.name, p)
            if sp is None:
                out.append((ref, ErrorCode.unknown_topic_or_partition, [], []))
                continue
            if left_records <= 0 or left_bytes <= 0:
                out.append((ref, ErrorCode.none, [], []))
                continue
            batches, runs, nbytes, n = _acquire_partition(
                store, channel_for(topic.name, p), sp, self.member_id, deadline_ms,
                left_records, left_bytes, self.committed)
            left_records -= n
            left_bytes -= nbytes
            out.append((ref, ErrorCode.none, batches, runs))
        if any(r[3] for r in out):
            c.schedule_expiry()
        return out

    def _park(self) -> None:
        store = self.ctx.broker.store
        catalog = self.ctx.broker.extras["topics"]
        watches = []
        for (tid, p) in self.session.partitions:
            topic = catalog.by_id(uuid.UUID(tid))
            if topic is None:
                continue
            sp = self.c.partitions.get((self.group_id, topic.name, p))
            if sp is not None:
                # A full window takes nothing new: only a release (or the time-out) may
                # wake it, or data already there would wake it again at once, for ever.
                channel = channel_for(topic.name, p)
                beyond = sp.next + 1 if sp.room() > 0 else NEVER
                if self.committed and beyond != NEVER:
                    # Records past the last stable offset are there but may not be taken
                    # yet: wake on what comes after them (the transaction's marker).
                    beyond = max(beyond, store.bounds(channel).high_watermark)
                watches.append((channel, beyond))
        remaining = self.deadline - self.ctx.broker.reactor.seconds()
        wait = store.wait_any(watches, remaining)
        if wait.called and watches:
            # Data is there that this fetch could not take: only a release or the
            # time-out can change that, so waking on data would spin.
            wait = store.wait_any([(channel, NEVER) for channel, _ in watches], remaining)
        self.wait = wait
        wait.addCallbacks(self._woke, self._wait_failed)
        self.c.released.append(self._released)

    def _released(self) -> None:
        if self.wait is not None and not self.wait.called:
            wait, self.wait = self.wait, None
            wait.cancel()
            self._woke(True)

    def _woke(self, ready: bool) -> None:
        self.wait = None
        if self.deferred is None or self.deferred.called:
            return
        try:
            if not _serving(self.ctx):
                # This node stopped leading while the fetch waited (a stalled leader woken
                # by the new leader's log): it may acquire nothing, the client looks again.
                self.deferred.callback(self._not_leader())
                return
            if self.c.sessions.get((self.group_id, self.member_id)) is not self.session:
                # The session closed while this fetch waited (its member's final request):
                # nothing may be acquired for it any more.
                self.deferred.callback(self.respond([]))
                return
            got = self._acquire()
            if any(r[2] for r in got) or not ready or self._done() or _only_denied(got):
                self.deferred.callback(self.respond(got))
            else:
                self._park()
        except Exception:
            self.deferred.errback()

    def _wait_failed(self, failure: Any) -> None:
        if failure.check(CancelledError):
            return None
        self.wait = None
        if self.deferred is not None and not self.deferred.called:
            self.deferred.errback(failure)
        return None

    def _cancel(self, _d: Deferred) -> None:
        """The connection went while parked: nothing was acquired for this request."""
        if self.wait is not None and not self.wait.called:
            self.wait.cancel()

    def _not_leader(self) -> Any:
        """NOT_LEADER_OR_FOLLOWER for every partition of the session (Kafka's answer once
        leadership moved), naming the leader when one is known."""
        return self.respond([((uuid.UUID(tid), p), ErrorCode.not_leader_or_follower, [], [])
                             for tid, p in self.session.partitions])

    def respond(self, got: list) -> Any:
        t = types_of(self.ctx)
        leader = _leader(self.ctx, t)
        by_topic: dict[uuid.UUID, list] = {}
        seen = set()
        for ref, code, batches, runs in got:
            seen.add(ref)
            ack = self.acks.get(ref, ErrorCode.none)
            if not (batches or runs or code is not ErrorCode.none or ref in self.acks
                    or self.full):
                continue
            by_topic.setdefault(ref[0], []).append(make(
                t.PartitionData, partition_index=ref[1], error_code=code, error_message=None,
                acknowledge_error_code=ack, acknowledge_error_message=None,
                current_leader=leader,
                records=b"".join(bytes(b) for b in batches) if batches else b"",
                acquired_records=tuple(make(t.AcquiredRecords, first_offset=f, last_offset=l,
                                            delivery_count=n) for f, l, n in runs)))
        for ref, ack in self.acks.items():
            if ref not in seen:
                by_topic.setdefault(ref[0], []).append(make(
                    t.PartitionData, partition_index=ref[1], error_code=ErrorCode.none,
                    error_message=None, acknowledge_error_code=ack,
                    acknowledge_error_message=None, current_leader=leader, records=b"",
                    acquired_records=()))
        return make(self.ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.none, error_message=None,
                    acquisition_lock_timeout=datetime.timedelta(milliseconds=self.lock_ms),
                    responses=tuple(make(t.ShareFetchableTopicResponse, topic_id=tid,
                                         partitions=tuple(ps))
                                    for tid, ps in by_topic.items()),
                    node_endpoints=_endpoints(self.ctx, t, any(
                        r[1] is ErrorCode.not_leader_or_follower for r in got)))


def _only_denied(got: list) -> bool:
    """Nothing to wait for: every partition of the session failed, some of them for want of
    READ on their topic (Kafka answers at once when no partition is left to fetch)."""
    return (any(r[1] is ErrorCode.topic_authorization_failed for r in got)
            and all(r[1] is not ErrorCode.none for r in got))


def _acquire_partition(store: Any, channel: str, sp: SharePartition, member: str,
                       deadline_ms: int, max_records: int, max_bytes: int,
                       committed: bool = False
                       ) -> tuple[list, list[tuple[int, int, int]], int, int]:
    """Acquire for ``member`` in one share-partition: redeliveries first, then new records.
    ``committed`` (``share.isolation.level=read_committed``) stops at the last stable offset
    and archives the records of aborted transactions instead of delivering them.
    Returns (stored batches to send, acquired runs, bytes, records acquired)."""
    batches: list[memoryview] = []
    runs: list[tuple[int, int, int]] = []
    nbytes = n = 0
    sent: set[int] = set()
    # The first offset not readable.
    hw = (store.stable_end(channel) if committed else store.bounds(channel).high_watermark) - 1
    aborted: AbortedIndex | None = None

    def in_aborted(buf: memoryview) -> bool:
        """A transactional batch whose transaction was aborted."""
        nonlocal aborted
        h = rec.read_header(buf)
        if not h.is_transactional:
            return False
        if aborted is None:
            aborted = index_aborted(store.aborted_between(channel, sp.start + 1, hw + 1))
        return is_aborted(aborted, h.producer_id, h.base_offset + 1)

    def take(first: int, last: int, buf: memoryview, base: int, control: bool) -> None:
        nonlocal nbytes, n
        if control or (committed and last >= sp.next and in_aborted(buf)):
            # A transaction marker, or a record read_committed must never see.
            if last >= sp.next:
                sp.archive_new(max(first, sp.next), last)
            sp.archive_gap(first, min(last, sp.next - 1))
            return
        got = sp.acquire(first, last, member, deadline_ms)
        if not got:
            return
        if base not in sent:
            sent.add(base)
            batches.append(buf)
            nbytes += len(buf)
        runs.extend(got)
        n += sum(l - f + 1 for f, l, _c in got)

    def stored(from_offset: int, budget: int) -> list[tuple[int, int, memoryview, bool]]:
        rr = store.read(channel, from_offset + 1, max(min(budget, READ_CHUNK), 1), min_one=True)
        out = []
        for chunk in rr.batches:
            pos = 0
            while pos + rec.HEADER_SIZE <= len(chunk):
                h = rec.read_header(chunk, pos)
                out.append((h.base_offset, h.last_offset, chunk[pos:pos + h.size],
                            h.is_control))
                pos += h.size
        return out

    for first, last in sp.available_runs():
        if n >= max_records or nbytes >= max_bytes:
            break
        offset = first
        while offset <= last and n < max_records and nbytes < max_bytes:
            found = stored(offset, max_bytes - nbytes)
            if not found:
                sp.archive_gap(offset, last)
                break
            for base, end, buf, control in found:
                if base > last:
                    break
                if end < offset:
                    continue
                if base > offset:
                    sp.archive_gap(offset, base - 1)
                take(max(base, offset), min(end, last), buf, base, control)
                offset = end + 1
                if n >= max_records or nbytes >= max_bytes:
                    break
            else:
                if offset <= last:
                    sp.archive_gap(offset, last)
                break
    while n < max_records and nbytes < max_bytes and sp.room() > 0 and sp.next < hw:
        found = stored(sp.next, max_bytes - nbytes)
        if not found:
            break
        progressed = False
        for base, end, buf, control in found:
            if end < sp.next or sp.room() <= 0:
                continue
            if base >= hw:
                break
            if base > sp.next:  # offsets the log does not hold (compacted away)
                sp.archive_new(sp.next, base - 1)
            take(max(base, sp.next), end, buf, base, control)
            progressed = True
            if n >= max_records or nbytes >= max_bytes:
                break
        if not progressed:
            break
    return batches, runs, nbytes, n


def _serving(ctx: RequestContext) -> bool:
    """Whether this node still coordinates (and leads every partition): checked again when
    a parked ShareFetch wakes, as leadership may have moved meanwhile."""
    coordination = ctx.broker.extras.get("coordination")
    return coordination is None or coordination.serving()


def _leader(ctx: RequestContext, t: Any) -> Any:
    leader = identity.leader(ctx.broker)
    return make(t.LeaderIdAndEpoch, leader_id=-1 if leader is None else leader,
                leader_epoch=identity.leader_epoch(ctx.broker))


def _endpoints(ctx: RequestContext, t: Any, moved: bool) -> tuple:
    """Kafka's NodeEndpoints: where the leader named in a NOT_LEADER_OR_FOLLOWER answer is
    reached, so the client need not ask Metadata first."""
    leader = identity.leader(ctx.broker) if moved else None
    where = None if leader is None else identity.endpoint(ctx.broker, leader, ctx.listener)
    if where is None:
        return ()
    return (make(t.NodeEndpoint, node_id=leader, host=where[0], port=where[1], rack=None),)


# --- ShareAcknowledge -------------------------------------------------------------------


def share_acknowledge(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    c = coordinator(ctx.broker)
    group_id, member_id = request.group_id or "", request.member_id or ""

    def top_error(code: ErrorCode, message: str | None = None) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                    error_message=message, responses=(), node_endpoints=())

    if not groups.may_read_group(ctx, group_id):
        return top_error(ErrorCode.group_authorization_failed)
    if not group_id or not member_id:
        return top_error(ErrorCode.invalid_request, "GroupId and MemberId must be set.")
    epoch = int(request.share_session_epoch)
    if epoch == 0:
        return top_error(ErrorCode.invalid_share_session_epoch)
    session, code = c.session(group_id, member_id, epoch)
    if session is None:
        return top_error(code)
    acks, written = _acknowledge(c, ctx, group_id, member_id, request.topics)
    if epoch == -1:
        written.addCallback(lambda _: c.close_session(group_id, member_id))
    leader = _leader(ctx, t)

    def answer(_: Any) -> Any:
        by_topic: dict[Hashable, list] = {}
        for tp in request.topics:
            for p in tp.partitions:
                ref = (tp.topic_id, int(p.partition_index))
                by_topic.setdefault(tp.topic_id, []).append(make(
                    t.PartitionData, partition_index=ref[1],
                    error_code=acks.get(ref, ErrorCode.none), error_message=None,
                    current_leader=leader))
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                    error_message=None,
                    responses=tuple(make(t.ShareAcknowledgeTopicResponse, topic_id=tid,
                                         partitions=tuple(ps))
                                    for tid, ps in by_topic.items()),
                    node_endpoints=())

    return written.addCallback(answer)


def _fetch_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    kwargs: dict[str, Any] = {}
    if ctx.api_key == SHARE_FETCH:
        kwargs["acquisition_lock_timeout"] = datetime.timedelta(0)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                error_message=None, responses=(), node_endpoints=(), **kwargs)


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(SHARE_GROUP_HEARTBEAT, groups.coordinated(heartbeat), 1, 1)
    dispatcher.register(SHARE_GROUP_DESCRIBE,
                        groups.coordinated(describe, consumer_groups.describe_error), 1, 1)
    dispatcher.register(SHARE_FETCH, groups.coordinated(share_fetch, _fetch_error), 1, 1,
                        wait_only=True)
    dispatcher.register(SHARE_ACKNOWLEDGE, groups.coordinated(share_acknowledge, _fetch_error),
                        1, 1)


__all__ = ["coordinator", "install", "register"]
