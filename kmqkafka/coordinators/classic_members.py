"""Classic-protocol members of a KIP-848 consumer group (Kafka 4's online migration).

After an online upgrade (``migration``) a consumer group holds members that still speak
JoinGroup, SyncGroup and Heartbeat, and during a rolling upgrade more of them may join. They are
ordinary members of the consumer group: the server assignor assigns them and they reconcile as
KIP-848 members do, partitions to revoke first, then what others have released. The classic
protocol only carries it, following Kafka's ``classicGroup{Join,Sync,Heartbeat}ToConsumerGroup``:

* **JoinGroup** answers as soon as the member's state is durable, never waiting for other
  members: generation = the member's epoch, protocol = its first one, no leader (the client
  acts as a follower and sends an empty SyncGroup). A v4+ join without a member id first gets
  MEMBER_ID_REQUIRED with a fresh id. The owned partitions in its subscription are what it
  still holds (an eager client revokes everything before joining).
* **SyncGroup** answers the member's current assignment, in the version of its subscription;
  REBALANCE_IN_PROGRESS while the group epoch is ahead of it (unless it has partitions to
  revoke, which the answer takes away).
* **Heartbeat** answers REBALANCE_IN_PROGRESS while the member is behind the group epoch, has
  partitions to revoke, or could now get partitions it was waiting for: the client joins
  again and is reconciled.

Timers: the session timeout is the member's own (from its JoinGroup); a join timer (rebalance
timeout) runs from a REBALANCE_IN_PROGRESS until the next JoinGroup, a sync timer from a
JoinGroup answer until its SyncGroup. Any expiry fences the member.

Mixed into ``ConsumerGroupCoordinator`` (its state, persistence and reconciliation);
reactor-thread only.
"""
from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, succeed

from kmqkafka.coordinators.consumer_protocol import (
    decode_subscription, embedded_version, encode_assignment,
)
from kmqkafka.coordinators.group import (
    CONSUMER_PROTOCOL_TYPE, JoinRequest, JoinResult, SyncResult,
)
from kmqkafka.coordinators.migration import ClassicProtocol, by_topic_id, by_topic_name

# A member's reconciliation state (Kafka's MemberState), shared with ``consumer_group``.
STABLE, UNREVOKED, UNRELEASED = "stable", "unrevoked_partitions", "unreleased_partitions"


class Reject(Exception):
    """A request refused with a Kafka error code (and Kafka's message)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


class ClassicMembers:
    """The classic protocol's calls for consumer groups (see the module docstring)."""

    groups: dict[str, Any]
    clock: Any

    # --- JoinGroup ----------------------------------------------------------------------

    def classic_join(self, req: JoinRequest) -> Deferred:
        """A JoinGroup for a non-empty consumer group; fires with a ``JoinResult``."""
        group = self.groups[req.group_id]
        if not self._speaks_group_protocol(group, req):
            return succeed(JoinResult(ErrorCode.inconsistent_group_protocol, req.member_id))
        try:
            sub = decode_subscription(req.protocols[0][1])
        except ValueError:
            return succeed(JoinResult(ErrorCode.inconsistent_group_protocol, req.member_id))
        if not req.member_id and not req.group_instance_id and req.require_known_member_id:
            return succeed(JoinResult(ErrorCode.member_id_required, self._new_id()))
        try:
            member, replaced_kip848 = self._classic_member_for_join(group, req)
        except Reject as r:
            return succeed(JoinResult(r.code, req.member_id))
        topics = tuple(sorted(set(sub.topics)))
        bump = topics != member.topics or member.regex is not None
        member.topics, member.regex = topics, None
        member.rack_id = sub.rack_id
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        member.classic = ClassicProtocol(req.session_timeout_ms, req.protocols)
        group.members.setdefault(member.member_id, member)
        if member.instance_id:
            group.static_members[member.instance_id] = member.member_id
        if replaced_kip848 and self._maybe_downgrade(group):
            # A static member rolled back to the classic protocol took the place of the last
            # KIP-848 member: the group is classic again (Kafka's
            # validateOnlineDowngradeWithReplacedMember), and its coordinator takes the join.
            return self._persist(group).addCallback(lambda _: self.classic.join(req))
        bump |= self._refresh_metadata(group)
        if bump:
            group.epoch += 1
        self._maybe_assign(group)
        self._reconcile(group, member, by_topic_id(sub.owned, self.topic_id))
        _cancel(member, "join_timer")
        self._touch(group, member)
        result = JoinResult(ErrorCode.none, member.member_id, member.epoch,
                            CONSUMER_PROTOCOL_TYPE, member.classic.first_protocol, "", (), False)

        def answered(_: object) -> JoinResult:
            _cancel(member, "sync_timer")  # each JoinGroup answer starts the wait afresh
            self._arm(group, member, "sync_timer", "did not sync within the rebalance timeout")
            return result

        return self._persist(group).addCallbacks(
            answered, lambda f: JoinResult(ErrorCode.coordinator_not_available,
                                           member.member_id))

    def _speaks_group_protocol(self, group: Any, req: JoinRequest) -> bool:
        """Kafka's ``throwIfClassicProtocolIsNotSupported``: the consumer protocol type, and
        one protocol name every other classic member supports."""
        if req.protocol_type != CONSUMER_PROTOCOL_TYPE or not req.protocols:
            return False
        names = {n for n, _ in req.protocols}
        for m in group.members.values():
            if m.classic is not None and m.member_id != req.member_id:
                names &= {n for n, _ in m.classic.protocols}
        return bool(names)

    def _classic_member_for_join(self, group: Any, req: JoinRequest) -> tuple[Any, bool]:
        """The joining member, and whether it took a KIP-848 static member's place."""
        if req.group_instance_id:
            owner_id = group.static_members.get(req.group_instance_id)
            owner = group.members.get(owner_id) if owner_id else None
            if not req.member_id:
                if owner is None:
                    return self._new_member(group, "", req.group_instance_id), False
                return self._replace_static(group, owner, ""), owner.classic is None
            if owner is None:
                raise Reject(ErrorCode.unknown_member_id)
            if owner.member_id != req.member_id:
                raise Reject(ErrorCode.fenced_instance_id)
            return owner, False
        member = group.members.get(req.member_id) if req.member_id else None
        if member is None:
            member = self._new_member(group, req.member_id, None)
        return member, False

    # --- SyncGroup and Heartbeat --------------------------------------------------------

    def classic_sync(self, group_id: str, member_id: str, instance_id: str | None,
                     generation_id: int, protocol_type: str | None,
                     protocol_name: str | None) -> Deferred:
        """A SyncGroup for a consumer group; fires with a ``SyncResult`` (the assignments a
        client sends are ignored: the server assigned)."""
        group = self.groups.get(group_id)
        member, code = self._classic_member(group, member_id, instance_id)
        if member is None:
            return succeed(SyncResult(code))
        if generation_id != member.epoch:
            return succeed(SyncResult(ErrorCode.illegal_generation))
        first = member.classic.first_protocol
        if ((protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE)
                or (protocol_name is not None and protocol_name != first)):
            return succeed(SyncResult(ErrorCode.inconsistent_group_protocol))
        if group.epoch > member.epoch and member.state != UNREVOKED:
            self._arm(group, member, "join_timer", "did not rejoin within the rebalance timeout")
            return succeed(SyncResult(ErrorCode.rebalance_in_progress))
        _cancel(member, "sync_timer")
        self._touch(group, member)
        version = embedded_version(member.classic.metadata_for(first))
        assignment = encode_assignment(by_topic_name(member.assigned, self.topic_name), version)
        return succeed(SyncResult(ErrorCode.none, CONSUMER_PROTOCOL_TYPE, first, assignment))

    def classic_heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                          generation_id: int) -> ErrorCode:
        """A Heartbeat for a consumer group: keeps the member alive, and tells it to join
        again when reconciling has something for it."""
        group = self.groups.get(group_id)
        member, code = self._classic_member(group, member_id, instance_id)
        if member is None:
            return code
        if generation_id != member.epoch:
            return ErrorCode.illegal_generation
        self._touch(group, member)
        if (member.epoch < group.epoch or member.state == UNREVOKED
                or (member.state == UNRELEASED and not self._waits_on_others(group, member))):
            self._arm(group, member, "join_timer", "did not rejoin within the rebalance timeout")
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    @staticmethod
    def _classic_member(group: Any, member_id: str, instance_id: str | None
                        ) -> tuple[Any, ErrorCode]:
        if group is None or not group.members:
            return None, ErrorCode.unknown_member_id
        if instance_id:
            owner_id = group.static_members.get(instance_id)
            if owner_id is None:
                return None, ErrorCode.unknown_member_id
            if owner_id != member_id:
                return None, ErrorCode.fenced_instance_id
        member = group.members.get(member_id)
        if member is None or member.classic is None:
            return None, ErrorCode.unknown_member_id
        return member, ErrorCode.none

    @staticmethod
    def _waits_on_others(group: Any, member: Any) -> bool:
        """Whether a partition of the member's target is still held by another member."""
        wanted = {(t, p) for t, ps in group.target.get(member.member_id, {}).items() for p in ps}
        wanted -= {(t, p) for t, ps in member.assigned.items() for p in ps}
        return bool(wanted & group.held_by_others(member))

    def _arm(self, group: Any, member: Any, name: str, why: str) -> None:
        """Start the member's join or sync timer unless it runs already; expiry fences it."""
        timer = getattr(member, name)
        if timer is not None and timer.active():
            return
        setattr(member, name, self.clock.callLater(
            member.rebalance_timeout_ms / 1000.0, self._expire, group, member, why))

    # Provided by ``ConsumerGroupCoordinator``.
    _new_id: Any
    _new_member: Any
    _replace_static: Any
    _refresh_metadata: Any
    _maybe_assign: Any
    _reconcile: Any
    _touch: Any
    _persist: Any
    _expire: Any
    _maybe_downgrade: Any
    classic: Any
    topic_id: Any
    topic_name: Any


def _cancel(member: Any, name: str) -> None:
    timer = getattr(member, name)
    if timer is not None and timer.active():
        timer.cancel()
    setattr(member, name, None)


__all__ = ["ClassicMembers", "Reject", "STABLE", "UNRELEASED", "UNREVOKED"]
