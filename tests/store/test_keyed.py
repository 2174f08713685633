"""KeyedLog: the compact keyed logs of the internal coordinator families."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kmqkafka.store import names
from kmqkafka.store.errors import CorruptStore
from kmqkafka.store.keyed import RESERVED_FAMILIES, KeyedLog

NOW = 1_700_000_000_000


def gen_dirs(root: Path, family: str) -> list[int]:
    stem = names.dir_name(f"_kafka.{family}.")
    return sorted(int(e[len(stem):]) for e in os.listdir(root)
                  if e.startswith(stem) and e[len(stem):].isdigit())


def flush(keyed: KeyedLog) -> None:
    token = keyed.prepare_flush()
    if token is not None:
        token.run()
        keyed.complete_flush(token)


def test_reserved_families() -> None:
    assert RESERVED_FAMILIES == ("offsets", "groups", "config", "txn")


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        KeyedLog.open(tmp_path, "topics", NOW)


def test_put_get_delete_items_len(tmp_path: Path) -> None:
    kl = KeyedLog.open(tmp_path, "offsets", NOW)
    assert len(kl) == 0 and kl.get(b"a") is None
    kl.put(b"g1/t/0", b"10", NOW)
    kl.put(b"g1/t/1", b"11", NOW)
    kl.put(b"g2/t/0", b"20", NOW)
    kl.put(b"g1/t/0", b"12", NOW)  # overwrite
    assert kl.get(b"g1/t/0") == b"12"
    assert len(kl) == 3
    assert sorted(kl.items(b"g1/")) == [(b"g1/t/0", b"12"), (b"g1/t/1", b"11")]
    kl.put(b"g1/t/1", None, NOW)  # delete
    kl.put(b"missing", None, NOW)  # deleting an absent key is a no-op
    assert kl.get(b"g1/t/1") is None
    assert len(kl) == 2
    assert dict(kl.items()) == {b"g1/t/0": b"12", b"g2/t/0": b"20"}


def test_layout_pointer_and_channel_dir(tmp_path: Path) -> None:
    kl = KeyedLog.open(tmp_path, "txn", NOW)
    kl.put(b"k", b"v", NOW)
    kl.close()
    assert (tmp_path / "_kafka.txn.CURRENT").read_bytes() == b"0"
    assert (tmp_path / names.dir_name("_kafka.txn.0")).is_dir()


def test_families_are_independent(tmp_path: Path) -> None:
    a = KeyedLog.open(tmp_path, "offsets", NOW)
    b = KeyedLog.open(tmp_path, "groups", NOW)
    a.put(b"k", b"offsets", NOW)
    b.put(b"k", b"groups", NOW)
    a.close()
    b.close()
    assert KeyedLog.open(tmp_path, "offsets", NOW).get(b"k") == b"offsets"
    assert KeyedLog.open(tmp_path, "groups", NOW).get(b"k") == b"groups"


def test_replay_after_close_and_put_many(tmp_path: Path) -> None:
    kl = KeyedLog.open(tmp_path, "config", NOW)
    kl.put_many([(b"a", b"1"), (b"b", b"2"), (b"a", None), (b"c", b"")], NOW)
    assert dict(kl.items()) == {b"b": b"2", b"c": b""}
    kl.close()
    again = KeyedLog.open(tmp_path, "config", NOW)
    assert dict(again.items()) == {b"b": b"2", b"c": b""}
    assert again.records_in_generation == 4  # put_many wrote all four records


def test_crash_after_flush_keeps_flushed_puts(tmp_path: Path) -> None:
    kl = KeyedLog.open(tmp_path, "offsets", NOW)
    kl.put(b"a", b"1", NOW)
    flush(kl)
    # No close: the process "dies" here; the files are all that is left.
    crashed = tmp_path.parent / (tmp_path.name + "-crash")
    shutil.copytree(tmp_path, crashed)
    kl.put(b"b", b"2", NOW)
    again = KeyedLog.open(crashed, "offsets", NOW)
    assert dict(again.items()) == {b"a": b"1"}


def test_roll_bounds_records_and_removes_old_generation(tmp_path: Path) -> None:
    kl = KeyedLog.open(tmp_path, "offsets", NOW, roll_min_records=50)
    for i in range(500):
        kl.put(b"k%d" % (i % 10), b"v%d" % i, NOW + i)
        flush(kl)
        assert kl.records_in_generation <= 51
    assert kl.generation >= 9
    assert gen_dirs(tmp_path, "offsets") == [kl.generation]
    assert (tmp_path / "_kafka.offsets.CURRENT").read_bytes() == str(kl.generation).encode()
    expected = {b"k%d" % j: b"v%d" % (490 + j) for j in range(10)}
    assert dict(kl.items()) == expected
    gen = kl.generation
    kl.close()
    again = KeyedLog.open(tmp_path, "offsets", NOW, roll_min_records=50)
    assert again.generation == gen
    assert dict(again.items()) == expected
    assert again.records_in_generation <= 51


def test_roll_threshold_follows_live_keys(tmp_path: Path) -> None:
    """With many live keys the roll waits until records exceed twice the live keys."""
    kl = KeyedLog.open(tmp_path, "groups", NOW, roll_min_records=10)
    kl.put_many([(b"k%d" % i, b"v") for i in range(100)], NOW)
    assert kl.generation == 0  # 100 records, 100 live keys: 100 <= 200
    for i in range(100):
        kl.put(b"k0", b"x%d" % i, NOW)
    assert kl.generation == 0  # exactly 200 records
    kl.put(b"k0", b"y", NOW)
    assert kl.generation == 1
    assert kl.records_in_generation == 100  # the snapshot only
    flush(kl)
    assert gen_dirs(tmp_path, "groups") == [1]


def _roll_pending(tmp_path: Path) -> tuple[KeyedLog, dict[bytes, bytes]]:
    """Puts that trigger a roll, flushed up to just before it; returns the state at the roll."""
    kl = KeyedLog.open(tmp_path, "offsets", NOW, roll_min_records=20)
    for i in range(20):
        kl.put(b"k%d" % (i % 3), b"v%d" % i, NOW)
    flush(kl)
    kl.put(b"k9", b"trigger", NOW)
    assert kl.generation == 1 and gen_dirs(tmp_path, "offsets") == [0, 1]
    return kl, dict(kl.items())


def test_crash_before_pointer_switch_keeps_old_generation(tmp_path: Path) -> None:
    kl, at_roll = _roll_pending(tmp_path)
    kl.put(b"after", b"roll", NOW)  # goes to gen 1, whose pointer never became durable
    again = KeyedLog.open(tmp_path, "offsets", NOW, roll_min_records=20)
    assert again.generation == 0
    assert dict(again.items()) == at_roll
    assert gen_dirs(tmp_path, "offsets") == [0]  # the half-made gen 1 is gone


def test_crash_after_pointer_before_delete_uses_new_generation(tmp_path: Path) -> None:
    kl, at_roll = _roll_pending(tmp_path)
    token = kl.prepare_flush()
    assert token is not None
    token.run()  # snapshot fsynced and pointer switched; complete_flush never runs
    assert gen_dirs(tmp_path, "offsets") == [0, 1]
    again = KeyedLog.open(tmp_path, "offsets", NOW, roll_min_records=20)
    assert again.generation == 1
    assert dict(again.items()) == at_roll
    assert gen_dirs(tmp_path, "offsets") == [1]


def test_open_removes_garbage_generations_and_pointer_part(tmp_path: Path) -> None:
    kl = KeyedLog.open(tmp_path, "txn", NOW)
    kl.put(b"p", b"1", NOW)
    kl.close()
    junk = tmp_path / names.dir_name("_kafka.txn.7")
    junk.mkdir()
    (junk / "00000000000000000000.log").write_bytes(b"\x00garbage")
    (tmp_path / "_kafka.txn.CURRENT.part").write_bytes(b"7")
    other = tmp_path / "_kafka.txnx.3"  # not this family: left alone
    other.mkdir()
    again = KeyedLog.open(tmp_path, "txn", NOW)
    assert again.generation == 0 and again.get(b"p") == b"1"
    assert not junk.exists()
    assert not (tmp_path / "_kafka.txn.CURRENT.part").exists()
    assert other.exists()


def test_generations_without_pointer_are_corrupt(tmp_path: Path) -> None:
    (tmp_path / names.dir_name("_kafka.offsets.3")).mkdir()
    with pytest.raises(CorruptStore):
        KeyedLog.open(tmp_path, "offsets", NOW)


KEYS = st.sampled_from([b"a", b"b", b"c", b"g/1", b"g/2", b"\x00", b"long" * 20])
VALUES = st.one_of(st.none(), st.binary(max_size=24))


@settings(max_examples=60, stateful_step_count=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
class KeyedModel(RuleBasedStateMachine):
    """Any mix of puts, flushes, reopens and crash-reopens matches a plain dict."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        self.tmp = Path(tempfile.mkdtemp(prefix="keyed-"))
        self.kl = KeyedLog.open(self.tmp, "groups", NOW, roll_min_records=8)
        self.model: dict[bytes, bytes] = {}
        self.now = NOW

    @rule(key=KEYS, value=VALUES)
    def put(self, key: bytes, value: bytes | None) -> None:
        self.now += 1
        was_rolling = self.kl.rolling
        self.kl.put(key, value, self.now)
        if value is None:
            self.model.pop(key, None)
        else:
            self.model[key] = value
        self.check_bounded(was_rolling)

    @rule(pairs=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=6))
    def put_many(self, pairs: list[tuple[bytes, bytes | None]]) -> None:
        self.now += 1
        was_rolling = self.kl.rolling
        self.kl.put_many(pairs, self.now)
        for k, v in pairs:
            if v is None:
                self.model.pop(k, None)
            else:
                self.model[k] = v
        self.check_bounded(was_rolling)

    def check_bounded(self, was_rolling: bool) -> None:
        """After a put, replay is bounded by live state unless a roll awaited its flush."""
        if not was_rolling:
            assert self.kl.records_in_generation <= max(8, 2 * len(self.model))

    @rule()
    def flush(self) -> None:
        flush(self.kl)
        assert not self.kl.rolling

    @rule()
    def reopen(self) -> None:
        self.kl.close()
        self.kl = KeyedLog.open(self.tmp, "groups", self.now, roll_min_records=8)

    @rule()
    def crash_after_flush(self) -> None:
        flush(self.kl)
        abandoned = self.kl
        self.kl = KeyedLog.open(self.tmp, "groups", self.now, roll_min_records=8)
        abandoned.close()  # only releases fds: everything was flushed before the "crash"

    @invariant()
    def matches_model(self) -> None:
        assert dict(self.kl.items()) == self.model
        assert len(self.kl) == len(self.model)
        for k in (b"a", b"g/1"):
            assert self.kl.get(k) == self.model.get(k)
        assert sorted(self.kl.items(b"g/")) == sorted(
            (k, v) for k, v in self.model.items() if k.startswith(b"g/"))

    def teardown(self) -> None:
        self.kl.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


TestKeyedModel = KeyedModel.TestCase
