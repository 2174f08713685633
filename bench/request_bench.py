"""Per-request broker cost: small Produce and Fetch requests over one connection, raw sockets.

Run: .venv/bin/python bench/request_bench.py [--requests 10000] [--window 48]

What a client with small batches costs the broker per request, apart from the bytes it
carries: librdkafka with ``linger.ms`` 0-1 over many partitions sends thousands of small
Produce requests a second, and a consumer long-polling a quiet partition sends a Fetch per
answer. One daemon (``kafka_bench.kmqkafka_daemon``, fsync on) and, per case, one connection
that keeps ``--window`` requests in flight (Produce, acks=all, one 1 KiB record per partition)
or one at a time (Fetch v12, ``max_wait`` 0, like librdkafka's fetcher). Reported: requests
per second and the daemon's CPU time (user+system, all threads) per request. The requests
are built once with kio and sent as bytes, so the client (Python) stays far from the broker's
cost. Every loop is bounded in count.

Cases: produce to 1 and to 16 partitions per request; fetch one partition at its high
watermark (an empty answer), at offset 0 (ten 100 B records), and 16 partitions at offset 0.
"""
from __future__ import annotations

import argparse
import io
import json
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer
from kio.index import load_request_schema
from kio.serial import entity_writer

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kafka_bench as kb  # noqa: E402

from kmqkafka import records  # noqa: E402


def _request(api: str, version: int, name: str) -> Any:
    module = sys.modules[load_request_schema({"produce": 0, "fetch": 1}[api], version).__module__]
    return getattr(module, name)


def _frame(request: Any, client_id: str = "request-bench") -> bytes:
    header_type = request.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_type)(buf, header_type(
        request_api_key=request.__api_key__, request_api_version=request.__version__,
        correlation_id=1, client_id=client_id))
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def _ms(n: int) -> Any:
    import datetime
    return datetime.timedelta(milliseconds=n)


def produce_frame(topic: str, partitions: int) -> bytes:
    Pr = _request("produce", 9, "ProduceRequest")
    Td = _request("produce", 9, "TopicProduceData")
    Pd = _request("produce", 9, "PartitionProduceData")
    batch = records.build_batch([records.NewRecord(key=None, value=b"x" * 1024, headers=(),
                                                   timestamp=-1)],
                                now_ms=int(time.time() * 1000))
    return _frame(Pr(transactional_id=None, acks=-1, timeout=_ms(30000), topic_data=(
        Td(name=topic, partition_data=tuple(Pd(index=p, records=batch)
                                            for p in range(partitions))),)))


def fetch_frame(topic: str, partitions: int, offset: int) -> bytes:
    Fr = _request("fetch", 12, "FetchRequest")
    Ft = _request("fetch", 12, "FetchTopic")
    Fp = _request("fetch", 12, "FetchPartition")
    return _frame(Fr(
        replica_id=-1, max_wait=_ms(0), min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
        topics=(Ft(topic=topic, partitions=tuple(
            Fp(partition=p, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
               log_start_offset=-1, partition_max_bytes=1 << 20)
            for p in range(partitions))),)))


class Connection:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def read_one(self) -> None:
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack_from(">i", self.buf)[0]
                if len(self.buf) >= 4 + n:
                    del self.buf[:4 + n]
                    return
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            self.buf += chunk

    def run(self, frame: bytes, count: int, window: int) -> float:
        sent = got = 0
        start = time.perf_counter()
        while got < count:
            while sent < count and sent - got < window:
                self.sock.sendall(frame)
                sent += 1
            self.read_one()
            got += 1
        return time.perf_counter() - start


def measure(daemon: Any, frame: bytes, count: int, window: int) -> dict[str, float]:
    proc = psutil.Process(daemon.pid)
    conn = Connection(daemon.bootstrap)
    conn.run(frame, min(200, count), window)  # warm up
    before = sum(proc.cpu_times()[:2])
    seconds = conn.run(frame, count, window)
    cpu = sum(proc.cpu_times()[:2]) - before
    conn.sock.close()
    return {"req_s": round(count / seconds), "cpu_us_per_req": round(1e6 * cpu / count, 1),
            "cpu_pct": round(100 * cpu / seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=48, help="Produce requests in flight")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    with kb.kmqkafka_daemon() as d:
        kb.create_topic(d.bootstrap, "one", 1)
        kb.create_topic(d.bootstrap, "many", 16)
        p = Producer({"bootstrap.servers": d.bootstrap, "linger.ms": 0, **kb.QUIET})
        for topic, parts in (("one", 1), ("many", 16)):
            for part in range(parts):
                for _ in range(10):
                    p.produce(topic, b"y" * 100, partition=part)
        p.flush(30)
        cases = [
            ("fetch_1p_empty", fetch_frame("one", 1, 10), args.requests, 1),
            ("fetch_1p_10_records", fetch_frame("one", 1, 0), args.requests, 1),
            ("fetch_16p_10_records", fetch_frame("many", 16, 0), args.requests // 4, 1),
            ("produce_1p", produce_frame("one", 1), args.requests, args.window),
            ("produce_16p", produce_frame("many", 16), args.requests // 5, args.window),
        ]
        for name, frame, count, window in cases:
            results[name] = measure(d, frame, count, window)
            r = results[name]
            print(f"{name:22s} {r['req_s']:>8,} req/s  {r['cpu_us_per_req']:7.1f} us of broker "
                  f"CPU per request ({r['cpu_pct']:.0f} % of a core)", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
