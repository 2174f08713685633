"""Online migration between classic groups and KIP-848 consumer groups (Kafka 4's
``group.consumer.migration.policy``, default ``bidirectional``).

A rolling upgrade of consumers from ``group.protocol=classic`` to ``consumer`` meets a group
that still has classic members; a roll back meets the opposite. Kafka converts the group in
place instead of refusing the newcomer:

* **Upgrade** (``to_consumer_group``): the first KIP-848 member's heartbeat turns a non-empty
  classic group whose protocol type is ``consumer`` into a consumer group. Each classic member
  keeps its id, its last SyncGroup assignment (as its current and target assignment) and the
  subscription of the selected protocol; its member epoch and the group epoch are the
  generation. What the classic protocol needs later (session timeout, the protocols it
  joined with) is kept as ``ClassicProtocol``.
* **Downgrade** (``to_classic_group``): when the last KIP-848 member leaves (or is fenced), the
  remaining classic members become a Stable classic group at generation = group epoch, each
  with its target assignment; the caller then starts a rebalance, so the classic leader assigns
  what the departed member held.

Pure functions over the coordinators' data classes, no timers or I/O; ``ConversionRefused``
carries Kafka's message (the caller answers GROUP_ID_NOT_FOUND, as Kafka does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from kmqkafka.coordinators.assignors import Assignment
from kmqkafka.coordinators.consumer_protocol import (
    CustomAssignment, decode_assignment, decode_subscription, embedded_version,
    encode_assignment,
)
from kmqkafka.coordinators.group import ClassicGroup, GroupState, Member

POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")
DEFAULT_POLICY = "bidirectional"  # Kafka 4's default (3.x shipped "disabled")
CONSUMER_PROTOCOL_TYPE = "consumer"


class ConversionRefused(Exception):
    """The group cannot change kind; the message is Kafka's."""


@dataclass(frozen=True, slots=True)
class ClassicProtocol:
    """What a member that speaks the classic protocol joined with (Kafka's
    ``ClassicMemberMetadata``): its session timeout and its ``(name, metadata)`` protocols in
    the order of its JoinGroup."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]

    @property
    def first_protocol(self) -> str:
        return self.protocols[0][0] if self.protocols else ""

    def metadata_for(self, name: str | None) -> bytes:
        for n, metadata in self.protocols:
            if n == name:
                return metadata
        return self.protocols[0][1] if self.protocols else b""

    def supports(self, names: Iterable[str]) -> bool:
        mine = {n for n, _ in self.protocols}
        return any(n in mine for n in names)


def allows_upgrade(policy: str) -> bool:
    return policy in ("bidirectional", "upgrade")


def allows_downgrade(policy: str) -> bool:
    return policy in ("bidirectional", "downgrade")


def by_topic_id(by_name: dict[str, frozenset[int]], topic_id_of: Callable[[str], str | None]
                ) -> Assignment:
    """Topic name -> partitions as topic id -> partitions; unknown topics are dropped."""
    out: dict[str, frozenset[int]] = {}
    for name, ps in by_name.items():
        tid = topic_id_of(name)
        if tid is not None and ps:
            out[tid] = out.get(tid, frozenset()) | ps
    return out


def by_topic_name(by_id: Assignment, name_of: Callable[[str], str | None]
                  ) -> dict[str, frozenset[int]]:
    out: dict[str, frozenset[int]] = {}
    for tid, ps in by_id.items():
        name = name_of(tid)
        if name and ps:
            out[name] = ps
    return out


def to_consumer_group(classic: ClassicGroup, consumer_group_type: Any, member_type: Any,
                      topic_id_of: Callable[[str], str | None], *, policy: str,
                      max_size: int) -> Any:
    """A consumer group holding a classic group's members (Kafka's ``validateOnlineUpgrade``
    then ``ConsumerGroup.fromClassicGroup``). The consumer group's types are passed in: their
    module builds on this one. Raises ``ConversionRefused``."""
    gid = classic.group_id
    if not allows_upgrade(policy):
        raise ConversionRefused(f"Cannot upgrade classic group {gid} to consumer group because "
                                f"the online upgrade is disabled.")
    if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
        raise ConversionRefused(f"Cannot upgrade classic group {gid} to consumer group because "
                                f"the group does not use the consumer embedded protocol.")
    if len(classic.members) > max_size:
        raise ConversionRefused(f"Cannot upgrade classic group {gid} to consumer group because "
                                f"the group size exceeds the consumer group maximum size.")
    generation = classic.generation_id
    group = consumer_group_type(gid, epoch=generation, assignment_epoch=generation)
    for m in classic.members.values():
        try:
            sub = decode_subscription(m.metadata_for(classic.protocol_name) if classic.protocol_name
                                      else (m.protocols[0][1] if m.protocols else b""))
            assigned = by_topic_id(decode_assignment(m.assignment), topic_id_of)
        except ValueError as exc:
            raise ConversionRefused(f"Cannot upgrade classic group {gid} to consumer group: "
                                    f"{exc}.") from None
        except CustomAssignment as exc:
            raise ConversionRefused(f"Cannot upgrade classic group {gid} to consumer group "
                                    f"because {exc}.") from None
        member = member_type(
            m.member_id, instance_id=m.group_instance_id, rack_id=sub.rack_id,
            client_id=m.client_id, client_host=m.client_host,
            rebalance_timeout_ms=m.rebalance_timeout_ms, topics=tuple(sorted(set(sub.topics))),
            epoch=generation, previous_epoch=generation, assigned=assigned,
            classic=ClassicProtocol(m.session_timeout_ms, m.protocols))
        group.members[member.member_id] = member
        group.target[member.member_id] = dict(assigned)
        if member.instance_id:
            group.static_members[member.instance_id] = member.member_id
    return group


def to_classic_group(group: Any, name_of: Callable[[str], str | None]) -> ClassicGroup:
    """A Stable classic group of a consumer group whose members all speak the classic protocol
    (Kafka's ``ClassicGroup.fromConsumerGroup``): generation = group epoch, each member's
    target assignment serialized in the version of its subscription, the leader the first
    member, the protocol chosen by the classic vote."""
    classic = ClassicGroup(group.group_id, state=GroupState.STABLE,
                                 generation_id=group.epoch,
                                 protocol_type=CONSUMER_PROTOCOL_TYPE)
    for m in group.members.values():
        cp: ClassicProtocol = m.classic
        classic.members[m.member_id] = Member(
            member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
            client_host=m.client_host, session_timeout_ms=cp.session_timeout_ms,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            protocol_type=CONSUMER_PROTOCOL_TYPE, protocols=cp.protocols)
        if m.instance_id:
            classic.static_members[m.instance_id] = m.member_id
    classic.protocol_name = classic.select_protocol()
    classic.leader_id = next(iter(classic.members))
    for m in group.members.values():
        target = by_topic_name(group.target.get(m.member_id, {}), name_of)
        version = embedded_version(m.classic.metadata_for(classic.protocol_name))
        classic.members[m.member_id].assignment = encode_assignment(target, version)
    return classic


__all__ = [
    "ClassicProtocol", "ConversionRefused", "DEFAULT_POLICY", "POLICIES", "allows_downgrade",
    "allows_upgrade", "by_topic_id", "by_topic_name", "to_classic_group", "to_consumer_group",
]
