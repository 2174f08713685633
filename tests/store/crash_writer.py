"""Child process for the crash tests: appends forever, printing each acknowledged batch.

Usage: python crash_writer.py DATA_DIR SEED [local|raft]. Prints ``READY`` after
recovery, then ``ACK <channel> <first> <last> <sha256 of values>`` for every append
whose Deferred fired (that the store acknowledged as durable). With ``raft`` the
proposer is one-member Raft with small checkpoint, roll and compaction sizes, so kills
land while entries are applied early (during their Raft log fsync), in checkpoints, in
rolls of the Raft log onto recycled files and in compactions.
"""

import hashlib
import random
import sys
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred

from kmqkafka.raft.proposer import one_member_factory
from kmqkafka.records import NewRecord, build_batch
from kmqkafka.store.store import ChannelStore

CHANNELS = ["kafka.crash", "kafka.crash~1", "native.crash"]
RAFT = dict(checkpoint_bytes=192 * 1024, checkpoint_interval_s=0.05, wal_roll_bytes=256 * 1024,
            compact_bytes=768 * 1024)


def main() -> None:
    data_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "local"
    rng = random.Random(seed)
    factory = one_member_factory(reactor, data_dir / "raft", **RAFT) if mode == "raft" else None
    store = ChannelStore(data_dir, reactor, proposer_factory=factory)
    out = sys.stdout

    def one() -> None:
        name = rng.choice(CHANNELS)
        n = rng.choice([1, 1, 2, 20, 60])
        values = [rng.randbytes(rng.randint(0, 3000)) for _ in range(n)]
        # A 16-byte tag makes every batch's digest unique (the reader treats a repeated digest
        # as a batch stored twice; two one-record batches of empty values used to collide).
        values[0] = rng.randbytes(16) + values[0]
        batch = build_batch([NewRecord(value=v) for v in values], now_ms=store.now_ms(),
                            compression=rng.choice([0, 0, 1, 3, 4]))
        digest = hashlib.sha256(b"".join(values)).hexdigest()

        def acked(res):
            out.write(f"ACK {name} {res.first_sequence} {res.last_sequence} {digest}\n")
            out.flush()
            reactor.callLater(0, one)

        store.append_batch(name, batch).addCallback(acked)

    async def go() -> None:
        await store.start()
        for name in CHANNELS:
            await store.create_channel(name, exist_ok=True, config={"segment_bytes": 256 * 1024})
        out.write("READY\n")
        out.flush()
        for _ in range(16):
            one()

    reactor.callWhenRunning(lambda: ensureDeferred(go()).addErrback(
        lambda f: (sys.stderr.write(f.getTraceback()), reactor.stop())))
    reactor.run()


if __name__ == "__main__":
    main()
