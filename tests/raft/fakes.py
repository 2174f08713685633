"""An in-memory network of Raft nodes for driver tests: messages go through ``encode``/``decode``
and are delivered in a later reactor turn of the shared fake clock; nodes can be cut off."""
from __future__ import annotations

import shutil
from typing import Any, Sequence

from twisted.internet.defer import Deferred, fail, maybeDeferred, succeed
from twisted.internet.task import Clock

from kmqkafka.raft.errors import TransportError
from kmqkafka.raft.messages import Message, Snapshot, decode, encode


class Network:
    """Connects ``LoopbackTransport``s by node id; ``down`` nodes neither send nor receive."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.nodes: dict[int, "LoopbackTransport"] = {}
        self.down: set[int] = set()
        self.sent = 0

    def transport(self, node_id: int) -> "LoopbackTransport":
        t = LoopbackTransport(self, node_id)
        self.nodes[node_id] = t
        return t

    def reachable(self, a: int, b: int) -> bool:
        return (a not in self.down and b not in self.down and a in self.nodes
                and b in self.nodes and self.nodes[b].receiver is not None)


class LoopbackTransport:
    def __init__(self, net: Network, node_id: int) -> None:
        self.net = net
        self.node_id = node_id
        self.receiver: Any = None

    def start(self, receiver: Any) -> None:
        self.receiver = receiver

    def stop(self) -> Deferred:
        self.receiver = None
        return succeed(None)

    def send(self, messages: Sequence[Message]) -> None:
        for m in messages:
            if self.net.reachable(self.node_id, m.to):
                self.net.sent += 1
                self.net.clock.callLater(0, self._deliver, m.to, encode(m))

    def _deliver(self, to: int, frame: bytes) -> None:
        if self.net.reachable(self.node_id, to):
            self.net.nodes[to].receiver.receive(decode(frame))

    def forward(self, to: int, data: bytes) -> Deferred:
        if not self.net.reachable(self.node_id, to):
            return fail(TransportError(f"node {to} unreachable"))
        d: Deferred = Deferred()

        def run() -> None:
            if not self.net.reachable(self.node_id, to):
                d.errback(TransportError(f"node {to} unreachable"))
                return
            maybeDeferred(self.net.nodes[to].receiver.handle_forward, data).chainDeferred(d)

        self.net.clock.callLater(0, run)
        return d

    def fetch_snapshot(self, frm: int, snapshot: Snapshot) -> Deferred:
        if not self.net.reachable(self.node_id, frm):
            return fail(TransportError(f"node {frm} unreachable"))
        index = int(snapshot.data.split(b":")[1])
        src = self.net.nodes[frm].receiver.snapshot_path(index)
        if src is None:
            return fail(TransportError(f"node {frm} has no snapshot {index}"))
        dest = self.receiver.snapshot_dir / f"{index:020d}"
        shutil.copytree(src, dest, dirs_exist_ok=True)
        return succeed(None)
