"""The share-group coordinator over an in-memory store and a simulated clock: joining, epochs,
the simple assignment, session time-outs, share sessions, where a share-partition starts, and
locks that run out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode as E
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kmqkafka.coordinators.share_group import (
    ShareGroupCoordinator, ShareHeartbeat, duration_ms,
)
from kmqkafka.coordinators.share_partition import ACK_ACCEPT, AVAILABLE
from kmqkafka.store import commands as c
from kmqkafka.store.names import channel_for

from .fakes import KeyedStore


@dataclass
class Bounds:
    log_start: int
    high_watermark: int


@dataclass
class Topic:
    name: str
    partitions: int


class Store(KeyedStore):
    def __init__(self) -> None:
        super().__init__()
        self.ends: dict[str, Bounds] = {}

    def keyed_get(self, family: str, key: bytes) -> bytes | None:
        return self.families.get(family, {}).get(key)

    def now_ms(self) -> int:
        return 100_000

    def sequence_for_timestamp(self, name: str, timestamp_ms: int) -> int | None:
        """Record Sequence s has timestamp 1000 * s here; None past the end."""
        first = -(-timestamp_ms // 1000)
        return first if first < self.bounds(name).high_watermark else None

    def bounds(self, name: str) -> Bounds:
        return self.ends.setdefault(name, Bounds(1, 1))

    def propose(self, command: c.Command) -> Deferred:
        assert isinstance(command, c.KeyedPut)
        return self.keyed_put(command.family, command.pairs)


class Catalog:
    def __init__(self, **topics: int) -> None:
        self.topics = {n: Topic(n, p) for n, p in topics.items()}

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)


class Configs:
    def __init__(self) -> None:
        self.by_group: dict[str, dict[str, str]] = {}

    def overrides(self, group_id: str) -> dict[str, str]:
        return self.by_group.get(group_id, {})


def setup(**topics: int) -> tuple[ShareGroupCoordinator, Clock, Store, Configs]:
    clock, store, configs = Clock(), Store(), Configs()
    sc = ShareGroupCoordinator(clock, store, Catalog(**topics), configs,
                               other_group=lambda g: g == "classic")
    sc.load()
    return sc, clock, store, configs


def beat(sc: ShareGroupCoordinator, member: str, epoch: int = 0,
         topics: tuple[str, ...] | None = ("t",), group: str = "g") -> Any:
    out: list[Any] = []
    sc.heartbeat(ShareHeartbeat(group, member, epoch, None, topics)).addBoth(out.append)
    assert out, "the heartbeat did not finish"
    return out[0]


def test_members_join_and_share_the_partitions() -> None:
    sc, _clock, _store, _configs = setup(t=4)
    a = beat(sc, "a")
    assert a.error is E.none and a.member_epoch == 1 and a.assignment == {"t": (0, 1, 2, 3)}
    b = beat(sc, "b")
    assert b.member_epoch == 2 and b.assignment == {"t": (1, 3)}
    a2 = beat(sc, "a", 1, None)  # a's next heartbeat moves it on, with its smaller share
    assert a2.member_epoch == 2 and a2.assignment == {"t": (0, 2)}
    assert beat(sc, "a", 2, None).assignment is None  # nothing new to say


def test_more_members_than_partitions_share_them() -> None:
    sc, *_ = setup(t=2)
    results = [beat(sc, m) for m in "abc"]
    assert results[-1].assignment == {"t": (0,)}  # c is third: partition 2 % 2
    group = sc.groups["g"]
    covered = {p for m in group.members.values() for p in m.assignment.get("t", ())}
    assert covered == {0, 1}


def test_epochs_and_unknown_members_are_checked() -> None:
    sc, *_ = setup(t=1)
    assert beat(sc, "a").member_epoch == 1
    assert beat(sc, "a", 7, None).error is E.fenced_member_epoch
    assert beat(sc, "x", 3, None).error is E.unknown_member_id
    assert beat(sc, "a", 0, None).error is E.invalid_request  # a join must name its topics
    assert beat(sc, "", 0).error is E.invalid_request
    classic = beat(sc, "a", 0, group="classic")  # Kafka's GroupIdNotFoundException
    assert (classic.error, classic.message) == (E.group_id_not_found,
                                                "Group classic is not a share group.")


def test_leaving_and_timing_out_hand_partitions_back() -> None:
    sc, clock, _store, _configs = setup(t=2)
    beat(sc, "a")
    beat(sc, "b")
    left = beat(sc, "b", 2, None)
    assert left.member_epoch == 2
    assert beat(sc, "b", -1).member_epoch == -1
    back = beat(sc, "a", 1, None)  # a never heard of b: its assignment did not change
    assert back.member_epoch == 3 and back.assignment is None
    assert sc.groups["g"].members["a"].assignment == {"t": (0, 1)}
    clock.advance(44)
    assert "a" in sc.groups["g"].members
    clock.advance(2)  # 45 s since a's last heartbeat
    assert not sc.groups["g"].members and sc.groups["g"].state() == "Empty"


def test_a_partition_starts_at_the_end_unless_the_group_says_earliest() -> None:
    sc, _clock, store, configs = setup(t=1, u=1)
    store.ends[channel_for("t", 0)] = Bounds(5, 41)  # offsets 4..39 held
    beat(sc, "a")
    assert sc.partition("g", "t", 0).start == 40
    configs.by_group["h"] = {"share.auto.offset.reset": "earliest"}
    beat(sc, "a", group="h")
    assert sc.partition("h", "t", 0).start == 4
    sc.unload()  # a new leader reads it back from the store
    sc.load()
    assert sc.partition("g", "t", 0).start == 40 and "g" in sc.groups



def test_by_duration_starts_at_the_first_record_young_enough() -> None:
    """share.auto.offset.reset=by_duration:D starts at the first record at most D old (the
    log end if there is none), and never before the log start."""
    sc, _clock, store, configs = setup(t=1)
    store.ends[channel_for("t", 0)] = Bounds(5, 91)  # Sequence s was written at 1000 * s ms
    for group, age, start in (("a", "PT20S", 79), ("b", "PT1M30.5S", 9), ("c", "P1D", 4),
                              ("d", "PT0S", 90)):
        configs.by_group[group] = {"share.auto.offset.reset": f"by_duration:{age}"}
        beat(sc, "m", group=group)
        assert sc.partition(group, "t", 0).start == start, group


def test_group_limits_bind_the_window() -> None:
    sc, _clock, _store, configs = setup(t=1)
    configs.by_group["g"] = {"share.delivery.count.limit": "2",
                             "share.partition.max.record.locks": "100"}
    beat(sc, "a")
    sp = sc.partition("g", "t", 0)
    assert (sp.delivery_limit, sp.max_in_flight) == (2, 100)
    configs.by_group["g"]["share.delivery.count.limit"] = "7"  # altered later: binds at once
    assert sc.partition("g", "t", 0).delivery_limit == 7


def test_iso_durations_read_as_java_reads_them() -> None:
    assert duration_ms("PT0.5S") == 500
    assert duration_ms("P2DT3H4M5.006S") == ((2 * 24 + 3) * 60 + 4) * 60_000 + 5006
    assert duration_ms("pt15m") == 900_000
    for bad in ("", "P", "PT", "-PT1S", "PT-1S", "1H", "P1H", "PT1D", "P1DT", "PT1.5"):
        assert duration_ms(bad) is None, bad

def test_share_sessions_follow_their_epochs() -> None:
    sc, *_ = setup(t=1)
    s, code = sc.session("g", "a", 0)
    assert code is E.none and s is not None
    assert sc.session("g", "a", 2) == (None, E.invalid_share_session_epoch)
    assert sc.session("g", "a", 1)[1] is E.none
    assert sc.session("g", "b", 1) == (None, E.share_session_not_found)


def test_closing_a_session_and_lock_expiry_release_records() -> None:
    sc, clock, store, _configs = setup(t=1)
    beat(sc, "a")
    sp = sc.partition("g", "t", 0)
    sp.acquire(0, 4, "a", int(clock.seconds() * 1000) + 30_000)
    sc.schedule_expiry()
    woken: list[int] = []
    sc.released.append(lambda: woken.append(1))
    clock.advance(29)
    assert not sp.available_runs()
    clock.advance(1.1)
    assert sp.available_runs() == [(0, 4)] and woken == [1]
    sp.acquire(0, 4, "a", 10**9)
    sp.acknowledge("a", 0, 1, [ACK_ACCEPT])
    sc.session("g", "a", 0)
    puts = store.puts
    sc.close_session("g", "a")
    assert store.puts == puts + 1  # the release is made durable
    assert sp.records[2].state == AVAILABLE and sp.start == 2


def test_a_member_that_leaves_keeps_its_session_for_its_final_acknowledgement() -> None:
    """A closing client sends its leave heartbeat and its final ShareAcknowledge at once, on
    two connections: the leave must not close the session and release records before the
    acknowledgements arrive. A session whose final request never comes closes one lock
    duration later; a member that timed out loses its session at once."""
    sc, clock, _store, _configs = setup(t=1)
    beat(sc, "a")
    sp = sc.partition("g", "t", 0)
    sc.session("g", "a", 0)
    sp.acquire(0, 4, "a", 10**9)
    beat(sc, "a", -1)
    assert "a" not in sc.groups["g"].members and sp.acquired_by("a") == [0, 1, 2, 3, 4]
    assert sc.session("g", "a", -1)[1] is E.none  # the final request finds it
    sp.acknowledge("a", 0, 4, [ACK_ACCEPT])
    sc.close_session("g", "a")
    assert sp.start == 5 and not sc._lingering
    beat(sc, "b")
    sc.session("g", "b", 0)
    sp.acquire(5, 6, "b", 10**9)
    beat(sc, "b", -1)
    clock.advance(29.9)
    assert sp.acquired_by("b") == [5, 6]
    clock.advance(0.2)  # share.record.lock.duration.ms: the final request never came
    assert sp.available_runs() == [(5, 6)] and ("g", "b") not in sc.sessions
    beat(sc, "c")
    sc.session("g", "c", 0)
    sp.acquire(5, 6, "c", 10**9)
    clock.advance(45.1)  # c's session timeout
    assert "c" not in sc.groups["g"].members and sp.available_runs() == [(5, 6)]
    assert ("g", "c") not in sc.sessions


def test_deleting_a_group() -> None:
    sc, *_ = setup(t=1)
    beat(sc, "a")
    assert sc.delete_group("g")[0] is E.non_empty_group
    beat(sc, "a", -1)
    code, written = sc.delete_group("g")
    assert code is E.none and written.called
    assert "g" not in sc.groups and not list(sc.store.keyed_items("groups"))
    assert sc.delete_group("g")[0] is E.group_id_not_found


