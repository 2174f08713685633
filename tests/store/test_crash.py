"""kill -9 a real writer process many times: every acknowledged batch survives, byte-exact."""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from twisted.internet.task import Clock

from kmqkafka.records import iter_records, read_header, validate_batch
from kmqkafka.store.store import ChannelStore

WRITER = Path(__file__).with_name("crash_writer.py")
KILLS = 12


def run_until_killed(data_dir: Path, seed: int, rng: random.Random) -> list[str]:
    proc = subprocess.Popen([sys.executable, str(WRITER), str(data_dir), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    line = proc.stdout.readline()
    assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
    kill_at = time.monotonic() + rng.uniform(0.05, 0.6)
    while time.monotonic() < kill_at and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    out, _err = proc.communicate(timeout=10)
    # A line cut by the kill was never completely acknowledged: ignore it.
    return [ln for ln in out.splitlines() if ln.startswith("ACK ") and len(ln.split()) == 5]


def verify(data_dir: Path, acked: dict) -> int:
    clock = Clock()
    clock.advance(time.time())
    store = ChannelStore(data_dir, clock, threaded_io=False)
    store.start()
    checked = 0
    try:
        for name in store.list_channels():
            bounds = store.bounds(name)
            assert bounds.high_watermark == bounds.next_sequence
            by_first = {}
            seq = bounds.log_start
            expect_base = bounds.log_start
            while seq < bounds.high_watermark:
                res = store.read(name, seq, 1 << 20)
                assert res.batches, (name, seq)
                for b in res.batches:
                    header = validate_batch(b)
                    assert header.base_offset + 1 == expect_base, "sequences must stay dense"
                    expect_base = header.last_offset + 2
                    by_first[header.base_offset + 1] = (header, bytes(b))
                seq = expect_base
            for (ch, first), (last, digest) in acked.items():
                if ch != name:
                    continue
                header, raw = by_first[first]
                assert header.last_offset + 1 == last
                values = b"".join(r.value or b"" for r in iter_records(raw))
                assert hashlib.sha256(values).hexdigest() == digest
                checked += 1
    finally:
        store.machine.close()
    return checked


def test_acknowledged_appends_survive_repeated_kill_9(tmp_path):
    rng = random.Random(20261129)
    data_dir = tmp_path / "data"
    acked: dict = {}
    total_checked = 0
    for round_no in range(KILLS):
        for line in run_until_killed(data_dir, rng.randrange(1 << 30), rng):
            _, name, first, last, digest = line.split()
            key = (name, int(first))
            assert key not in acked, f"sequence {first} of {name} acknowledged twice"
            acked[key] = (int(last), digest)
        total_checked = verify(data_dir, acked)
    assert total_checked == len(acked) > 100
