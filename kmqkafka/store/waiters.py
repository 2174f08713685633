"""Parked readers: Deferreds that fire when a channel's durable end moves past a point.

Fetch long-polls and native subscribers park here instead of polling. A
waiter may watch several channels at once (a Fetch over many partitions) and
fires once, on the first of: data beyond its Sequence on any watched channel
(``True``), its timeout (``False``), or cancellation. Reactor thread only.
"""

from __future__ import annotations

from typing import Callable, Iterable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime


class _Waiter:
    __slots__ = ("deferred", "watches", "timer")

    def __init__(self, deferred: Deferred, watches: dict[str, int]) -> None:
        self.deferred = deferred
        self.watches = watches
        self.timer: IDelayedCall | None = None


class Waiters:
    """Registry of parked waiters keyed by channel name."""

    def __init__(self, clock: IReactorTime, durable_end: Callable[[str], int]) -> None:
        """``durable_end(name)`` returns the channel's next durable Sequence (or 0 if gone)."""
        self._clock = clock
        self._durable_end = durable_end
        self._by_channel: dict[str, set[_Waiter]] = {}

    def wait(self, channel: str, sequence: int, timeout_s: float) -> Deferred:
        """Fire True once ``channel`` holds durable data at ``sequence`` or beyond."""
        return self.wait_any([(channel, sequence)], timeout_s)

    def wait_any(self, watches: Iterable[tuple[str, int]], timeout_s: float) -> Deferred:
        """Fire True when any watched channel has durable data at its Sequence or beyond.

        Fires at once if that is already true. ``timeout_s <= 0`` with no data
        fires False at once.
        """
        wanted = dict(watches)
        for name, seq in wanted.items():
            if self._durable_end(name) > seq:
                d: Deferred = Deferred()
                d.callback(True)
                return d
        if timeout_s <= 0 or not wanted:
            d = Deferred()
            d.callback(False)
            return d
        waiter = _Waiter(Deferred(lambda _d: self._remove(waiter)), wanted)
        for name in wanted:
            self._by_channel.setdefault(name, set()).add(waiter)
        waiter.timer = self._clock.callLater(timeout_s, self._expire, waiter)
        return waiter.deferred

    def notify(self, channel: str) -> None:
        """Called when ``channel``'s durable end advanced (or it was deleted/truncated)."""
        parked = self._by_channel.get(channel)
        if not parked:
            return
        end = self._durable_end(channel)
        ready = [w for w in parked if end > w.watches[channel] or end == 0]
        for waiter in ready:
            self._remove(waiter)
            waiter.deferred.callback(True)

    def wake_all(self) -> None:
        """Release every waiter (shutdown): they fire False."""
        for waiter in {w for ws in self._by_channel.values() for w in ws}:
            self._remove(waiter)
            waiter.deferred.callback(False)

    def _expire(self, waiter: _Waiter) -> None:
        waiter.timer = None
        self._remove(waiter)
        waiter.deferred.callback(False)

    def _remove(self, waiter: _Waiter) -> None:
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        for name in waiter.watches:
            parked = self._by_channel.get(name)
            if parked is not None:
                parked.discard(waiter)
                if not parked:
                    del self._by_channel[name]

    def __len__(self) -> int:
        return len({w for ws in self._by_channel.values() for w in ws})
