"""Store benchmark: durable append throughput vs the raw disk, and cached read throughput.

Run: .venv/bin/python bench/store_bench.py [--mib 256] [--dir /path/on/the/disk]
     [--proposer raft|local]   (default local, or env KMQ_BENCH_PROPOSER)

Prints a human summary, then one JSON line last with keys append_mb_s,
disk_mb_s, append_ratio, read_mb_s (plus details) so runs can be compared.
The raw-disk figure writes the same 1 MiB chunks and fdatasyncs once per
group of IN_FLIGHT chunks, the flush pattern group commit gives the store.
"""

from __future__ import annotations

import argparse
import json
from statistics import median
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twisted.internet import defer, reactor, task  # noqa: E402

from kmqkafka.records import NewRecord, build_batch  # noqa: E402
from kmqkafka.store.store import ChannelStore  # noqa: E402

MIB = 1 << 20
IN_FLIGHT = 4  # 1 MiB appends outstanding at once (a producer with a few requests in flight)


def raw_disk(path: Path, total_mib: int, group: int) -> float:
    """MB/s writing 1 MiB chunks with an fdatasync after every ``group`` of them.

    ``group`` equals the appends the store has in flight, so both sides get the
    same number of flushes per byte: the raw figure is what group commit could
    reach with zero software overhead.
    """
    chunk = os.urandom(MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.perf_counter()
    try:
        for i in range(total_mib):
            os.write(fd, chunk)
            if (i + 1) % group == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    os.unlink(path)
    return total_mib * MIB / elapsed / 1e6


def one_batch(record_bytes: int, batch_bytes: int) -> bytes:
    count = max(1, batch_bytes // (record_bytes + 8))
    value = os.urandom(record_bytes)
    return build_batch([NewRecord(value=value) for _ in range(count)], now_ms=int(time.time() * 1000))


async def append_run(store: ChannelStore, name: str, batch: bytes, total_bytes: int,
                     in_flight: int) -> float:
    """MB/s of acknowledged (fsynced) appends with ``in_flight`` outstanding."""
    n = max(1, total_bytes // len(batch))
    sem = defer.DeferredSemaphore(in_flight)
    start = time.perf_counter()
    await defer.gatherResults([sem.run(store.append_batch, name, batch) for _ in range(n)])
    elapsed = time.perf_counter() - start
    return n * len(batch) / elapsed / 1e6


def read_run(store: ChannelStore, name: str, max_bytes: int) -> tuple[float, int]:
    bounds = store.bounds(name)
    start = time.perf_counter()
    seq, total = bounds.log_start, 0
    while seq < bounds.high_watermark:
        res = store.read(name, seq, max_bytes)
        total += res.nbytes
        last = res.batches[-1]
        seq = int.from_bytes(last[0:8], "big", signed=True) + int.from_bytes(last[23:27], "big", signed=True) + 2
    elapsed = time.perf_counter() - start
    return total / elapsed / 1e6, total


async def main(args: argparse.Namespace) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kmq-bench-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        factory = None
        if args.proposer == "raft":
            from kmqkafka.raft.proposer import one_member_factory
            factory = one_member_factory(reactor, base / "store" / "raft")
        store = ChannelStore(base / "store", reactor, proposer_factory=factory)
        await store.start()
        disks, disks_each, bigs = [], [], []
        # Alternate raw and store runs so drift in the VM's disk hits both alike.
        for round_no in range(args.rounds):
            disks.append(raw_disk(base / "raw.bin", args.mib, IN_FLIGHT))
            name = f"bench.big{round_no}"
            await store.create_channel(name)
            bigs.append(await append_run(store, name, one_batch(1000, MIB), args.mib * MIB, IN_FLIGHT))
            disks_each.append(raw_disk(base / "raw.bin", args.mib, 1))
        disk, disk_each, big = median(disks), median(disks_each), median(bigs)
        await store.create_channel("bench.small")
        small = await append_run(store, "bench.small", one_batch(1000, 1024), args.mib * MIB // 8, 256)
        read_mb_s, read_bytes = read_run(store, "bench.big0", MIB)
        read_mb_s_2, _ = read_run(store, "bench.big0", MIB)
        await store.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "append_mb_s": round(big, 1),
        "disk_mb_s": round(disk, 1),
        "append_ratio": round(big / disk, 3),
        "read_mb_s": round(max(read_mb_s, read_mb_s_2), 1),
        "append_1kib_batches_mb_s": round(small, 1),
        "disk_fsync_each_mb_s": round(disk_each, 1),
        "read_bytes": read_bytes,
        "mib": args.mib,
        "proposer": args.proposer,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="kmqkafka store benchmark")
    parser.add_argument("--mib", type=int, default=128, help="MiB appended per 1 MiB-batch run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating raw/store rounds (median)")
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--proposer", choices=("raft", "local"),
                        default=os.environ.get("KMQ_BENCH_PROPOSER", "local"),
                        help="store proposer: one-member Raft or the local group commit "
                             "(env KMQ_BENCH_PROPOSER)")
    cli = parser.parse_args()

    async def go(_reactor: object) -> None:
        figures = await main(cli)
        print(f"proposer:                           {figures['proposer']}")
        print(f"raw disk, fdatasync every {IN_FLIGHT} MiB:  {figures['disk_mb_s']} MB/s")
        print(f"raw disk, fdatasync every 1 MiB:   {figures['disk_fsync_each_mb_s']} MB/s")
        print(f"durable appends, 1 MiB batches:     {figures['append_mb_s']} MB/s "
              f"({figures['append_ratio']:.0%} of raw)")
        print(f"durable appends, 1 KiB batches:     {figures['append_1kib_batches_mb_s']} MB/s")
        print(f"cached reads, 1 MiB budget:         {figures['read_mb_s']} MB/s")
        print(json.dumps(figures, sort_keys=True))

    task.react(lambda r: defer.ensureDeferred(go(r)))
