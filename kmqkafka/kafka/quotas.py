"""Client byte-rate quotas (CONNECTORS_KAFKA_PRODUCE_BYTE_RATE / _FETCH_BYTE_RATE).

Like Kafka's client quotas, the budget is per client id: a client that sends
(or fetches) more than its rate is not refused but slowed. Each client has a
bucket that refills at ``rate`` bytes/s and holds at most one second of
budget; a request that takes the bucket below zero is answered after the time
it takes to refill that debt, and the response carries the same figure as its
``throttle_time_ms`` so well-behaved clients back off too. A rate of 0 turns
the quota off. Pure logic: callers pass ``now`` in seconds.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from kmqkafka.dispatch import NO_RESPONSE

MAX_CLIENTS = 10_000
PRODUCE = 0
FETCH = 1


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class ByteRateQuota:
    """Per-client token buckets for one direction (produce or fetch)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def record(self, client_id: str | None, nbytes: int, now: float) -> float:
        """Charge ``nbytes`` to the client; return how long (s) to hold its response."""
        if self.rate <= 0 or nbytes <= 0:
            return 0.0
        key = client_id or ""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_CLIENTS:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(float(self.rate), now)
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(self.rate), bucket.tokens + elapsed * self.rate)
        bucket.updated = now
        bucket.tokens -= nbytes
        if bucket.tokens >= 0:
            return 0.0
        return -bucket.tokens / self.rate

    def _forget_full(self, now: float) -> None:
        """Drop clients whose buckets have refilled: they carry no debt worth keeping."""
        for key, b in list(self._buckets.items()):
            if b.tokens + (now - b.updated) * self.rate >= self.rate:
                del self._buckets[key]
        if len(self._buckets) >= MAX_CLIENTS:
            self._buckets.clear()


def _produced_bytes(request: Any) -> int:
    return sum(len(p.records or b"") for t in request.topic_data for p in t.partition_data)


def _fetched_bytes(response: Any) -> int:
    return sum(len(p.records or b"") for t in response.responses for p in t.partitions)


def throttled(quota: ByteRateQuota, clock: IReactorTime, *, measure_request: bool
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a Produce (``measure_request``) or Fetch handler with ``quota``.

    The response of a client over its rate is held for the throttle time and
    reports it in ``throttle_time_ms``; acks=0 produces (no response) are
    charged but never held, as Kafka cannot signal them either.
    """

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        def handle(request: Any, ctx: Any) -> Deferred:
            d = maybeDeferred(handler, request, ctx)

            def charge(response: Any) -> Any:
                if response is NO_RESPONSE and not measure_request:
                    return response
                nbytes = _produced_bytes(request) if measure_request else _fetched_bytes(response)
                delay = quota.record(ctx.client_id, nbytes, clock.seconds())
                if delay <= 0 or response is NO_RESPONSE:
                    return response
                held = dataclasses.replace(
                    response, throttle_time=datetime.timedelta(milliseconds=int(delay * 1000)))
                return deferLater(clock, delay, lambda: held)

            return d.addCallback(charge)

        return handle

    return wrap


def install(dispatcher: Any, settings: Any, clock: IReactorTime) -> None:
    """Apply the configured produce/fetch byte-rate quotas to their handlers."""
    if settings.kafka_produce_byte_rate > 0:
        dispatcher.wrap(PRODUCE, throttled(ByteRateQuota(settings.kafka_produce_byte_rate), clock,
                                           measure_request=True))
    if settings.kafka_fetch_byte_rate > 0:
        dispatcher.wrap(FETCH, throttled(ByteRateQuota(settings.kafka_fetch_byte_rate), clock,
                                         measure_request=False))
