"""Writer for test_direct_crash: append entries to a DiskStorage until killed.

argv: raft dir, seed. Resumes after the last entry the log holds, appends entries of
random sizes (some within a block, some across many) one save at a time, and prints
``ACK index`` once ``save`` returned (fdatasynced), never before.
"""
import random
import sys

from kmqkafka.raft import Entry, EntryKind, HardState, Ready
from kmqkafka.raft.storage import DiskStorage


def payload(index: int) -> bytes:
    """The data of entry ``index``: a size and bytes the checker derives again."""
    rng = random.Random(index)
    size = rng.choice([1, 65, 700, 4095, 4096, 5000, 20_000, 300_000])
    return rng.randbytes(size)


def main() -> None:
    st = DiskStorage.open(sys.argv[1], roll_bytes=4 << 20, keep_free=2)
    rng = random.Random(int(sys.argv[2]))
    index = st.last_index
    print("READY", index, "direct" if st._direct is not None else "cached", flush=True)
    while True:
        n = rng.choice([1, 1, 2, 5])
        entries = tuple(Entry(i, 1, EntryKind.NORMAL, payload(i))
                        for i in range(index + 1, index + n + 1))
        st.save(Ready(hard_state=HardState(1, 1, index), entries=entries))
        index += n
        print("ACK", index, flush=True)


if __name__ == "__main__":
    main()
