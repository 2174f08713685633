"""How much work the consuming client does per record against kmqkafka and against tansu.

    .venv/bin/python bench/client_instructions.py [--count 300000] [--size 100] [--passes 3]

The consume 100 B phase of ``kafka_bench.py`` is bound by the client: librdkafka and the
Python loop take 120-140 % of a core while either broker idles. This asks whether the client
does more *work* against one broker than the other, apart from the machine's noise.

For each broker, one after the other: produce ``count`` records of ``size`` bytes (acks=1,
kafka_bench's producer tuning) into a fresh 1-partition topic, then read them back in a child
process with kafka_bench's consumer tuning, twice:

1. under ``valgrind --tool=callgrind``: the instructions the child executed (every thread,
   Python, librdkafka and libc together). The count is repeatable for the same inputs, so a
   difference in it is a difference in work, not in timing;
2. plainly, ``--passes`` times (the median counts): the CPU time of its whole process (every
   thread) and the wall-clock time of its reading loop, per record.

The instruction run also counts the child's time-outs and empty ``consume()`` calls, so a
client that waited on a broker would show it. Needs ``valgrind`` on PATH. The last line is
the JSON of both brokers.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kafka_bench as kb  # noqa: E402

TOPIC = "instr"
TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


def consume_child(bootstrap: str, target: int, time_cap: float) -> None:
    """The child: read ``target`` records from partition 0 of TOPIC; print one JSON line."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "instr",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  **kb.CONSUMER_TUNING, **kb.QUIET})
    got = calls = empty = 0
    start, cpu = time.perf_counter(), time.process_time()
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        while got < target and time.perf_counter() - start < time_cap:
            batch = c.consume(10_000, 0.5)
            calls += 1
            empty += not batch
            got += sum(1 for m in batch if not m.error())
    finally:
        c.close()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"got": got, "calls": calls, "empty": empty, "seconds": seconds,
                      "cpu_s": cpu}))


def _child(bootstrap: str, target: int, time_cap: float, wrapper: list[str]) -> dict[str, Any]:
    cmd = [*wrapper, sys.executable, __file__, "--child", bootstrap, "--count", str(target),
           "--time-cap", str(time_cap)]
    out = subprocess.run(cmd, check=True, capture_output=True, timeout=time_cap + 600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def instructions(bootstrap: str, target: int, work: Path, name: str) -> dict[str, Any]:
    """Run the child under callgrind; its total instruction count and its own report."""
    out_file = work / f"callgrind.{name}.out"
    r = _child(bootstrap, target, 900.0,
               ["valgrind", "--tool=callgrind", "--quiet", f"--callgrind-out-file={out_file}"])
    found = TOTALS.search(out_file.read_bytes())
    if found is None:
        raise RuntimeError(f"no instruction total in {out_file}")
    r["instructions"] = int(found.group(1))
    return r


def measure(daemon: kb.Daemon, count: int, size: int, work: Path, passes: int) -> dict[str, Any]:
    kb.create_topic(daemon.bootstrap, TOPIC, 1)
    produced = kb.produce_phase(daemon.bootstrap, TOPIC, size, count, "1", 60.0)["acked"]
    counted = instructions(daemon.bootstrap, produced, work, daemon.name)
    plain = [_child(daemon.bootstrap, produced, 60.0, []) for _ in range(passes)]
    got = max(counted["got"], 1)
    return {
        "records": produced,
        "instructions_per_record": counted["instructions"] / got,
        "instructions": counted["instructions"],
        "callgrind_got": counted["got"], "callgrind_empty_polls": counted["empty"],
        "cpu_us_per_record": statistics.median(p["cpu_s"] / max(p["got"], 1) * 1e6
                                               for p in plain),
        "msg_s": statistics.median(p["got"] / p["seconds"] for p in plain),
        "plain_got": [p["got"] for p in plain],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--passes", type=int, default=3, help="plain reads; the median counts")
    ap.add_argument("--child", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    ap.add_argument("--time-cap", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        consume_child(args.child, args.count, args.time_cap)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not on PATH (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kmq-instr-") as tmp:
        for start in (kb.kmqkafka_daemon, kb.tansu_daemon):
            with start() as d:
                r = out[d.name] = measure(d, args.count, args.size, Path(tmp), args.passes)
                print(f"{d.name}: {r['records']:,} records, {r['instructions_per_record']:,.0f} "
                      f"client instructions per record ({r['callgrind_empty_polls']} empty polls "
                      f"under valgrind); plainly {r['msg_s']:,.0f} msg/s at "
                      f"{r['cpu_us_per_record']:.2f} us of client CPU per record", flush=True)
    k, t = out["kmqkafka"], out["tansu"]
    out["ratio"] = {"instructions": k["instructions_per_record"] / t["instructions_per_record"],
                    "cpu": k["cpu_us_per_record"] / t["cpu_us_per_record"]}
    print(f"kmqkafka / tansu: instructions {out['ratio']['instructions']:.4f}, "
          f"CPU {out['ratio']['cpu']:.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
