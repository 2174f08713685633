"""A follower that was down while the leader compacted its Raft log past it is caught up by a
snapshot sent over the real Raft transport (tar over TCP): it then serves every record at its
offset, byte for byte, and the files it installed are on disk, not only in the page cache.

The daemons run with the Raft log compacted every MiB (a wrapper lowers the threshold, which
is 256 MiB by default), so a few MB of produce are enough to leave the follower behind."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import make_self_signed, on_tmpfs, resident_bytes
from tests.raft.test_kafka_cluster import Cluster, fetch_all, produce_confluent

pytest.importorskip("confluent_kafka")

SMALL_COMPACTION = """
import sys
from kmqkafka.raft import proposer
_init = proposer.RaftProposer.__init__
def init(self, *args, **kwargs):
    kwargs["compact_bytes"] = 1 << 20
    _init(self, *args, **kwargs)
proposer.RaftProposer.__init__ = init
sys.argv = sys.argv[1:]
from twisted.scripts.twistd import run
run()
"""


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_a_follower_behind_a_compaction_is_caught_up_by_a_snapshot(tmp_path: Path,
                                                                   tls: bool) -> None:
    """Over plain TCP, and over TLS Raft links (the follower pauses and resumes its link
    through the TLS layer while it unpacks)."""
    env = None
    if tls:
        cert, key = make_self_signed(tmp_path)
        env = {"KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key),
               "KMQKAFKA_TLS_CA": str(cert)}
    cluster = Cluster(tmp_path, prefix=(sys.executable, "-c", SMALL_COMPACTION), env=env)
    try:
        leader = cluster.leader()
        victim = cluster.follower()
        brokers = cluster.brokers
        topic = "behind"
        values = [b"%05d:" % i + os.urandom(2000) for i in range(3000)]
        boot = brokers[leader].bootstrap
        assert produce_confluent(boot, topic, values[:100]) == list(range(100))
        brokers[victim].kill()
        for start in range(100, 3000, 500):  # ~6 MB: the leader compacts several times
            chunk = values[start:start + 500]
            assert produce_confluent(boot, topic, chunk) == list(range(start, start + len(chunk)))
        brokers[victim].restart()
        assert fetch_all(cluster.kafka_ports[victim], topic, 3000) == list(enumerate(values))
        fetched = re.findall(r"fetching snapshot (\d+) from node", brokers[victim].log())
        assert fetched, "the follower was not caught up by a snapshot"
        if not on_tmpfs(tmp_path):  # synced before install, then dropped from the cache
            received = brokers[victim].data_dir / "raft" / "snapshots" / f"{int(fetched[-1]):020d}"
            files = list((received / "channels" / f"kafka.{topic}").glob("*.log"))
            assert files and sum(resident_bytes(p) for p in files) == 0
        assert cluster.leader() == leader
    finally:
        cluster.stop()
