"""The transaction coordinator's state machine over an in-memory store: what each call does to
a transactional id, what one EndTxn writes (a marker per partition, the offsets, the state, in
one command), time-outs that abort with the epoch bumped, and ids forgotten after 7 days idle."""
from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E
from twisted.internet.defer import Deferred, succeed

from kmqkafka import records
from kmqkafka.coordinators.transactions import (
    FAMILY, ID_EXPIRATION_MS, TxnCoordinator, TxnError,
)
from kmqkafka.store import commands as c
from kmqkafka.store.names import channel_for

from .fakes import KeyedStore


class Store(KeyedStore):
    """Applies ``propose``d KeyedPut/Append/Batch commands at once; time is ``now``."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000
        self.appended: list[tuple[str, bytes]] = []
        self.proposals: list[c.Command] = []

    def now_ms(self) -> int:
        return self.now

    def exists(self, name: str) -> bool:
        return True

    def propose(self, command: c.Command) -> Deferred:
        self.proposals.append(command)
        self._apply(command)
        return succeed(None)

    def _apply(self, command: c.Command) -> None:
        if isinstance(command, c.Batch):
            for inner in command.commands:
                self._apply(inner)
        elif isinstance(command, c.KeyedPut):
            self.keyed_put(command.family, command.pairs)
        elif isinstance(command, c.Append):
            self.appended.append((command.name, bytes(command.batch)))


def result(d: Deferred) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the call did not finish"
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


@pytest.fixture
def store() -> Store:
    return Store()


def coordinator(store: Store) -> TxnCoordinator:
    pids = iter(range(100, 200))
    committed: list[tuple[str, list]] = []
    txn = TxnCoordinator(store, lambda: succeed(next(pids)),
                         lambda topic: 2 if topic == "t" else None,
                         lambda group, recs: committed.append((group, recs)))
    txn.committed = committed  # type: ignore[attr-defined]
    txn.load()
    return txn


def markers(store: Store) -> list[tuple[str, int, int, int]]:
    """(channel, producer id, epoch, COMMIT=1/ABORT=0) of every marker appended."""
    out = []
    for name, batch in store.appended:
        h = records.read_header(batch)
        assert h.is_control
        out.append((name, h.producer_id, h.producer_epoch, records.control_type(batch)))
    return out


def test_a_commit_is_one_command_with_markers_offsets_and_state(store: Store) -> None:
    txn = coordinator(store)
    pid, epoch = result(txn.init_producer("a", 60_000, -1, -1))
    assert (pid, epoch) == (100, 0)
    assert result(txn.add_partitions("a", pid, 0, [("t", 0), ("t", 1), ("t", 0)])) == {
        ("t", 0): E.none, ("t", 1): E.none}
    result(txn.add_offsets("a", pid, 0, "g"))
    result(txn.commit_offsets("a", pid, 0, "g", [("t", 0, 42, -1, "m")]))
    assert txn.unstable("g", "t", 0) and not txn.unstable("g", "t", 1)
    store.proposals.clear()
    result(txn.end("a", pid, 0, True))
    assert len(store.proposals) == 1 and isinstance(store.proposals[0], c.Batch)
    assert markers(store) == [(channel_for("t", 0), pid, 0, 1), (channel_for("t", 1), pid, 0, 1)]
    assert [g for g, _recs in txn.committed] == ["g"]  # type: ignore[attr-defined]
    assert txn.describe("a").state == "CompleteCommit" and not txn.unstable("g", "t", 0)
    # A reloaded coordinator (a new leader) knows the same.
    again = coordinator(store)
    assert again.describe("a") == txn.describe("a")


def test_what_each_call_refuses(store: Store) -> None:
    txn = coordinator(store)
    with pytest.raises(TxnError) as info:
        result(txn.init_producer("a", 900_001, -1, -1))
    assert info.value.code is E.invalid_transaction_timeout
    pid, _ = result(txn.init_producer("a", 60_000, -1, -1))
    for call, code in (
        (lambda: txn.add_partitions("a", pid + 1, 0, [("t", 0)]), E.invalid_producer_id_mapping),
        (lambda: txn.add_partitions("a", pid, 1, [("t", 0)]), E.producer_fenced),
        (lambda: txn.end("a", pid, 0, True), E.invalid_txn_state),
        (lambda: txn.commit_offsets("a", pid, 0, "g", []), E.invalid_txn_state),
        (lambda: txn.init_producer("a", 60_000, pid, 5), E.producer_fenced),
    ):
        with pytest.raises(TxnError) as info:
            result(call())
        assert info.value.code is code
    assert result(txn.add_partitions("a", pid, 0, [("t", 0), ("u", 0), ("t", 9)])) == {
        ("t", 0): E.operation_not_attempted, ("u", 0): E.unknown_topic_or_partition,
        ("t", 9): E.unknown_topic_or_partition}
    assert txn.describe("a").state == "Empty"


def test_a_timed_out_transaction_is_aborted_with_the_epoch_bumped(store: Store) -> None:
    txn = coordinator(store)
    pid, _ = result(txn.init_producer("a", 10_000, -1, -1))
    result(txn.add_partitions("a", pid, 0, [("t", 1)]))
    store.now += 10_000
    assert result(txn.abort_expired()) == 0
    store.now += 1
    assert result(txn.abort_expired()) == 1
    assert markers(store) == [(channel_for("t", 1), pid, 1, 0)]
    meta = txn.describe("a")
    assert (meta.state, meta.epoch) == ("CompleteAbort", 1)
    with pytest.raises(TxnError) as info:
        result(txn.end("a", pid, 0, True))
    assert info.value.code is E.producer_fenced


def test_init_on_an_open_transaction_aborts_it_and_fences_its_producer(store: Store) -> None:
    txn = coordinator(store)
    pid, _ = result(txn.init_producer("a", 60_000, -1, -1))
    result(txn.add_partitions("a", pid, 0, [("t", 0)]))
    assert result(txn.init_producer("a", 60_000, -1, -1)) == (pid, 2)
    assert markers(store) == [(channel_for("t", 0), pid, 1, 0)]
    assert txn.describe("a").state == "Empty"


def test_an_idle_id_is_forgotten_after_seven_days(store: Store) -> None:
    txn = coordinator(store)
    pid, _ = result(txn.init_producer("idle", 60_000, -1, -1))
    busy, _ = result(txn.init_producer("busy", 60_000, -1, -1))
    result(txn.add_partitions("busy", busy, 0, [("t", 0)]))
    store.now += ID_EXPIRATION_MS + 1
    result(txn.abort_expired())  # aborts "busy" (timed out), forgets "idle"
    assert txn.describe("idle") is None and txn.describe("busy") is not None
    assert [k for k, _v in store.keyed_items(FAMILY)] == [b"tid:busy"]
    assert result(txn.init_producer("idle", 60_000, -1, -1)) == (102, 0)  # a new producer id


def test_failed_writes_and_old_versions_get_the_codes_kafka_clients_expect() -> None:
    from types import SimpleNamespace

    from twisted.python.failure import Failure

    from kmqkafka.kafka.transactions import END_TXN, _code
    from kmqkafka.raft.errors import CommitTimeout, NotLeaderError

    v3 = SimpleNamespace(api_key=END_TXN, api_version=3)
    v1 = SimpleNamespace(api_key=END_TXN, api_version=1)
    assert _code(Failure(NotLeaderError("not the leader", 2)), v3) is E.not_coordinator
    assert _code(Failure(CommitTimeout("slow")), v3) is E.coordinator_not_available
    assert _code(Failure(TxnError(E.producer_fenced)), v3) is E.producer_fenced
    assert _code(Failure(TxnError(E.producer_fenced)), v1) is E.invalid_producer_epoch
