"""Memory benchmark: the kmqkafka daemon's RSS while 2 GiB is produced and consumed back.

Run: .venv/bin/python bench/memory_bench.py [--total-mib 2048] [--max-seconds 300]
                                             [--broker kmqkafka|tansu|cluster]

Produces ``--total-mib`` of 1 KiB records (confluent-kafka, acks=all, the producer settings
of kafka_bench.py) into a one-partition topic, then reads everything back from offset 0 with
a fresh consumer (kafka_bench's consumer settings), sampling the broker's RSS every 0.5 s
throughout. Produce and consume each get half of ``--max-seconds``; a broker too slow for the
total stops early and the bytes actually moved are reported. Bar: max RSS < 256 MB.
``--broker cluster`` runs a 3-node Raft cluster (cluster_bench's) with the clients on the
leader and samples every node. The kernel's own high-water mark (VmHWM, what
``/usr/bin/time`` reports as maximum resident set size) is read at the end as well, since
0.5 s samples can miss a short peak.

Prints a human summary, then one JSON line last (max_rss_mb, per-phase maxima, bytes moved).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_bench import cluster  # noqa: E402
from kafka_bench import (  # noqa: E402
    KIB, CONSUMER_TUNING, PRODUCER_TUNING, QUIET, create_topic, data_root, kmqkafka_daemon,
    tansu_daemon,
)
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

MB = 1_000_000
BAR_MB = 256


class RssSampler(threading.Thread):
    """Samples a pid's RSS every ``interval`` s; ``mark(phase)`` attributes later samples."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.phase = "idle"
        self.max_by_phase: dict[str, int] = {}
        self.samples: list[tuple[float, str, int]] = []
        self._halt = threading.Event()

    def mark(self, phase: str) -> None:
        self.phase = phase

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.is_set():
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.samples.append((time.monotonic() - t0, self.phase, rss))
            self.max_by_phase[self.phase] = max(rss, self.max_by_phase.get(self.phase, 0))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def produce(bootstrap: str, topic: str, count: int, seconds: float) -> dict[str, Any]:
    failed = [0]

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    # A bounded client queue (256 MiB) so the client does not hold the whole total.
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", **PRODUCER_TUNING,
                  "queue.buffering.max.kbytes": 262_144, **QUIET,
                  "delivery.report.only.error": True, "on_delivery": on_error})
    value = os.urandom(KIB)
    start = time.perf_counter()
    deadline = start + seconds
    sent = 0
    while sent < count and time.perf_counter() < deadline:
        try:
            p.produce(topic, value)
        except BufferError:
            p.poll(0.01)
            continue
        sent += 1
        if sent % 2000 == 0:
            p.poll(0)
    left = p.flush(max(5.0, deadline + 30 - time.perf_counter()))
    elapsed = time.perf_counter() - start
    acked = sent - failed[0] - left
    return {"acked": acked, "seconds": elapsed, "mb_s": acked * KIB / elapsed / MB}


def consume(bootstrap: str, topic: str, target: int, seconds: float) -> dict[str, Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"mem-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  **CONSUMER_TUNING, **QUIET})
    got = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while got < target and time.perf_counter() < deadline:
            got += sum(1 for m in c.consume(10_000, 0.5) if not m.error())
    finally:
        c.close()
    elapsed = time.perf_counter() - start
    return {"consumed": got, "seconds": elapsed, "mb_s": got * KIB / elapsed / MB}


def peak_rss(pid: int) -> int | None:
    """The kernel's resident-set high-water mark of ``pid`` in bytes (None off Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mib", type=int, default=2048, help="MiB of 1 KiB records")
    ap.add_argument("--max-seconds", type=float, default=300, help="produce + consume bound")
    ap.add_argument("--broker", choices=("kmqkafka", "tansu", "cluster"), default="kmqkafka")
    ap.add_argument("--data-root", type=Path, help="parent of kmqkafka's temp data dir")
    args = ap.parse_args(argv)
    count = args.total_mib * 1024  # 1 KiB records
    root = args.data_root or data_root()
    starter = {"kmqkafka": lambda: kmqkafka_daemon(root), "tansu": tansu_daemon,
               "cluster": lambda: cluster(root)}[args.broker]
    with starter() as d:
        pids = getattr(d, "pids", None) or [d.pid]
        samplers = [RssSampler(pid) for pid in pids]
        for sampler in samplers:
            sampler.start()
        try:
            topic = f"mem-{int(time.time())}"
            create_topic(d.bootstrap, topic, 1)
            for sampler in samplers:
                sampler.mark("produce")
            prod = produce(d.bootstrap, topic, count, args.max_seconds / 2)
            for sampler in samplers:
                sampler.mark("consume")
            cons = consume(d.bootstrap, topic, prod["acked"], args.max_seconds / 2)
            for sampler in samplers:
                sampler.mark("after")
            time.sleep(1.0)
            hwm = [peak_rss(pid) for pid in pids]
        finally:
            for sampler in samplers:
                sampler.stop()
    by_node = [max((s[2] for s in sampler.samples), default=0) for sampler in samplers]
    peak = max(by_node)
    by_phase: dict[str, int] = {}
    for sampler in samplers:
        for k, v in sampler.max_by_phase.items():
            by_phase[k] = max(v, by_phase.get(k, 0))
    out = {
        "broker": args.broker,
        "max_rss_mb": round(peak / MB, 1),
        "max_rss_mb_by_phase": {k: round(v / MB, 1) for k, v in by_phase.items()},
        "max_rss_mb_by_node": [round(v / MB, 1) for v in by_node],
        "hwm_mb_by_node": [None if v is None else round(v / MB, 1) for v in hwm],
        "bar_lt_256mb": peak / MB < BAR_MB,
        "target_mib": args.total_mib,
        "produced_mib": round(prod["acked"] * KIB / (1 << 20), 1),
        "consumed_mib": round(cons["consumed"] * KIB / (1 << 20), 1),
        "produce_mb_s": round(prod["mb_s"], 1),
        "consume_mb_s": round(cons["mb_s"], 1),
        "produce_s": round(prod["seconds"], 1),
        "consume_s": round(cons["seconds"], 1),
        "samples": sum(len(sampler.samples) for sampler in samplers),
    }
    print(f"{args.broker}: produced {out['produced_mib']} MiB at {out['produce_mb_s']} MB/s, "
          f"consumed {out['consumed_mib']} MiB at {out['consume_mb_s']} MB/s")
    print(f"max RSS {out['max_rss_mb']} MB (bar < {BAR_MB} MB: "
          f"{'ok' if out['bar_lt_256mb'] else 'OVER'}); by phase {out['max_rss_mb_by_phase']}; "
          f"by node {out['max_rss_mb_by_node']}, kernel high-water mark {out['hwm_mb_by_node']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
