"""The classic consumer-group coordinator: Kafka's group state machine over an injected clock.

States: Empty → PreparingRebalance → CompletingRebalance → Stable (→ PreparingRebalance …),
and Dead for a group that has been deleted. The rules follow Apache Kafka's classic group
coordinator (``GroupMetadataManager``):

* JoinGroup parks until every known member has rejoined (or the largest rebalance timeout of the
  members expires; dynamic members that did not rejoin are then removed, static ones kept), then
  bumps the generation, selects the protocol by votes among the protocols every member supports,
  keeps (or elects) a leader among the joined members and answers everyone; only the leader gets
  the member list with metadata.
* SyncGroup from the leader stores the assignments durably, then the group is Stable and every
  parked follower gets its assignment. Members that do not sync within the rebalance timeout are
  removed (pending-sync expiry).
* Heartbeats keep a member alive for its session timeout; an expired member is removed and the
  group rebalances. During PreparingRebalance heartbeats answer REBALANCE_IN_PROGRESS.
* KIP-394: a v4+ JoinGroup with an empty member id gets MEMBER_ID_REQUIRED and a fresh id, which
  stays pending for one session timeout.
* KIP-345: a static member (group.instance.id) rejoining with an empty member id replaces its old
  member id (the old one is fenced: FENCED_INSTANCE_ID); in a Stable group whose selected
  protocol would not change this does not rebalance and the member gets its previous assignment
  at SyncGroup. A LeaveGroup is always a real leave (clients do not send one for static members
  on close) and rebalances.

State that survives a restart is kept in the ``groups`` coordinator family (see ``GroupLog``) and
committed offsets in ``offsets`` (``kmqkafka.coordinators.offsets``); after a restart groups come
back Stable with their members and assignments, and the members' session timers start afresh, as
after a Kafka coordinator fail-over.

Design: ``GroupCoordinator`` is reactor-thread only. Time comes from the injected
``IReactorTime`` (``task.Clock`` in tests); waiting JoinGroup/SyncGroup calls are parked
Deferreds, cancellable (connection lost). Results are plain dataclasses carrying kio
``ErrorCode``s; the wire mapping lives in ``kmqkafka.kafka.groups``.
"""
from __future__ import annotations

import base64
import enum
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from kmqkafka.coordinators.consumer_protocol import decode_subscription
from kmqkafka.coordinators.offsets import (
    FAMILY as OFFSETS_FAMILY, CommittedOffset, OffsetStore, Record, TopicPartition,
)

GROUPS_FAMILY = "groups"
# Keys of the ``groups`` family starting with NUL belong to other group types (KIP-848 consumer
# groups, ``kmqkafka.coordinators.consumer_group``); the classic coordinator skips them.
FOREIGN_KEY_PREFIX = b"\x00"
DEFAULT_MAX_GROUP_SIZE = 1000
MIN_SESSION_TIMEOUT_MS = 6000  # Kafka group.min.session.timeout.ms
MAX_SESSION_TIMEOUT_MS = 1800000  # Kafka group.max.session.timeout.ms
NEW_MEMBER_JOIN_TIMEOUT_MS = 300000  # Kafka group.classic.new.member.join.timeout.ms
CONSUMER_PROTOCOL_TYPE = "consumer"

log = Logger()


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """What a JoinGroup asks for, version differences already resolved by the handler."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True
    supports_skip_assignment: bool = True


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[MemberDescription, ...]


@dataclass(eq=False)
class Member:
    """One member of a classic group; timers and parked Deferreds are not persisted."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    awaiting_join: bool = False
    join_waiter: Deferred | None = None
    sync_waiter: Deferred | None = None
    is_new: bool = False
    heartbeat_timer: IDelayedCall | None = None

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return self.protocols == protocols


@dataclass(eq=False)
class ClassicGroup:
    """The state of one group (reactor-thread only)."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    pending_members: dict[str, IDelayedCall] = field(default_factory=dict)
    pending_sync: set[str] = field(default_factory=set)
    join_timer: IDelayedCall | None = None
    initial_delay: bool = False
    joined_in_delay: bool = False  # a new member came during the current initial delay
    sync_timer: IDelayedCall | None = None
    empty_since_ms: int | None = None  # when its last member left (offset expiry counts from it)

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def candidate_protocols(self) -> list[str]:
        """Protocols every member supports, in the first member's order of preference."""
        members = list(self.members.values())
        if not members:
            return []
        common = set(n for n, _ in members[0].protocols)
        for m in members[1:]:
            common &= {n for n, _ in m.protocols}
        return [n for n, _ in members[0].protocols if n in common]

    def supports_protocols(self, protocol_type: str, protocols: Iterable[tuple[str, bytes]]
                           ) -> bool:
        names = [n for n, _ in protocols]
        if not self.members:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        common = set(self.candidate_protocols())
        return any(n in common for n in names)

    def select_protocol(self) -> str:
        """Kafka's vote: each member votes for its most preferred candidate; most votes win."""
        candidates = self.candidate_protocols()
        votes = {name: 0 for name in candidates}
        for m in self.members.values():
            for name, _ in m.protocols:
                if name in votes:
                    votes[name] += 1
                    break
        return max(candidates, key=lambda n: votes[n])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol), None when unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            metadata = m.metadata_for(self.protocol_name) if self.protocol_name else (
                m.protocols[0][1] if m.protocols else b"")
            sub = subscription_topics(metadata)
            if sub is None:
                return None
            topics |= sub
        return topics


def subscription_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (int16 version + body); None if undecodable."""
    try:
        return set(decode_subscription(metadata).topics)
    except ValueError:
        return None


def valid_group_id(group_id: str | None, *, allow_empty: bool = False) -> bool:
    """Kafka: OffsetCommit/OffsetFetch/DescribeGroups/DeleteGroups accept an empty id."""
    return group_id is not None and (allow_empty or group_id != "")


class GroupLog:
    """The ``groups`` family: one record per group, ``key = group_id`` (UTF-8), value JSON::

        {"protocol_type": str|null, "generation": int, "protocol": str|null, "leader": str|null,
         "empty_ms": int (when its last member left; absent before),
         "members": [{"id", "instance", "client_id", "client_host", "session_ms",
                      "rebalance_ms", "protocols": [[name, base64 metadata]...],
                      "assignment": base64}]}

    A null value deletes the group.
    """

    @staticmethod
    def record(group: ClassicGroup) -> tuple[bytes, bytes]:
        members = [
            {"id": m.member_id, "instance": m.group_instance_id, "client_id": m.client_id,
             "client_host": m.client_host, "session_ms": m.session_timeout_ms,
             "rebalance_ms": m.rebalance_timeout_ms,
             "protocols": [[n, base64.b64encode(md).decode()] for n, md in m.protocols],
             "assignment": base64.b64encode(m.assignment).decode()}
            for m in group.members.values()
        ] if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE) else []
        value = {"protocol_type": group.protocol_type, "generation": group.generation_id,
                 "protocol": group.protocol_name if members else None,
                 "leader": group.leader_id if members else None, "members": members}
        if not members and group.empty_since_ms is not None:
            value["empty_ms"] = group.empty_since_ms
        return group.group_id.encode(), json.dumps(value, separators=(",", ":")).encode()

    @staticmethod
    def tombstone(group_id: str) -> tuple[bytes, None]:
        return group_id.encode(), None

    @staticmethod
    def replay(value: bytes, group_id: str) -> ClassicGroup:
        d = json.loads(value)
        group = ClassicGroup(group_id, generation_id=d["generation"],
                             protocol_type=d.get("protocol_type"),
                             empty_since_ms=d.get("empty_ms"))
        for md in d.get("members", ()):
            m = Member(
                member_id=md["id"], group_instance_id=md.get("instance"),
                client_id=md.get("client_id", ""), client_host=md.get("client_host", ""),
                session_timeout_ms=md["session_ms"], rebalance_timeout_ms=md["rebalance_ms"],
                protocol_type=group.protocol_type or "",
                protocols=tuple((n, base64.b64decode(b)) for n, b in md["protocols"]),
                assignment=base64.b64decode(md.get("assignment", "")))
            group.members[m.member_id] = m
            if m.group_instance_id:
                group.static_members[m.group_instance_id] = m.member_id
        if group.members:
            group.state = GroupState.STABLE
            group.protocol_name = d.get("protocol")
            group.leader_id = d.get("leader") if d.get("leader") in group.members else next(
                iter(group.members))
        return group


class GroupCoordinator:
    """Every classic group of this broker, their timers, and their committed offsets.

    ``store`` provides ``keyed_put(family, pairs) -> Deferred`` (fires once durable) and
    ``keyed_items(family)``; call ``load()`` once the store has recovered and before serving.
    ``max_groups`` bounds how many groups may exist (a group is created by its first JoinGroup
    or standalone OffsetCommit): creating one more answers GROUP_MAX_SIZE_REACHED, Kafka's code
    for "this group cannot take a member" (Kafka itself has no broker-wide group cap), which
    clients treat as fatal instead of retrying forever.
    """

    def __init__(
        self,
        clock: IReactorTime,
        store: Any,
        *,
        max_groups: int = 10000,
        max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
        min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS,
        initial_rebalance_delay_ms: int = 0,
        new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.clock = clock
        self.store = store
        self.max_groups = max_groups
        self.max_group_size = max_group_size
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self._new_id = new_id or (lambda: str(uuid.uuid4()))
        self.groups: dict[str, ClassicGroup] = {}
        self.offsets = OffsetStore()
        self.loaded = False
        # The KIP-848 ConsumerGroupCoordinator, set by its installer: a group id is either
        # classic or consumer, and max_groups counts both.
        self.consumer_groups: Any = None

    # --- life cycle ---------------------------------------------------------------------

    def load(self) -> None:
        """Replay the ``groups`` and ``offsets`` families; start members' session timers."""
        if self.loaded:
            return
        self.offsets.load(self.store.keyed_items(OFFSETS_FAMILY))
        for key, value in self.store.keyed_items(GROUPS_FAMILY):
            if key.startswith(FOREIGN_KEY_PREFIX):
                continue
            group = GroupLog.replay(value, key.decode())
            self.groups[group.group_id] = group
            for m in group.members.values():
                self._schedule_heartbeat(group, m)
        for group_id in self.offsets.groups():
            if group_id not in self.groups:
                self.groups[group_id] = ClassicGroup(group_id)
        self.loaded = True
        log.info("group coordinator loaded {groups} group(s)", groups=len(self.groups))

    def stop(self) -> None:
        """Cancel every timer (the store keeps what was written)."""
        for group in self.groups.values():
            self._cancel_group_timers(group)

    def _cancel_group_timers(self, group: ClassicGroup) -> None:
        for timer in [group.join_timer, group.sync_timer, *group.pending_members.values(),
                      *(m.heartbeat_timer for m in group.members.values())]:
            if timer is not None and timer.active():
                timer.cancel()

    # --- helpers ------------------------------------------------------------------------

    def _now_timer(self, delay_ms: int, fn: Callable[..., None], *args: Any) -> IDelayedCall:
        return self.clock.callLater(max(delay_ms, 0) / 1000.0, fn, *args)

    def _alive(self, group: ClassicGroup) -> bool:
        return self.groups.get(group.group_id) is group and group.state is not GroupState.DEAD

    def _persist(self, pairs: list[tuple[bytes, bytes | None]], family: str = GROUPS_FAMILY
                 ) -> Deferred:
        try:
            return self.store.keyed_put(family, pairs)
        except Exception as exc:  # a stopped store raises rather than failing the Deferred
            return fail(exc)

    def _persist_group(self, group: ClassicGroup) -> Deferred:
        d = self._persist([GroupLog.record(group)])
        d.addErrback(lambda f: (log.warn("could not persist group {group}: {error}",
                                         group=group.group_id, error=f.getErrorMessage()), f)[1])
        return d

    def _schedule_heartbeat(self, group: ClassicGroup, member: Member,
                            timeout_ms: int | None = None) -> None:
        if member.heartbeat_timer is not None and member.heartbeat_timer.active():
            member.heartbeat_timer.cancel()
        member.heartbeat_timer = self._now_timer(
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            self._expire_heartbeat, group, member)

    def _resolve_join(self, member: Member, result: JoinResult) -> None:
        member.awaiting_join = False
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is not None:
            waiter.callback(result)

    def _resolve_sync(self, member: Member, result: SyncResult) -> bool:
        waiter, member.sync_waiter = member.sync_waiter, None
        if waiter is not None:
            waiter.callback(result)
            return True
        return False

    def _park_join(self, group: ClassicGroup, member: Member) -> Deferred:
        if member.join_waiter is not None:  # a retried JoinGroup replaces the older one
            self._resolve_join(member, JoinResult(ErrorCode.rebalance_in_progress,
                                                  member.member_id))
        d: Deferred = Deferred(lambda d: self._join_cancelled(group, member, d))
        member.join_waiter = d
        member.awaiting_join = True
        return d

    def _join_cancelled(self, group: ClassicGroup, member: Member, d: Deferred) -> None:
        """Connection lost while parked in JoinGroup."""
        if member.join_waiter is not d:
            return
        member.join_waiter = None
        if not self._alive(group) or group.members.get(member.member_id) is not member:
            return
        if member.is_new:
            # A brand-new member has nothing to come back to: drop it now.
            self._remove_member_and_update(group, member, "new member disconnected while joining")
        # An existing member stays counted as joined (as in Kafka, which cannot see the
        # disconnect): the rebalance completes and its session timer removes it unless it
        # comes back and rejoins.

    def _sync_cancelled(self, member: Member, d: Deferred) -> None:
        if member.sync_waiter is d:
            member.sync_waiter = None

    def _join_result(self, group: ClassicGroup, member: Member, *, leader_view: bool,
                     skip_assignment: bool = False, leader: str | None = None) -> JoinResult:
        members: tuple[JoinedMember, ...] = ()
        if leader_view:
            members = tuple(JoinedMember(m.member_id, m.group_instance_id,
                                         m.metadata_for(group.protocol_name))
                            for m in group.members.values())
        return JoinResult(
            ErrorCode.none, member.member_id, group.generation_id, group.protocol_type,
            group.protocol_name, leader if leader is not None else (group.leader_id or ""),
            members, skip_assignment)

    def _validate_member(self, group: ClassicGroup, member_id: str,
                         instance_id: str | None) -> ErrorCode:
        if instance_id:
            owner = group.static_members.get(instance_id)
            if owner is None:
                return ErrorCode.unknown_member_id
            if owner != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    def _new_group_allowed(self) -> bool:
        others = len(self.consumer_groups.groups) if self.consumer_groups is not None else 0
        return len(self.groups) + others < self.max_groups

    # --- JoinGroup ----------------------------------------------------------------------

    def join(self, req: JoinRequest) -> Deferred:
        """Handle a JoinGroup; fires with a ``JoinResult`` (possibly after parking)."""
        if not valid_group_id(req.group_id):
            return succeed(JoinResult(ErrorCode.invalid_group_id, req.member_id))
        if not (self.min_session_timeout_ms <= req.session_timeout_ms
                <= self.max_session_timeout_ms):
            return succeed(JoinResult(ErrorCode.invalid_session_timeout, req.member_id))
        if self.consumer_groups is not None and self.consumer_groups.owns(req.group_id):
            # An empty consumer (KIP-848) group converts to a classic one, as in Kafka (its
            # offsets stay); a non-empty one takes the member in as a classic-protocol member
            # (online migration, ``kmqkafka.coordinators.classic_members``).
            results, _written = self.consumer_groups.delete_groups([req.group_id])
            if results.get(req.group_id) is not ErrorCode.none:
                return self.consumer_groups.classic_join(req)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return succeed(JoinResult(ErrorCode.unknown_member_id, req.member_id))
            if not self._new_group_allowed():
                return succeed(JoinResult(ErrorCode.group_max_size_reached, req.member_id))
            group = ClassicGroup(req.group_id)
            self.groups[req.group_id] = group
        if group.state is GroupState.DEAD:
            return succeed(JoinResult(ErrorCode.coordinator_not_available, req.member_id))
        if not group.supports_protocols(req.protocol_type, req.protocols):
            return succeed(JoinResult(ErrorCode.inconsistent_group_protocol, req.member_id))
        if not req.member_id:
            return self._join_new(group, req)
        return self._join_existing(group, req)

    def _accepts_new_member(self, group: ClassicGroup) -> bool:
        if group.state is GroupState.PREPARING_REBALANCE:
            joined = sum(1 for m in group.members.values() if m.awaiting_join)
            return joined + len(group.pending_members) < self.max_group_size
        return len(group.members) + len(group.pending_members) < self.max_group_size

    def _join_new(self, group: ClassicGroup, req: JoinRequest) -> Deferred:
        if req.group_instance_id:
            old_id = group.static_members.get(req.group_instance_id)
            new_id = f"{req.group_instance_id}-{self._new_id()}"
            if old_id is not None and old_id in group.members:
                return self._replace_static_member(group, req, old_id, new_id)
        else:
            new_id = f"{req.client_id}-{self._new_id()}"
        if not self._accepts_new_member(group):
            return succeed(JoinResult(ErrorCode.group_max_size_reached, ""))
        if req.require_known_member_id and not req.group_instance_id:
            group.pending_members[new_id] = self._now_timer(
                req.session_timeout_ms, self._expire_pending, group, new_id)
            return succeed(JoinResult(ErrorCode.member_id_required, new_id))
        return self._add_member(group, req, new_id)

    def _join_existing(self, group: ClassicGroup, req: JoinRequest) -> Deferred:
        member_id = req.member_id
        if member_id in group.pending_members:
            timer = group.pending_members[member_id]
            if not self._accepts_new_member_pending(group):
                return succeed(JoinResult(ErrorCode.group_max_size_reached, member_id))
            del group.pending_members[member_id]
            if timer.active():
                timer.cancel()
            return self._add_member(group, req, member_id)
        error = self._validate_member(group, member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return succeed(JoinResult(error, member_id))
        member = group.members[member_id]
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(group, member, req)
        if state is GroupState.COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                return succeed(self._join_result(group, member,
                                                 leader_view=member_id == group.leader_id))
            return self._update_member_and_rebalance(group, member, req)
        if state is GroupState.STABLE:
            if member_id == group.leader_id or not member.matches(req.protocols):
                return self._update_member_and_rebalance(group, member, req)
            return succeed(self._join_result(group, member, leader_view=False))
        return succeed(JoinResult(ErrorCode.unknown_member_id, member_id))

    def _accepts_new_member_pending(self, group: ClassicGroup) -> bool:
        # The pending member already counts in the size check of ``_accepts_new_member``.
        if group.state is GroupState.PREPARING_REBALANCE:
            joined = sum(1 for m in group.members.values() if m.awaiting_join)
            return joined < self.max_group_size
        return len(group.members) < self.max_group_size

    def _update_member(self, member: Member, req: JoinRequest) -> None:
        member.protocols = req.protocols
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id = req.client_id or member.client_id
        member.client_host = req.client_host or member.client_host

    def _update_member_and_rebalance(self, group: ClassicGroup, member: Member,
                                     req: JoinRequest) -> Deferred:
        self._update_member(member, req)
        d = self._park_join(group, member)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")
        return d

    def _add_member(self, group: ClassicGroup, req: JoinRequest, member_id: str) -> Deferred:
        member = Member(
            member_id=member_id, group_instance_id=req.group_instance_id,
            client_id=req.client_id, client_host=req.client_host,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms, protocol_type=req.protocol_type,
            protocols=req.protocols, is_new=True)
        if not group.members:
            group.protocol_type = req.protocol_type
        group.members[member_id] = member
        if group.initial_delay:
            group.joined_in_delay = True
        if req.group_instance_id:
            group.static_members[req.group_instance_id] = member_id
        if group.leader_id is None:
            group.leader_id = member_id
        d = self._park_join(group, member)
        # New members cannot heartbeat yet; bound how long one may sit in a rebalance.
        self._schedule_heartbeat(group, member, self.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group, f"new member {member_id} joined")
        return d

    def _replace_static_member(self, group: ClassicGroup, req: JoinRequest, old_id: str,
                               new_id: str) -> Deferred:
        member = group.members.pop(old_id)
        current_leader = group.leader_id
        fenced = JoinResult(ErrorCode.fenced_instance_id, old_id)
        self._resolve_join(member, fenced)
        self._resolve_sync(member, SyncResult(ErrorCode.fenced_instance_id))
        old = (member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms)
        member.member_id = new_id
        group.members[new_id] = member
        group.static_members[req.group_instance_id or ""] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        group.pending_sync.discard(old_id)
        self._schedule_heartbeat(group, member)
        self._update_member(member, req)
        d = self._park_join(group, member)
        log.info("static member {instance} of group {group} rejoined: {old} -> {new}",
                 instance=req.group_instance_id, group=group.group_id, old=old_id, new=new_id)
        if group.state is GroupState.STABLE:
            if group.select_protocol() == group.protocol_name:
                persisted = self._persist_group(group)

                def done(_: object) -> None:
                    is_leader = group.leader_id == new_id
                    if req.supports_skip_assignment:
                        result = self._join_result(group, member, leader_view=is_leader,
                                                   skip_assignment=is_leader)
                    else:
                        result = self._join_result(group, member, leader_view=False,
                                                   leader=current_leader or "")
                    self._resolve_join(member, result)

                def failed(f: Any) -> None:
                    # Revert: the old member id keeps its place.
                    member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms = old
                    group.members.pop(new_id, None)
                    member.member_id = old_id
                    group.members[old_id] = member
                    group.static_members[req.group_instance_id or ""] = old_id
                    if group.leader_id == new_id:
                        group.leader_id = old_id
                    self._resolve_join(member, JoinResult(ErrorCode.unknown_member_id, ""))

                persisted.addCallbacks(done, failed)
                return d
            self._maybe_prepare_rebalance(group, "static member changed the selected protocol")
        elif group.state is GroupState.COMPLETING_REBALANCE:
            self._prepare_rebalance(group, "static member rejoined while completing rebalance")
        else:
            self._maybe_complete_join(group)
        return d

    # --- rebalance ----------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE,
                           GroupState.EMPTY):
            self._prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join(group)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
                self._resolve_sync(m, SyncResult(ErrorCode.rebalance_in_progress))
        self._cancel_sync_expiry(group)
        initial = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        log.info("preparing to rebalance group {group} (generation {generation}): {reason}",
                 group=group.group_id, generation=group.generation_id, reason=reason)
        if group.join_timer is not None and group.join_timer.active():
            group.join_timer.cancel()
        if initial and self.initial_rebalance_delay_ms > 0:
            # Kafka's group.initial.rebalance.delay.ms: let a new group's members gather.
            group.initial_delay = True
            group.joined_in_delay = False
            remaining = max(group.rebalance_timeout_ms() - self.initial_rebalance_delay_ms, 0)
            group.join_timer = self._now_timer(self.initial_rebalance_delay_ms,
                                               self._end_initial_delay, group, remaining)
            return
        if group.all_joined():
            self._complete_join(group)
        else:
            group.join_timer = self._now_timer(group.rebalance_timeout_ms(),
                                               self._complete_join, group)

    def _end_initial_delay(self, group: ClassicGroup, remaining_ms: int) -> None:
        """As Kafka's InitialDelayedJoin: while members keep arriving, wait one more delay,
        within the rebalance timeout in all; then complete the join."""
        if group.joined_in_delay and remaining_ms > 0 and self._alive(group):
            group.joined_in_delay = False
            delay = min(self.initial_rebalance_delay_ms, remaining_ms)
            group.join_timer = self._now_timer(delay, self._end_initial_delay, group,
                                               max(remaining_ms - delay, 0))
            return
        self._complete_join(group)

    def _maybe_complete_join(self, group: ClassicGroup) -> None:
        if (group.state is GroupState.PREPARING_REBALANCE and not group.initial_delay
                and group.all_joined()):
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        if not self._alive(group) or group.state is not GroupState.PREPARING_REBALANCE:
            return
        if group.join_timer is not None and group.join_timer.active():
            group.join_timer.cancel()
        group.join_timer = None
        group.initial_delay = False
        for m in [m for m in group.members.values()
                  if not m.awaiting_join and not m.group_instance_id]:
            log.info("removing member {member} of group {group}: did not rejoin in time",
                     member=m.member_id, group=group.group_id)
            self._remove_member(group, m)
        joined = [m for m in group.members.values() if m.awaiting_join]
        if group.members and not joined:
            # Only static members that did not rejoin: wait for their sessions to expire.
            group.join_timer = self._now_timer(group.rebalance_timeout_ms(),
                                               self._complete_join, group)
            return
        if group.leader_id not in group.members or not group.members[group.leader_id].awaiting_join:
            group.leader_id = joined[0].member_id if joined else None
        group.generation_id += 1
        if not group.members:
            group.state = GroupState.EMPTY
            group.empty_since_ms = int(self.clock.seconds() * 1000)
            group.protocol_name = None
            group.leader_id = None
            log.info("group {group} is empty at generation {generation}",
                     group=group.group_id, generation=group.generation_id)
            self._persist_group(group).addErrback(lambda f: None)
            return
        group.protocol_name = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        log.info("group {group} generation {generation}: {n} member(s), protocol {protocol}",
                 group=group.group_id, generation=group.generation_id, n=len(group.members),
                 protocol=group.protocol_name)
        group.pending_sync = set(group.members)
        for m in list(group.members.values()):
            result = self._join_result(group, m, leader_view=m.member_id == group.leader_id)
            m.is_new = False
            self._schedule_heartbeat(group, m)
            if m.awaiting_join:
                self._resolve_join(m, result)
        group.sync_timer = self._now_timer(group.rebalance_timeout_ms(),
                                           self._expire_pending_sync, group,
                                           group.generation_id)

    def _cancel_sync_expiry(self, group: ClassicGroup) -> None:
        group.pending_sync.clear()
        if group.sync_timer is not None and group.sync_timer.active():
            group.sync_timer.cancel()
        group.sync_timer = None

    def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        group.sync_timer = None
        if not self._alive(group) or generation != group.generation_id:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        missing = [group.members[i] for i in group.pending_sync if i in group.members]
        group.pending_sync.clear()
        if missing:
            for m in missing:
                self._remove_member(group, m)
            self._prepare_rebalance(group, f"{len(missing)} member(s) did not sync in time")

    def _expire_heartbeat(self, group: ClassicGroup, member: Member) -> None:
        member.heartbeat_timer = None
        if not self._alive(group) or group.members.get(member.member_id) is not member:
            return
        satisfied = (member.awaiting_join or member.sync_waiter is not None) and not member.is_new
        if satisfied:
            return
        log.info("member {member} of group {group} failed its session timeout; removing it",
                 member=member.member_id, group=group.group_id)
        self._remove_member_and_update(group, member, "session timeout")

    def _expire_pending(self, group: ClassicGroup, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is None or not self._alive(group):
            return
        self._maybe_complete_join(group)

    def _remove_member(self, group: ClassicGroup, member: Member) -> None:
        self._resolve_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        self._resolve_sync(member, SyncResult(ErrorCode.unknown_member_id))
        if member.heartbeat_timer is not None and member.heartbeat_timer.active():
            member.heartbeat_timer.cancel()
        member.heartbeat_timer = None
        group.members.pop(member.member_id, None)
        group.pending_sync.discard(member.member_id)
        if member.group_instance_id and group.static_members.get(
                member.group_instance_id) == member.member_id:
            del group.static_members[member.group_instance_id]
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)

    def _remove_member_and_update(self, group: ClassicGroup, member: Member, reason: str) -> None:
        self._remove_member(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member.member_id} removed: {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    # --- SyncGroup ----------------------------------------------------------------------

    def sync(self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
             protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes]) -> Deferred:
        """Handle a SyncGroup; fires with a ``SyncResult`` (followers park until the leader's)."""
        if not valid_group_id(group_id):
            return succeed(SyncResult(ErrorCode.invalid_group_id))
        if self.consumer_groups is not None and self.consumer_groups.owns(group_id):
            return self.consumer_groups.classic_sync(group_id, member_id, instance_id,
                                                     generation_id, protocol_type, protocol_name)
        group = self.groups.get(group_id)
        if group is None:
            return succeed(SyncResult(ErrorCode.unknown_member_id))
        if group.state is GroupState.DEAD:
            return succeed(SyncResult(ErrorCode.coordinator_not_available))
        error = self._validate_member(group, member_id, instance_id)
        if error is not ErrorCode.none:
            return succeed(SyncResult(error))
        if generation_id != group.generation_id:
            return succeed(SyncResult(ErrorCode.illegal_generation))
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return succeed(SyncResult(ErrorCode.inconsistent_group_protocol))
        if group.state is GroupState.EMPTY:
            return succeed(SyncResult(ErrorCode.unknown_member_id))
        if group.state is GroupState.PREPARING_REBALANCE:
            return succeed(SyncResult(ErrorCode.rebalance_in_progress))
        member = group.members[member_id]
        group.pending_sync.discard(member_id)
        if group.state is GroupState.STABLE:
            return succeed(SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name,
                                      member.assignment))
        # CompletingRebalance: park until the leader's assignment is durable.
        self._resolve_sync(member, SyncResult(ErrorCode.rebalance_in_progress))
        d: Deferred = Deferred(lambda d: self._sync_cancelled(member, d))
        member.sync_waiter = d
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            generation = group.generation_id
            persisted = self._persist_group(group)

            def stored(_: object) -> None:
                if group.state is GroupState.COMPLETING_REBALANCE and (
                        group.generation_id == generation) and self._alive(group):
                    group.state = GroupState.STABLE
                    self._propagate(group, ErrorCode.none)

            def failed(f: Any) -> None:
                if group.state is GroupState.COMPLETING_REBALANCE and (
                        group.generation_id == generation) and self._alive(group):
                    for m in group.members.values():
                        m.assignment = b""
                    self._propagate(group, ErrorCode.coordinator_not_available)

            persisted.addCallbacks(stored, failed)
        return d

    def _propagate(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error is ErrorCode.none
        for m in list(group.members.values()):
            result = SyncResult(error, group.protocol_type if ok else None,
                                group.protocol_name if ok else None,
                                m.assignment if ok else b"")
            if self._resolve_sync(m, result):
                self._schedule_heartbeat(group, m)

    # --- Heartbeat and LeaveGroup -------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        """Handle a Heartbeat; resets the member's session timer when it is a member."""
        if not valid_group_id(group_id):
            return ErrorCode.invalid_group_id
        if self.consumer_groups is not None and self.consumer_groups.owns(group_id):
            return self.consumer_groups.classic_heartbeat(group_id, member_id, instance_id,
                                                          generation_id)
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        error = self._validate_member(group, member_id, instance_id)
        if error is not ErrorCode.none:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        self._schedule_heartbeat(group, group.members[member_id])
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, members: list[tuple[str, str | None]]
              ) -> tuple[ErrorCode, list[ErrorCode]]:
        """Handle a LeaveGroup of ``(member_id, group_instance_id)`` pairs.

        Returns (top-level error, one error per requested member). Any successful removal of a
        member of a Stable/CompletingRebalance group triggers a rebalance.
        """
        if not valid_group_id(group_id):
            return ErrorCode.invalid_group_id, []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id, []
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, []
        errors: list[ErrorCode] = []
        removed: list[Member] = []
        pending_removed = False
        for member_id, instance_id in members:
            if instance_id:
                owner = group.static_members.get(instance_id)
                if owner is None or owner not in group.members:
                    errors.append(ErrorCode.unknown_member_id)
                elif member_id and member_id != owner:
                    errors.append(ErrorCode.fenced_instance_id)
                else:
                    removed.append(group.members[owner])
                    self._remove_member(group, group.members[owner])
                    errors.append(ErrorCode.none)
            elif member_id in group.pending_members:
                timer = group.pending_members.pop(member_id)
                if timer.active():
                    timer.cancel()
                pending_removed = True
                errors.append(ErrorCode.none)
            elif member_id in group.members:
                removed.append(group.members[member_id])
                self._remove_member(group, group.members[member_id])
                errors.append(ErrorCode.none)
            else:
                errors.append(ErrorCode.unknown_member_id)
        if removed or pending_removed:
            log.info("group {group}: {n} member(s) left", group=group_id,
                     n=len(removed) + int(pending_removed))
            if removed and group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                self._prepare_rebalance(group, "member(s) left the group")
            else:
                self._maybe_complete_join(group)
        return ErrorCode.none, errors

    # --- online migration (``kmqkafka.coordinators.migration``) --------------------------

    def hand_over(self, group_id: str) -> None:
        """Give up a group that has become a consumer group: parked JoinGroup and SyncGroup
        calls answer REBALANCE_IN_PROGRESS (their clients join again, into the consumer
        group, as Kafka's ``convertToConsumerGroup`` answers them) and its timers stop."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        for m in group.members.values():
            self._resolve_join(m, JoinResult(ErrorCode.rebalance_in_progress, m.member_id))
            self._resolve_sync(m, SyncResult(ErrorCode.rebalance_in_progress))
        self._cancel_group_timers(group)

    def take_over(self, group: ClassicGroup, reason: str) -> None:
        """Serve a Stable group converted from a consumer group (its record is written by the
        caller) and rebalance it at once, so that its leader assigns what the members that
        left held; members learn of it from REBALANCE_IN_PROGRESS on their heartbeats."""
        self.groups[group.group_id] = group
        for m in group.members.values():
            self._schedule_heartbeat(group, m)
        self._prepare_rebalance(group, reason)

    # --- administration -----------------------------------------------------------------

    def describe(self, group_id: str) -> GroupDescription | None:
        """The group as DescribeGroups shows it, or None when it does not exist."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        stable = group.state is GroupState.STABLE
        members = tuple(
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata_for(group.protocol_name) if stable else b"",
                m.assignment if stable else b"")
            for m in group.members.values())
        return GroupDescription(group_id, group.state.value, group.protocol_type or "",
                                group.protocol_name or "" if stable else "", members)

    def list_groups(self) -> list[tuple[str, str, str]]:
        """``(group_id, protocol_type, state)`` of every group."""
        return [(g.group_id, g.protocol_type or "", g.state.value) for g in self.groups.values()]

    def delete_groups(self, group_ids: list[str]) -> Deferred:
        """Delete empty groups and their offsets; fires with {group_id: ErrorCode}."""
        results: dict[str, ErrorCode] = {}
        pairs: list[tuple[str, bytes, bytes | None]] = []
        deleted: list[str] = []
        for group_id in group_ids:
            if not valid_group_id(group_id, allow_empty=True):
                results[group_id] = ErrorCode.invalid_group_id
                continue
            group = self.groups.get(group_id)
            if group is None or group.state is GroupState.DEAD:
                results[group_id] = ErrorCode.group_id_not_found
                continue
            if group.state is not GroupState.EMPTY:
                results[group_id] = ErrorCode.non_empty_group
                continue
            for key, value in self.offsets.delete_records(group_id):
                pairs.append((OFFSETS_FAMILY, key, value))
            key, tomb = GroupLog.tombstone(group_id)
            pairs.append((GROUPS_FAMILY, key, tomb))
            group.state = GroupState.DEAD
            self._cancel_group_timers(group)
            del self.groups[group_id]
            deleted.append(group_id)
            results[group_id] = ErrorCode.none
        if not deleted:
            return succeed(results)
        for family, key, value in pairs:
            if family == OFFSETS_FAMILY:
                self.offsets.replay(key, value)
        writes = [self._persist([(k, v) for f, k, v in pairs if f == fam], fam)
                  for fam in (OFFSETS_FAMILY, GROUPS_FAMILY)
                  if any(f == fam for f, _, _ in pairs)]
        d = gatherResults(writes, consumeErrors=True)

        def failed(f: Any) -> dict[str, ErrorCode]:
            log.warn("deleting groups failed: {error}", error=f.getErrorMessage())
            return {g: (ErrorCode.coordinator_not_available if g in deleted else e)
                    for g, e in results.items()}

        d.addCallbacks(lambda _: results, failed)
        return d

    def forget_topic(self, topic: str) -> Deferred:
        """A deleted topic takes every group's committed offsets of it along, as in Kafka:
        a group must not resume a recreated topic of that name at an old position."""
        records = []
        for group_id in self.offsets.groups():
            records += self.offsets.delete_records(
                group_id, [tp for tp in self.offsets.of_group(group_id) if tp[0] == topic])
        if not records:
            return succeed(None)
        d = self._persist(records, OFFSETS_FAMILY)
        for key, value in records:
            self.offsets.replay(key, value)
        return d

    def expire_offsets(self, retention_ms: int) -> Deferred:
        """Kafka's periodic clean-up (``offsets.retention.minutes``, KIP-211): committed
        offsets older than ``retention_ms`` go, then every empty group left without offsets.

        What counts as older, as in Kafka: an empty classic group's offsets from when its last
        member left (or their commit, for a group emptied before that was recorded); a
        standalone group's (no protocol) each from its commit; a stable consumer-protocol
        group's, and a KIP-848 group's, only for topics it no longer subscribes to, from their
        commit. An offset whose commit time is unknown (0) never expires. Fires with the ids
        of the groups deleted."""
        now_ms = int(self.clock.seconds() * 1000)
        records: list[Record] = []
        touched: list[str] = []
        for group_id in self.offsets.groups():
            expired = self._expired(group_id, now_ms, retention_ms)
            if expired:
                records += self.offsets.delete_records(group_id, expired)
                touched.append(group_id)
        for key, value in records:
            self.offsets.replay(key, value)
        writes = [self._persist(records, OFFSETS_FAMILY)] if records else []
        # A standalone group with no group record is gone with its last offset.
        gone = [g for g in touched if g not in self.groups and not self.offsets.has_group(g)
                and (self.consumer_groups is None
                     or self.consumer_groups.subscribed_topics(g) is None)]
        tombs: list[Record] = []
        for group_id, group in list(self.groups.items()):
            if group.state is GroupState.EMPTY and not self.offsets.has_group(group_id):
                group.state = GroupState.DEAD
                self._cancel_group_timers(group)
                del self.groups[group_id]
                tombs.append(GroupLog.tombstone(group_id))
                gone.append(group_id)
        if tombs:
            writes.append(self._persist(tombs))
        if self.consumer_groups is not None:
            empty = [g for g, state in self.consumer_groups.list_groups()
                     if state == "Empty" and not self.offsets.has_group(g)]
            if empty:
                _results, written = self.consumer_groups.delete_groups(empty)
                writes.append(written)
                gone += empty
        if gone or records:
            log.info("offset expiry removed {offsets} offset(s) and {groups} empty group(s)",
                     offsets=len(records), groups=len(gone))
        return gatherResults(writes, consumeErrors=True).addCallback(lambda _: gone)

    def _expired(self, group_id: str, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """The partitions of ``group_id`` whose committed offsets have expired."""
        offsets = self.offsets.of_group(group_id)
        subscribed: set[str] | None = (None if self.consumer_groups is None
                                       else self.consumer_groups.subscribed_topics(group_id))
        since: int | None = None
        if subscribed is None:
            group = self.groups.get(group_id)
            subscribed = set()
            if group is not None and group.protocol_type:
                if group.state is GroupState.EMPTY:
                    since = group.empty_since_ms
                else:
                    topics = (group.subscribed_topics()
                              if group.protocol_type == CONSUMER_PROTOCOL_TYPE
                              and group.state is GroupState.STABLE else None)
                    if topics is None:
                        return []  # in a rebalance, or its subscriptions unknown: keep all
                    subscribed = topics
        return [tp for tp, c in offsets.items()
                if tp[0] not in subscribed and c.commit_ms > 0
                and now_ms - max(since or 0, c.commit_ms) >= retention_ms]

    def rebalance_groups_subscribed_to(self, topic: str) -> list[str]:
        """Trigger a rebalance of every active consumer group subscribed to ``topic``.

        Called by the CreatePartitions handler after a successful (non validate-only) increase,
        so members pick up the new partitions. A group whose subscriptions cannot be decoded is
        rebalanced too. KIP-848 consumer groups whose partition counts changed get a new group
        epoch. Returns the ids of the groups rebalanced.
        """
        done = []
        if self.consumer_groups is not None:
            done.extend(self.consumer_groups.partitions_added(topic))
        for group in list(self.groups.values()):
            if group.state not in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                continue
            topics = group.subscribed_topics()
            if group.protocol_type == CONSUMER_PROTOCOL_TYPE and (topics is None or topic in topics):
                self._prepare_rebalance(group, f"partitions added to topic {topic}")
                done.append(group.group_id)
        return done

    # --- offsets ------------------------------------------------------------------------

    def validate_commit(self, group_id: str, generation_id: int, member_id: str,
                        instance_id: str | None, api_version: int = 9,
                        ) -> tuple[ErrorCode, ClassicGroup | None]:
        """Kafka's OffsetCommit checks for a classic group. A group that does not exist is
        created (a "simple" group) for a commit with generation -1, whatever member id it
        names; with a generation it is GROUP_ID_NOT_FOUND from v9 on, ILLEGAL_GENERATION
        before (Kafka's OffsetMetadataManager.validateOffsetCommit)."""
        if not valid_group_id(group_id, allow_empty=True):
            return ErrorCode.invalid_group_id, None
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return (ErrorCode.group_id_not_found if api_version >= 9
                        else ErrorCode.illegal_generation), None
            if not self._new_group_allowed():
                return ErrorCode.group_max_size_reached, None
            group = self.groups[group_id] = ClassicGroup(group_id)
            return ErrorCode.none, group
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, None
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.none, group
        if generation_id >= 0 or member_id or instance_id:
            error = self._validate_member(group, member_id, instance_id)
            if error is not ErrorCode.none:
                return error, None
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation, None
        elif group.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id, None
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress, None
        if member_id in group.members:
            self._schedule_heartbeat(group, group.members[member_id])
        return ErrorCode.none, group

    def commit_offsets(self, group_id: str, commits: list[tuple[str, int, CommittedOffset]]
                       ) -> Deferred:
        """Write already validated commits; fires once durable (errback on a store failure)."""
        records = self.offsets.commit_records(group_id, commits)
        if not records:
            return succeed(None)
        d = self._persist(records, OFFSETS_FAMILY)
        for key, value in records:  # the store applies at once and acknowledges when durable
            self.offsets.replay(key, value)
        return d

    def fetch_offsets(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        """Every committed partition of ``group_id`` (empty for an unknown group)."""
        return self.offsets.of_group(group_id)

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> Deferred:
        """OffsetDelete: fires with (top-level error, {partition: error}).

        Partitions of topics the (non-empty) consumer group subscribes to answer
        GROUP_SUBSCRIBED_TO_TOPIC, for classic and KIP-848 groups alike; a non-empty classic
        group of another protocol type answers NON_EMPTY_GROUP; everything else is deleted.
        """
        if not valid_group_id(group_id):
            return succeed((ErrorCode.invalid_group_id, {}))
        subscribed: set[str] | None = (None if self.consumer_groups is None
                                       else self.consumer_groups.subscribed_topics(group_id))
        if subscribed is None:
            group = self.groups.get(group_id)
            if group is None or group.state is GroupState.DEAD:
                return succeed((ErrorCode.group_id_not_found, {}))
            subscribed = set()
            if group.state is not GroupState.EMPTY:
                if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                    return succeed((ErrorCode.non_empty_group, {}))
                subscribed = group.subscribed_topics()
        results: dict[TopicPartition, ErrorCode] = {}
        deletable: list[TopicPartition] = []
        for tp in partitions:
            if subscribed is None or tp[0] in subscribed:
                results[tp] = ErrorCode.group_subscribed_to_topic
            else:
                results[tp] = ErrorCode.none
                deletable.append(tp)
        records = self.offsets.delete_records(group_id, deletable)
        if not records:
            return succeed((ErrorCode.none, results))
        d = self._persist(records, OFFSETS_FAMILY)
        for key, value in records:
            self.offsets.replay(key, value)
        d.addCallback(lambda _: (ErrorCode.none, results))
        return d


__all__ = [
    "ClassicGroup", "GroupCoordinator", "GroupDescription", "GroupLog", "GroupState",
    "JoinRequest", "JoinResult", "JoinedMember", "Member", "MemberDescription", "SyncResult",
    "subscription_topics", "valid_group_id",
]
