"""Child process for the crash test: appends forever, printing each acknowledged batch.

Usage: python crash_writer.py DATA_DIR SEED. Prints ``READY`` after recovery,
then ``ACK <channel> <first> <last> <sha256 of values>`` for every append
whose Deferred fired (i.e. that the store acknowledged as durable).
"""

import hashlib
import random
import sys

from twisted.internet import reactor

from kmqkafka.records import NewRecord, build_batch
from kmqkafka.store.store import ChannelStore

CHANNELS = ["kafka.crash", "kafka.crash~1", "native.crash"]


def main() -> None:
    data_dir, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    store = ChannelStore(data_dir, reactor,
                         default_config=None)
    store.start()
    for name in CHANNELS:
        store.create_channel(name, exist_ok=True, config={"segment_bytes": 256 * 1024})
    out = sys.stdout

    def one() -> None:
        name = rng.choice(CHANNELS)
        values = [rng.randbytes(rng.randint(0, 3000)) for _ in range(rng.randint(1, 20))]
        batch = build_batch([NewRecord(value=v) for v in values], now_ms=store.now_ms(),
                            compression=rng.choice([0, 0, 1, 3, 4]))
        digest = hashlib.sha256(b"".join(values)).hexdigest()

        def acked(res):
            out.write(f"ACK {name} {res.first_sequence} {res.last_sequence} {digest}\n")
            out.flush()
            reactor.callLater(0, one)

        store.append_batch(name, batch).addCallback(acked)

    def go() -> None:
        out.write("READY\n")
        out.flush()
        for _ in range(16):
            one()

    reactor.callWhenRunning(go)
    reactor.run()


if __name__ == "__main__":
    main()
