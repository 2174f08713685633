"""Kafka benchmark: kmqkafka (fsynced channel store) against tansu (in-memory) in one run.

Run: .venv/bin/python bench/kafka_bench.py [--quick] [--only kmqkafka|tansu]
                                            [--partitions 1] [--profile DIR]

For each broker, one after the other, with the same confluent-kafka settings:

1. produce throughput: 1 KiB and 100 B records, acks=all and acks=1, each into a fresh
   topic (PRODUCER_TUNING below: linger.ms=5, batch.size=1000000);
2. consume throughput: a fresh consumer assigned every partition at offset 0 (no group
   protocol) reads back the acks=all topics up to their high watermark (CONSUMER_TUNING:
   raised queue and fetch limits so librdkafka does not throttle itself);
3. end-to-end latency: 2,000 msg/s for 10 s (100 B payload starting with the send
   ``time.perf_counter_ns()``), producer and consumer with client defaults; receive - send;
4. broker CPU: the broker process's CPU time (user+system, all threads) over each phase,
   as % of one core. The client's own CPU (this process, librdkafka threads included) is
   printed too, because client and broker share the same cores.

Prints a human table, then, last, one JSON line: ``{"kmqkafka": {...}, "tansu": {...},
"ratio": {...}, "bars": {...}, "settings": {...}}`` with keys like
``produce_acks_all_1k_msg_s``. ``--profile DIR`` runs ``py-spy record`` on the kmqkafka
daemon during each phase (raw collapsed stacks + a top-functions summary; it slows the
daemon, so do not compare those figures). Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tansu import HOST, free_port, tansu_broker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# $BENCH_TWISTD runs another twistd entry point (e.g. a wrapper that patches an experiment in).
TWISTD = Path(os.environ.get("BENCH_TWISTD") or Path(sys.executable).parent / "twistd")

# The same client settings for both brokers.
PRODUCER_TUNING = {
    "linger.ms": 5,
    "batch.size": 1_000_000,          # bytes per partition batch (librdkafka's ceiling)
    "batch.num.messages": 100_000,    # so batch.size, not the count, closes 100 B batches
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 262_144,  # 256 MiB: ample, and no client paging storm
    "message.timeout.ms": 60_000,
}
CONSUMER_TUNING = {
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 10_485_760,
    "queued.max.messages.kbytes": 1_048_576,
    "queued.min.messages": 1_000_000,
    # Once its queue passes either limit librdkafka stops fetching for this long (1 s by
    # default): a broker that filled the queue faster than the application drained it lost a
    # second of a one-second phase in about half the runs (consume 100 B: 0.8 against 1.6 M
    # msg/s). Raising the limits instead let the client queue everything, and touching that
    # much fresh memory slowed it as much.
    "fetch.queue.backoff.ms": 10,
}
QUIET = {"log.connection.close": False}

KIB = 1024
# Counts per throughput phase; each phase also stops at phase_s seconds (a slow broker then
# reports what it did in that time).
FULL = {"n_1k": 500_000, "n_100b": 2_000_000, "phase_s": 20.0, "e2e_s": 10.0}
QUICK = {"n_1k": 100_000, "n_100b": 400_000, "phase_s": 6.0, "e2e_s": 5.0}
E2E_RATE = 2000
E2E_SIZE = 100

PHASES = frozenset({"throughput", "e2e"})  # throughput = produce, then consume back
BARS = {"throughput_ratio_min": 1.2, "e2e_p50_ms_max": 10.0, "e2e_p99_ms_max": 25.0}


# --------------------------------------------------------------------------- brokers


def data_root() -> Path:
    """A temp parent on a real disk: the system temp dir unless it is tmpfs, then /var/tmp."""
    base = Path(tempfile.gettempdir()).resolve()
    return Path("/var/tmp") if _fstype(base) in ("tmpfs", "ramfs") else base


def _fstype(path: Path) -> str:
    best, fstype = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mnt = parts[1]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, fstype = mnt, parts[2]
    return fstype


@dataclass
class Daemon:
    """A running broker process: where to reach it and its pid."""

    name: str
    bootstrap: str
    pid: int
    log_path: Path


def _http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=1.0) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@contextlib.contextmanager
def kmqkafka_daemon(root: Path | None = None, timeout: float = 30.0,
                    extra_env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """``twistd -n --pidfile= kmqkafka`` on free loopback ports with a fresh data dir on disk.

    Yields once ``/health`` is 200; SIGTERM (then SIGKILL) and removes the data dir on exit.
    """
    work = Path(tempfile.mkdtemp(prefix="kmqkafka-bench-", dir=root or data_root()))
    kafka_port, tls_port, http_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONNECTORS_KAFKA_", "KMQKAFKA_"))}
    env.update({
        "CONNECTORS_KAFKA_ENABLE": "true",
        "CONNECTORS_KAFKA_PORT": str(kafka_port),
        "CONNECTORS_KAFKA_TLS_PORT": str(tls_port),
        "CONNECTORS_KAFKA_BIND_HOST": HOST,
        "KMQKAFKA_HTTP_PORT": str(http_port),
        "KMQKAFKA_HTTP_HOST": HOST,
        "KMQKAFKA_DATA_DIR": str(work / "data"),
        **(extra_env or {}),
    })
    log_path = work / "kmqkafka.log"
    with open(log_path, "ab") as log:
        cmd = [str(TWISTD)] if os.access(TWISTD, os.X_OK) else [sys.executable, str(TWISTD)]
        proc = subprocess.Popen([*cmd, "-n", "--pidfile=", "kmqkafka"], cwd=work, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while _http_status(http_port, "/health") != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"kmqkafka exited with {proc.returncode}:\n"
                                   f"{log_path.read_text(errors='replace')[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kmqkafka /health not 200 within {timeout}s")
            time.sleep(0.05)
        yield Daemon("kmqkafka", f"{HOST}:{kafka_port}", proc.pid, log_path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if os.environ.get("BENCH_KEEP_DATA") != "1":  # failures already carry the log tail
            shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def tansu_daemon() -> Iterator[Daemon]:
    with tansu_broker() as t:
        yield Daemon("tansu", t.bootstrap, t.pid, t.log_path)


# --------------------------------------------------------------------------- measuring


class CpuMeter:
    """CPU seconds (user+system, all threads) of the broker and of this client process."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)

    def sample(self) -> tuple[float, float, float]:
        t = self.proc.cpu_times()
        mine = os.times()
        return time.perf_counter(), t.user + t.system, mine.user + mine.system

    @staticmethod
    def pct(before: tuple[float, float, float], after: tuple[float, float, float]
            ) -> tuple[float, float]:
        wall = max(after[0] - before[0], 1e-9)
        return 100.0 * (after[1] - before[1]) / wall, 100.0 * (after[2] - before[2]) / wall


class Profiler:
    """Optional py-spy recording of one pid per phase (raw collapsed stacks)."""

    def __init__(self, out_dir: Path | None, pid: int) -> None:
        self.out_dir, self.pid = out_dir, pid

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.out_dir is None:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        raw = self.out_dir / f"{name}.txt"
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        # --gil: only samples where a thread holds the GIL, i.e. Python CPU work (the
        # reactor's epoll wait and fsync threads drop out); BENCH_PYSPY_ARGS overrides.
        extra = os.environ.get("BENCH_PYSPY_ARGS", "--gil --threads").split()
        proc = subprocess.Popen([spy, "record", "--pid", str(self.pid), "--format", "raw",
                                 "--rate", "200", "--nonblocking", *extra, "-o", str(raw)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # let py-spy attach
        try:
            yield
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if raw.exists():
                (self.out_dir / f"{name}.top.txt").write_text(summarise_stacks(raw))


def _frame_name(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (file.py)``: one entry per function."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    return f"{name} ({where.rsplit('/', 1)[-1].rsplit(':', 1)[0].rstrip(')')})"


def summarise_stacks(raw: Path, top: int = 30) -> str:
    """Top functions by self and by inclusive samples from a py-spy raw (collapsed) file."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    out = [f"{total} samples", "", "self%   function"]
    out += [f"{100 * n / max(total, 1):5.1f}  {f}" for f, n in own.most_common(top)]
    out += ["", "incl%   function"]
    out += [f"{100 * n / max(total, 1):5.1f}  {f}" for f, n in incl.most_common(top)]
    return "\n".join(out) + "\n"


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# --------------------------------------------------------------------------- phases


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """CreateTopics; when the broker lacks it and one partition will do, rely on auto-create."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    try:
        admin.create_topics([NewTopic(name, partitions, 1)],
                            operation_timeout=10, request_timeout=15)[name].result(20)
        return
    except Exception as e:  # noqa: BLE001 - a broker without CreateTopics; fall back below
        if partitions != 1:
            raise RuntimeError(f"CreateTopics {name}: {e}") from e
    p = Producer({"bootstrap.servers": bootstrap, **QUIET})
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = p.list_topics(name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None and t.partitions:
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {name} was not created")


def partitions_of(bootstrap: str, topic: str) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    return sorted(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def high_watermarks(bootstrap: str, topic: str) -> list[TopicPartition]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks",
                  "enable.auto.commit": False, **QUIET})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        out = []
        for p in sorted(md.partitions):
            _low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            out.append(TopicPartition(topic, p, high))
        return out
    finally:
        c.close()


def produce_phase(bootstrap: str, topic: str, size: int, count: int, acks: str,
                  time_cap: float) -> dict[str, Any]:
    """Send ``count`` records of ``size`` bytes (stop early at ``time_cap`` s); time to flush."""
    failed = [0]

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, **PRODUCER_TUNING, **QUIET,
                  "delivery.report.only.error": True, "on_delivery": on_error})
    p.list_topics(topic, timeout=10)  # connect and learn the leader before the clock starts
    value = os.urandom(size)
    produce, poll = p.produce, p.poll
    start = time.perf_counter()
    deadline = start + time_cap
    sent = 0
    while sent < count:
        try:
            produce(topic, value)
        except BufferError:
            poll(0.01)
            continue
        sent += 1
        if sent % 2000 == 0:
            poll(0)
            if time.perf_counter() > deadline:
                break
    left = p.flush(max(5.0, deadline + 30 - time.perf_counter()))
    elapsed = time.perf_counter() - start
    ok = sent - failed[0] - left
    return {"msg_s": ok / elapsed, "mb_s": ok * size / elapsed / 1e6, "sent": sent,
            "acked": ok, "failed": failed[0] + left, "seconds": elapsed}


def consume_phase(bootstrap: str, topic: str, size: int, produced: int | None,
                  time_cap: float) -> dict[str, Any]:
    """Read every partition from offset 0 with a fresh consumer until ``produced`` records.

    ``produced`` is the acked count of the produce phase; the high watermarks are only the
    fallback (tansu's ListOffsets latest lags the records it serves).
    """
    if produced:
        target = produced
        parts = partitions_of(bootstrap, topic)
    else:
        ends = high_watermarks(bootstrap, topic)
        target, parts = sum(tp.offset for tp in ends), [tp.partition for tp in ends]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  **CONSUMER_TUNING, **QUIET})
    got = errors = 0
    start = time.perf_counter()
    deadline = start + time_cap
    try:
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        while got < target and time.perf_counter() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error():
                    errors += 1
                else:
                    got += 1
        elapsed = time.perf_counter() - start
    finally:
        c.close()
    return {"msg_s": got / elapsed, "mb_s": got * size / elapsed / 1e6, "consumed": got,
            "target": target, "errors": errors, "seconds": elapsed}


def e2e_phase(bootstrap: str, topic: str, seconds: float) -> dict[str, Any]:
    """2,000 msg/s for ``seconds``; latency = consumer receive - producer send (same clock)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **QUIET})
    c.assign([TopicPartition(topic, 0, 0)])
    p = Producer({"bootstrap.servers": bootstrap, **QUIET})
    pad = b"\0" * (E2E_SIZE - 8)
    latencies: list[int] = []
    acks: list[int] = []  # produce() -> delivery report: the producer's share of the latency
    stop = threading.Event()
    warm = threading.Event()

    def receive() -> None:
        end = time.monotonic() + seconds + 60
        # poll(), not consume(n, t): consume waits for n messages or the full timeout,
        # which would add up to t to every latency.
        while not stop.is_set() and time.monotonic() < end:
            m = c.poll(0.1)
            now = time.perf_counter_ns()
            if m is not None and not m.error():
                v = m.value()
                if v[:8] == b"WARMWARM":
                    warm.set()
                else:
                    latencies.append(now - int.from_bytes(v[:8], "big"))

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    try:
        # Warm up: the consumer is fetching and the producer connected before timing.
        deadline = time.monotonic() + 20
        while not warm.is_set() and time.monotonic() < deadline:
            p.produce(topic, b"WARMWARM" + pad)
            p.flush(2)
            warm.wait(0.5)
        if not warm.is_set():
            raise RuntimeError("e2e warm-up message never arrived")
        total = int(E2E_RATE * seconds)
        start = time.perf_counter()
        for i in range(total):
            due = start + i / E2E_RATE
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent_ns = time.perf_counter_ns()
            p.produce(topic, sent_ns.to_bytes(8, "big") + pad,
                      on_delivery=lambda err, _m, t=sent_ns:
                      acks.append(time.perf_counter_ns() - t) if err is None else None)
            p.poll(0)
        p.flush(30)
        end = time.monotonic() + 30
        while len(latencies) < total and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(10)
        c.close()
    lat = sorted(x / 1e6 for x in latencies)
    ack = sorted(x / 1e6 for x in acks)
    return {"p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
            "max_ms": lat[-1] if lat else float("nan"), "received": len(lat),
            "sent": int(E2E_RATE * seconds),
            "produce_ack_p50_ms": percentile(ack, 0.50), "produce_ack_p99_ms": percentile(ack, 0.99)}


# --------------------------------------------------------------------------- driver


def run_broker(daemon: Daemon, sizes: dict[str, Any], partitions: int,
               profile_dir: Path | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Every phase against one running broker; a failed phase is recorded and skipped."""
    meter = CpuMeter(daemon.pid)
    prof = Profiler(profile_dir if daemon.name == "kmqkafka" else None, daemon.pid)
    res: dict[str, Any] = {}
    run_id = f"{int(time.time())}"

    def phase(key: str, fn: Callable[[], dict[str, Any]], fields: tuple[str, ...]) -> None:
        log(f"  {daemon.name}: {key} ...")
        with prof.phase(key):
            before = meter.sample()
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 - report the failure, go on with the rest
                out = {"error": f"{type(e).__name__}: {e}"}
            after = meter.sample()
        cpu, client_cpu = CpuMeter.pct(before, after)
        if "error" in out:  # a phase that failed at once has no meaningful CPU figure
            cpu = client_cpu = None
        for f in fields:
            res[f"{key}_{f}"] = out.get(f)
        res[f"{key}_cpu_pct"] = None if cpu is None else round(cpu, 1)
        res[f"{key}_client_cpu_pct"] = None if client_cpu is None else round(client_cpu, 1)
        res[f"{key}_detail"] = out
        log(f"    {json.dumps(out)}  broker cpu {_fmt(cpu)}%  client cpu {_fmt(client_cpu)}%")

    cases = [("1k", KIB, sizes["n_1k"]), ("100b", 100, sizes["n_100b"])]
    if "throughput" in PHASES:
        for label, size, count in cases:
            for acks, acks_label in (("all", "all"), ("1", "1")):
                topic = f"bench-{run_id}-{label}-acks{acks_label}"
                create_topic(daemon.bootstrap, topic, partitions)
                phase(f"produce_acks_{acks_label}_{label}",
                      lambda t=topic, s=size, n=count, a=acks:
                      produce_phase(daemon.bootstrap, t, s, n, a, sizes["phase_s"]),
                      ("msg_s", "mb_s"))
        for label, size, _count in cases:
            topic = f"bench-{run_id}-{label}-acksall"
            produced = res.get(f"produce_acks_all_{label}_detail", {}).get("acked")
            phase(f"consume_{label}",
                  lambda t=topic, s=size, n=produced:
                  consume_phase(daemon.bootstrap, t, s, n, sizes["phase_s"]),
                  ("msg_s", "mb_s"))
    if "e2e" in PHASES:
        topic = f"bench-{run_id}-e2e"
        create_topic(daemon.bootstrap, topic, 1)
        phase("e2e", lambda: e2e_phase(daemon.bootstrap, topic, sizes["e2e_s"]),
              ("p50_ms", "p99_ms", "max_ms", "produce_ack_p50_ms", "produce_ack_p99_ms"))
    return res


ROWS = [
    ("produce acks=all 1 KiB", "produce_acks_all_1k", ("msg_s", "mb_s")),
    ("produce acks=1   1 KiB", "produce_acks_1_1k", ("msg_s", "mb_s")),
    ("produce acks=all 100 B", "produce_acks_all_100b", ("msg_s", "mb_s")),
    ("produce acks=1   100 B", "produce_acks_1_100b", ("msg_s", "mb_s")),
    ("consume 1 KiB", "consume_1k", ("msg_s", "mb_s")),
    ("consume 100 B", "consume_100b", ("msg_s", "mb_s")),
    ("e2e 2k msg/s 100 B", "e2e", ("p50_ms", "p99_ms", "max_ms", "produce_ack_p50_ms",
                                    "produce_ack_p99_ms")),
]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}"
    return str(v)


def table(results: dict[str, dict[str, Any]], ratio: dict[str, Any]) -> str:
    names = list(results)
    head = f"{'phase':<24}{'figure':<20}" + "".join(f"{n:>14}{'cpu%':>7}" for n in names)
    head += f"{'kmq/tansu':>11}" if len(names) == 2 else ""
    lines = [head, "-" * len(head)]
    for title, key, fields in ROWS:
        for i, f in enumerate(fields):
            row = f"{title if i == 0 else '':<24}{f:<20}"
            for n in names:
                r = results[n]
                cpu = r.get(f"{key}_cpu_pct") if i == 0 else None
                row += f"{_fmt(r.get(f'{key}_{f}')):>14}{_fmt(cpu) if i == 0 else '':>7}"
            if len(names) == 2:
                row += f"{_fmt(ratio.get(f'{key}_{f}')):>11}"
            lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts, ~1 minute in all")
    ap.add_argument("--only", choices=("kmqkafka", "tansu"), help="run one broker only")
    ap.add_argument("--partitions", type=int, default=1, help="partitions per throughput topic")
    ap.add_argument("--profile", type=Path, help="py-spy the kmqkafka daemon into this dir")
    ap.add_argument("--data-root", type=Path, help="parent of kmqkafka's temp data dir")
    ap.add_argument("--phases", help="comma list: throughput,e2e (default both)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    global PHASES
    if args.phases:
        PHASES = frozenset(args.phases.split(","))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    root = args.data_root or data_root()
    log(f"kmqkafka data under {root} ({_fstype(root.resolve())}); cpus={os.cpu_count()}")
    results: dict[str, dict[str, Any]] = {}
    brokers = [("kmqkafka", lambda: kmqkafka_daemon(root)), ("tansu", tansu_daemon)]
    for name, starter in brokers:
        if args.only and args.only != name:
            continue
        t0 = time.monotonic()
        try:
            with starter() as daemon:
                results[name] = run_broker(daemon, sizes, args.partitions, args.profile, log)
        except Exception as e:  # noqa: BLE001 - a broker that will not start is a result too
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  {name}: {results[name]['error']}")
        log(f"  {name}: {time.monotonic() - t0:.0f}s")

    ratio: dict[str, Any] = {}
    bars: dict[str, Any] = {}
    kmq, tan = results.get("kmqkafka", {}), results.get("tansu", {})
    for _title, key, fields in ROWS:
        for f in fields:
            a, b = kmq.get(f"{key}_{f}"), tan.get(f"{key}_{f}")
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratio[f"{key}_{f}"] = round(a / b, 3)
    for key in ("produce_acks_all_1k", "produce_acks_1_1k", "produce_acks_all_100b",
                "produce_acks_1_100b", "consume_1k", "consume_100b"):
        r = ratio.get(f"{key}_msg_s")
        bars[f"{key}_ratio_ge_1_2"] = None if r is None else r >= BARS["throughput_ratio_min"]
    p50, p99 = kmq.get("e2e_p50_ms"), kmq.get("e2e_p99_ms")
    bars["e2e_p50_le_10ms"] = None if p50 is None else p50 <= BARS["e2e_p50_ms_max"]
    bars["e2e_p99_le_25ms"] = None if p99 is None else p99 <= BARS["e2e_p99_ms_max"]

    print(table(results, ratio))
    print("bars: " + ", ".join(f"{k}={v}" for k, v in bars.items()))
    settings = {"quick": args.quick, "partitions": args.partitions, "producer": PRODUCER_TUNING,
                "consumer": CONSUMER_TUNING, "e2e_rate": E2E_RATE, "e2e_size": E2E_SIZE,
                **sizes, "cpus": os.cpu_count(), "python": platform.python_version(),
                "profiled": bool(args.profile)}
    flat = {n: {k: v for k, v in r.items() if not k.endswith("_detail")}
            for n, r in results.items()}
    print(json.dumps({**flat, "ratio": ratio, "bars": bars, "settings": settings,
                      "detail": {n: {k: v for k, v in r.items() if k.endswith("_detail")}
                                 for n, r in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
