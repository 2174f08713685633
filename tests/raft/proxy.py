"""Fault injection for real-process cluster tests: a TCP proxy per directed Raft link.

``ProxyHub`` runs one asyncio loop in a daemon thread; ``hub.proxy(target_port)`` opens a
``LinkProxy`` listening on its own free 127.0.0.1 port that forwards every connection to
``127.0.0.1:target_port``. From the test thread a proxy can be

- ``block()``: close every connection it carries and refuse new ones (accepted, then closed at
  once, so the dialer sees the link drop and retries with backoff); with
  ``block(blackhole=True)`` open connections stay up and new ones are accepted and held open,
  but every byte either way is discarded (the dialer believes the link is up);
- ``unblock()``: forward again (blackholed connections are closed first: their byte stream was
  cut mid-frame, the dialer must reconnect);
- ``delay(seconds)``: hold every chunk that long before passing it on, in order (0 = off).

``ProxiedCluster`` starts a 3-process kmqkafka cluster (``tests.conftest.start_broker``) where
node i reaches node j's Raft port through the proxy ``links[i, j]``: every node gets its own
``--peers`` list (``KMQKAFKA_PEERS``) with the same node ids, its own real Raft address, the
proxies' addresses for the others and everyone's real Kafka address. A Raft transport sends on
its outgoing connection and gets the replies back on it, so cutting ``(i, j)`` and ``(j, i)``
separates i and j completely. ``isolate(n)`` cuts ``n`` from everybody; ``heal()`` undoes every
cut. Kafka traffic is never proxied.

Note: a node derives the cluster id from its own peers list (``kafka/identity.py``), so with
proxies the three nodes report different cluster ids; these tests do not depend on it.
"""
from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterable

HOST = "127.0.0.1"
_CHUNK = 65536
LEADER_LINE = re.compile(r"raft node (\d+): (\w[\w-]*), leader (\w+)")


class LinkProxy:
    """One listening port forwarding to one target; controlled from any thread."""

    def __init__(self, hub: "ProxyHub", target_port: int, name: str) -> None:
        self.hub = hub
        self.target_port = target_port
        self.name = name
        self.port = 0
        self.blocked = False
        self.blackhole = False
        self.delay_s = 0.0
        self.accepted = 0          # connections accepted (any mode)
        self.forwarded = 0         # bytes passed on, both directions
        self.dropped = 0           # bytes discarded while blackholed
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()

    # -- control (test thread) -------------------------------------------------------------

    def block(self, blackhole: bool = False) -> None:
        self.hub.call(self._set, True, blackhole)

    def unblock(self) -> None:
        self.hub.call(self._set, False, False)

    def delay(self, seconds: float) -> None:
        self.delay_s = max(0.0, float(seconds))

    def __repr__(self) -> str:
        state = "blackhole" if self.blackhole else "blocked" if self.blocked else "open"
        return f"<LinkProxy {self.name} :{self.port}->:{self.target_port} {state}>"

    # -- loop side --------------------------------------------------------------------------

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._set(True, False)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _set(self, blocked: bool, blackhole: bool) -> None:
        # A refusing block cuts what is open; a blackhole keeps it open but drops every byte
        # (see ``_pump``); leaving a blackhole cuts too: a stream never resumes after a gap.
        was_blackhole = self.blackhole
        self.blocked, self.blackhole = blocked, blackhole
        if (blocked and not blackhole) or (was_blackhole and not blackhole):
            for client, upstream in list(self._conns):
                _abort(client)
                if upstream is not None:
                    _abort(upstream)
            self._conns.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.blocked and not self.blackhole:
            _abort(writer)
            return
        if self.blocked:
            entry = (writer, None)
            self._conns.add(entry)
            try:
                while data := await reader.read(_CHUNK):
                    self.dropped += len(data)
            except OSError:
                pass
            finally:
                self._conns.discard(entry)
                _abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.target_port), 5)
        except (OSError, asyncio.TimeoutError):
            _abort(writer)
            return
        if self.blocked:  # blocked while connecting
            _abort(writer)
            _abort(up_writer)
            return
        entry = (writer, up_writer)
        self._conns.add(entry)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                                 return_exceptions=True)
        finally:
            self._conns.discard(entry)
            _abort(writer)
            _abort(up_writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction; with a delay, a queue keeps chunks in order and the reader
        never waits for the delay of earlier chunks."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if writer.is_closing():
                    return
                writer.write(data)
                await writer.drain()
                self.forwarded += len(data)

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(_CHUNK):
                if writer.is_closing() or sender.done():
                    break
                if self.blocked:  # blackholed: the connection stays up, the bytes vanish
                    self.dropped += len(data)
                    continue
                queue.put_nowait((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        finally:
            queue.put_nowait(None)
            try:
                await sender
            except OSError:
                pass
            _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once (RST, no lingering data): the other side learns the link is gone."""
    transport = writer.transport
    if transport is None or transport.is_closing():
        return
    try:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    transport.abort()


class ProxyHub:
    """An asyncio loop in a daemon thread hosting any number of ``LinkProxy``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="proxy-hub",
                                       daemon=True)
        self.thread.start()
        self.proxies: list[LinkProxy] = []

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` (a plain function or a coroutine function) on the loop; wait."""
        async def run() -> Any:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def proxy(self, target_port: int, name: str = "") -> LinkProxy:
        p = LinkProxy(self, target_port, name or f"->{target_port}")
        self.call(p._start)
        self.proxies.append(p)
        return p

    def close(self) -> None:
        for p in self.proxies:
            try:
                self.call(p._stop)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.call(cancel_rest)
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


# --------------------------------------------------------------------------- a cluster


class ProxiedCluster:
    """Three (or more) kmqkafka processes whose Raft links all go through ``LinkProxy``s.

    ``links[i, j]`` carries node i's connection to node j. With ``proxied=False`` the nodes
    share one ordinary peers string (no proxies). The brokers are ``tests.conftest``
    ``BrokerProcess`` objects (``stop``/``kill``/``restart``/``log``).
    """

    def __init__(self, root: Path, ids: Iterable[int] = (1, 2, 3), *, proxied: bool = True,
                 tick_ms: int = 50, election_ticks: int = 10,
                 extra_env: dict[str, str] | None = None) -> None:
        # Ports are picked free and bound later, so another process (or a proxy's own
        # ephemeral port) can take one in between: start again on fresh ports when that
        # happens, a bounded number of times.
        for attempt in range(3):
            try:
                self._start(root / f"try{attempt}" if attempt else root, ids, proxied, tick_ms,
                            election_ticks, extra_env)
                return
            except AssertionError as exc:
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise

    def _start(self, root: Path, ids: Iterable[int], proxied: bool, tick_ms: int,
               election_ticks: int, extra_env: dict[str, str] | None) -> None:
        from tests.conftest import _wait_healthy, free_port, start_broker

        self.ids = tuple(ids)
        self.raft_ports = {i: free_port() for i in self.ids}
        self.kafka_ports = {i: free_port() for i in self.ids}
        self.hub = ProxyHub() if proxied else None
        self.links: dict[tuple[int, int], LinkProxy] = {}
        if self.hub is not None:
            for i in self.ids:
                for j in self.ids:
                    if i != j:
                        self.links[i, j] = self.hub.proxy(self.raft_ports[j], f"{i}->{j}")
        self.brokers: dict[int, Any] = {}
        try:
            for i in self.ids:
                d = root / f"n{i}"
                d.mkdir(parents=True, exist_ok=True)
                env = {"KMQKAFKA_NODE_ID": str(i), "KMQKAFKA_PEERS": self.peers_for(i),
                       "CONNECTORS_KAFKA_PORT": str(self.kafka_ports[i]),
                       "KMQKAFKA_RAFT_TICK_MS": str(tick_ms),
                       "KMQKAFKA_RAFT_ELECTION_TICKS": str(election_ticks),
                       **(extra_env or {})}
                self.brokers[i] = start_broker(d, env=env, wait=False)
            for b in self.brokers.values():
                _wait_healthy(b, 30)
        except BaseException:
            self.close()
            raise
        self.election_timeout_s = 2 * election_ticks * tick_ms / 1000  # randomized upper bound

    def peers_for(self, node: int) -> str:
        """Node ``node``'s --peers: itself at its real Raft port, the others at the proxies."""
        parts = []
        for j in self.ids:
            port = self.raft_ports[j] if j == node or not self.links else self.links[node, j].port
            parts.append(f"{j}={HOST}:{port}/{HOST}:{self.kafka_ports[j]}")
        return ",".join(parts)

    # -- faults -----------------------------------------------------------------------------

    def cut(self, a: int, b: int, blackhole: bool = False) -> None:
        """Separate ``a`` and ``b`` both ways."""
        self.links[a, b].block(blackhole)
        self.links[b, a].block(blackhole)

    def isolate(self, node: int, blackhole: bool = False) -> None:
        for j in self.ids:
            if j != node:
                self.cut(node, j, blackhole)

    def heal(self) -> None:
        for p in self.links.values():
            p.unblock()
            p.delay(0)

    # -- observation ------------------------------------------------------------------------

    def live(self) -> dict[int, Any]:
        return {i: b for i, b in self.brokers.items() if b.proc.poll() is None}

    def bootstrap(self, *nodes: int) -> str:
        return ",".join(self.brokers[i].bootstrap for i in (nodes or self.ids))

    def last_state(self, node: int) -> tuple[str, int | None] | None:
        """(role, leader) from the node's latest ``raft node N: role, leader L`` log line
        of its current process (earlier processes' lines are ignored after a restart)."""
        b = self.brokers[node]
        text = b.log()
        marker = f"raft node {node} of "
        start = text.rfind(marker)  # the current process's start line
        lines = LEADER_LINE.findall(text[start:] if start >= 0 else text)
        if not lines:
            return None
        _id, role, leader = lines[-1]
        return role, (None if leader == "None" else int(leader))

    def wait_leader(self, among: Iterable[int] | None = None, timeout: float = 20.0,
                    not_: int | None = None) -> int:
        """The leader every node in ``among`` (default: the live ones) agrees on."""
        nodes = tuple(among) if among is not None else tuple(self.live())
        deadline = time.monotonic() + timeout
        states: dict[int, Any] = {}
        while time.monotonic() < deadline:
            states = {i: self.last_state(i) for i in nodes}
            leaders = {s[1] if s else None for s in states.values()}
            if len(leaders) == 1 and (leader := leaders.pop()) is not None and leader != not_ \
                    and leader in nodes and states[leader][0] == "leader":
                return leader
            time.sleep(0.05)
        raise AssertionError(f"no agreed leader among {nodes} within {timeout}s: {states}\n"
                             + "\n".join(self.brokers[i].log()[-1500:] for i in nodes))

    def close(self) -> None:
        for b in self.brokers.values():
            if b.proc.poll() is None:
                b.kill()
        if self.hub is not None:
            self.hub.close()
