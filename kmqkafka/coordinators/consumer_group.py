"""KIP-848 consumer groups: ConsumerGroupHeartbeat state machine with server-side assignment.

The model (Apache Kafka's next-generation rebalance protocol):

* A group has a **group epoch**, bumped whenever something that changes the assignment changes:
  a member joins or leaves, a subscription or the server assignor changes, or the partition
  count of a subscribed topic changes (the group's *subscription metadata*).
* When the group epoch is ahead of the **assignment epoch**, the selected server assignor
  (``uniform`` by default, or ``range``; chosen by the members' ``server_assignor``) computes a
  new **target assignment** at once and the assignment epoch catches up.
* Each member has a **member epoch** and a **current assignment** it may consume. A member
  behind the assignment epoch **reconciles** on its heartbeats: partitions it holds that the
  target no longer gives it are revoked first (the member keeps its epoch and stays
  ``unrevoked_partitions`` until a heartbeat reports owned partitions without them); then it
  moves to the new epoch and is given the target partitions nobody else holds. Partitions still
  held (assigned or pending revocation) by another member are withheld
  (``unreleased_partitions``) and handed over on a later heartbeat once released. So at no
  point do two members hold the same partition.
* Heartbeats carry the epoch the member believes it has: ahead of ours → FENCED_MEMBER_EPOCH;
  behind is accepted only for the previous epoch when its owned partitions are a subset of its
  assignment (the response that bumped it was lost); anything else → FENCED_MEMBER_EPOCH.
  Epoch 0 joins (or rejoins, dropping everything held); -1 leaves; -2 is a static member's
  temporary leave (kept with its assignment until its session expires or it rejoins with a new
  member id and takes the old one's place).
* A member not heard from for the session timeout (``group.consumer.session.timeout.ms``,
  45 s) is removed, as is one that does not revoke within its rebalance timeout.

Durability: one record per group in the ``groups`` family under key
``CONSUMER_KEY_PREFIX + group_id`` (the classic coordinator skips that prefix), value JSON::

    {"epoch": int, "assignment_epoch": int, "assignor": str,
     "metadata": {topic name: [topic id, partitions]},
     "members": [{"id", "instance", "rack", "client_id", "client_host", "rebalance_ms",
                  "topics": [names], "regex": str|null, "assignor": str|null, "epoch": int,
                  "prev": int, "state": str, "assigned": {topic id: [p...]},
                  "revoking": {topic id: [p...]},
                  "classic": {"session_ms": int, "protocols": [[name, base64]]} (absent for
                  members that speak KIP-848)}],
     "target": {member id: {topic id: [p...]}}}

A null value deletes the group. A heartbeat that changes the record answers once it is durable.
After a restart members' timers start afresh. Committed offsets stay in the ``offsets`` family,
written through the classic coordinator's ``OffsetStore`` (so the lag metric covers them).

Reactor-thread only; time comes from the injected ``IReactorTime``. Results carry kio
``ErrorCode``s; the wire mapping lives in ``kmqkafka.kafka.consumer_groups``.
"""
from __future__ import annotations

import base64
import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from kmqkafka.coordinators.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, Assignment
from kmqkafka.coordinators.classic_members import (
    STABLE, UNRELEASED, UNREVOKED, ClassicMembers, Reject as _Reject,
)
from kmqkafka.coordinators.group import (
    DEFAULT_MAX_GROUP_SIZE, FOREIGN_KEY_PREFIX, GROUPS_FAMILY, GroupLog, GroupState,
)
from kmqkafka.coordinators.migration import (
    DEFAULT_POLICY, ClassicProtocol, ConversionRefused, allows_downgrade, to_classic_group,
    to_consumer_group,
)

CONSUMER_KEY_PREFIX = FOREIGN_KEY_PREFIX + b"consumer\x00"
DEFAULT_SESSION_TIMEOUT_MS = 45000  # group.consumer.session.timeout.ms
DEFAULT_HEARTBEAT_INTERVAL_MS = 5000  # group.consumer.heartbeat.interval.ms
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2

log = Logger()


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat; ``None`` fields mean "unchanged since the last heartbeat".

    ``owned`` is topic id (str) -> partitions; ``rebalance_timeout_ms`` is -1 when unchanged.
    ``client_generates_id``: v1+, where the member id comes from the client and must be set.
    """

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    client_generates_id: bool = True
    # The topics of ``names`` this member may describe (the ACLs, as its principal): what its
    # regex may match. None lets every topic through.
    describable: Callable[[list[str]], list[str]] | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


@dataclass(eq=False)
class ConsumerMember:
    """One member; timers are not persisted."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300000
    topics: tuple[str, ...] = ()
    regex: str | None = None
    assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = -1
    state: str = STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    # Set for a member that speaks the classic protocol (``classic_members``).
    classic: ClassicProtocol | None = None
    # Its last heartbeat's ``HeartbeatRequest.describable`` (not persisted: after a restart a
    # regex matches every topic until the member's next heartbeat).
    describable: Callable[[list[str]], list[str]] | None = None
    session_timer: IDelayedCall | None = None
    revocation_timer: IDelayedCall | None = None
    join_timer: IDelayedCall | None = None  # classic: from REBALANCE_IN_PROGRESS to JoinGroup
    sync_timer: IDelayedCall | None = None  # classic: from a JoinGroup answer to its SyncGroup

    def holds(self) -> set[tuple[str, int]]:
        """Every partition this member may still be consuming (assigned or being revoked)."""
        return _pairs(self.assigned) | _pairs(self.revoking)


@dataclass(eq=False)
class ConsumerGroup:
    """The state of one consumer group (reactor-thread only)."""

    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = DEFAULT_ASSIGNOR
    metadata: dict[str, tuple[str, int]] = field(default_factory=dict)
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    persisted: bytes | None = None
    # Regexes resolved against the topic list (Kafka resolves a new one in the background: the
    # heartbeat that brings it is assigned the literal topics only). Not persisted: a loaded
    # group's regexes count as resolved.
    resolved_regexes: set[str] = field(default_factory=set)
    resolving: bool = False
    # Records of a downgrade to a classic group, written by the next ``_persist``.
    handed_over: list[tuple[bytes, bytes | None]] = field(default_factory=list)

    def held_by_others(self, member: ConsumerMember) -> set[tuple[str, int]]:
        """Partitions another member still holds (assigned or being revoked)."""
        held: set[tuple[str, int]] = set()
        for other in self.members.values():
            if other is not member:
                held |= other.holds()
        return held

    def state(self) -> str:
        """Kafka's ConsumerGroupState name: Empty, Assigning, Reconciling or Stable."""
        if not self.members:
            return "Empty"
        if self.epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state != STABLE
               for m in self.members.values()):
            return "Reconciling"
        return "Stable"


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    topics: tuple[str, ...]
    regex: str | None
    assignment: Assignment
    target: Assignment
    classic: bool = False  # speaks the classic protocol (ConsumerGroupDescribe's MemberType)


@dataclass(frozen=True, slots=True)
class GroupView:
    """What ConsumerGroupDescribe shows of a group."""

    group_id: str
    state: str
    epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberView, ...]


def _pairs(a: Assignment) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in a.items() for p in ps}


def _from_pairs(pairs: Iterable[tuple[str, int]]) -> Assignment:
    out: dict[str, set[int]] = {}
    for t, p in pairs:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items() if ps}


def _json_assignment(a: Assignment) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(a.items()) if ps}


def _read_assignment(d: Mapping[str, list[int]]) -> Assignment:
    return {t: frozenset(ps) for t, ps in d.items() if ps}


def _json_classic(cp: ClassicProtocol) -> dict[str, Any]:
    return {"session_ms": cp.session_timeout_ms,
            "protocols": [[n, base64.b64encode(md).decode()] for n, md in cp.protocols]}


def _read_classic(d: Mapping[str, Any]) -> ClassicProtocol:
    return ClassicProtocol(d["session_ms"],
                           tuple((n, base64.b64decode(md)) for n, md in d["protocols"]))


def _matching(member: ConsumerMember, names: list[str]) -> list[str]:
    """The topics of ``names`` the member's regex subscribes it to: those it matches in full
    and, with ACLs, that the member may describe (Kafka never assigns a member a topic it
    could not see through Metadata)."""
    pattern = re.compile(member.regex or "")
    matched = [n for n in names if pattern.fullmatch(n)]
    return member.describable(matched) if member.describable is not None and matched else matched


class ConsumerGroupLog:
    """Encoding of a consumer group as one ``groups`` family record (see the module doc)."""

    @staticmethod
    def key(group_id: str) -> bytes:
        return CONSUMER_KEY_PREFIX + group_id.encode()

    @staticmethod
    def value(group: ConsumerGroup) -> bytes:
        members = [
            {"id": m.member_id, "instance": m.instance_id, "rack": m.rack_id,
             "client_id": m.client_id, "client_host": m.client_host,
             "rebalance_ms": m.rebalance_timeout_ms, "topics": list(m.topics), "regex": m.regex,
             "assignor": m.assignor, "epoch": m.epoch, "prev": m.previous_epoch,
             "state": m.state, "assigned": _json_assignment(m.assigned),
             "revoking": _json_assignment(m.revoking),
             **({"classic": _json_classic(m.classic)} if m.classic is not None else {})}
            for m in group.members.values()]
        value = {"epoch": group.epoch, "assignment_epoch": group.assignment_epoch,
                 "assignor": group.assignor,
                 "metadata": {n: [i, c] for n, (i, c) in sorted(group.metadata.items())},
                 "members": members,
                 "target": {m: _json_assignment(a) for m, a in sorted(group.target.items())}}
        return json.dumps(value, separators=(",", ":")).encode()

    @staticmethod
    def replay(group_id: str, value: bytes) -> ConsumerGroup:
        d = json.loads(value)
        group = ConsumerGroup(group_id, epoch=d["epoch"], assignment_epoch=d["assignment_epoch"],
                              assignor=d.get("assignor", DEFAULT_ASSIGNOR),
                              metadata={n: (i, c) for n, (i, c) in d["metadata"].items()},
                              target={m: _read_assignment(a) for m, a in d["target"].items()})
        for md in d["members"]:
            m = ConsumerMember(
                md["id"], md.get("instance"), md.get("rack"), md.get("client_id", ""),
                md.get("client_host", ""), md["rebalance_ms"], tuple(md["topics"]),
                md.get("regex"), md.get("assignor"), md["epoch"], md["prev"], md["state"],
                _read_assignment(md["assigned"]), _read_assignment(md["revoking"]),
                _read_classic(md["classic"]) if md.get("classic") else None)
            group.members[m.member_id] = m
            if m.instance_id:
                group.static_members[m.instance_id] = m.member_id
        group.persisted = value
        return group


class ConsumerGroupCoordinator(ClassicMembers):
    """Every KIP-848 consumer group of this broker.

    ``store`` provides ``keyed_put``/``keyed_get``/``keyed_items`` (see ``GroupCoordinator``);
    ``topics`` provides ``get(name) -> Topic | None`` and ``all()`` (``TopicCatalog``);
    ``classic`` is the classic ``GroupCoordinator``: a group id is either classic or consumer,
    and ``max_groups`` counts both kinds. Call ``load()`` after the classic coordinator has
    loaded and before serving.
    """

    def __init__(
        self,
        clock: IReactorTime,
        store: Any,
        topics: Any,
        classic: Any = None,
        *,
        max_groups: int = 10000,
        max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        new_id: Callable[[], str] | None = None,
        group_configs: Any = None,
        migration_policy: str = DEFAULT_POLICY,
    ) -> None:
        """``group_configs`` (``kafka.group_configs.GroupConfigs``) holds per-group overrides
        of the session timeout and heartbeat interval (Kafka's GROUP config resource);
        ``migration_policy`` is Kafka's ``group.consumer.migration.policy``."""
        self.clock = clock
        self.store = store
        self.topics = topics
        self.classic = classic
        self.max_groups = max_groups
        self.max_group_size = max_group_size
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.group_configs = group_configs
        self.migration_policy = migration_policy
        self._new_id = new_id or (lambda: str(uuid.uuid4()))
        self.groups: dict[str, ConsumerGroup] = {}
        self.loaded = False

    # --- life cycle ---------------------------------------------------------------------

    def load(self) -> None:
        """Replay consumer groups from the ``groups`` family; start members' timers."""
        if self.loaded:
            return
        for key, value in self.store.keyed_items(GROUPS_FAMILY, CONSUMER_KEY_PREFIX):
            group = ConsumerGroupLog.replay(key[len(CONSUMER_KEY_PREFIX):].decode(), value)
            self.groups[group.group_id] = group
            group.resolved_regexes = {m.regex for m in group.members.values() if m.regex}
            for m in group.members.values():
                self._touch(group, m)
                if m.state == UNREVOKED:
                    self._start_revocation_timer(group, m)
            if self.classic is not None:
                # The classic coordinator makes an empty group for every id with offsets.
                self.classic.groups.pop(group.group_id, None)
        self.loaded = True
        log.info("consumer group coordinator loaded {groups} group(s)", groups=len(self.groups))

    def stop(self) -> None:
        """Cancel every timer (the store keeps what was written)."""
        for group in self.groups.values():
            for m in group.members.values():
                self._cancel_timers(m)

    def owns(self, group_id: str) -> bool:
        """Whether ``group_id`` is a consumer (KIP-848) group."""
        return group_id in self.groups

    # --- ConsumerGroupHeartbeat ---------------------------------------------------------

    def heartbeat(self, req: HeartbeatRequest) -> Deferred:
        """Handle one ConsumerGroupHeartbeat; fires with a ``HeartbeatResult`` once any state
        change it made is durable."""
        try:
            self._check_request(req)
            if req.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
                return self._leave(req)
            return self._join_or_heartbeat(req)
        except _Reject as r:
            return succeed(HeartbeatResult(r.code, r.message, req.member_id or None,
                                           req.member_epoch))

    def _check_request(self, req: HeartbeatRequest) -> None:
        invalid = ErrorCode.invalid_request
        if not req.group_id:
            raise _Reject(invalid, "GroupId can't be empty.")
        if req.instance_id == "":
            raise _Reject(invalid, "InstanceId can't be empty.")
        if req.rack_id == "":
            raise _Reject(invalid, "RackId can't be empty.")
        if req.client_generates_id and not req.member_id:
            raise _Reject(invalid, "MemberId can't be empty.")
        if req.member_epoch < LEAVE_STATIC_EPOCH:
            raise _Reject(invalid, f"MemberEpoch {req.member_epoch} is invalid.")
        if req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise _Reject(invalid, "RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or req.owned:
                raise _Reject(invalid, "TopicPartitions must be empty when (re-)joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise _Reject(invalid, "SubscribedTopicNames or SubscribedTopicRegex must be "
                                       "set in first request.")
        elif req.member_epoch == LEAVE_STATIC_EPOCH and not req.instance_id:
            raise _Reject(invalid, "InstanceId can't be null when leaving as a static member.")
        elif req.member_epoch > 0 and not req.member_id:
            raise _Reject(invalid, "MemberId can't be empty.")
        if req.server_assignor is not None and req.server_assignor not in ASSIGNORS:
            raise _Reject(ErrorCode.unsupported_assignor,
                          f"ServerAssignor {req.server_assignor} is not supported. Supported "
                          f"assignors: {', '.join(sorted(ASSIGNORS))}.")
        if req.subscribed_topic_regex:
            try:
                re.compile(req.subscribed_topic_regex)
            except re.error as e:
                raise _Reject(ErrorCode.invalid_regular_expression,
                              f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a "
                              f"valid regular expression: {e}.") from None

    def _group_for_join(self, req: HeartbeatRequest) -> tuple[ConsumerGroup, list[Any]]:
        """The group to heartbeat into, created (not yet registered) for a first join.

        Returns (group, extra records to write); raises ``_Reject``.
        """
        group = self.groups.get(req.group_id)
        if group is not None:
            return group, []
        if req.member_epoch != 0:
            raise _Reject(ErrorCode.group_id_not_found, f"Group {req.group_id} not found.")
        extra: list[Any] = []
        classic = self.classic.groups.get(req.group_id) if self.classic is not None else None
        if classic is not None:
            if classic.members or classic.state is not GroupState.EMPTY:
                return self._upgrade(classic), []
            extra.append(GroupLog.tombstone(req.group_id))  # an empty classic group converts
        elif self._group_count() >= self.max_groups:
            raise _Reject(ErrorCode.group_max_size_reached,
                          f"The number of groups has reached the maximum of {self.max_groups}.")
        return ConsumerGroup(req.group_id), extra

    def _upgrade(self, classic: Any) -> ConsumerGroup:
        """Take a non-empty classic group over as a consumer group (online upgrade): its
        members stay, speaking the classic protocol, and the conversion is written at once
        (the heartbeat that caused it may still be refused)."""
        try:
            group = to_consumer_group(classic, ConsumerGroup, ConsumerMember, self.topic_id,
                                      policy=self.migration_policy,
                                      max_size=self.max_group_size)
        except ConversionRefused as exc:
            raise _Reject(ErrorCode.group_id_not_found, str(exc)) from None
        self.classic.hand_over(group.group_id)
        self.groups[group.group_id] = group
        self._refresh_metadata(group)
        for m in group.members.values():
            self._touch(group, m)
        log.info("classic group {group} (generation {epoch}, {n} member(s)) is now a consumer "
                 "group", group=group.group_id, epoch=group.epoch, n=len(group.members))
        self._persist(group, [GroupLog.tombstone(group.group_id)]).addErrback(lambda f: None)
        return group

    def _maybe_downgrade(self, group: ConsumerGroup) -> bool:
        """After members left: a group whose remaining members all speak the classic protocol
        becomes a classic group again (online downgrade), which rebalances at once. Its
        records are written by the caller's ``_persist``."""
        members = list(group.members.values())
        if (self.classic is None or not members or not allows_downgrade(self.migration_policy)
                or any(m.classic is None for m in members)
                or len(members) > self.classic.max_group_size
                or not set.intersection(*({n for n, _ in m.classic.protocols} for m in members))):
            return False
        classic = to_classic_group(group, self.topic_name)
        for m in members:
            self._cancel_timers(m)
        del self.groups[group.group_id]
        group.handed_over = [(ConsumerGroupLog.key(group.group_id), None),
                             GroupLog.record(classic)]
        log.info("consumer group {group} is now a classic group (generation {epoch}): only "
                 "classic members are left", group=group.group_id, epoch=classic.generation_id)
        self.classic.take_over(classic, "the last member using the consumer protocol left")
        return True

    def topic_id(self, name: str) -> str | None:
        topic = self.topics.get(name)
        return str(topic.topic_id) if topic is not None else None

    def topic_name(self, topic_id: str) -> str | None:
        topic = self.topics.by_id(uuid.UUID(topic_id))
        return topic.name if topic is not None else None

    def _group_count(self) -> int:
        classic = len(self.classic.groups) if self.classic is not None else 0
        return classic + len(self.groups)

    def _join_or_heartbeat(self, req: HeartbeatRequest) -> Deferred:
        group, extra = self._group_for_join(req)
        member, bump = self._member_for(group, req)
        old_assigned = dict(member.assigned)
        bump |= self._update_member(member, req)
        group.members.setdefault(member.member_id, member)
        if member.instance_id:
            group.static_members[member.instance_id] = member.member_id
        if group.group_id not in self.groups:
            self.groups[group.group_id] = group
            if self.classic is not None:
                self.classic.groups.pop(group.group_id, None)
            log.info("consumer group {group} created", group=group.group_id)
        bump |= self._refresh_metadata(group)
        if bump:
            group.epoch += 1
        self._maybe_assign(group)
        self._reconcile(group, member, req.owned)
        self._touch(group, member)
        # Kafka sends the assignment on a (re)join or when it changed; also when the member
        # reports owning something else (a response carrying the assignment was lost).
        send = req.member_epoch == 0 or member.assigned != old_assigned or (
            req.owned is not None and member.state != UNREVOKED
            and _pairs(req.owned) != _pairs(member.assigned))
        result = HeartbeatResult(ErrorCode.none, None, member.member_id, member.epoch,
                                 self._heartbeat_ms(group),
                                 dict(member.assigned) if send else None)
        return self._persist(group, extra).addCallbacks(
            lambda _: result,
            lambda f: HeartbeatResult(ErrorCode.coordinator_not_available, f.getErrorMessage(),
                                      member.member_id, req.member_epoch))

    def _member_for(self, group: ConsumerGroup, req: HeartbeatRequest
                    ) -> tuple[ConsumerMember, bool]:
        """Find, create or take over the member; returns (member, whether it is new)."""
        if req.instance_id:
            owner_id = group.static_members.get(req.instance_id)
            owner = group.members.get(owner_id) if owner_id else None
            if req.member_epoch == 0:
                if owner is None:
                    return self._new_member(group, req.member_id, req.instance_id), True
                if owner.member_id == req.member_id:
                    self._reset(owner)
                    return owner, False
                if owner.epoch != LEAVE_STATIC_EPOCH:
                    raise _Reject(ErrorCode.unreleased_instance_id,
                                  f"Static member {owner.member_id} with instance id "
                                  f"{req.instance_id} is not released yet.")
                return self._replace_static(group, owner, req.member_id), False
            if owner is None:
                raise _Reject(ErrorCode.unknown_member_id,
                              f"Instance id {req.instance_id} is unknown.")
            if owner.member_id != req.member_id:
                raise _Reject(ErrorCode.fenced_instance_id,
                              f"Instance id {req.instance_id} belongs to another member.")
            self._check_epoch(owner, req)
            return owner, False
        member = group.members.get(req.member_id) if req.member_id else None
        if member is None:
            if req.member_epoch != 0:
                raise _Reject(ErrorCode.unknown_member_id,
                              f"Member {req.member_id} is not a member of group {group.group_id}.")
            return self._new_member(group, req.member_id, req.instance_id), True
        if req.member_epoch == 0:
            self._reset(member)  # a rejoin: the member dropped everything it held
        else:
            self._check_epoch(member, req)
        return member, False

    def _new_member(self, group: ConsumerGroup, member_id: str, instance_id: str | None
                    ) -> ConsumerMember:
        if len(group.members) >= self.max_group_size:
            raise _Reject(ErrorCode.group_max_size_reached,
                          f"The consumer group has reached its maximum capacity of "
                          f"{self.max_group_size} members.")
        return ConsumerMember(member_id or self._new_id(), instance_id=instance_id)

    def _replace_static(self, group: ConsumerGroup, old: ConsumerMember, member_id: str
                        ) -> ConsumerMember:
        """A static member rejoining under a new member id takes over the old one's state."""
        self._cancel_timers(old)
        del group.members[old.member_id]
        new = ConsumerMember(
            member_id or self._new_id(), old.instance_id, old.rack_id, old.client_id,
            old.client_host, old.rebalance_timeout_ms, old.topics, old.regex, old.assignor,
            old.previous_epoch if old.epoch == LEAVE_STATIC_EPOCH else old.epoch, -1,
            old.state, dict(old.assigned), dict(old.revoking), old.classic)
        if new.epoch < 0:
            new.epoch = 0
        group.members[new.member_id] = new
        if old.member_id in group.target:
            group.target[new.member_id] = group.target.pop(old.member_id)
        if new.state == UNREVOKED:
            self._start_revocation_timer(group, new)
        log.info("group {group}: static member {instance} rejoined as {member}",
                 group=group.group_id, instance=old.instance_id, member=new.member_id)
        return new

    @staticmethod
    def _reset(member: ConsumerMember) -> None:
        member.epoch, member.previous_epoch, member.state = 0, -1, STABLE
        member.assigned, member.revoking = {}, {}

    @staticmethod
    def _check_epoch(member: ConsumerMember, req: HeartbeatRequest) -> None:
        received = req.member_epoch
        if received > member.epoch:
            raise _Reject(ErrorCode.fenced_member_epoch,
                          f"The consumer group member has a greater member epoch ({received}) "
                          f"than the one known by the group coordinator ({member.epoch}).")
        if received < member.epoch:
            lost_ack = received == member.previous_epoch and (
                req.owned is None or _pairs(req.owned) <= _pairs(member.assigned))
            if not lost_ack:
                raise _Reject(ErrorCode.fenced_member_epoch,
                              f"The consumer group member has a smaller member epoch "
                              f"({received}) than the one known by the group coordinator "
                              f"({member.epoch}).")

    @staticmethod
    def _update_member(member: ConsumerMember, req: HeartbeatRequest) -> bool:
        """Apply what the request changed; True if the group epoch must be bumped."""
        bump = False
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.client_id:
            member.client_id = req.client_id
        if req.client_host:
            member.client_host = req.client_host
        if req.subscribed_topic_names is not None:
            topics = tuple(sorted(set(req.subscribed_topic_names)))
            bump |= topics != member.topics
            member.topics = topics
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            bump |= regex != member.regex
            member.regex = regex
        if req.server_assignor is not None and req.server_assignor != member.assignor:
            member.assignor = req.server_assignor
            bump = True
        if req.describable is not None:
            member.describable = req.describable
        return bump

    # --- subscription metadata and target assignment ------------------------------------

    def _subscribed_names(self, group: ConsumerGroup) -> set[str]:
        names: set[str] = set()
        regexes = set()
        for m in group.members.values():
            names.update(m.topics)
            if m.regex:
                regexes.add(m.regex)
        if regexes - group.resolved_regexes and not group.resolving:
            group.resolving = True
            self.clock.callLater(0, self._resolve_regexes, group)
        if regexes & group.resolved_regexes:
            all_names = [t.name for t in self.topics.all()]
            for m in group.members.values():
                if m.regex in group.resolved_regexes:
                    names.update(_matching(m, all_names))
        return names

    def _resolve_regexes(self, group: ConsumerGroup) -> None:
        """Resolve the members' new regexes after the heartbeat that brought them (Kafka's
        ``refreshRegularExpressions`` runs in the background): the topics they match join
        the target under a new group epoch, which members pick up on their next heartbeat."""
        group.resolving = False
        if self.groups.get(group.group_id) is not group:
            return
        group.resolved_regexes = {m.regex for m in group.members.values() if m.regex}
        if not group.members or not self._refresh_metadata(group):
            return
        group.epoch += 1
        self._maybe_assign(group)
        self._persist(group).addErrback(lambda f: None)  # logged by _write

    def _member_topics(self, member: ConsumerMember, group: ConsumerGroup) -> frozenset[str]:
        """Topic ids (str) of existing topics the member subscribes to."""
        names = set(member.topics)
        if member.regex:
            names.update(_matching(member, list(group.metadata)))
        return frozenset(group.metadata[n][0] for n in names if n in group.metadata)

    def _refresh_metadata(self, group: ConsumerGroup) -> bool:
        """Re-read the subscribed topics' ids and partition counts; True if they changed."""
        metadata: dict[str, tuple[str, int]] = {}
        for name in self._subscribed_names(group):
            topic = self.topics.get(name)
            if topic is not None:
                metadata[name] = (str(topic.topic_id), int(topic.partitions))
        if metadata == group.metadata:
            return False
        group.metadata = metadata
        return True

    def _select_assignor(self, group: ConsumerGroup) -> str:
        votes = Counter(m.assignor for m in group.members.values() if m.assignor)
        if not votes:
            return DEFAULT_ASSIGNOR
        return sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]

    def _maybe_assign(self, group: ConsumerGroup) -> None:
        """Compute the target assignment when the group epoch is ahead of it."""
        if group.epoch <= group.assignment_epoch:
            return
        group.assignor = self._select_assignor(group)
        subscriptions = {m.member_id: self._member_topics(m, group)
                         for m in group.members.values()}
        counts = {tid: n for tid, n in group.metadata.values()}
        group.target = ASSIGNORS[group.assignor](subscriptions, counts, group.target)
        group.assignment_epoch = group.epoch
        log.info("group {group}: target assignment at epoch {epoch} by {assignor}",
                 group=group.group_id, epoch=group.epoch, assignor=group.assignor)

    # --- reconciliation -----------------------------------------------------------------

    def _reconcile(self, group: ConsumerGroup, member: ConsumerMember,
                   owned: Assignment | None) -> None:
        """Move ``member`` toward its target: revoke first, then assign what is free."""
        if member.epoch == LEAVE_STATIC_EPOCH:
            return
        if member.state == UNREVOKED:
            if owned is None or _pairs(owned) & _pairs(member.revoking):
                return  # still holds partitions being revoked
            member.revoking = {}
            self._stop_revocation_timer(member)
        elif member.epoch == group.assignment_epoch and member.state == STABLE:
            return
        target = _pairs(group.target.get(member.member_id, {}))
        assigned = _pairs(member.assigned)
        keep, revoke, wanted = assigned & target, assigned - target, target - assigned
        if revoke:
            member.assigned, member.revoking = _from_pairs(keep), _from_pairs(revoke)
            member.state = UNREVOKED
            self._start_revocation_timer(group, member)
            return
        free = wanted - group.held_by_others(member)
        member.assigned = _from_pairs(keep | free)
        if member.epoch != group.assignment_epoch:
            member.previous_epoch, member.epoch = member.epoch, group.assignment_epoch
        member.state = UNRELEASED if wanted - free else STABLE

    # --- leaving and expiry -------------------------------------------------------------

    def _leave(self, req: HeartbeatRequest) -> Deferred:
        group = self.groups.get(req.group_id)
        if group is None:
            raise _Reject(ErrorCode.group_id_not_found, f"Group {req.group_id} not found.")
        if req.instance_id:
            owner_id = group.static_members.get(req.instance_id)
            if owner_id is None or owner_id not in group.members:
                raise _Reject(ErrorCode.unknown_member_id,
                              f"Instance id {req.instance_id} is unknown.")
            if owner_id != req.member_id:
                raise _Reject(ErrorCode.fenced_instance_id,
                              f"Instance id {req.instance_id} belongs to another member.")
        member = group.members.get(req.member_id)
        if member is None:
            raise _Reject(ErrorCode.unknown_member_id,
                          f"Member {req.member_id} is not a member of group {group.group_id}.")
        if req.member_epoch == LEAVE_STATIC_EPOCH:
            if member.epoch != LEAVE_STATIC_EPOCH:
                member.previous_epoch, member.epoch = member.epoch, LEAVE_STATIC_EPOCH
            self._touch(group, member)
            log.info("group {group}: static member {member} left temporarily",
                     group=group.group_id, member=member.member_id)
        else:
            self._remove(group, member, "left the group")
        result = HeartbeatResult(ErrorCode.none, None, req.member_id, req.member_epoch, 0)
        return self._persist(group).addCallbacks(
            lambda _: result,
            lambda f: HeartbeatResult(ErrorCode.coordinator_not_available, f.getErrorMessage(),
                                      req.member_id, req.member_epoch))

    def _remove(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        """Drop a member, bump the group epoch and recompute the target assignment (or, when
        only classic members are left, hand the group back to the classic coordinator)."""
        self._drop(group, member, why)
        if not self._maybe_downgrade(group):
            self._bump(group)

    def _drop(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        """Forget a member and its timers; the caller bumps the group epoch."""
        self._cancel_timers(member)
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        if member.instance_id and group.static_members.get(member.instance_id) == member.member_id:
            del group.static_members[member.instance_id]
        log.info("group {group}: member {member} {why}", group=group.group_id,
                 member=member.member_id, why=why)

    def _bump(self, group: ConsumerGroup) -> None:
        self._refresh_metadata(group)
        group.epoch += 1
        self._maybe_assign(group)

    def leave_members(self, group_id: str, members: Iterable[tuple[str, str | None]]
                      ) -> tuple[list[ErrorCode], Deferred]:
        """A classic LeaveGroup aimed at consumer group ``group_id`` (Kafka's
        ``classicGroupLeaveToConsumerGroup``), which is how admin tools remove members
        (``remove_members``, ``--delete-members``): a static member by its instance id (member
        id empty, or its current one, else FENCED_INSTANCE_ID), any other by member id; unknown
        ones get UNKNOWN_MEMBER_ID. The removed members are fenced at once and the group epoch
        is bumped once. Returns one error per requested member and the Deferred of the write.
        """
        group = self.groups[group_id]
        errors: list[ErrorCode] = []
        removed = False
        for member_id, instance_id in members:
            if instance_id is None:
                member = group.members.get(member_id) if member_id else None
            else:
                owner_id = group.static_members.get(instance_id)
                member = group.members.get(owner_id) if owner_id else None
                if member is not None and member_id and member_id != member.member_id:
                    errors.append(ErrorCode.fenced_instance_id)
                    continue
            if member is None:
                errors.append(ErrorCode.unknown_member_id)
                continue
            self._drop(group, member, "was removed by a LeaveGroup request")
            removed = True
            errors.append(ErrorCode.none)
        if not removed:
            return errors, succeed(None)
        if not self._maybe_downgrade(group):
            self._bump(group)
        return errors, self._persist(group)

    def _expire(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        member.session_timer = member.revocation_timer = None
        if self.groups.get(group.group_id) is not group or (
                group.members.get(member.member_id) is not member):
            return
        self._remove(group, member, why)
        self._persist(group).addErrback(lambda f: None)  # logged by _write

    def _touch(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if member.session_timer is not None and member.session_timer.active():
            member.session_timer.cancel()
        session_ms = (member.classic.session_timeout_ms if member.classic is not None
                      else self._session_ms(group))
        member.session_timer = self.clock.callLater(
            session_ms / 1000.0, self._expire, group, member, "expired (session timeout)")

    def _session_ms(self, group: ConsumerGroup) -> int:
        if self.group_configs is None:
            return self.session_timeout_ms
        return self.group_configs.session_timeout_ms(group.group_id)

    def _heartbeat_ms(self, group: ConsumerGroup) -> int:
        if self.group_configs is None:
            return self.heartbeat_interval_ms
        return self.group_configs.heartbeat_interval_ms(group.group_id)

    def _start_revocation_timer(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if member.classic is not None:
            return  # a classic member revokes by joining again: its join timer bounds that
        self._stop_revocation_timer(member)
        member.revocation_timer = self.clock.callLater(
            member.rebalance_timeout_ms / 1000.0, self._expire, group, member,
            "did not revoke its partitions within the rebalance timeout")

    @staticmethod
    def _stop_revocation_timer(member: ConsumerMember) -> None:
        if member.revocation_timer is not None and member.revocation_timer.active():
            member.revocation_timer.cancel()
        member.revocation_timer = None

    def _cancel_timers(self, member: ConsumerMember) -> None:
        self._stop_revocation_timer(member)
        for timer in (member.session_timer, member.join_timer, member.sync_timer):
            if timer is not None and timer.active():
                timer.cancel()
        member.session_timer = member.join_timer = member.sync_timer = None

    # --- topic changes ------------------------------------------------------------------

    def partitions_added(self, topic: str) -> list[str]:
        """Re-read topic metadata of every group subscribed to ``topic``; groups whose partition
        counts changed get a new group epoch and target (members pick it up on their next
        heartbeat). Idempotent. Returns the ids of the groups bumped."""
        bumped = []
        for group in list(self.groups.values()):
            if not group.members or not self._refresh_metadata(group):
                continue
            group.epoch += 1
            self._maybe_assign(group)
            self._persist(group).addErrback(lambda f: None)  # logged by _write
            bumped.append(group.group_id)
        return bumped

    # --- offsets ------------------------------------------------------------------------

    def validate_commit(self, group_id: str, member_id: str, member_epoch: int,
                        api_version: int = 9) -> ErrorCode:
        """OffsetCommit checks for a consumer group (``generation_id_or_member_epoch``)."""
        group = self.groups[group_id]
        if member_epoch < 0 and not group.members:
            return ErrorCode.none  # an admin or manual commit to an empty group, any member id
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if api_version < 9 and member.classic is None:
            return ErrorCode.unsupported_version
        return self._epoch_error(group, member, member_epoch)

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int
                       ) -> ErrorCode:
        """OffsetFetch v9 checks: a fetch naming a member must carry its current epoch."""
        group = self.groups[group_id]
        if member_epoch < 0 and not member_id:
            return ErrorCode.none
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        return self._epoch_error(group, member, member_epoch)

    def _epoch_error(self, group: ConsumerGroup, member: ConsumerMember, member_epoch: int
                     ) -> ErrorCode:
        """Kafka's ``validateMemberEpoch``: any other epoch than the member's is stale (the
        client refreshes it and retries); FENCED_MEMBER_EPOCH belongs to heartbeats. A classic
        member's generation is its epoch: another one is ILLEGAL_GENERATION."""
        if member_epoch == member.epoch:
            return ErrorCode.none
        return (ErrorCode.illegal_generation if member.classic is not None
                else ErrorCode.stale_member_epoch)

    # --- administration -----------------------------------------------------------------

    def describe(self, group_id: str) -> GroupView | None:
        """The group as ConsumerGroupDescribe shows it, or None if it is not a consumer group."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        members = tuple(
            MemberView(m.member_id, m.instance_id, m.rack_id, m.epoch, m.client_id,
                       m.client_host, m.topics, m.regex, dict(m.assigned),
                       dict(group.target.get(m.member_id, {})), m.classic is not None)
            for m in group.members.values())
        return GroupView(group_id, group.state(), group.epoch, group.assignment_epoch,
                         group.assignor, members)

    def subscribed_topics(self, group_id: str) -> set[str] | None:
        """Topic names the members of consumer group ``group_id`` subscribe to, regexes resolved
        against existing topics (none for an empty group): OffsetDelete keeps these, as Kafka's
        ``ConsumerGroup.isSubscribedToTopic``. None when ``group_id`` is not a consumer group."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        return self._subscribed_names(group) if group.members else set()

    def list_groups(self) -> list[tuple[str, str]]:
        """``(group_id, state)`` of every consumer group."""
        return [(g.group_id, g.state()) for g in self.groups.values()]

    def delete_groups(self, group_ids: Iterable[str]) -> tuple[dict[str, ErrorCode], Deferred]:
        """Delete the given empty consumer groups (offsets are the caller's business).

        Returns ({group_id: error} for ids that are consumer groups, Deferred of the write).
        """
        results: dict[str, ErrorCode] = {}
        pairs: list[tuple[bytes, bytes | None]] = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is None:
                continue
            if group.members:
                results[group_id] = ErrorCode.non_empty_group
                continue
            del self.groups[group_id]
            pairs.append((ConsumerGroupLog.key(group_id), None))
            results[group_id] = ErrorCode.none
        return results, (self._write(pairs) if pairs else succeed(None))

    # --- persistence --------------------------------------------------------------------

    def _persist(self, group: ConsumerGroup, extra: list[Any] = ()) -> Deferred:  # type: ignore[assignment]
        """Write the group's record if it changed; fires once durable."""
        pairs = list(extra)
        pairs += group.handed_over
        group.handed_over = []
        if self.groups.get(group.group_id) is group:
            value = ConsumerGroupLog.value(group)
            if value != group.persisted:
                group.persisted = value
                pairs.append((ConsumerGroupLog.key(group.group_id), value))
        if not pairs:
            return succeed(None)
        return self._write(pairs)

    def _write(self, pairs: list[tuple[bytes, bytes | None]]) -> Deferred:
        try:
            d = self.store.keyed_put(GROUPS_FAMILY, pairs)
        except Exception as exc:  # a stopped store raises rather than failing the Deferred
            d = fail(exc)
        d.addErrback(lambda f: (log.warn("could not persist consumer group state: {error}",
                                         error=f.getErrorMessage()), f)[1])
        return d


__all__ = [
    "CONSUMER_KEY_PREFIX", "ConsumerGroup", "ConsumerGroupCoordinator", "ConsumerGroupLog",
    "ConsumerMember", "GroupView", "HeartbeatRequest", "HeartbeatResult", "MemberView",
]
