"""How much work a Kafka client does per record against kmqkafka and against tansu.

    .venv/bin/python bench/client_instructions.py [--count 300000] [--size 100] [--passes 3]
                                                  [--modes consume,produce]

The 100 B phases of ``kafka_bench.py`` are bound by the client: librdkafka and the Python loop
take 100-140 % of a core while either broker has time to spare. This asks whether the client
does more *work* against one broker than against the other, apart from the machine's noise.

For each broker, one after the other, and each mode, a child process runs one client:

- ``consume``: reads back ``count`` records of ``size`` bytes (written first with acks=1 into
  a fresh 1-partition topic) with kafka_bench's consumer tuning;
- ``produce``: sends ``count`` such records, acks=all, with kafka_bench's producer tuning.

Each child runs once under ``valgrind --tool=callgrind``, which counts the instructions it
executed (every thread: Python, librdkafka and libc together). The count repeats for the same
inputs, so a difference in it is a difference in work, not in timing. Then it runs
``--passes`` times plainly (the median counts): the CPU time of its whole process and the
wall-clock rate of its loop, per record. The callgrind run also reports the consumer's
errors and the producer's failed records. Needs ``valgrind`` on PATH. The last line is the
JSON of every figure.
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

TOPIC = "instr"          # read back by the consuming child
PRODUCE_TOPIC = "instr-p"  # written by the producing child
TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


def consume_child(bootstrap: str, target: int, size: int, time_cap: float) -> dict[str, Any]:
    """Read ``target`` records back from TOPIC with kafka_bench's consumer."""
    cpu = time.process_time()
    r = kb.consume_phase(bootstrap, TOPIC, size, target, time_cap)
    return {"got": r["consumed"], "errors": r["errors"], "seconds": r["seconds"],
            "cpu_s": time.process_time() - cpu}


def produce_child(bootstrap: str, target: int, size: int, time_cap: float) -> dict[str, Any]:
    """Send ``target`` records of ``size`` bytes, acks=all, with kafka_bench's producer."""
    cpu = time.process_time()
    r = kb.produce_phase(bootstrap, PRODUCE_TOPIC, size, target, "all", time_cap)
    return {"got": r["acked"], "errors": r["failed"], "seconds": r["seconds"],
            "cpu_s": time.process_time() - cpu}


CHILDREN = {"consume": consume_child, "produce": produce_child}


def _child(mode: str, bootstrap: str, target: int, size: int, time_cap: float,
           wrapper: list[str]) -> dict[str, Any]:
    cmd = [*wrapper, sys.executable, __file__, "--child", mode, bootstrap, "--count",
           str(target), "--size", str(size), "--time-cap", str(time_cap)]
    out = subprocess.run(cmd, check=True, capture_output=True, timeout=time_cap + 600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def instructions(mode: str, bootstrap: str, target: int, size: int, out_file: Path
                 ) -> dict[str, Any]:
    """Run the child under callgrind; its total instruction count and its own report."""
    r = _child(mode, bootstrap, target, size, 900.0,
               ["valgrind", "--tool=callgrind", "--quiet", f"--callgrind-out-file={out_file}"])
    found = TOTALS.search(out_file.read_bytes())
    if found is None:
        raise RuntimeError(f"no instruction total in {out_file}")
    r["instructions"] = int(found.group(1))
    return r


def measure(mode: str, daemon: kb.Daemon, count: int, size: int, work: Path,
            passes: int) -> dict[str, Any]:
    """One client under callgrind, then ``passes`` plain runs of it, against ``daemon``."""
    counted = instructions(mode, daemon.bootstrap, count, size,
                           work / f"callgrind.{mode}.{daemon.name}.out")
    plain = [_child(mode, daemon.bootstrap, count, size, 60.0, []) for _ in range(passes)]
    return {
        "records": counted["got"],
        "instructions_per_record": counted["instructions"] / max(counted["got"], 1),
        "instructions": counted["instructions"],
        "callgrind_errors": counted["errors"],
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
    ap.add_argument("--modes", default="consume,produce",
                    help="which clients to count: consume, produce or both")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "BOOTSTRAP"), help=argparse.SUPPRESS)
    ap.add_argument("--time-cap", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        mode, bootstrap = args.child
        print(json.dumps(CHILDREN[mode](bootstrap, args.count, args.size, args.time_cap)))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in CHILDREN for m in modes):
        ap.error(f"--modes takes {', '.join(CHILDREN)}")
    if shutil.which("valgrind") is None:
        print("valgrind is not on PATH (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kmq-instr-") as tmp:
        for start in (kb.kmqkafka_daemon, kb.tansu_daemon):
            with start() as d:
                if "consume" in modes:  # the records the consuming child reads back
                    kb.create_topic(d.bootstrap, TOPIC, 1)
                    kb.produce_phase(d.bootstrap, TOPIC, args.size, args.count, "1", 60.0)
                if "produce" in modes:
                    kb.create_topic(d.bootstrap, PRODUCE_TOPIC, 1)
                for mode in modes:
                    r = out.setdefault(mode, {})[d.name] = measure(
                        mode, d, args.count, args.size, Path(tmp), args.passes)
                    print(f"{mode} {d.name}: {r['records']:,} records, "
                          f"{r['instructions_per_record']:,.0f} client instructions per record; "
                          f"plainly {r['msg_s']:,.0f} msg/s at {r['cpu_us_per_record']:.2f} us "
                          f"of client CPU per record", flush=True)
    for mode in modes:
        k, t = out[mode]["kmqkafka"], out[mode]["tansu"]
        out[mode]["ratio"] = {
            "instructions": k["instructions_per_record"] / t["instructions_per_record"],
            "cpu": k["cpu_us_per_record"] / t["cpu_us_per_record"],
            "msg_s": k["msg_s"] / t["msg_s"]}
        print(f"{mode}, kmqkafka / tansu: instructions {out[mode]['ratio']['instructions']:.4f}, "
              f"client CPU {out[mode]['ratio']['cpu']:.2f}, msg/s {out[mode]['ratio']['msg_s']:.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
