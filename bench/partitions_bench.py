"""Keyed produce over many partitions: kmqkafka against tansu, alternating, medians.

Run: .venv/bin/python bench/partitions_bench.py [--partitions 64] [--count 600000]
                                                 [--rounds 3] [--only kmqkafka|tansu]

What kafka_bench.py does not cover: records spread by key over many partitions. librdkafka
sends one Produce per partition, so the broker answers many small requests (about 100 records
each here) instead of a few 1 MB ones, and kmqkafka fsyncs every partition's segment before it
acknowledges (tansu keeps its log in memory).

Each round starts a fresh broker of each kind, one after the other, creates a topic of
``--partitions`` partitions and runs one confluent-kafka producer twice: ``--count`` records of
100 B, each keyed by its number (librdkafka's default partitioner spreads them), acks=all,
linger.ms=5 and otherwise client defaults (so the producer waits in ``poll`` when its
100,000-message queue is full, as an application would). Per run: msg/s, the broker's CPU
(all threads, % of one core), CPU microseconds per record, and the ack latency of every 500th
record (produce() -> delivery report). The figure is the median over all runs.
Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_bench import (  # noqa: E402
    QUIET, CpuMeter, create_topic, kmqkafka_daemon, percentile, tansu_daemon,
)

RECORD = 100
SAMPLE_EVERY = 500


def keyed_run(bootstrap: str, topic: str, count: int, meter: CpuMeter) -> dict[str, Any]:
    """One producer, ``count`` keyed records; flush; the figures of that run."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **QUIET})
    p.list_topics(topic, timeout=10)
    value = os.urandom(RECORD)
    acks: list[float] = []
    waits = 0

    def sampled(sent: float) -> Any:
        return lambda err, _msg: acks.append(time.perf_counter() - sent) if err is None else None

    before = meter.sample()
    start = time.perf_counter()
    for i in range(count):
        key = b"%d" % i
        while True:
            try:
                if i % SAMPLE_EVERY == 0:
                    p.produce(topic, value, key=key, on_delivery=sampled(time.perf_counter()))
                else:
                    p.produce(topic, value, key=key)
                break
            except BufferError:
                waits += 1
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(60)
    elapsed = time.perf_counter() - start
    after = meter.sample()
    cpu, _client = CpuMeter.pct(before, after)
    acks.sort()
    acked = count - left
    return {"msg_s": acked / elapsed, "broker_cpu_pct": cpu,
            "cpu_us_per_msg": cpu / 100 * elapsed / max(acked, 1) * 1e6,
            "ack_p50_ms": percentile(acks, 0.5) * 1e3, "ack_p99_ms": percentile(acks, 0.99) * 1e3,
            "queue_full_waits": waits, "unacked": left}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--count", type=int, default=600_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("kmqkafka", "tansu"))
    args = ap.parse_args(argv)
    brokers = {"kmqkafka": kmqkafka_daemon, "tansu": tansu_daemon}
    if args.only:
        brokers = {args.only: brokers[args.only]}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in brokers}
    for r in range(args.rounds):
        for name, start in brokers.items():
            with start() as daemon:
                topic = f"keyed-{r}"
                create_topic(daemon.bootstrap, topic, args.partitions)
                meter = CpuMeter(daemon.pid)
                for _ in range(2):
                    out = keyed_run(daemon.bootstrap, topic, args.count, meter)
                    runs[name].append(out)
                    print(f"  round {r + 1} {name}: {out['msg_s']:,.0f} msg/s, broker cpu "
                          f"{out['broker_cpu_pct']:.0f}%, ack p50 {out['ack_p50_ms']:.1f} ms",
                          flush=True)
    fields = ("msg_s", "broker_cpu_pct", "cpu_us_per_msg", "ack_p50_ms", "ack_p99_ms")
    medians = {name: {f: statistics.median(x[f] for x in rs) for f in fields}
               for name, rs in runs.items()}
    print(f"{'median of ' + str(2 * args.rounds) + ' runs':<28}" + "".join(f"{n:>14}" for n in medians))
    for f in fields:
        print(f"{f:<28}" + "".join(f"{m[f]:>14,.1f}" for m in medians.values()))
    if len(medians) == 2:
        print(f"{'kmqkafka/tansu msg/s':<28}{medians['kmqkafka']['msg_s'] / medians['tansu']['msg_s']:>14.2f}")
    print(json.dumps({"settings": {"partitions": args.partitions, "count": args.count,
                                   "rounds": args.rounds, "record_bytes": RECORD},
                      "median": medians, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
