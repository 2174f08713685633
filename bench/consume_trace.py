"""Trace one 100 B consume against kmqkafka and tansu: how the client's progress and its
prefetch queue move while it reads 2 M records (the consume 100 B phase of kafka_bench.py).

    .venv/bin/python bench/consume_trace.py [--count 2000000] [--runs 2]

For each broker: produce ``count`` 100 B records (acks=1, kafka_bench's producer tuning) to a
fresh 1-partition topic, then read them back ``runs`` times with kafka_bench's consumer tuning,
printing the time to the first record, the records read so far about every 0.2 s, librdkafka's
fetch-queue length every 0.25 s (its statistics), and how many fetch responses it received.
The last line is the JSON of the runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kafka_bench as kb  # noqa: E402
from confluent_kafka import Consumer, TopicPartition  # noqa: E402

TOPIC = "trace100"


def trace(bootstrap: str, target: int, time_cap: float = 20.0) -> dict[str, Any]:
    stats: list[dict] = []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "trace",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  **kb.CONSUMER_TUNING, **kb.QUIET, "statistics.interval.ms": 250,
                  "stats_cb": lambda s: stats.append(json.loads(s))})
    got = 0
    first = None
    progress: list[tuple[float, int]] = []
    start = time.perf_counter()
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        while got < target and time.perf_counter() - start < time_cap:
            for m in c.consume(10_000, 0.5):
                if not m.error():
                    got += 1
            if got and first is None:
                first = time.perf_counter() - start
            progress.append((round(time.perf_counter() - start, 3), got))
        elapsed = time.perf_counter() - start
    finally:
        c.close()
    queue = [s["topics"][TOPIC]["partitions"]["0"].get("fetchq_cnt")
             for s in stats if TOPIC in s.get("topics", {})]
    responses = [b.get("rx") for s in stats[-1:] for b in s.get("brokers", {}).values()
                 if b.get("nodeid", -1) >= 0]
    return {"msg_s": got / elapsed, "seconds": elapsed, "first_record_s": first,
            "progress": progress[::max(1, len(progress) // 12)], "fetchq": queue,
            "responses": responses}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2_000_000)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args(argv)
    out: dict[str, list] = {}
    for name in ("kmqkafka", "tansu"):
        with (kb.kmqkafka_daemon() if name == "kmqkafka" else kb.tansu_daemon()) as d:
            kb.create_topic(d.bootstrap, TOPIC, 1)
            produced = kb.produce_phase(d.bootstrap, TOPIC, 100, args.count, "1", 20)["acked"]
            out[name] = []
            for _ in range(args.runs):
                r = trace(d.bootstrap, produced)
                out[name].append(r)
                print(f"{name}: {r['msg_s']:,.0f} msg/s in {r['seconds']:.2f} s, first record "
                      f"at {r['first_record_s']:.3f} s, {r['responses']} fetch responses")
                print(f"  read so far: {r['progress']}")
                print(f"  fetch queue: {r['fetchq']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
