"""Share-group benchmark (KIP-932): what consuming through a share group costs on kmqkafka.

Run: .venv/bin/python bench/share_bench.py [--records 200000] [--seconds 5]

One kmqkafka daemon as ``kafka_bench.py`` starts it (fsyncing on its real-disk data dir), a
topic of 4 partitions filled with ``--records`` × 100 B records (acks=all), then, with
confluent-kafka (librdkafka 2.16):

1. ``classic``: a classic-group ``Consumer`` reads every record: the baseline on the same data.
2. ``share1``: one ``ShareConsumer`` (implicit acknowledgement: every poll accepts the records
   of the previous one) reads every record.
3. ``share2``: two ``ShareConsumer`` s of one group, one thread each, read every record
   between them; ``duplicates`` must be 0 and both must get some.
4. ``latency``: a ShareConsumer waits at the end of the topic while a producer sends 1,000
   records/s for ``--seconds``; latency = receive - send (timestamps in the payload).

tansu is not run: it does not serve share groups. The broker's CPU (user+sys, % of one core) is
measured over each phase. Prints a table, then, last, one JSON line with every figure.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_bench import QUIET, CpuMeter, create_topic, kmqkafka_daemon, percentile  # noqa: E402

PARTITIONS = 4
VALUE = b"v" * 100



def earliest(bootstrap: str, group: str) -> None:
    """Share groups start at the log end by default; these read from the start."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("share.auto.offset.reset", "earliest",
                        incremental_operation=AlterConfigOpType.SET)
    for f in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])]).values():
        f.result(30)


def fill(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "batch.num.messages": 10000, **QUIET})
    for i in range(n):
        while True:
            try:
                p.produce(topic, VALUE, key=str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0, "the fill did not finish"


def classic_phase(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-classic",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **QUIET})
    c.subscribe([topic])
    got, start, deadline = 0, None, time.monotonic() + 120
    while got < n and time.monotonic() < deadline:
        for m in c.consume(10000, 0.5):
            if not m.error():
                start = start or time.perf_counter()
                got += 1
    seconds = time.perf_counter() - (start or time.perf_counter())
    c.close()
    return {"msg_s": got / max(seconds, 1e-9), "consumed": got}


def share_phase(bootstrap: str, topic: str, n: int, consumers: int, group: str
                ) -> dict[str, Any]:
    earliest(bootstrap, group)
    seen: list[list[tuple[int, int]]] = [[] for _ in range(consumers)]
    first: list[float] = []
    done = threading.Event()

    def run(i: int) -> None:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **QUIET})
        c.subscribe([topic])
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            for m in c.poll(0.5):
                if not m.error():
                    if not first:
                        first.append(time.perf_counter())
                    seen[i].append((m.partition(), m.offset()))
            if sum(len(s) for s in seen) >= n:
                done.set()
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(consumers)]
    for t in threads:
        t.start()
    done.wait(125)
    end = time.perf_counter()
    for t in threads:
        t.join(30)
    total = sum(len(s) for s in seen)
    distinct = len({x for s in seen for x in s})
    seconds = end - (first[0] if first else end)
    return {"msg_s": total / max(seconds, 1e-9), "consumed": total, "distinct": distinct,
            "duplicates": total - distinct, "per_consumer": [len(s) for s in seen]}


def latency_phase(bootstrap: str, topic: str, seconds: float) -> dict[str, Any]:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency",
                       **QUIET})
    c.subscribe([topic])
    latencies: list[float] = []
    stop = threading.Event()
    warm = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            for m in c.poll(0.1):
                if m.error():
                    continue
                now = time.perf_counter_ns()
                v = m.value()
                if v[:8] == b"WARMWARM":
                    warm.set()
                else:
                    latencies.append((now - int.from_bytes(v[:8], "big")) / 1e6)

    reader = threading.Thread(target=receive)
    reader.start()
    p = Producer({"bootstrap.servers": bootstrap, **QUIET})
    pad = b"\0" * 92
    try:
        deadline = time.monotonic() + 30
        while not warm.is_set() and time.monotonic() < deadline:
            p.produce(topic, b"WARMWARM" + pad, partition=0)
            p.flush(5)
            warm.wait(1.0)
        total = int(1000 * seconds)
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / 1000 - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            p.produce(topic, time.perf_counter_ns().to_bytes(8, "big") + pad,
                      partition=i % PARTITIONS)
            p.poll(0)
        p.flush(30)
        end = time.monotonic() + 30
        while len(latencies) < total and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(10)
        c.close()
    lat = sorted(latencies)
    return {"p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
            "received": len(lat), "sent": int(1000 * seconds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with kmqkafka_daemon() as d:
        cpu = CpuMeter(d.pid)
        create_topic(d.bootstrap, "share-bench", PARTITIONS)
        fill(d.bootstrap, "share-bench", args.records)
        phases = [
            ("classic", lambda: classic_phase(d.bootstrap, "share-bench", args.records)),
            ("share1", lambda: share_phase(d.bootstrap, "share-bench", args.records, 1,
                                           "bench-share1")),
            ("share2", lambda: share_phase(d.bootstrap, "share-bench", args.records, 2,
                                           "bench-share2")),
        ]
        for name, run in phases:
            before = cpu.sample()
            results[name] = run()
            results[name]["cpu_pct"] = round(CpuMeter.pct(before, cpu.sample())[0], 1)
            print(f"{name}: {results[name]}", flush=True)
        create_topic(d.bootstrap, "share-latency", PARTITIONS)
        before = cpu.sample()
        results["latency"] = latency_phase(d.bootstrap, "share-latency", args.seconds)
        results["latency"]["cpu_pct"] = round(CpuMeter.pct(before, cpu.sample())[0], 1)
        print(f"latency: {results['latency']}", flush=True)
    print(f"{'phase':<10}{'msg/s':>12}{'cpu%':>8}  notes")
    for name in ("classic", "share1", "share2"):
        r = results[name]
        note = "" if name == "classic" else f"duplicates {r['duplicates']}"
        if name == "share2":
            note += f", per consumer {r['per_consumer']}"
        print(f"{name:<10}{r['msg_s']:>12,.0f}{r['cpu_pct']:>8}  {note}")
    r = results["latency"]
    print(f"latency   p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  "
          f"({r['received']}/{r['sent']} received)  cpu {r['cpu_pct']}%")
    print(json.dumps({"records": args.records, **results}))


if __name__ == "__main__":
    main()
