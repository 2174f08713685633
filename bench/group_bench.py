"""Consumer-group benchmark for kmqkafka: rebalance latency and OffsetCommit throughput.

Run: .venv/bin/python bench/group_bench.py [--quick] [--repeats 3] [--partitions 12]
                                           [--phases rebalance,commit] [--modes range,...]

One kmqkafka daemon (``twistd -n --pidfile= kmqkafka``, started by ``kafka_bench``'s helper,
fresh data dir on the real disk) with ``CONNECTORS_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS=500``
(it only affects KIP-848 groups). Clients are confluent-kafka (librdkafka).

1. Rebalance latency. Per mode, a 10-member group on a topic with ``--partitions`` (>= 11)
   partitions is formed and left to settle (every member holds a disjoint share, the union is
   every partition, DescribeGroups says Stable with 10 members). Then, ``--repeats`` times, an
   11th member calls ``subscribe()`` and we time until
   * ``assigned_ms``: every one of the 11 members' assignment callbacks have left them holding
     a non-empty, disjoint share covering all partitions (the time of the last callback), and
   * ``stable_ms``: AdminClient.describe_consumer_groups (polled every 25 ms) reports Stable
     with 11 members, and the assignments above are complete.
   The 11th member then close()s (LeaveGroup) and the group settles back to 10 before the next
   repeat. Every member polls in its own thread with ``poll(0.05)``.
   Modes: ``range`` (classic, eager), ``cooperative-sticky`` (classic, incremental), both with
   session.timeout.ms=6000 and heartbeat.interval.ms=500; ``consumer`` (KIP-848,
   group.protocol=consumer, server-side assignor, heartbeat interval from the broker = 500 ms).
2. OffsetCommit throughput.
   (a) sync: one subscribed consumer commits one partition with explicit offsets,
       ``commit(offsets=[tp], asynchronous=False)``, back to back: commits/s and p50/p99 latency.
   (b) async: ``--commit-consumers`` consumers in one group on a ``--commit-partitions``
       topic; each thread keeps up to ``--inflight`` ``commit(asynchronous=True)`` calls
       outstanding (completion via ``on_commit``), each commit carrying all of that member's
       partitions (b1) or one partition (b2). Reported as OffsetCommit requests/s and
       partition offsets/s.
   The broker's CPU (user+sys, all threads, % of one core) is measured over each phase.

Prints a human summary, then, last, one JSON line with every figure. Loops are bounded in
count and in time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_bench import (  # noqa: E402
    QUIET, CpuMeter, create_topic, data_root, kmqkafka_daemon, percentile,
)

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500
KIP848_HEARTBEAT_MS = 500
POLL_S = 0.05
DESCRIBE_EVERY_S = 0.025
MEMBERS = 10

CLASSIC = {"session.timeout.ms": SESSION_TIMEOUT_MS,
           "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS}
MODES: dict[str, dict[str, Any]] = {
    "range": {"partition.assignment.strategy": "range", **CLASSIC},
    "cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky", **CLASSIC},
    "consumer": {"group.protocol": "consumer"},
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- rebalance


class Member:
    """One consumer polling in its own thread; the assignment is tracked from the callbacks."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str,
                 extra: dict[str, Any], lock: threading.Lock, lifetime_s: float) -> None:
        self.name, self.topic, self.lock = name, topic, lock
        self.assignment: set[int] = set()
        self.last_callback = 0.0
        self.callbacks = 0
        self.events: list[tuple[float, str, int]] = []  # (perf_counter, "assign"/"revoke", n)
        self.errors: list[str] = []
        self.subscribed_at = 0.0
        self.stop = threading.Event()
        self.closed = threading.Event()
        self.conf = {"bootstrap.servers": bootstrap, "group.id": group,
                     "client.id": name, "enable.auto.commit": False,
                     "auto.offset.reset": "latest", **QUIET, **extra,
                     "error_cb": lambda e: self.errors.append(str(e))}
        self.lifetime_s = lifetime_s
        self._incr = (extra.get("group.protocol") == "consumer"
                      or extra.get("partition.assignment.strategy") == "cooperative-sticky")
        self.consumer = Consumer(self.conf)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _on_assign(self, _c: Any, parts: list[TopicPartition]) -> None:
        now = time.perf_counter()
        with self.lock:
            if self._incremental():
                self.assignment |= {p.partition for p in parts}
            else:
                self.assignment = {p.partition for p in parts}
            self.last_callback, self.callbacks = now, self.callbacks + 1
            self.events.append((now, "+", len(parts)))

    def _on_revoke(self, _c: Any, parts: list[TopicPartition]) -> None:
        now = time.perf_counter()
        with self.lock:
            if self._incremental():
                self.assignment -= {p.partition for p in parts}
            else:
                self.assignment = set()
            self.last_callback, self.callbacks = now, self.callbacks + 1
            self.events.append((now, "-", len(parts)))

    _on_lost = _on_revoke

    def _incremental(self) -> bool:
        # cooperative-sticky and KIP-848 callbacks carry only the change; eager ones the lot.
        return self._incr

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        c = self.consumer
        end = time.monotonic() + self.lifetime_s
        try:
            self.subscribed_at = time.perf_counter()
            c.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                        on_lost=self._on_lost)
            while not self.stop.is_set() and time.monotonic() < end:
                c.poll(POLL_S)
        except Exception as e:  # noqa: BLE001 - recorded, the group check then fails
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            try:
                c.close()
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"close: {e}")
            self.closed.set()

    def leave(self, timeout: float = 15.0) -> None:
        self.stop.set()
        self.thread.join(timeout)


def describe(admin: AdminClient, group: str) -> tuple[str, int]:
    try:
        d = admin.describe_consumer_groups([group], request_timeout=5)[group].result(6)
    except Exception as e:  # noqa: BLE001 - e.g. coordinator not yet known
        return f"error:{e}", -1
    state = d.state.name if isinstance(d.state, ConsumerGroupState) else str(d.state)
    return state, len(d.members)


def assignments_complete(members: list[Member], partitions: int) -> bool:
    seen: set[int] = set()
    total = 0
    for m in members:
        if not m.assignment:
            return False
        seen |= m.assignment
        total += len(m.assignment)
    return total == partitions and len(seen) == partitions


def wait_settled(admin: AdminClient, group: str, members: list[Member], partitions: int,
                 lock: threading.Lock, start: float, timeout: float
                 ) -> dict[str, Any]:
    """Poll until the assignments are complete and DescribeGroups is Stable with len(members)."""
    deadline = time.monotonic() + timeout
    assigned_at: float | None = None
    stable_at: float | None = None
    last_state: tuple[str, int] = ("?", -1)
    describes = 0
    while time.monotonic() < deadline:
        with lock:
            done = assignments_complete(members, partitions)
            last_cb = max(m.last_callback for m in members)
        if done and assigned_at is None:
            assigned_at = last_cb
        elif not done:
            assigned_at = None
        last_state = describe(admin, group)
        describes += 1
        now = time.perf_counter()
        if last_state == ("STABLE", len(members)) and assigned_at is not None:
            # Re-check: a callback may have landed while describe() ran.
            with lock:
                if assignments_complete(members, partitions):
                    stable_at = max(now, max(m.last_callback for m in members))
                    assigned_at = max(m.last_callback for m in members)
                    break
        time.sleep(DESCRIBE_EVERY_S)
    out: dict[str, Any] = {"state": last_state[0], "members_seen": last_state[1],
                           "describes": describes}
    if stable_at is None:
        with lock:
            out["assignment_sizes"] = [len(m.assignment) for m in members]
        out["error"] = f"not settled within {timeout}s"
        return out
    out["assigned_ms"] = (assigned_at - start) * 1000
    out["stable_ms"] = (stable_at - start) * 1000
    return out


def rebalance_mode(bootstrap: str, mode: str, partitions: int, repeats: int,
                   meter: CpuMeter, timeout: float) -> dict[str, Any]:
    topic = f"grp-{mode}-{int(time.time() * 1000)}"
    create_topic(bootstrap, topic, partitions)
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    lock = threading.Lock()
    extra = MODES[mode]
    life = timeout * (repeats + 2) * 2 + 60
    members = [Member(f"m{i}", bootstrap, group, topic, extra, lock, life) for i in range(MEMBERS)]
    runs: list[dict[str, Any]] = []
    res: dict[str, Any] = {"mode": mode, "partitions": partitions, "config": extra}
    try:
        t0 = time.perf_counter()
        for m in members:
            m.start()
        form = wait_settled(admin, group, members, partitions, lock, t0, timeout * 2)
        res["form_10_ms"] = form.get("stable_ms")
        if "error" in form:
            res["error"] = f"10-member group did not form: {form} " + \
                "; ".join(e for m in members for e in m.errors[:2])
            return res
        time.sleep(1.0)
        for r in range(repeats):
            new = Member(f"new{r}", bootstrap, group, topic, extra, lock, timeout * 3 + 30)
            everyone = members + [new]
            before = meter.sample()
            with lock:
                start = time.perf_counter()
            new.start()  # the thread's first action is subscribe(); start is taken just before
            out = wait_settled(admin, group, everyone, partitions, lock, start, timeout)
            after = meter.sample()
            out["broker_cpu_pct"], out["client_cpu_pct"] = (round(x, 1) for x in
                                                            CpuMeter.pct(before, after))
            out["subscribe_lag_ms"] = (new.subscribed_at - start) * 1000 if new.subscribed_at else None
            with lock:
                out["callbacks"] = sum(m.callbacks for m in everyone)
                # Timeline of this rebalance: "ms member +n/-n" (assigned/revoked n partitions).
                out["timeline"] = [f"{(t - start) * 1000:.0f} {m.name} {k}{n}"
                                   for m in everyone for t, k, n in m.events if t >= start]
                out["timeline"].sort(key=lambda x: float(x.split()[0]))
            runs.append(out)
            log(f"    {mode} repeat {r + 1}: assigned {out.get('assigned_ms', '-')} ms, "
                f"stable {out.get('stable_ms', '-')} ms, broker cpu {out['broker_cpu_pct']}%"
                + (f"  ERROR {out['error']} {new.errors[:2]}" if "error" in out else ""))
            # Back to 10 members before the next repeat.
            new.leave()
            back = wait_settled(admin, group, members, partitions, lock, time.perf_counter(),
                                timeout)
            out["back_to_10_ms"] = back.get("stable_ms")
            if "error" in back:
                res["error"] = f"did not settle back to 10 members: {back}"
                break
            time.sleep(1.0)
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.thread.join(15)
    res["runs"] = runs
    ok = [r for r in runs if "error" not in r]
    res["ok_runs"] = len(ok)
    for key in ("assigned_ms", "stable_ms"):
        vals = [r[key] for r in ok]
        res[f"{key}_median"] = round(statistics.median(vals), 1) if vals else None
        res[f"{key}_max"] = round(max(vals), 1) if vals else None
        res[f"{key}_all"] = [round(v, 1) for v in vals]
    cpus = [r["broker_cpu_pct"] for r in ok]
    res["broker_cpu_pct_median"] = statistics.median(cpus) if cpus else None
    return res


# --------------------------------------------------------------------------- commits


def commit_sync_phase(bootstrap: str, count: int, seconds: float) -> dict[str, Any]:
    topic = f"commit-sync-{int(time.time() * 1000)}"
    create_topic(bootstrap, topic, 1)
    (c, parts), = _joined_with_callbacks(bootstrap, f"g-{topic}", topic, 1, 1, [{}])
    lat: list[float] = []
    errors = 0
    try:
        for i in range(20):  # warm-up: coordinator connection, first write of the group
            c.commit(offsets=[TopicPartition(topic, parts[0], i)], asynchronous=False)
        start = time.perf_counter()
        deadline = start + seconds
        i = 20
        while len(lat) < count and time.perf_counter() < deadline:
            t = time.perf_counter()
            try:
                c.commit(offsets=[TopicPartition(topic, parts[0], i)], asynchronous=False)
                lat.append(time.perf_counter() - t)
            except KafkaException:
                errors += 1
            i += 1
        elapsed = time.perf_counter() - start
        last = c.committed([TopicPartition(topic, parts[0])], timeout=10)[0].offset
    finally:
        c.close()
    lat_ms = sorted(x * 1000 for x in lat)
    return {"commits_s": len(lat) / elapsed, "commits": len(lat), "errors": errors,
            "p50_ms": percentile(lat_ms, 0.5), "p99_ms": percentile(lat_ms, 0.99),
            "max_ms": lat_ms[-1] if lat_ms else None, "seconds": elapsed,
            "last_committed": last, "expected_last": i}


def commit_async_phase(bootstrap: str, consumers_n: int, partitions: int, inflight: int,
                       per_commit: str, count: int, seconds: float) -> dict[str, Any]:
    """Each thread keeps ``inflight`` async commits outstanding; counts completed requests."""
    topic = f"commit-async-{per_commit}-{int(time.time() * 1000)}"
    create_topic(bootstrap, topic, partitions)
    done = [0] * consumers_n
    failed = [0] * consumers_n
    offsets_done = [0] * consumers_n
    callbacks: list[Callable[..., None]] = []
    for i in range(consumers_n):
        def on_commit(err: Any, parts: list[TopicPartition], i: int = i) -> None:
            if err is not None:
                failed[i] += 1
            else:
                done[i] += 1
                offsets_done[i] += len(parts)
        callbacks.append(on_commit)
    # on_commit must be in the config; build the consumers with their own callback each.
    members = []
    group = f"g-{topic}"
    for i in range(consumers_n):
        members.append({"on_commit": callbacks[i]})
    joined = _joined_with_callbacks(bootstrap, group, topic, consumers_n, partitions, members)
    per_thread = max(1, count // consumers_n)
    start_gate = threading.Event()
    sent = [0] * consumers_n

    def worker(i: int, c: Consumer, parts: list[int]) -> None:
        start_gate.wait(10)
        end = time.perf_counter() + seconds
        n = 0
        off = 1
        while n < per_thread and time.perf_counter() < end:
            if n - done[i] - failed[i] >= inflight:
                c.poll(0.001)
                continue
            if per_commit == "all":
                tps = [TopicPartition(topic, p, off) for p in parts]
            else:
                tps = [TopicPartition(topic, parts[n % len(parts)], off)]
            try:
                c.commit(offsets=tps, asynchronous=True)
            except KafkaException:
                failed[i] += 1
            n += 1
            off += 1
            c.poll(0)
        sent[i] = n
        drain = time.perf_counter() + 15
        while done[i] + failed[i] < n and time.perf_counter() < drain:
            c.poll(0.01)

    threads = [threading.Thread(target=worker, args=(i, c, parts), daemon=True)
               for i, (c, parts) in enumerate(joined)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    start_gate.set()
    for t in threads:
        t.join(seconds + 30)
    elapsed = time.perf_counter() - start
    for c, _ in joined:
        c.close()
    reqs, offs = sum(done), sum(offsets_done)
    return {"commits_s": reqs / elapsed, "partition_offsets_s": offs / elapsed,
            "commits": reqs, "failed": sum(failed), "sent": sum(sent), "seconds": elapsed,
            "consumers": consumers_n, "partitions": partitions, "inflight": inflight,
            "partitions_per_commit": (partitions // consumers_n if per_commit == "all" else 1)}


def _joined_with_callbacks(bootstrap: str, group: str, topic: str, n: int, partitions: int,
                           extras: list[dict[str, Any]]) -> list[tuple[Consumer, list[int]]]:
    """``n`` subscribed consumers of one group, returned once they jointly hold every partition.

    They are polled round-robin from this thread until then; afterwards each is used by
    exactly one thread.
    """
    assigned: list[list[int]] = [[] for _ in range(n)]
    consumers = []
    for i in range(n):
        def on_assign(_c: Any, parts: list[TopicPartition], i: int = i) -> None:
            assigned[i] = sorted(p.partition for p in parts)
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": f"c{i}",
                      "enable.auto.commit": False, "partition.assignment.strategy": "range",
                      **CLASSIC, **QUIET, **extras[i]})
        c.subscribe([topic], on_assign=on_assign)
        consumers.append(c)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.02)
        if sum(len(a) for a in assigned) == partitions and all(assigned):
            return list(zip(consumers, assigned))
    for c in consumers:
        c.close()
    raise RuntimeError(f"commit group did not form: {assigned}")


# --------------------------------------------------------------------------- driver


def measured(meter: CpuMeter, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    before = meter.sample()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - report and go on
        return {"error": f"{type(e).__name__}: {e}"}
    after = meter.sample()
    cpu, client = CpuMeter.pct(before, after)
    out["broker_cpu_pct"], out["client_cpu_pct"] = round(cpu, 1), round(client, 1)
    return out


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer commits, 3 repeats")
    ap.add_argument("--repeats", type=int, default=5, help="11th-member joins per mode")
    ap.add_argument("--partitions", type=int, default=12, help="partitions of the group topic")
    ap.add_argument("--modes", default="range,cooperative-sticky,consumer")
    ap.add_argument("--phases", default="rebalance,commit")
    ap.add_argument("--commit-seconds", type=float, default=8.0)
    ap.add_argument("--commit-consumers", type=int, default=4)
    ap.add_argument("--commit-partitions", type=int, default=32)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=30.0, help="per rebalance measurement")
    args = ap.parse_args(argv)
    if args.partitions < MEMBERS + 1:
        ap.error("--partitions must be at least 11 so every member gets a partition")
    repeats = 3 if args.quick else args.repeats
    commit_s = 4.0 if args.quick else args.commit_seconds
    phases = set(args.phases.split(","))
    modes = [m for m in args.modes.split(",") if m]

    root = data_root()
    env = {"CONNECTORS_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS": str(KIP848_HEARTBEAT_MS)}
    log(f"kmqkafka data under {root}; cpus={os.cpu_count()}; broker env {env}")
    results: dict[str, Any] = {"rebalance": {}, "commit": {}}
    t_all = time.monotonic()
    with kmqkafka_daemon(root, extra_env=env) as daemon:
        meter = CpuMeter(daemon.pid)
        if "rebalance" in phases:
            for mode in modes:
                log(f"  rebalance {mode} ...")
                try:
                    results["rebalance"][mode] = rebalance_mode(
                        daemon.bootstrap, mode, args.partitions, repeats, meter, args.timeout)
                except Exception as e:  # noqa: BLE001
                    results["rebalance"][mode] = {"error": f"{type(e).__name__}: {e}"}
                if "error" in results["rebalance"][mode]:
                    log(f"    {mode}: {results['rebalance'][mode]['error']}")
        if "commit" in phases:
            log("  commit sync ...")
            results["commit"]["sync_1p"] = measured(
                meter, lambda: commit_sync_phase(daemon.bootstrap, 100_000, commit_s))
            log(f"    {results['commit']['sync_1p']}")
            for per in ("all", "one"):
                key = f"async_{per}"
                log(f"  commit {key} ...")
                results["commit"][key] = measured(meter, lambda p=per: commit_async_phase(
                    daemon.bootstrap, args.commit_consumers, args.commit_partitions,
                    args.inflight, p, 2_000_000, commit_s))
                log(f"    {results['commit'][key]}")

    # ---- human summary
    print(f"group_bench: kmqkafka, {os.cpu_count()} cpus, {time.monotonic() - t_all:.0f}s")
    if results["rebalance"]:
        print(f"\nRebalance: 10 stable members + 1 joiner, topic {args.partitions} partitions, "
              f"{repeats} repeats; classic session.timeout.ms={SESSION_TIMEOUT_MS} "
              f"heartbeat.interval.ms={HEARTBEAT_INTERVAL_MS}; KIP-848 broker heartbeat "
              f"{KIP848_HEARTBEAT_MS} ms; poll({POLL_S})")
        print(f"{'mode':<20}{'assigned med/max ms':>22}{'stable med/max ms':>22}"
              f"{'broker cpu%':>13}{'ok':>5}")
        for mode, r in results["rebalance"].items():
            if "error" in r and not r.get("ok_runs"):
                print(f"{mode:<20}  ERROR {r['error'][:200]}")
                continue
            print(f"{mode:<20}"
                  f"{_f(r['assigned_ms_median']) + ' / ' + _f(r['assigned_ms_max']):>22}"
                  f"{_f(r['stable_ms_median']) + ' / ' + _f(r['stable_ms_max']):>22}"
                  f"{_f(r['broker_cpu_pct_median']):>13}{r['ok_runs']:>5}")
    if results["commit"]:
        print("\nOffsetCommit (confluent-kafka commit() with explicit offsets):")
        s = results["commit"].get("sync_1p", {})
        if "error" in s:
            print(f"  sync 1 partition: ERROR {s['error']}")
        elif s:
            print(f"  sync 1 partition, 1 consumer: {_f(s['commits_s'], 0)} commits/s, "
                  f"p50 {_f(s['p50_ms'], 2)} ms, p99 {_f(s['p99_ms'], 2)} ms, "
                  f"broker cpu {_f(s['broker_cpu_pct'])}%, client cpu {_f(s['client_cpu_pct'])}%")
        for key in ("async_all", "async_one"):
            a = results["commit"].get(key, {})
            if "error" in a:
                print(f"  {key}: ERROR {a['error']}")
            elif a:
                print(f"  async, {a['consumers']} consumers x {a['inflight']} in flight, "
                      f"{a['partitions']} partitions, {a['partitions_per_commit']} per commit: "
                      f"{_f(a['commits_s'], 0)} commits/s ({_f(a['partition_offsets_s'], 0)} "
                      f"partition offsets/s), failed {a['failed']}, "
                      f"broker cpu {_f(a['broker_cpu_pct'])}%, client cpu "
                      f"{_f(a['client_cpu_pct'])}%")
    settings = {"members": MEMBERS, "partitions": args.partitions, "repeats": repeats,
                "session_timeout_ms": SESSION_TIMEOUT_MS,
                "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
                "kip848_broker_heartbeat_ms": KIP848_HEARTBEAT_MS, "poll_s": POLL_S,
                "commit_seconds": commit_s, "commit_consumers": args.commit_consumers,
                "commit_partitions": args.commit_partitions, "inflight": args.inflight,
                "cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps({**results, "settings": settings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
