"""Cluster benchmark: a single kmqkafka node against a 3-node Raft cluster on loopback, one run.

Run: .venv/bin/python bench/cluster_bench.py [--quick] [--repeats 3] [--count 300000]
                                              [--record-bytes 1024]
                                              [--seconds 10] [--latency-seconds 5]
                                              [--only single|cluster] [--data-root DIR]

For each deployment, one after the other (never both at once):

- ``single``: one ``twistd -n --pidfile= kmqkafka`` as ``kafka_bench.py`` starts it (no peers:
  the daemon's default, local group-commit path);
- ``cluster``: three daemons with ``KMQKAFKA_PEERS`` / ``KMQKAFKA_NODE_ID`` (default Raft tick
  and election settings), every data dir on the real disk; the clients bootstrap on the Raft
  leader only (the leader of every partition).

Phases, each against a fresh 1-partition topic:

1. produce-ack latency (first, on the fresh deployment, so no backlog from the throughput
   runs leaks in): 1 KiB records, acks=all, at 1,000 msg/s for ``--latency-seconds`` with
   otherwise default client settings (as kafka_bench's e2e phase); ``produce()`` -> delivery
   report, p50/p99/max;
2. produce throughput: 1 KiB records (``--record-bytes``), acks=all,
   ``kafka_bench.PRODUCER_TUNING`` (linger.ms=5, batch.size=1000000, ...), ``--count`` records
   or ``--seconds``, whichever first; only acked records count; repeated ``--repeats`` times,
   the median is the figure;
3. broker CPU over each phase (user+system of every broker process, all threads, % of a core),
   and the bytes the data root's disk wrote during each produce run, per acknowledged byte;
   beside them, once at the start, what one sequential fdatasynced write gets from that disk
   (``disk_probe_mb_s``): a cluster whose nodes write near it is bound by the disk.

Bar (issue 4): the cluster's produce throughput with acks=all >= 50 % of the single node's.
Prints a human summary, then one JSON line last.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_bench import (  # noqa: E402
    PRODUCER_TUNING, QUIET, TWISTD, Profiler, _fstype, _http_status, create_topic, data_root,
    kmqkafka_daemon, percentile, produce_phase,
)
from store_bench import raw_disk  # noqa: E402
from tansu import HOST, free_port  # noqa: E402

KIB = 1024
LAT_RATE = 1000
BAR_RATIO = 0.5
DISK_PROBE_MIB = 256  # one sequential write, fdatasynced once at its end
def produce_key(size: int) -> str:
    """The JSON key prefix of a throughput figure: ``produce_acks_all_1k`` for 1 KiB records
    (the bar's case), ``produce_acks_all_<n>b`` for any other size."""
    return "produce_acks_all_1k" if size == KIB else f"produce_acks_all_{size}b"


LEADER_LINE = re.compile(r"raft node (\d+): (\w[\w-]*), leader (\w+)")


class Deployment:
    """Where the clients go and which processes to meter."""

    def __init__(self, name: str, bootstrap: str, pids: list[int], logs: list[Path],
                 leader: int | None = None) -> None:
        self.name, self.bootstrap, self.pids, self.logs, self.leader = (
            name, bootstrap, pids, logs, leader)


@contextlib.contextmanager
def single(root: Path) -> Iterator[Deployment]:
    with kmqkafka_daemon(root) as d:
        yield Deployment("single", d.bootstrap, [d.pid], [d.log_path])


@contextlib.contextmanager
def cluster(root: Path, nodes: int = 3, timeout: float = 45.0) -> Iterator[Deployment]:
    """``nodes`` daemons on loopback forming one Raft cluster; yields once a leader is known."""
    work = Path(tempfile.mkdtemp(prefix="kmqkafka-cluster-bench-", dir=root))
    ids = list(range(1, nodes + 1))
    raft = {i: free_port() for i in ids}
    kafka = {i: free_port() for i in ids}
    http = {i: free_port() for i in ids}
    peers = ",".join(f"{i}={HOST}:{raft[i]}/{HOST}:{kafka[i]}" for i in ids)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("CONNECTORS_KAFKA_", "KMQKAFKA_"))}
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs = {i: work / f"node{i}.log" for i in ids}
    cmd = [str(TWISTD)] if os.access(TWISTD, os.X_OK) else [sys.executable, str(TWISTD)]
    try:
        for i in ids:
            env = {**base, "CONNECTORS_KAFKA_ENABLE": "true",
                   "CONNECTORS_KAFKA_PORT": str(kafka[i]),
                   "CONNECTORS_KAFKA_TLS_PORT": str(free_port()),
                   "CONNECTORS_KAFKA_BIND_HOST": HOST,
                   "KMQKAFKA_HTTP_PORT": str(http[i]), "KMQKAFKA_HTTP_HOST": HOST,
                   "KMQKAFKA_DATA_DIR": str(work / f"data{i}"),
                   "KMQKAFKA_NODE_ID": str(i), "KMQKAFKA_PEERS": peers}
            with open(logs[i], "ab") as log:
                procs[i] = subprocess.Popen([*cmd, "-n", "--pidfile=", "kmqkafka"], cwd=work,
                                            env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        for i in ids:
            while _http_status(http[i], "/health") != 200:
                if procs[i].poll() is not None:
                    raise RuntimeError(f"node {i} exited with {procs[i].returncode}:\n"
                                       f"{logs[i].read_text(errors='replace')[-4000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {i} /health not 200 within {timeout}s")
                time.sleep(0.05)
        leader = None
        while leader is None:
            seen = set()
            for i in ids:
                found = LEADER_LINE.findall(logs[i].read_text(errors="replace"))
                seen.add(found[-1][2] if found else "None")
            if len(seen) == 1 and (only := seen.pop()) != "None":
                leader = int(only)
            elif time.monotonic() > deadline:
                raise RuntimeError(f"no agreed Raft leader within {timeout}s: {seen}")
            else:
                time.sleep(0.05)
        yield Deployment("cluster" if nodes > 1 else "raft1", f"{HOST}:{kafka[leader]}", [procs[i].pid for i in ids],
                         [logs[i] for i in ids], leader)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if os.environ.get("BENCH_KEEP_DATA") != "1":
            shutil.rmtree(work, ignore_errors=True)


class DiskMeter:
    """Bytes the block device under the data root wrote (``/proc/diskstats`` via psutil): how
    many bytes reach the disk per acknowledged byte while the produce phase runs."""

    def __init__(self, path: Path) -> None:
        st = os.stat(path)
        dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        real = dev.resolve() if dev.exists() else None
        if real is not None and (real / "partition").exists():
            real = real.parent  # a partition: count its disk
        self.name = real.name if real is not None else None

    def sample(self) -> int | None:
        if self.name is None:
            return None
        counters = psutil.disk_io_counters(perdisk=True).get(self.name)
        return None if counters is None else counters.write_bytes


class Meter:
    """CPU seconds (user+system, all threads) summed over the deployment's processes."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = [psutil.Process(p) for p in pids]

    def sample(self) -> tuple[float, list[float]]:
        out = []
        for p in self.procs:
            try:
                t = p.cpu_times()
                out.append(t.user + t.system)
            except psutil.Error:
                out.append(0.0)
        return time.perf_counter(), out

    @staticmethod
    def pct(a: tuple[float, list[float]], b: tuple[float, list[float]]) -> list[float]:
        wall = max(b[0] - a[0], 1e-9)
        return [round(100 * (y - x) / wall, 1) for x, y in zip(a[1], b[1])]


def ack_latency_phase(bootstrap: str, topic: str, seconds: float) -> dict[str, Any]:
    """1 KiB acks=all records at LAT_RATE msg/s; produce() -> delivery report."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUIET})
    p.list_topics(topic, timeout=10)
    value = os.urandom(KIB)
    acks: list[int] = []
    failed = [0]

    def report(err: Any, _m: Any, t: int) -> None:
        if err is None:
            acks.append(time.perf_counter_ns() - t)
        else:
            failed[0] += 1

    p.produce(topic, value)  # warm-up: connection and first batch out of the way
    p.flush(10)
    total = int(LAT_RATE * seconds)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / LAT_RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = time.perf_counter_ns()
        p.produce(topic, value, on_delivery=lambda err, m, t=t: report(err, m, t))
        p.poll(0)
    left = p.flush(30)
    lat = sorted(x / 1e6 for x in acks)
    return {"p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
            "max_ms": lat[-1] if lat else float("nan"), "acked": len(lat), "sent": total,
            "failed": failed[0] + left}


def run(dep: Deployment, args: argparse.Namespace, log: Callable[[str], None],
        disk: DiskMeter) -> dict[str, Any]:
    meter = Meter(dep.pids)
    size, key = args.record_bytes, produce_key(args.record_bytes)
    run_id = int(time.time())
    topic = f"cbench-{run_id}-{dep.name}-lat"
    create_topic(dep.bootstrap, topic, 1)
    before = meter.sample()
    lat = ack_latency_phase(dep.bootstrap, topic, args.latency_seconds)
    lat["cpu_pct"] = meter.pct(before, meter.sample())
    log(f"  {dep.name}: ack latency p50 {lat['p50_ms']:.1f} p99 {lat['p99_ms']:.1f} "
        f"max {lat['max_ms']:.1f} ms (acked {lat['acked']}/{lat['sent']}, "
        f"failed {lat['failed']}), broker cpu {lat['cpu_pct']}")
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        topic = f"cbench-{run_id}-{dep.name}-{r}"
        create_topic(dep.bootstrap, topic, 1)
        with contextlib.ExitStack() as spies:
            if args.profile is not None and r == 0:
                # py-spy on every node during the first run (slows them: not a figure).
                for i, pid in enumerate(dep.pids, 1):
                    spies.enter_context(Profiler(args.profile, pid).phase(f"{dep.name}-node{i}"))
            before, disk_before = meter.sample(), disk.sample()
            out = produce_phase(dep.bootstrap, topic, size, args.count, "all", args.seconds)
            after, disk_after = meter.sample(), disk.sample()
            out["cpu_pct"] = meter.pct(before, after)
            # CPU seconds each node spent per GB acknowledged: comparable across runs whose
            # throughput differs (this machine's run-to-run swing is large).
            gb = max(out["acked"] * size / 1e9, 1e-9)
            out["cpu_s_per_gb"] = [round((b - a) / gb, 2) for a, b in zip(before[1], after[1])]
            # Bytes the disk wrote meanwhile per byte acknowledged (every node's fsyncs and
            # the writeback they force; 0 on tmpfs).
            out["disk_bytes_per_acked_byte"] = (
                None if disk_before is None or disk_after is None
                else round((disk_after - disk_before) / (gb * 1e9), 2))
            out["disk_mb_s"] = (None if disk_before is None or disk_after is None
                                else round((disk_after - disk_before) / out["seconds"] / 1e6))
        log(f"  {dep.name}: produce run {r + 1}: {out['msg_s']:,.0f} msg/s "
            f"({out['mb_s']:.0f} MB/s), acked {out['acked']:,}, failed {out['failed']}, "
            f"broker cpu {out['cpu_pct']}, cpu-s per GB {out['cpu_s_per_gb']}, disk wrote "
            f"{out['disk_mb_s']} MB/s = {out['disk_bytes_per_acked_byte']} B per acked B")
        runs.append(out)
    rates = [x["msg_s"] for x in runs]
    median = statistics.median(rates) if rates else None
    return {f"{key}_msg_s": None if median is None else round(median),
            f"{key}_mb_s": None if median is None else round(median * size / 1e6, 1),
            "produce_runs_msg_s": [round(x) for x in rates],
            "produce_failed": sum(x["failed"] for x in runs),
            "produce_cpu_pct": [x["cpu_pct"] for x in runs],
            "produce_cpu_s_per_gb": [x["cpu_s_per_gb"] for x in runs],
            "produce_disk_mb_s": [x["disk_mb_s"] for x in runs],
            "produce_disk_bytes_per_acked_byte": [x["disk_bytes_per_acked_byte"] for x in runs],
            "ack_p50_ms": round(lat["p50_ms"], 2), "ack_p99_ms": round(lat["p99_ms"], 2),
            "ack_max_ms": round(lat["max_ms"], 2), "ack_failed": lat["failed"],
            "ack_cpu_pct": lat["cpu_pct"], "nodes": len(dep.pids), "leader": dep.leader}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats, 5 s phases")
    ap.add_argument("--repeats", type=int, default=3, help="produce runs per deployment")
    ap.add_argument("--count", type=int, default=300_000, help="records per produce run")
    ap.add_argument("--record-bytes", type=int, default=KIB,
                    help="record size of the throughput runs (the bar is for 1 KiB)")
    ap.add_argument("--seconds", type=float, default=10.0, help="time cap per produce run")
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    ap.add_argument("--only", choices=("single", "raft1", "cluster"))
    ap.add_argument("--data-root", type=Path, help="parent of the temp data dirs")
    ap.add_argument("--raft1", action="store_true",
                    help="also a one-member Raft node (--peers naming only itself)")
    ap.add_argument("--profile", type=Path,
                    help="py-spy every node during the first produce run into this dir")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.seconds, args.latency_seconds = 2, 5.0, 3.0

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    root = args.data_root or data_root()
    # What the disk takes at best this hour (``dd bs=1M conv=fdatasync``): each cluster node
    # writes every record twice (Raft log, segment), so nodes writing near this rate are
    # bound by the disk, not by the CPUs.
    disk_mb_s = round(raw_disk(root / f"disk-probe-{os.getpid()}", DISK_PROBE_MIB,
                               DISK_PROBE_MIB))
    log(f"data under {root} ({_fstype(root.resolve())}); cpus={os.cpu_count()}; "
        f"load {os.getloadavg()[0]:.1f}; one sequential fdatasynced write: {disk_mb_s} MB/s")
    results: dict[str, dict[str, Any]] = {}
    t_all = time.monotonic()
    deployments = [("single", lambda: single(root)), ("cluster", lambda: cluster(root))]
    if args.raft1:
        deployments.insert(1, ("raft1", lambda: cluster(root, nodes=1)))
    for name, starter in deployments:
        if args.only and args.only != name:
            continue
        t0 = time.monotonic()
        try:
            with starter() as dep:
                log(f"{name}: {len(dep.pids)} node(s), producing to {dep.bootstrap}"
                    + (f" (raft leader {dep.leader})" if dep.leader else ""))
                results[name] = run(dep, args, log, DiskMeter(root))
        except Exception as e:  # noqa: BLE001 - report what failed, still print the JSON
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  {name}: {results[name]['error']}")
        log(f"  {name}: {time.monotonic() - t0:.0f}s")

    s = results.get("single", {})
    produce = produce_key(args.record_bytes)
    label = "1 KiB" if args.record_bytes == KIB else f"{args.record_bytes} B"
    ratio: dict[str, Any] = {}  # cluster/single; raft1/single under "raft1_..."
    for name, prefix in (("cluster", ""), ("raft1", "raft1_")):
        for key in (f"{produce}_msg_s", "ack_p50_ms", "ack_p99_ms"):
            a, b = results.get(name, {}).get(key), s.get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratio[prefix + key] = round(a / b, 3)
    r = ratio.get(f"{produce}_msg_s")
    bars = {"cluster_produce_ge_50pct_of_single": None if r is None else r >= BAR_RATIO}

    def fig(d: dict[str, Any], key: str, fmt: str) -> str:
        v = d.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    names = list(results)
    print(f"{'':34}" + "".join(f"{n:>12}" for n in names) + f"{'cluster/single':>16}")
    for key, title, fmt in (
            (f"{produce}_msg_s", f"produce acks=all {label} msg/s", ",d"),
            (f"{produce}_mb_s", f"produce acks=all {label} MB/s", ".1f"),
            ("ack_p50_ms", "ack latency p50 ms (1k msg/s)", ".1f"),
            ("ack_p99_ms", "ack latency p99 ms (1k msg/s)", ".1f"),
            ("ack_max_ms", "ack latency max ms", ".1f")):
        print(f"{title:34}" + "".join(f"{fig(results[n], key, fmt):>12}" for n in names)
              + f"{fig(ratio, key, '.2f'):>16}")
    for n in names:
        print(f"  {n} produce runs msg/s: {results[n].get('produce_runs_msg_s', '-')}, "
              f"broker cpu % per run: {results[n].get('produce_cpu_pct', '-')}")
        if "error" in results[n]:
            print(f"{n}: {results[n]['error']}")
    print("bar: cluster produce >= 50% of single: "
          f"{bars['cluster_produce_ge_50pct_of_single']} (ratio {r})")
    settings = {"record_bytes": args.record_bytes, "acks": "all", "producer": PRODUCER_TUNING,
                "count": args.count, "seconds": args.seconds, "repeats": args.repeats,
                "latency_rate": LAT_RATE, "latency_seconds": args.latency_seconds,
                "cpus": os.cpu_count(), "python": platform.python_version(),
                "load_avg_1m": round(os.getloadavg()[0], 2), "disk_probe_mb_s": disk_mb_s,
                "elapsed_s": round(time.monotonic() - t_all, 1)}
    print(json.dumps({**results, "ratio": ratio, "bars": bars, "settings": settings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
