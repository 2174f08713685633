"""A lone node stages the next appends while the last ones are being flushed.

The driver does not wait for a written-through Ready's group-commit flush before it cuts the
next Ready (``RaftDriver._pipelines``, ``RaftProposer.detach_staged``): each group of appends
is answered, and shown to readers, when the flush that follows its apply returns, in log
order; anything else waits until every such group is answered; a crash loses only what was
never answered. The flush runs on a held I/O runner so each step is visible.
"""
from __future__ import annotations

from twisted.internet.task import Clock
from twisted.python.failure import Failure

from kmqkafka.store.errors import StorageFailure
from tests.raft.test_driver import (
    _crash, _HeldIO, _settle, _solo_with_channel, _started_solo, batch, values,
)


def _held_flushes(store) -> _HeldIO:
    """Hold the store's group-commit flushes (segment fsyncs and checkpoint) until released."""
    flushes = _HeldIO()
    store.proposer._commit._run_io = flushes
    return flushes


def _turns(clock: Clock, n: int = 3) -> None:
    for _ in range(n):
        clock.advance(0)


def _setup(tmp_path):
    clock = Clock()
    clock.advance(1_700_000_000)
    io = _HeldIO()
    store = _solo_with_channel(tmp_path, clock, io)
    return clock, io, store, _held_flushes(store)


def test_appends_made_during_a_flush_are_staged_and_answered_after_their_own(tmp_path):
    clock, io, store, flushes = _setup(tmp_path)
    ch = store.machine.channels["kafka.e"]
    first: list = []
    second: list = []
    store.append_batch("kafka.e", batch(b"a")).addBoth(first.append)
    _turns(clock)
    assert len(flushes.calls) == 1 and io.calls == []  # ELIDED positions: no Raft fsync
    store.append_batch("kafka.e", batch(b"b")).addBoth(second.append)
    _turns(clock)
    assert ch.next_sequence == 3, "the second append waited for the first one's flush"
    assert first == [] and second == []
    assert store.bounds("kafka.e").high_watermark == 1
    flushes.finish()               # the first flush returns...
    assert [a.first_sequence for a in first] == [1]
    assert second == []            # ...which did not cover the second append
    assert store.bounds("kafka.e").high_watermark == 2
    _turns(clock)
    assert len(flushes.calls) == 1  # the group commit's next flush covers the second
    flushes.finish()
    assert [a.first_sequence for a in second] == [2]
    assert store.bounds("kafka.e").high_watermark == 3
    assert store.machine.journal.durable_applied == store.machine.last_applied
    assert values(store, "kafka.e") == [b"a", b"b"]


def test_a_command_that_is_not_written_through_waits_for_earlier_groups(tmp_path):
    clock, io, store, flushes = _setup(tmp_path)
    order: list = []
    store.append_batch("kafka.e", batch(b"a")).addCallback(lambda _: order.append("append"))
    _turns(clock)
    store.create_channel("kafka.f").addCallback(lambda _: order.append("create"))
    _turns(clock)
    io.finish()
    _turns(clock)
    assert "kafka.f" not in store.machine.channels, "applied ahead of an unanswered append"
    assert order == []
    flushes.finish()
    for _ in range(10):
        _turns(clock)
        io.finish()
        flushes.finish()
    assert order == ["append", "create"]
    assert "kafka.f" in store.machine.channels


def test_a_crash_with_two_unanswered_groups_loses_only_them(tmp_path):
    clock, io, store, flushes = _setup(tmp_path)
    kept: list = []
    store.append_batch("kafka.e", batch(b"kept")).addBoth(kept.append)
    _turns(clock)
    flushes.finish()
    assert [a.first_sequence for a in kept] == [1]
    lost: list = []
    for value in (b"lost1", b"lost2"):
        store.append_batch("kafka.e", batch(value)).addBoth(lost.append)
        _turns(clock)
    assert store.machine.channels["kafka.e"].next_sequence == 4
    _crash(store)                  # neither flush returned
    assert lost == []
    io2 = _HeldIO()
    again = _started_solo(tmp_path, clock, io2)
    assert values(again, "kafka.e") == [b"kept"]
    nxt: list = []
    again.append_batch("kafka.e", batch(b"next")).addBoth(nxt.append)
    _settle(clock, io2)
    assert [a.first_sequence for a in nxt] == [2]
    assert values(again, "kafka.e") == [b"kept", b"next"]


def test_a_failed_flush_fails_every_unanswered_group_and_stops_the_node(tmp_path):
    clock, io, store, flushes = _setup(tmp_path)
    answers: list = []
    for value in (b"a", b"b"):
        store.append_batch("kafka.e", batch(value)).addBoth(answers.append)
        _turns(clock)
    calls, flushes.calls = flushes.calls, []
    for d, _f, _args in calls:
        d.errback(Failure(OSError(5, "Input/output error")))
    _turns(clock)
    assert len(answers) == 2
    assert all(isinstance(a, Failure) and a.check(StorageFailure) for a in answers)
    assert store.proposer.driver.failed is not None
    assert store.bounds("kafka.e").high_watermark == 1
    late: list = []
    store.append_batch("kafka.e", batch(b"c")).addBoth(late.append)
    _turns(clock)
    assert late and isinstance(late[0], Failure)
