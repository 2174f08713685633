"""kill -9 a real writer process many times: every acknowledged batch survives, once.

Runs with the local group-commit proposer and with one-member Raft. The Raft proposer applies a one-member cluster's Append entries while their Raft log write is
still being fsynced (``RaftProposer.stage``) and reuses freed Raft log files; this checks the
crash argument end to end: after each kill the store recovers (checkpoint cut, Raft log replay),
every acknowledged batch is there byte-exact at the Sequence it was acknowledged with, sequences
stay dense, and no batch is stored twice.
"""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from kmqkafka.raft.proposer import RaftProposer
from kmqkafka.records import iter_records, validate_batch
from kmqkafka.store.store import ChannelStore

WRITER = Path(__file__).with_name("crash_writer.py")
KILLS = 12


def flush(m) -> None:
    """One group commit of a StateMachine, inline: prepare, run and complete its flush."""
    tokens = m.prepare_flush()
    m.run_flush(tokens)
    m.complete_flush(tokens)


def run_until_killed(data_dir: Path, seed: int, rng: random.Random, mode: str) -> list[str]:
    proc = subprocess.Popen([sys.executable, str(WRITER), str(data_dir), str(seed), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    deadline = time.monotonic() + 30
    line = proc.stdout.readline()
    assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
    kill_at = time.monotonic() + rng.uniform(0.05, 0.8)
    while time.monotonic() < kill_at and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    out, _err = proc.communicate(timeout=10)
    # A line cut by the kill was never completely acknowledged: ignore it.
    return [ln for ln in out.splitlines() if ln.startswith("ACK ") and len(ln.split()) == 5]


def recover(data_dir: Path, mode: str) -> tuple[ChannelStore, Clock]:
    clock = Clock()
    clock.advance(time.time())

    def factory(machine, reactor, run_io):
        return RaftProposer(machine, reactor, run_io, node_id=1, members=None, transport=None,
                            raft_dir=data_dir / "raft", rng=random.Random(0), tick_s=0.1)

    store = ChannelStore(data_dir, clock, threaded_io=False,
                         proposer_factory=factory if mode == "raft" else None)
    started: list = []
    store.start().addBoth(started.append)
    for _ in range(50):
        if started:
            break
        clock.advance(0.1)
    assert started == [None], started
    return store, clock


def verify(data_dir: Path, acked: dict, mode: str) -> int:
    store, clock = recover(data_dir, mode)
    checked = 0
    digests: set[str] = set()
    try:
        for name in store.list_channels():
            bounds = store.bounds(name)
            assert bounds.high_watermark == bounds.next_sequence
            by_first = {}
            seq = expect_base = bounds.log_start
            while seq < bounds.high_watermark:
                res = store.read(name, seq, 1 << 20)
                assert res.batches, (name, seq)
                for b in res.batches:
                    header = validate_batch(b)
                    assert header.base_offset + 1 == expect_base, "sequences must stay dense"
                    expect_base = header.last_offset + 2
                    values = b"".join(r.value or b"" for r in iter_records(bytes(b)))
                    digest = hashlib.sha256(values).hexdigest()
                    # Random values: a batch applied twice would repeat its digest.
                    assert digest not in digests, f"a batch of {name} is stored twice"
                    digests.add(digest)
                    by_first[header.base_offset + 1] = (header, digest)
                seq = expect_base
            for (ch, first), (last, digest) in acked.items():
                if ch != name:
                    continue
                header, stored = by_first[first]
                assert header.last_offset + 1 == last
                assert stored == digest
                checked += 1
    finally:
        # No clean stop: the next writer recovers from the killed state itself.
        if mode == "raft":
            store.proposer.storage.close()
        store.machine.close()
    return checked


@pytest.mark.parametrize("mode", ["local", "raft"])
def test_acknowledged_appends_survive_repeated_kill_9(tmp_path, mode):
    rng = random.Random(20261130)
    data_dir = tmp_path / "data"
    acked: dict = {}
    total_checked = 0
    for _round in range(KILLS):
        for line in run_until_killed(data_dir, rng.randrange(1 << 30), rng, mode):
            _, name, first, last, digest = line.split()
            key = (name, int(first))
            assert key not in acked, f"sequence {first} of {name} acknowledged twice"
            acked[key] = (int(last), digest)
        total_checked = verify(data_dir, acked, mode)
    assert total_checked == len(acked) > 100


def test_a_created_channel_is_durable_only_through_the_flush_that_checkpoints_it(tmp_path):
    """Replicated mode creates an Events channel without fsyncs (a 256-partition CreateTopics
    held the reactor for seconds); the next flush syncs its files before its checkpoint names
    it. A crash before that may leave the directory with lost contents: recovery removes it
    (replaying the Raft log creates it again) instead of failing to open it."""
    from kmqkafka.store import commands as c
    from kmqkafka.store.machine import StateMachine
    from kmqkafka.store.names import dir_name

    m = StateMachine(tmp_path, replicated=True)
    m.recover(0)
    m.apply(1, c.CreateChannel("kafka.a"))
    assert m.has_unflushed()
    flush(m)
    m.apply(2, c.CreateChannel("kafka.b"))  # not flushed: "lost" below
    m.close()
    lost = tmp_path / "channels" / dir_name("kafka.b")
    for name in ("kind", "config.json"):
        (lost / name).write_bytes(b"")
    again = StateMachine(tmp_path, replicated=True)
    again.recover(0)
    assert "kafka.a" in again.channels and "kafka.b" not in again.channels
    assert again.last_applied == 1 and not lost.exists()
    again.apply(2, c.CreateChannel("kafka.b"))  # the replay
    flush(again)
    again.close()
    third = StateMachine(tmp_path, replicated=True)
    third.recover(0)
    assert {"kafka.a", "kafka.b"} <= set(third.channels) and third.last_applied == 2
    third.close()


def test_a_refused_write_inside_a_topic_create_leaves_nothing_half_made(tmp_path, monkeypatch):
    """A create batch: its partitions' channels, then the catalog entry. A full disk failing
    the third channel used to leave the catalog entry and two channels (a topic listed with
    partitions that did not exist); a lost race used to be found only at the catalog write."""
    from kmqkafka.store import commands as c
    from kmqkafka.store.errors import KeyConflict
    from kmqkafka.store.machine import BatchFailure, StateMachine

    m = StateMachine(tmp_path, replicated=True)
    m.recover(0)
    key = b"topic:t"
    create = c.Batch(tuple(c.CreateChannel(f"kafka.t~{p}" if p else "kafka.t", exist_ok=True)
                           for p in range(4))
                     + (c.KeyedPut("config", ((key, b"v1"),), 0, expect=((key, None),)),))
    real_open = m._open_channel
    calls = []

    def full_disk(name, kind, now_ms, sync=True):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_open(name, kind, now_ms, sync=sync)

    monkeypatch.setattr(m, "_open_channel", full_disk)
    with pytest.raises(OSError):
        m.apply(1, create)
    assert not m.channels and m.keyed["config"].get(key) is None
    monkeypatch.setattr(m, "_open_channel", real_open)
    assert len(m.apply(2, create)) == 5  # the retry makes the whole topic
    assert len(m.channels) == 4 and m.keyed["config"].get(key) == b"v1"

    lost = c.Batch((c.CreateChannel("kafka.u"),
                    c.KeyedPut("config", ((key, b"v2"),), 0, expect=((key, None),))))
    outcome = m.apply(3, lost)
    assert isinstance(outcome, BatchFailure) and isinstance(outcome.error, KeyConflict)
    assert "kafka.u" not in m.channels  # checked before anything was applied
    m.close()


def test_a_channel_deleted_while_its_flush_runs_is_not_a_failed_flush(tmp_path):
    """The flush runs on the I/O thread while the reactor may delete (and create again) the
    channels it covers; a path gone meanwhile used to fail the flush, and a failed flush
    makes the store refuse every write until a restart."""
    from kmqkafka.records import NewRecord, build_batch
    from kmqkafka.store import commands as c
    from kmqkafka.store.machine import StateMachine

    m = StateMachine(tmp_path, replicated=True)
    m.recover(0)
    m.apply(1, c.CreateChannel("kafka.gone", config={"segment_bytes": 200}))
    for i in range(5):  # rolls: index jobs and a directory sync pending
        m.apply(2 + i, c.Append("kafka.gone", 0, build_batch(
            [NewRecord(value=b"v" * 150)], now_ms=0)))
    tokens = m.prepare_flush()
    m.apply(10, c.DeleteChannel("kafka.gone"))
    m.apply(11, c.CreateChannel("kafka.gone"))
    m.run_flush(tokens)  # would raise FileNotFoundError
    m.complete_flush(tokens)
    flush(m)
    m.close()


def test_a_deleted_channel_directory_goes_with_the_next_flush(tmp_path):
    """Replicated mode: applying a delete only renames the directory; the next flush (I/O
    thread) syncs that and removes it, so a delete of thousands of topics does not hold the
    reactor. A crash before that flush leaves the renamed directory to recovery, and one
    entry may delete, create and delete the same name again."""
    from kmqkafka.store import commands as c
    from kmqkafka.store.machine import StateMachine

    def leftovers() -> list[str]:
        return sorted(p.name for p in (tmp_path / "channels").iterdir() if ".deleted" in p.name)

    m = StateMachine(tmp_path, replicated=True)
    m.recover(0)
    m.apply(1, c.CreateChannel("kafka.a"))
    flush(m)
    m.apply(2, c.Batch((c.DeleteChannel("kafka.a"), c.CreateChannel("kafka.a"),
                        c.DeleteChannel("kafka.a"))))
    assert "kafka.a" not in m.channels and len(leftovers()) == 2
    flush(m)
    assert leftovers() == []
    m.apply(3, c.CreateChannel("kafka.b"))
    flush(m)
    m.apply(4, c.DeleteChannel("kafka.b"))
    m.close()  # a crash before the flush
    assert len(leftovers()) == 1
    again = StateMachine(tmp_path, replicated=True)
    again.recover(0)
    assert leftovers() == []
    again.close()


def test_replay_after_a_crash_meets_the_coordinator_state_of_its_checkpoint(tmp_path):
    """A topic created (its channels and a compare-and-set catalog entry) and then altered
    (another compare-and-set of the same key) after the last checkpoint: the crash keeps the
    coordinator files (the page cache survives kill -9) but removes the channels, which
    replay re-creates. Replay used to meet the altered entry, fail the create's check, and
    leave the topic listed with no channels behind it."""
    from kmqkafka.store import commands as c
    from kmqkafka.store.machine import BatchFailure, StateMachine

    key = b"topic:t"
    create = c.Batch(tuple(c.CreateChannel(f"kafka.t~{p}" if p else "kafka.t") for p in range(2))
                     + (c.KeyedPut("config", ((key, b"v1"),), 0, expect=((key, None),)),))
    alter = c.Batch((c.KeyedPut("config", ((key, b"v2"),), 0, expect=((key, b"v1"),)),
                     c.SetChannelConfig("kafka.t", {"retention_ms": 5})))
    m = StateMachine(tmp_path, replicated=True)
    m.recover(0)
    m.apply(1, c.KeyedPut("offsets", ((b"g", b"0"),), 0))
    flush(m)  # the checkpoint: index 1
    assert not isinstance(m.apply(2, create), BatchFailure)
    assert not isinstance(m.apply(3, alter), BatchFailure)
    m.close()  # every file written, no newer checkpoint: what kill -9 leaves

    again = StateMachine(tmp_path, replicated=True)
    again.recover(0)
    assert again.last_applied == 1 and again.keyed["config"].get(key) is None
    assert again.keyed["offsets"].get(b"g") == b"0"
    assert not isinstance(again.apply(2, create), BatchFailure)
    assert not isinstance(again.apply(3, alter), BatchFailure)
    assert {"kafka.t", "kafka.t~1"} <= set(again.channels)
    assert again.channel("kafka.t").config.retention_ms == 5
    assert again.keyed["config"].get(key) == b"v2"
    again.close()


def test_a_coordinator_family_goes_back_to_the_generation_its_checkpoint_names(tmp_path):
    """A roll's new generation pointer may be durable before the checkpoint naming it (the
    old generation stays until that flush completes): the cut switches the pointer back."""
    from kmqkafka.store.keyed import KeyedLog, cut_back

    keyed = KeyedLog.open(tmp_path, "groups", 0, roll_min_records=3)
    keyed.put_many([(b"a", b"1"), (b"b", b"1")], 0)
    keyed._log.flush_now()
    at = keyed.position
    for i in range(6):  # past the roll threshold: a new generation with a snapshot
        keyed.put(b"c", b"%d" % i, 0)
    assert keyed.generation == at[0] + 1
    token = keyed.prepare_flush()
    token.run()  # the pointer names the new generation; complete_flush never ran
    keyed._log._log.close()
    keyed._log._retired.close()
    assert cut_back(tmp_path, "groups", *at) >= 0
    back = KeyedLog.open(tmp_path, "groups", 0)
    assert back.position == at and dict(back.items()) == {b"a": b"1", b"b": b"1"}
    back.close()


def test_a_name_deleted_and_created_again_after_the_checkpoint_is_replayed_not_cut(tmp_path):
    """The checkpoint names the old channel's end (Sequence 4); the directory now holds the
    new one, whose first batch covers Sequences 1-10. Recovery used to cut the new log back
    to 4, found that inside a batch, and the daemon refused to start. Each create now has an
    incarnation the checkpoint records: another one is removed and re-created by replay."""
    from kmqkafka.records import NewRecord, build_batch, iter_records
    from kmqkafka.store import commands as c
    from kmqkafka.store.machine import StateMachine

    def batch(n: int, tag: bytes) -> bytes:
        return build_batch([NewRecord(value=tag + b"%d" % i) for i in range(n)], now_ms=0)

    old, new = batch(3, b"old"), batch(10, b"new")
    commands = [c.CreateChannel("kafka.st"), c.Append("kafka.st", 0, old),
                c.DeleteChannel("kafka.st", missing_ok=True),  # as DeleteTopics sends it
                c.CreateChannel("kafka.st"),
                c.Append("kafka.st", 0, new)]
    m = StateMachine(tmp_path, replicated=True)
    m.recover(0)
    m.apply(1, commands[0])
    m.apply(2, commands[1])
    flush(m)  # the checkpoint: index 2, kafka.st ends at 4
    for index, command in enumerate(commands[2:], start=3):
        m.apply(index, command)
    m.close()  # the new log is on disk; no newer checkpoint

    again = StateMachine(tmp_path, replicated=True)
    again.recover(0)  # used to raise CorruptStore: a batch straddles checkpoint 4
    assert again.last_applied == 2 and "kafka.st" not in again.channels
    for index, command in enumerate(commands[2:], start=3):
        again.apply(index, command)  # the replay
    ch = again.channel("kafka.st")
    got = [r.value for b in ch.read(1, 1 << 20, upto=ch.next_sequence).batches
           for r in iter_records(b)]
    assert got == [b"new%d" % i for i in range(10)]
    again.close()
