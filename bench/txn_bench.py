"""Transaction benchmark: what a transactional producer costs, kmqkafka against tansu.

Run: .venv/bin/python bench/txn_bench.py [--seconds 5] [--only kmqkafka|tansu]

Both brokers as ``kafka_bench.py`` starts them (kmqkafka fsyncs on its real-disk data dir,
tansu in memory), one confluent-kafka (librdkafka) transactional producer, a topic of 2
partitions. Phases, each bounded by ``--seconds``:

1. ``small``: back-to-back transactions of one 100 B record each (begin, produce, commit):
   transactions/s and commit latency p50/p99. Every commit is AddPartitionsToTxn, Produce and
   EndTxn, each of which kmqkafka answers only once durable (the EndTxn writes a marker into
   each partition and the transaction's state as one Raft entry).
2. ``bulk``: transactions of 10,000 × 100 B records over both partitions: records/s and
   transactions/s, the transactional producer's throughput.
3. ``check``: one aborted transaction, then a read_committed consumer reads everything back
   and must see every committed record and none of the aborted one (``committed_ok``).

The broker's CPU (user+sys, % of one core) is measured over each phase. Prints a table, then,
last, one JSON line with every figure.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_bench import (  # noqa: E402
    QUIET, CpuMeter, Daemon, create_topic, kmqkafka_daemon, percentile, tansu_daemon,
)

SMALL_VALUE = b"s" * 100
BULK_RECORDS = 10_000


def small_phase(p: Producer, topic: str, seconds: float) -> tuple[int, list[float]]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        p.begin_transaction()
        p.produce(topic, SMALL_VALUE, partition=len(latencies) % 2)
        p.commit_transaction(30)
        latencies.append((time.perf_counter() - start) * 1000)
    return len(latencies), latencies


def bulk_phase(p: Producer, topic: str, seconds: float) -> tuple[int, int]:
    value = b"b" * 100
    txns = records = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        p.begin_transaction()
        for i in range(BULK_RECORDS):
            while True:
                try:
                    p.produce(topic, value, partition=i % 2)
                    break
                except BufferError:
                    p.poll(0.01)
        p.commit_transaction(60)
        txns += 1
        records += BULK_RECORDS
    return txns, records


def committed_read(bootstrap: str, topic: str, timeout: float = 60.0) -> dict[bytes, int]:
    """Count of each value prefix a read_committed consumer reads to both partitions' ends."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-bench-check",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "enable.auto.commit": False, **QUIET})
    counts: dict[bytes, int] = {}
    ended: set[int] = set()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        deadline = time.monotonic() + timeout
        while len(ended) < 2 and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        ended.add(m.partition())
                    continue
                key = m.value()[:1]
                counts[key] = counts.get(key, 0) + 1
    finally:
        c.close()
    return counts


def run(daemon: Daemon, seconds: float) -> dict[str, Any]:
    topic = "txn-bench"
    create_topic(daemon.bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": daemon.bootstrap, "transactional.id": "txn-bench",
                  "linger.ms": 5, "batch.size": 1_000_000, **QUIET})
    p.init_transactions(30)
    meter = CpuMeter(daemon.pid)
    out: dict[str, Any] = {}

    before = meter.sample()
    n, lat = small_phase(p, topic, seconds)
    cpu, _client = CpuMeter.pct(before, meter.sample())
    lat.sort()
    out.update(small_txn_s=n / seconds, small_p50_ms=percentile(lat, 0.50),
               small_p99_ms=percentile(lat, 0.99), small_cpu_pct=round(cpu, 1))

    before = meter.sample()
    start = time.perf_counter()
    txns, recs = bulk_phase(p, topic, seconds)
    wall = time.perf_counter() - start
    cpu, _client = CpuMeter.pct(before, meter.sample())
    out.update(bulk_msg_s=recs / wall, bulk_txn_s=txns / wall, bulk_cpu_pct=round(cpu, 1))

    p.begin_transaction()
    for i in range(100):
        p.produce(topic, b"a-aborted", partition=i % 2)
    p.flush(30)
    p.abort_transaction(30)
    counts = committed_read(daemon.bootstrap, topic)
    out["committed_ok"] = (counts.get(b"s", 0) == n and counts.get(b"b", 0) == recs
                           and b"a" not in counts)
    out["read_committed_counts"] = {k.decode(): v for k, v in counts.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    ap.add_argument("--only", choices=("kmqkafka", "tansu"), help="run one broker only")
    args = ap.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for name, start in (("kmqkafka", kmqkafka_daemon), ("tansu", tansu_daemon)):
        if args.only and args.only != name:
            continue
        with start() as daemon:
            print(f"{name}: running ...", flush=True)
            results[name] = run(daemon, args.seconds)
    keys = ("small_txn_s", "small_p50_ms", "small_p99_ms", "small_cpu_pct", "bulk_msg_s",
            "bulk_txn_s", "bulk_cpu_pct", "committed_ok")
    print(f"{'figure':16}" + "".join(f"{n:>14}" for n in results))
    for k in keys:
        cells = "".join(f"{r[k]:>14,.1f}" if isinstance(r[k], float) else f"{r[k]!s:>14}"
                        for r in results.values())
        print(f"{k:16}{cells}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
