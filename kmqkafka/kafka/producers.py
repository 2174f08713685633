"""InitProducerId (key 22): producer ids for idempotent producers.

Ids are unique for the life of the store: they are handed out from blocks
whose end is made durable in the ``txn`` coordinator family before any id in
the block is used, so a restart never reuses one. Transactional ids need the
transaction coordinator, which this broker does not run yet: such requests get
COORDINATOR_NOT_AVAILABLE (the client retries), never a half-working answer.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, DeferredLock

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.wire import NO_THROTTLE, make

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 5
BLOCK = 1000
MAX_EPOCH = 32767
_KEY = b"producer_id.block_end"
FAMILY = "txn"


class ProducerIds:
    """Allocates producer ids in durable blocks. Reactor thread only."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = DeferredLock()
        self._next: int | None = None
        self._block_end = 0

    def allocate(self) -> Deferred:
        """Fire with a producer id never handed out before."""
        return self._lock.run(self._allocate)

    async def _allocate_async(self) -> int:
        if self._next is None:
            raw = self._store.keyed_get(FAMILY, _KEY)
            self._next = self._block_end = int(raw) if raw else 0
        if self._next >= self._block_end:
            end = self._next + BLOCK
            await self._store.keyed_put(FAMILY, [(_KEY, str(end).encode())])
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid

    def _allocate(self) -> Deferred:
        return Deferred.fromCoroutine(self._allocate_async())


def _ids(ctx: RequestContext) -> ProducerIds:
    ids = ctx.broker.extras.get("producer_ids")
    if ids is None:
        ids = ctx.broker.extras["producer_ids"] = ProducerIds(ctx.broker.store)
    return ids


def handle(request: Any, ctx: RequestContext) -> Any:
    if request.transactional_id is not None:
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.coordinator_not_available, producer_id=-1,
                    producer_epoch=-1)
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < MAX_EPOCH:
        # KIP-360: an idempotent producer bumps its own epoch after a sequence error.
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                    producer_id=pid, producer_epoch=epoch + 1)
    d = _ids(ctx).allocate()
    return d.addCallback(lambda new_pid: make(
        ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        producer_id=new_pid, producer_epoch=0))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(API_KEY, handle, MIN_VERSION, MAX_VERSION)
