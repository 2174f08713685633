"""InitProducerId on every node of a real 3-process cluster at the same moment: each node
claims its first block of ids then, and every claim must get a block of its own."""
from __future__ import annotations

import datetime
import threading

from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from tests.raft.test_kafka_cluster import IDS, Cluster
from tests.rawkafka import RawClient


def test_nodes_claiming_blocks_at_once_never_share_one(tmp_path):
    """Each claim is a compare-and-set of the stored block end. One that writes the value the
    key already holds passes (so a command replayed after a crash applies again): claims
    racing from three nodes all wrote the same end, all passed, and all three nodes handed
    out the same ids (a second producer's acknowledged batches were then dropped as
    retries of the first's)."""
    cluster = Cluster(tmp_path)
    try:
        cluster.leader()
        clients = {i: RawClient(cluster.kafka_ports[i]) for i in IDS}
        go = threading.Barrier(len(IDS))
        got: dict[int, list] = {i: [] for i in IDS}

        def claim(i: int) -> None:
            go.wait(timeout=10)
            for _ in range(3):
                got[i].append(clients[i].call(InitProducerIdRequest(
                    transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                    producer_id=-1, producer_epoch=-1)))

        threads = [threading.Thread(target=claim, args=(i,)) for i in IDS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for c in clients.values():
            c.close()
        answers = [r for rs in got.values() for r in rs]
        assert len(answers) == 3 * len(IDS)
        assert all(r.error_code == ErrorCode.none for r in answers), answers
        ids = [r.producer_id for r in answers]
        assert len(set(ids)) == len(ids), {i: [r.producer_id for r in rs] for i, rs in got.items()}
    finally:
        cluster.stop()
