"""How a group commit runs its flush tokens: partitions side by side, the checkpoint last."""
from __future__ import annotations

import threading
import time

import pytest

from kmqkafka.store.machine import StateMachine


class Token:
    def __init__(self, log: list[str], name: str, barrier: threading.Barrier | None = None,
                 fail: bool = False) -> None:
        self.log, self.name, self.barrier, self.fail = log, name, barrier, fail

    def run(self) -> None:
        self.log.append(f"start {self.name}")
        if self.barrier is not None:
            self.barrier.wait()  # returns only once every partition's token is running
        time.sleep(0.01)
        self.log.append(f"end {self.name}")
        if self.fail:
            raise OSError(5, "fdatasync failed")


def test_partition_tokens_run_side_by_side_and_the_checkpoint_after_them() -> None:
    log: list[str] = []
    together = threading.Barrier(4, timeout=5)
    tokens = [(f"kafka.t~{p}", object(), Token(log, f"p{p}", together)) for p in range(4)]
    tokens += [(None, object(), Token(log, "offsets")), (None, object(), Token(log, "checkpoint"))]
    StateMachine.run_flush(tokens)
    assert log[-4:] == ["start offsets", "end offsets", "start checkpoint", "end checkpoint"]
    assert sorted(log[:8]) == sorted([f"{e} p{p}" for p in range(4) for e in ("start", "end")])


def test_a_failed_partition_flush_fails_the_flush_after_every_token_ran() -> None:
    log: list[str] = []
    tokens = [(f"kafka.t~{p}", object(), Token(log, f"p{p}", fail=p == 1)) for p in range(3)]
    tokens.append((None, object(), Token(log, "checkpoint")))
    with pytest.raises(OSError):
        StateMachine.run_flush(tokens)
    assert sum(e.startswith("end p") for e in log) == 3  # none still running
    assert "start checkpoint" not in log  # nothing claims the failed data durable


def test_many_partitions_share_the_workers_and_a_failure_stops_none_of_them() -> None:
    """64 partition tokens run on SYNC_WORKERS workers, each running a share of them; one
    failing token does not stop the rest of its share, and the flush fails after all ran."""
    from kmqkafka.store import machine

    log: list[str] = []
    running = [0, 0]  # now, most at once
    lock = threading.Lock()

    class Counted(Token):
        def run(self) -> None:
            with lock:
                running[0] += 1
                running[1] = max(running)
            try:
                super().run()
            finally:
                with lock:
                    running[0] -= 1

    tokens = [(f"kafka.t~{p}", object(), Counted(log, f"p{p}", fail=p == 3)) for p in range(64)]
    with pytest.raises(OSError):
        StateMachine.run_flush(tokens)
    assert sum(e.startswith("end p") for e in log) == 64
    assert 1 < running[1] <= machine.SYNC_WORKERS
