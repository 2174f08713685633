"""kill -9 a process appending to a Raft log many times: every entry whose save returned is
there, byte for byte, after each restart.

The log is appended with O_DIRECT (``raft/direct.py``): each write starts over the block that
holds the end of the log and pads the last block with zeros. A kill can land between any two
steps of that; recovery must cut the padding and keep every acknowledged entry, round after
round, across file rolls.
"""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from kmqkafka.raft.direct import open_direct
from kmqkafka.raft.messages import loaded
from kmqkafka.raft.storage import DiskStorage
from tests.raft.direct_crash_writer import payload

WRITER = Path(__file__).with_name("direct_crash_writer.py")
KILLS = 8


def run_until_killed(raft_dir: Path, seed: int, rng: random.Random) -> tuple[int, str]:
    """(the highest index acknowledged, "direct" or "cached") of one writer, killed at random."""
    proc = subprocess.Popen([sys.executable, str(WRITER), str(raft_dir), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    ready = proc.stdout.readline().split()
    assert ready and ready[0] == "READY", (ready, proc.stderr.read() if proc.poll() else "")
    time.sleep(rng.uniform(0.05, 0.35))
    os.kill(proc.pid, signal.SIGKILL)
    out, _err = proc.communicate(timeout=10)
    acks = [int(ln.split()[1]) for ln in out.splitlines()
            if ln.startswith("ACK ") and len(ln.split()) == 2]  # a cut line was not acked
    return max(acks, default=int(ready[1])), ready[2]


def test_acknowledged_entries_survive_repeated_kill_9(tmp_path):
    rng = random.Random(20261202)
    raft_dir = tmp_path / "raft"
    acked = 0
    modes = set()
    for _round in range(KILLS):
        got, mode = run_until_killed(raft_dir, rng.randrange(1 << 30), rng)
        modes.add(mode)
        assert got >= acked
        acked = got
        st = DiskStorage.open(raft_dir, roll_bytes=4 << 20, keep_free=2)
        try:
            assert st.last_index >= acked, f"round {_round}: entries past {st.last_index} lost"
            for e in st.entries:
                assert bytes(loaded(e).data) == payload(e.index), f"entry {e.index} damaged"
            assert st.first_index == 1
        finally:
            st.close()
    assert acked > 50
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    appender = open_direct(probe, 0)
    if appender is not None:  # where the filesystem takes O_DIRECT, every writer used it
        appender.close()
        assert modes == {"direct"}, modes
