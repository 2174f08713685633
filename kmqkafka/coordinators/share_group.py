"""KIP-932 share groups: membership, assignment, share sessions and share-partition state.

Membership follows ShareGroupHeartbeat: epoch 0 joins (the client names its own member id),
-1 leaves, anything else must be the member's current (or previous) epoch. The group epoch
moves whenever the assignment it computes changes; a member is given its new assignment, and
the group epoch as its member epoch, on its next heartbeat. There is nothing to revoke: a
share-partition may be read by several members at once, the records themselves are locked one
by one (``SharePartition``). The assignor is Kafka's ``simple`` idea: each subscribed
partition goes to at least one member and, while members are fewer than partitions, to exactly
one; with more members than partitions, members share them round-robin.

Members are kept in memory only (after a restart or leader change a member's heartbeat gets
UNKNOWN_MEMBER_ID and it joins again, as Kafka's clients do); the share-partition state is
durable, one record per partition in the ``groups`` family under
``SHARE_KEY_PREFIX + group "\\0" topic "\\0" partition``. A partition is initialised when it is
first assigned, at the log end, the log start or the first record at most a given age old, as
``share.auto.offset.reset`` says (latest by default), and written again after every
acknowledgement and every release, which answer only once that write is durable.

Share sessions (ShareFetch/ShareAcknowledge) are per (group, member): epoch 0 opens one with
the partitions named, later requests must carry the next epoch, -1 closes it and releases what
the member still holds. As in Kafka, a session belongs to the fetch connection, not to group
membership: a member that leaves with a heartbeat (epoch -1) keeps its session for its final
ShareAcknowledge or ShareFetch, which a closing client sends at the same time on another
connection and which carries its last acknowledgements. Should that never come, the session
is closed one lock duration later (Kafka closes it when the connection drops), by when every
lock it held has run out anyway. A member whose session timeout ran out is gone: its session is
closed at once. Reactor thread only; time from the injected ``IReactorTime``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from kio.schema.errors import ErrorCode
from prometheus_client.core import GaugeMetricFamily
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from kmqkafka.coordinators.group import FOREIGN_KEY_PREFIX, GROUPS_FAMILY
from kmqkafka.coordinators.share_partition import (
    ACKNOWLEDGED, ACQUIRED, ARCHIVED, DEFAULT_DELIVERY_LIMIT, DEFAULT_MAX_IN_FLIGHT,
    SharePartition,
)
from kmqkafka.store import commands as c
from kmqkafka.store.names import channel_for

__all__ = ["ShareGroupCoordinator", "ShareHeartbeat", "ShareLagCollector", "ShareResult",
           "ShareSession", "SHARE_KEY_PREFIX", "duration_ms"]

log = Logger()

SHARE_KEY_PREFIX = FOREIGN_KEY_PREFIX + b"share\x00"
ASSIGNOR = "simple"
MAX_EPOCH = (1 << 31) - 1

PartitionKey = tuple[str, str, int]  # group, topic name, partition
Assignment = dict[str, tuple[int, ...]]  # topic name -> partitions


_DURATION = re.compile(
    r"P(?:(\d+)D)?(?:T(?=\d)(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)(?:[.,](\d{1,9}))?S)?)?",
    re.IGNORECASE)


def duration_ms(text: str) -> int | None:
    """Milliseconds of a non-negative ISO-8601 duration as Java's ``Duration.parse`` reads it
    (``PnDTnHnMn.nS``), or None if ``text`` is not one (a ``by_duration:`` reset)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or text.strip().upper() in ("P", "PT"):
        return None
    days, hours, minutes, seconds, fraction = m.groups()
    total = ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes or 0)) * 60
    return (total + int(seconds or 0)) * 1000 + int((fraction or "0").ljust(9, "0")[:3])


@dataclass(frozen=True, slots=True)
class ShareHeartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None
    subscribed_topic_names: tuple[str, ...] | None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class ShareResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


@dataclass(slots=True)
class ShareMember:
    member_id: str
    topics: tuple[str, ...]
    rack_id: str | None
    client_id: str
    client_host: str
    epoch: int = 0
    previous_epoch: int = -1
    assignment: Assignment = field(default_factory=dict)
    sent: Assignment | None = None  # what its last response carried
    timer: IDelayedCall | None = None


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)

    def state(self) -> str:
        return "Stable" if self.members else "Empty"


@dataclass(slots=True)
class ShareSession:
    epoch: int = 0
    partitions: dict[tuple[str, int], None] = field(default_factory=dict)  # insertion order


class ShareGroupCoordinator:
    """Every share group this node serves."""

    def __init__(self, clock: IReactorTime, store: Any, catalog: Any, group_configs: Any, *,
                 other_group: Callable[[str], bool] = lambda _g: False,
                 max_members: int = 200) -> None:
        self.clock = clock
        self.store = store
        self.catalog = catalog
        self.configs = group_configs
        self.other_group = other_group
        self.max_members = max_members
        self.groups: dict[str, ShareGroup] = {}
        self.partitions: dict[PartitionKey, SharePartition] = {}
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self.loaded = False
        self._expiry: IDelayedCall | None = None
        self._lingering: dict[tuple[str, str], IDelayedCall] = {}  # sessions of members gone
        self.released: list[Callable[[], None]] = []  # woken when records become available

    # --- life cycle -----------------------------------------------------------------------

    def load(self) -> None:
        """Know every group that has share-partition state (they exist while empty)."""
        if self.loaded:
            return
        for key, _value in self.store.keyed_items(GROUPS_FAMILY, SHARE_KEY_PREFIX):
            group_id = key[len(SHARE_KEY_PREFIX):].decode().split("\x00", 1)[0]
            self.groups.setdefault(group_id, ShareGroup(group_id))
        self.loaded = True

    def unload(self) -> None:
        for group in self.groups.values():
            for m in group.members.values():
                if m.timer is not None and m.timer.active():
                    m.timer.cancel()
        if self._expiry is not None and self._expiry.active():
            self._expiry.cancel()
        self._expiry = None
        for timer in self._lingering.values():
            if timer.active():
                timer.cancel()
        self._lingering.clear()
        self.groups.clear()
        self.partitions.clear()
        self.sessions.clear()
        self.loaded = False

    # --- settings -------------------------------------------------------------------------

    def _config(self, group_id: str, name: str, default: str) -> str:
        return str(self.configs.overrides(group_id).get(name, default))

    def session_ms(self, group_id: str) -> int:
        return int(self._config(group_id, "share.session.timeout.ms", "45000"))

    def heartbeat_ms(self, group_id: str) -> int:
        return int(self._config(group_id, "share.heartbeat.interval.ms", "5000"))

    def lock_ms(self, group_id: str) -> int:
        return int(self._config(group_id, "share.record.lock.duration.ms", "30000"))

    def read_committed(self, group_id: str) -> bool:
        """``share.isolation.level``: deliver only committed transactions' records."""
        return self._config(group_id, "share.isolation.level",
                            "read_uncommitted") == "read_committed"

    def _limits(self, group_id: str) -> dict[str, int]:
        """The window limits of the group's share-partitions (``SharePartition`` keywords)."""
        set_here = self.configs.overrides(group_id)
        return {"delivery_limit": int(set_here.get("share.delivery.count.limit",
                                                   DEFAULT_DELIVERY_LIMIT)),
                "max_in_flight": int(set_here.get("share.partition.max.record.locks",
                                                  DEFAULT_MAX_IN_FLIGHT))}

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # --- membership -----------------------------------------------------------------------

    def heartbeat(self, req: ShareHeartbeat) -> Deferred:
        if not req.group_id:
            return succeed(ShareResult(ErrorCode.invalid_request, "GroupId can't be empty."))
        if not req.member_id:
            return succeed(ShareResult(ErrorCode.invalid_request, "MemberId can't be empty."))
        group = self.groups.get(req.group_id)
        if group is None and self.other_group(req.group_id):
            # Kafka's GroupIdNotFoundException for a group of another type.
            return succeed(ShareResult(
                ErrorCode.group_id_not_found, f"Group {req.group_id} is not a share group."))
        if req.member_epoch == -1:
            self._leave(group, req.member_id, keep_session=True)
            return succeed(ShareResult(ErrorCode.none, None, req.member_id, -1,
                                       self.heartbeat_ms(req.group_id)))
        if group is None:
            group = self.groups[req.group_id] = ShareGroup(req.group_id)
        member = group.members.get(req.member_id)
        if req.member_epoch == 0:
            if req.subscribed_topic_names is None:
                return succeed(ShareResult(ErrorCode.invalid_request,
                                           "SubscribedTopicNames must be set in first request."))
            if member is None and len(group.members) >= self.max_members:
                return succeed(ShareResult(ErrorCode.group_max_size_reached,
                                           f"The share group has reached its maximum size "
                                           f"{self.max_members}."))
            if member is None:
                member = group.members[req.member_id] = ShareMember(
                    req.member_id, tuple(req.subscribed_topic_names), req.rack_id,
                    req.client_id, req.client_host)
            else:
                member.topics = tuple(req.subscribed_topic_names)
            member.sent = None
        else:
            if member is None:
                return succeed(ShareResult(ErrorCode.unknown_member_id,
                                           f"Member {req.member_id} is not a member of "
                                           f"share group {req.group_id}."))
            if req.member_epoch not in (member.epoch, member.previous_epoch):
                return succeed(ShareResult(ErrorCode.fenced_member_epoch,
                                           f"The share group member has an epoch "
                                           f"{req.member_epoch} that is not the current one "
                                           f"({member.epoch})."))
            if req.member_epoch == member.previous_epoch != member.epoch:
                member.sent = None  # the response that moved it on was lost
            if req.subscribed_topic_names is not None:
                member.topics = tuple(req.subscribed_topic_names)
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        self._touch(group, member)
        self._reassign(group)
        if member.epoch != group.epoch:
            member.previous_epoch, member.epoch = member.epoch, group.epoch
        assignment = None
        if member.sent != member.assignment:
            assignment = member.sent = dict(member.assignment)
        return self._initialise(group.group_id, member.assignment).addCallback(
            lambda _: ShareResult(ErrorCode.none, None, member.member_id, member.epoch,
                                  self.heartbeat_ms(group.group_id), assignment))

    def _touch(self, group: ShareGroup, member: ShareMember) -> None:
        if member.timer is not None and member.timer.active():
            member.timer.cancel()
        member.timer = self.clock.callLater(self.session_ms(group.group_id) / 1000,
                                            self._expired, group.group_id, member.member_id)

    def _expired(self, group_id: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and member_id in group.members:
            log.info("share group {group}: member {member} timed out", group=group_id,
                     member=member_id)
            self._leave(group, member_id)

    def _leave(self, group: ShareGroup | None, member_id: str, keep_session: bool = False
               ) -> None:
        """``member_id`` is no longer a member. ``keep_session``: it left by heartbeat, and its
        final ShareAcknowledge/ShareFetch may still be on its way (see the module docstring)."""
        if group is None:
            return
        member = group.members.pop(member_id, None)
        if member is None:
            return
        if member.timer is not None and member.timer.active():
            member.timer.cancel()
        key = (group.group_id, member_id)
        if keep_session and key in self.sessions:
            self._cancel_linger(key)
            self._lingering[key] = self.clock.callLater(
                self.lock_ms(group.group_id) / 1000, self._linger_over, key,
                self.sessions[key])
        else:
            self.close_session(group.group_id, member_id)
        self._reassign(group)

    def _linger_over(self, key: tuple[str, str], session: ShareSession) -> None:
        self._lingering.pop(key, None)
        if self.sessions.get(key) is session:
            self.close_session(*key).addErrback(lambda f: log.warn(
                "saving share-partition state after a session closed failed: {error}",
                error=f.getErrorMessage()))

    def _cancel_linger(self, key: tuple[str, str]) -> None:
        timer = self._lingering.pop(key, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _reassign(self, group: ShareGroup) -> None:
        """Compute the simple assignment; bump the group epoch if it changed."""
        target = self._assign(group)
        changed = False
        for member_id, member in group.members.items():
            mine = target.get(member_id, {})
            if mine != member.assignment:
                member.assignment = mine
                changed = True
        if changed or group.epoch == 0:
            group.epoch = min(group.epoch + 1, MAX_EPOCH)
            group.assignment_epoch = group.epoch

    def _assign(self, group: ShareGroup) -> dict[str, Assignment]:
        by_topic: dict[str, list[str]] = {}
        for member_id in sorted(group.members):
            for topic in group.members[member_id].topics:
                by_topic.setdefault(topic, []).append(member_id)
        out: dict[str, Assignment] = {m: {} for m in group.members}
        for topic, members in sorted(by_topic.items()):
            found = self.catalog.get(topic)
            if found is None or found.partitions <= 0:
                continue
            n = found.partitions
            share: dict[str, list[int]] = {m: [] for m in members}
            if len(members) <= n:
                for p in range(n):
                    share[members[p % len(members)]].append(p)
            else:
                for i, m in enumerate(members):
                    share[m].append(i % n)
            for m, ps in share.items():
                if ps:
                    out[m][topic] = tuple(sorted(ps))
        return out

    def _initialise(self, group_id: str, assignment: Assignment) -> Deferred:
        """Give every newly assigned partition its durable start (auto.offset.reset)."""
        pairs = []
        for topic, ps in assignment.items():
            for p in ps:
                key = (group_id, topic, p)
                if key in self.partitions or self.store.keyed_get(GROUPS_FAMILY,
                                                                  _key(*key)) is not None:
                    continue
                sp = self._fresh(group_id, topic, p)
                if sp is None:
                    continue
                self.partitions[key] = sp
                pairs.append((_key(*key), sp.encode()))
        if not pairs:
            return succeed(None)
        return self.store.propose(c.KeyedPut(GROUPS_FAMILY, tuple(pairs), self.store.now_ms()))

    def _fresh(self, group_id: str, topic: str, p: int) -> SharePartition | None:
        try:
            bounds = self.store.bounds(channel_for(topic, p))
        except Exception:
            return None
        reset = self._config(group_id, "share.auto.offset.reset", "latest").lower()
        start = bounds.high_watermark - 1
        if reset == "earliest":
            start = bounds.log_start - 1
        elif reset.startswith("by_duration:"):
            age = duration_ms(reset[len("by_duration:"):]) or 0
            found = self.store.sequence_for_timestamp(channel_for(topic, p),
                                                      self.store.now_ms() - age)
            if found is not None:
                start = max(found, bounds.log_start) - 1
        return SharePartition(max(start, 0), **self._limits(group_id))

    # --- share-partition state ------------------------------------------------------------

    def partition(self, group_id: str, topic: str, p: int) -> SharePartition | None:
        """The loaded (or freshly initialised) state of one share-partition; None when the
        partition does not exist."""
        key = (group_id, topic, p)
        sp = self.partitions.get(key)
        if sp is None:
            raw = self.store.keyed_get(GROUPS_FAMILY, _key(*key))
            sp = SharePartition.decode(raw) if raw is not None else self._fresh(group_id, topic, p)
            if sp is None:
                return None
            self.partitions[key] = sp
            self.groups.setdefault(group_id, ShareGroup(group_id))
        # An admin may change the limits at any time; they bind from the next acquisition.
        for name, value in self._limits(group_id).items():
            setattr(sp, name, value)
        try:
            bounds = self.store.bounds(channel_for(topic, p))
        except Exception:
            return None
        sp.skip_to(bounds.log_start - 1)
        return sp

    def save(self, keys: Iterable[PartitionKey]) -> Deferred:
        """Make the current state of ``keys`` durable."""
        pairs = tuple((_key(*k), self.partitions[k].encode())
                      for k in dict.fromkeys(keys) if k in self.partitions)
        if not pairs:
            return succeed(None)
        return self.store.propose(c.KeyedPut(GROUPS_FAMILY, pairs, self.store.now_ms()))

    def schedule_expiry(self) -> None:
        """Arm one timer for the earliest lock deadline of any share-partition."""
        deadlines = [d for d in (sp.next_deadline() for sp in self.partitions.values())
                     if d is not None]
        if not deadlines:
            return
        due = max(0.0, min(deadlines) / 1000 - self.clock.seconds())
        if self._expiry is not None and self._expiry.active():
            if self._expiry.getTime() <= self.clock.seconds() + due:
                return
            self._expiry.cancel()
        self._expiry = self.clock.callLater(due + 0.001, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        now = self.now_ms()
        changed = [k for k, sp in self.partitions.items() if sp.expire(now)]
        if changed:
            self.save(changed).addErrback(lambda f: log.warn(
                "saving share-partition state after lock expiry failed: {error}",
                error=f.getErrorMessage()))
            self.wake()
        self.schedule_expiry()

    def wake(self) -> None:
        """Records became available again: parked share fetches look again."""
        waiters, self.released = self.released, []
        for w in waiters:
            w()

    # --- share sessions -------------------------------------------------------------------

    def session(self, group_id: str, member_id: str, epoch: int
                ) -> tuple[ShareSession | None, ErrorCode]:
        """The share session a request with ``epoch`` continues (0 opens a fresh one)."""
        key = (group_id, member_id)
        if epoch == 0:
            s = self.sessions[key] = ShareSession()
            return s, ErrorCode.none
        s = self.sessions.get(key)
        if s is None:
            return None, ErrorCode.share_session_not_found
        if epoch == -1:
            return s, ErrorCode.none
        expected = 1 if s.epoch == MAX_EPOCH else s.epoch + 1
        if epoch != expected:
            return None, ErrorCode.invalid_share_session_epoch
        s.epoch = epoch
        return s, ErrorCode.none

    def close_session(self, group_id: str, member_id: str) -> Deferred:
        """Drop the member's session and release everything it holds in the group."""
        self.sessions.pop((group_id, member_id), None)
        self._cancel_linger((group_id, member_id))
        changed = [k for k, sp in self.partitions.items()
                   if k[0] == group_id and sp.release_member(member_id)]
        if not changed:
            return succeed(None)
        self.wake()
        return self.save(changed)

    def is_member(self, group_id: str, member_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and member_id in group.members

    # --- admin ----------------------------------------------------------------------------

    def list_groups(self) -> list[tuple[str, str]]:
        return [(g.group_id, g.state()) for g in self.groups.values()]

    def forget_topic(self, topic: str) -> Deferred:
        """A deleted topic's share-partitions go with it."""
        doomed = [k for k in self.partitions if k[1] == topic]
        keys = {_key(*k) for k in doomed}
        for k in doomed:
            del self.partitions[k]
        for key, _v in self.store.keyed_items(GROUPS_FAMILY, SHARE_KEY_PREFIX):
            if key[len(SHARE_KEY_PREFIX):].decode().split("\x00")[1] == topic:
                keys.add(key)
        if not keys:
            return succeed(None)
        return self.store.propose(c.KeyedPut(GROUPS_FAMILY, tuple((k, None) for k in keys),
                                             self.store.now_ms()))

    def start_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """Every share-partition's start offset of ``group_id`` (DescribeShareGroupOffsets)."""
        out = {}
        for key, _v in self.store.keyed_items(GROUPS_FAMILY, _group_prefix(group_id)):
            _g, topic, p = key[len(SHARE_KEY_PREFIX):].decode().rsplit("\x00", 2)
            sp = self.partition(group_id, topic, int(p))
            if sp is not None:
                out[(topic, int(p))] = sp.start
        return out

    def start_and_lag(self, group_id: str, topic: str, p: int) -> tuple[int, int]:
        """(start offset, lag) of one share-partition: the lag counts the offsets from the
        start to the high watermark that are not done yet. (-1, -1) if the group never read
        the partition."""
        if (group_id, topic, p) not in self.partitions and not self.has_state(group_id, topic, p):
            return -1, -1
        sp = self.partition(group_id, topic, p)
        if sp is None:
            return -1, -1
        end = self.store.bounds(channel_for(topic, p)).high_watermark - 1
        done = sum(1 for r in sp.records.values() if r.state in (ACKNOWLEDGED, ARCHIVED))
        return sp.start, max(0, end - sp.start - done)

    def all_partitions(self) -> list[PartitionKey]:
        """Every share-partition with state, loaded or only stored."""
        keys = set(self.partitions)
        for key, _v in self.store.keyed_items(GROUPS_FAMILY, SHARE_KEY_PREFIX):
            g, topic, p = key[len(SHARE_KEY_PREFIX):].decode().rsplit("\x00", 2)
            keys.add((g, topic, int(p)))
        return sorted(keys)

    def has_state(self, group_id: str, topic: str, p: int) -> bool:
        return self.store.keyed_get(GROUPS_FAMILY, _key(group_id, topic, p)) is not None

    def partitions_of(self, group_id: str) -> dict[str, tuple[int, ...]]:
        """topic -> partitions the group has share-partition state for."""
        out: dict[str, set[int]] = {}
        for key, _v in self.store.keyed_items(GROUPS_FAMILY, _group_prefix(group_id)):
            _g, topic, p = key[len(SHARE_KEY_PREFIX):].decode().rsplit("\x00", 2)
            out.setdefault(topic, set()).add(int(p))
        for g, topic, p in self.partitions:
            if g == group_id:
                out.setdefault(topic, set()).add(p)
        return {t: tuple(sorted(ps)) for t, ps in out.items()}

    def move_starts(self, group_id: str, starts: dict[tuple[str, int], int]) -> Deferred:
        """AlterShareGroupOffsets: each share-partition starts afresh at its new offset."""
        keys = []
        for (topic, p), start in starts.items():
            self.partitions[(group_id, topic, p)] = SharePartition(start)
            keys.append((group_id, topic, p))
        return self.save(keys)

    def forget_group_topic(self, group_id: str, topic: str) -> Deferred:
        """DeleteShareGroupOffsets: the group's share-partitions of ``topic`` go."""
        for k in [k for k in self.partitions if k[0] == group_id and k[1] == topic]:
            del self.partitions[k]
        prefix = _group_prefix(group_id) + topic.encode() + b"\x00"
        keys = tuple((key, None) for key, _v in self.store.keyed_items(GROUPS_FAMILY, prefix))
        if not keys:
            return succeed(None)
        return self.store.propose(c.KeyedPut(GROUPS_FAMILY, keys, self.store.now_ms()))

    def delete_group(self, group_id: str) -> tuple[ErrorCode, Deferred]:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.group_id_not_found, succeed(None)
        if group.members:
            return ErrorCode.non_empty_group, succeed(None)
        del self.groups[group_id]
        for k in [k for k in self.partitions if k[0] == group_id]:
            del self.partitions[k]
        keys = tuple((key, None) for key, _v in
                     self.store.keyed_items(GROUPS_FAMILY, _group_prefix(group_id)))
        if not keys:
            return ErrorCode.none, succeed(None)
        return ErrorCode.none, self.store.propose(
            c.KeyedPut(GROUPS_FAMILY, keys, self.store.now_ms()))


def _key(group_id: str, topic: str, p: int) -> bytes:
    return SHARE_KEY_PREFIX + f"{group_id}\x00{topic}\x00{p}".encode()


def _group_prefix(group_id: str) -> bytes:
    return SHARE_KEY_PREFIX + group_id.encode() + b"\x00"


class ShareLagCollector:
    """Prometheus collector: ``kmqkafka_share_group_lag{group,topic,partition}`` (records from
    a share-partition's start offset to the high watermark not yet done) and
    ``kmqkafka_share_group_records_acquired{group,topic,partition}`` (records locked to a
    member now). ``coordinator()`` returns the loaded coordinator, or None while this node
    does not serve groups or the store has not recovered."""

    def __init__(self, coordinator: Callable[[], "ShareGroupCoordinator | None"]) -> None:
        self._coordinator = coordinator

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        labels = ["group", "topic", "partition"]
        return (GaugeMetricFamily("kmqkafka_share_group_lag",
                                  "Records of a share-partition from its start offset to the "
                                  "high watermark not yet acknowledged or archived",
                                  labels=labels),
                GaugeMetricFamily("kmqkafka_share_group_records_acquired",
                                  "Records of a share-partition locked to a member now",
                                  labels=labels))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag, acquired = self._families()
        c = self._coordinator()
        if c is not None:
            for group_id, topic, p in c.all_partitions():
                if not c.store.exists(channel_for(topic, p)):
                    continue
                _start, behind = c.start_and_lag(group_id, topic, p)
                sp = c.partitions.get((group_id, topic, p))
                held = 0 if sp is None else sum(1 for r in sp.records.values()
                                                if r.state == ACQUIRED)
                lag.add_metric([group_id, topic, str(p)], behind)
                acquired.add_metric([group_id, topic, str(p)], held)
        yield lag
        yield acquired
