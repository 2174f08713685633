"""Client byte-rate quotas: Kafka's ``producer_byte_rate`` / ``consumer_byte_rate`` set through
AlterClientQuotas (``kafka.client_quotas``: per user, client id or both, with defaults), then
the start-up CONNECTORS_KAFKA_PRODUCE_BYTE_RATE / _FETCH_BYTE_RATE per client id.

As in Kafka a client that sends (or fetches) more than its rate is not refused but slowed.
Each budget (a client id, a user, ... as the quota entity that applies says) has a bucket that
refills at its rate in bytes/s and holds at most one second of budget; a request that takes the
bucket below zero is answered after the time it takes to refill that debt, and the response
carries the same figure as its ``throttle_time_ms`` so well-behaved clients back off too. With
no quota in force a request costs one set lookup. Pure logic: callers pass ``now`` in seconds.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from kmqkafka.dispatch import NO_RESPONSE
from kmqkafka.kafka.client_quotas import (
    CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, StoredQuotas, user_of,
)
from kmqkafka.kafka.context import ANONYMOUS

MAX_CLIENTS = 10_000
PRODUCE = 0
FETCH = 1


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    rate: float


class ByteRateQuota:
    """Token buckets for one direction (produce or fetch), one per budget.

    ``rate``: the start-up rate per client id (0: none); ``stored`` and ``key``: the quotas
    set through AlterClientQuotas and which of their keys this direction uses."""

    def __init__(self, rate: int, stored: StoredQuotas | None = None, key: str = "") -> None:
        self.rate = rate
        self._stored = stored
        self._key = key
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.rate > 0 or (self._stored is not None and self._stored.sets(self._key))

    def budget(self, principal: str, client_id: str | None
               ) -> tuple[tuple[str, str], float] | None:
        """``(budget key, rate)`` of the quota that holds this client, None if none does."""
        client = client_id or ""
        if self._stored is not None:
            found = self._stored.limit(self._key, user_of(principal), client)
            if found is not None:
                return found
        return (("", client), float(self.rate)) if self.rate > 0 else None

    def record(self, client_id: str | None, nbytes: int, now: float,
               principal: str = ANONYMOUS) -> float:
        """Charge ``nbytes`` to the client's budget; return how long (s) to hold its
        response."""
        found = self.budget(principal, client_id) if nbytes > 0 else None
        if found is None:
            return 0.0
        key, rate = found
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != rate:  # new, or its quota changed: a full second
            if bucket is None and len(self._buckets) >= MAX_CLIENTS:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(rate, now, rate)
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(rate, bucket.tokens + elapsed * rate)
        bucket.updated = now
        bucket.tokens -= nbytes
        if bucket.tokens >= 0:
            return 0.0
        return -bucket.tokens / rate

    def _forget_full(self, now: float) -> None:
        """Drop budgets whose buckets have refilled: they carry no debt worth keeping."""
        for key, b in list(self._buckets.items()):
            if b.tokens + (now - b.updated) * b.rate >= b.rate:
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
        def handle(request: Any, ctx: Any) -> Any:
            if not quota.enabled:  # no quota in force: the handler's answer as it is
                return handler(request, ctx)
            d = maybeDeferred(handler, request, ctx)

            def charge(response: Any) -> Any:
                if response is NO_RESPONSE and not measure_request:
                    return response
                nbytes = _produced_bytes(request) if measure_request else _fetched_bytes(response)
                delay = quota.record(ctx.client_id, nbytes, clock.seconds(), ctx.principal)
                if delay <= 0 or response is NO_RESPONSE:
                    return response
                held = dataclasses.replace(
                    response, throttle_time=datetime.timedelta(milliseconds=int(delay * 1000)))
                return deferLater(clock, delay, lambda: held)

            return d.addCallback(charge)

        return handle

    return wrap


def install(dispatcher: Any, settings: Any, clock: IReactorTime,
            stored: StoredQuotas | None = None) -> None:
    """Hold Produce and Fetch to their quotas: the ones in ``stored`` (changed at runtime),
    then the configured start-up rates. Without ``stored`` only the start-up rates, and only
    when set."""
    for api, rate, key, measure_request in (
            (PRODUCE, settings.kafka_produce_byte_rate, PRODUCER_BYTE_RATE, True),
            (FETCH, settings.kafka_fetch_byte_rate, CONSUMER_BYTE_RATE, False)):
        if rate > 0 or stored is not None:
            dispatcher.wrap(api, throttled(ByteRateQuota(rate, stored, key), clock,
                                           measure_request=measure_request))
