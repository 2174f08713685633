"""Fetch (key 1, v4+): whole stored batches out, long-polled, with KIP-227 fetch sessions.

For each wanted partition the handler reads stored RecordBatches from the channel of (topic,
partition) starting at the batch that holds ``fetch_offset`` (offset = Sequence - 1) and returns
them as they are on disk: no record is decoded, the batches of one partition are joined once.

Limits (KIP-74): ``partition_max_bytes`` per partition and ``max_bytes`` for the response, except
that the first partition with data always returns at least one whole batch, as Kafka does; a
partition adds at most ``PARTITION_SOFT_CAP`` bytes of further batches to one response.
Offsets: OFFSET_OUT_OF_RANGE when ``fetch_offset`` < log start offset or beyond the log end; a
fetch at or past the high watermark (but not past the end) is answered empty, as Kafka does.

Long poll: when fewer than ``min_bytes`` are ready (and no partition has an error) the request is
parked on ``store.wait_any`` for every read partition until new durable data arrives or
``max_wait`` passes, then re-read. Cancelling the returned Deferred (the connection went) cancels
the parked wait. The leader epoch is the Raft term (``identity.leader_epoch``; 0 on a lone
node): a ``current_leader_epoch`` above it is UNKNOWN_LEADER_EPOCH (the client knows a newer
leader than we do), one below it FENCED_LEADER_EPOCH (the client's leader is gone).

ACLs: each topic needs READ, else its partitions answer TOPIC_AUTHORIZATION_FAILED (before any
other check but an unknown topic id's UNKNOWN_TOPIC_ID, as Kafka), for every partition of the
fetch session too; an unknown topic name the principal may not read is TOPIC_AUTHORIZATION_FAILED
as well, so a fetch never tells which topics exist.
"""

from __future__ import annotations

import random
from typing import Any, Hashable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, fetch_response, identity
from kmqkafka.kafka.context import Broker, RequestContext
from kmqkafka.kafka.errors import error_code_for
from kmqkafka.kafka.fetch_sessions import FetchContext, SessionCache, Wanted
from kmqkafka.kafka.topics import Topic, TopicCatalog
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.net.chunks import RecordChain
from kmqkafka.store.errors import OffsetOutOfRange
from kmqkafka.store.names import channel_for

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 18
SESSIONS_KEY = "fetch_sessions"
PARTITION_SOFT_CAP = 2 << 20
"""Bytes one partition contributes to a response even when the client allows more (a
consumer's ``max.partition.fetch.bytes`` is often tens of MiB), so one partition's backlog
does not make a response, and the time to build and send it, grow without bound. librdkafka's
consume rate was measured the same at 2, 10 and 64 MiB (bench/README.md; an earlier run had
favoured 2 MiB by 14-27 % for 100 B records). Returning less than allowed is within the
protocol; a first batch
larger than the cap is still returned whole when the limits allow, and a response the cap
leaves short of ``min_bytes`` is read again without it (it must not wait for withheld bytes)."""

log = Logger()

# One partition's outcome: (key, error, high watermark, log start offset, batches, nbytes,
# last stable offset, aborted transactions or None).
_Result = tuple[tuple[Hashable, int], ErrorCode, int, int, list[memoryview], int, int, Any]


def session_cache(broker: Broker) -> SessionCache:
    """The broker's fetch-session cache (``broker.extras["fetch_sessions"]``), made on first use."""
    cache = broker.extras.get(SESSIONS_KEY)
    if cache is None:
        cache = broker.extras[SESSIONS_KEY] = SessionCache(rng=random.SystemRandom())
    return cache


def handle(request: Any, ctx: RequestContext) -> Any:
    """Serve one Fetch; returns the response, or a Deferred of it when the fetch parks."""
    version = ctx.api_version
    uses_ids = version >= 13
    # Keyed as Kafka's request map (a LinkedHashMap): a partition named twice is answered once,
    # at its first place, for its last entry.
    requested: dict[tuple[Hashable, int], Wanted] = {}
    epoch_errors: dict[tuple[Hashable, int], ErrorCode] = {}
    epoch = -1  # read once, for the first partition that asks for a check
    for t in request.topics:
        topic_key = t.topic_id if uses_ids else t.topic
        for p in t.partitions:
            key = (topic_key, p.partition)
            requested[key] = Wanted(key, p.fetch_offset, p.partition_max_bytes)
            current = getattr(p, "current_leader_epoch", -1)
            if current != -1:
                if epoch < 0:
                    epoch = identity.leader_epoch(ctx.broker)
                if current > epoch:
                    epoch_errors[key] = ErrorCode.unknown_leader_epoch
                elif current < epoch:
                    epoch_errors[key] = ErrorCode.fenced_leader_epoch
    sessions = version >= 7
    forgotten: list[tuple[Hashable, int]] = []
    if sessions:
        for f in request.forgotten_topics_data:
            topic_key = f.topic_id if uses_ids else f.topic
            forgotten.extend((topic_key, p) for p in f.partitions)
    fctx = session_cache(ctx.broker).new_context(
        getattr(request, "session_id", 0),
        getattr(request, "session_epoch", -1),
        list(requested.values()),
        forgotten,
        uses_topic_ids=uses_ids,
        now=ctx.broker.reactor.seconds(),
        sessions_supported=sessions,
    )
    if fctx.error is not ErrorCode.none:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=fctx.error,
                    session_id=0, responses=())
    return _Fetch(request, ctx, fctx, epoch_errors).start()


class _Fetch:
    """One Fetch in progress: read, maybe park, re-read, answer."""

    __slots__ = ("ctx", "fctx", "store", "catalog", "uses_ids", "min_bytes", "max_bytes",
                 "deadline", "epoch_errors", "topics", "gone", "stamp", "wait", "deferred",
                 "committed", "aborted_cls", "parked", "ahead", "refusals")

    def __init__(self, request: Any, ctx: RequestContext, fctx: FetchContext,
                 epoch_errors: dict[tuple[Hashable, int], ErrorCode]) -> None:
        broker = ctx.broker
        self.ctx = ctx
        self.fctx = fctx
        self.store = broker.store
        self.catalog: TopicCatalog = broker.extras["topics"]
        self.uses_ids = ctx.api_version >= 13
        self.min_bytes = request.min_bytes
        self.max_bytes = request.max_bytes
        # READ_COMMITTED reads stop at the last stable offset and carry the aborted
        # transactions the records returned may hold (an empty list when none, as Kafka
        # sends); READ_UNCOMMITTED gets null.
        self.committed = request.isolation_level == 1
        self.aborted_cls = types_of(ctx).AbortedTransaction if self.committed else None
        self.deadline = broker.reactor.seconds() + max(0.0, request.max_wait.total_seconds())
        self.epoch_errors = epoch_errors
        self.topics: dict[Hashable, Topic | None] = {}
        self.gone: set[Hashable] = set()  # topics deleted while the fetch waited
        self.stamp = self.catalog.stamp()
        self.wait: Deferred | None = None
        self.deferred: Deferred | None = None
        self.parked: list[_Result] | None = None  # what the parked wait started from
        self.ahead = False  # a result stood for an offset this node has not applied yet
        # Per topic key: TOPIC_AUTHORIZATION_FAILED or None (READ allowed); None without ACLs.
        self.refusals: dict[Hashable, ErrorCode | None] | None = (
            {} if authz.enabled(ctx) else None)

    def start(self) -> Any:
        results, total, errors = self._read()
        if self._satisfied(total, errors):
            return self._respond(results)
        self.deferred = Deferred(self._cancel)
        self._park(results)
        return self.deferred

    # -- reading ---------------------------------------------------------------------------

    def _topic(self, topic_key: Hashable) -> Topic | None:
        try:
            return self.topics[topic_key]
        except KeyError:
            pass
        if self.uses_ids:
            topic = self.catalog.by_id(topic_key) if topic_key is not None else None
        else:
            topic = self.catalog.get(topic_key) if topic_key else None
        self.topics[topic_key] = topic
        return topic

    def _refused(self, topic_key: Hashable) -> ErrorCode | None:
        """TOPIC_AUTHORIZATION_FAILED unless the principal may READ the topic, decided once per
        topic for the whole fetch. An unknown topic id is not judged here: it stays
        UNKNOWN_TOPIC_ID, as Kafka answers before authorizing (there is no name to check)."""
        refusals = self.refusals
        try:
            return refusals[topic_key]
        except KeyError:
            pass
        if self.uses_ids:
            topic = self._topic(topic_key)
            name = topic.name if topic is not None else None
        else:
            name = topic_key
        code = None
        if name is not None and not authz.allowed(self.ctx, authz.READ, authz.TOPIC, name):
            code = ErrorCode.topic_authorization_failed
        refusals[topic_key] = code
        return code

    def _channel(self, key: tuple[Hashable, int]) -> str | None:
        topic = self._topic(key[0])
        p = key[1]
        if topic is None or not 0 <= p < topic.partitions:
            return None
        return channel_for(topic.name, p)

    def _read(self, capped: bool = True) -> tuple[list[_Result], int, bool]:
        """Read every wanted partition once; returns (results, total bytes, any error).

        With ``capped``, a partition adds at most ``PARTITION_SOFT_CAP`` bytes; if that leaves
        the response short of ``min_bytes`` while a cap withheld data, it is read again
        uncapped (the answer must not wait for bytes that are already there)."""
        store = self.store
        results: list[_Result] = []
        total = 0
        errors = False
        withheld = False
        self.ahead = False
        limit = self.max_bytes
        missing = ErrorCode.unknown_topic_id if self.uses_ids else ErrorCode.unknown_topic_or_partition
        refusals = self.refusals
        for w in self.fctx.wanted:
            key = w.key
            code = self._refused(key[0]) if refusals is not None else None
            if code is None:
                code = self.epoch_errors.get(key)
            if code is None:
                channel = self._channel(key)
                if channel is None:  # Kafka: an unknown id, or a partition the topic lacks
                    code = (missing if self._topic(key[0]) is None and key[0] not in self.gone
                            else ErrorCode.unknown_topic_or_partition)
            if code is not None:
                results.append((key, code, -1, -1, [], 0, -1, None))
                errors = True
                continue
            budget = min(w.max_bytes, limit - total)
            try:
                stable = store.stable_end(channel)
                upto = stable if self.committed else None
                if budget <= 0 and total:
                    b = store.bounds(channel)
                    if not b.log_start <= w.fetch_offset + 1 <= b.next_sequence:
                        raise OffsetOutOfRange(w.fetch_offset + 1, b.log_start, b.next_sequence)
                    results.append((key, ErrorCode.none, b.high_watermark - 1,
                                    b.log_start - 1, [], 0, stable - 1, None))
                    continue
                soft = PARTITION_SOFT_CAP if capped else budget
                rr = store.read(channel, w.fetch_offset + 1, max(min(budget, soft), 0),
                                upto=upto, min_one=not total)
                withheld = withheld or (rr.nbytes > 0 and soft < budget)
                if (not rr.nbytes and budget > soft
                        and (upto or rr.high_watermark) - 1 > w.fetch_offset):
                    # The next batch alone is larger than the cap: it still goes out whole.
                    rr = store.read(channel, w.fetch_offset + 1, budget, upto=upto,
                                    min_one=not total)
            except Exception as exc:
                code = error_code_for(exc)
                ahead = self._not_applied_yet(exc, w.fetch_offset)
                if ahead is not None:
                    self.ahead = True
                    results.append((key, ErrorCode.none, ahead[0], ahead[1], [], 0, -1, None))
                    continue
                if code is ErrorCode.unknown_server_error:
                    log.failure("fetch from {channel} failed", channel=channel)
                results.append((key, code, -1, -1, [], 0, -1, None))
                errors = True
                continue
            total += rr.nbytes
            aborted = None
            if rr.nbytes and self.committed:
                aborted = store.aborted_between(channel, w.fetch_offset + 1, stable)
            results.append((key, ErrorCode.none, rr.high_watermark - 1, rr.log_start - 1,
                            rr.batches, rr.nbytes, stable - 1, aborted))
        if withheld and not errors and total < self.min_bytes:
            return self._read(capped=False)
        return results, total, errors

    def _not_applied_yet(self, exc: Exception, fetch_offset: int) -> tuple[int, int] | None:
        """On a cluster, an offset past this node's applied end may be one the leader has
        acknowledged and this node holds in its Raft log but has not applied yet (a follower
        learns the commit a heartbeat later; a new leader applies its predecessor's tail):
        Kafka answers no error for an offset within a replica's log. Until the fetch's
        max_wait runs out it waits for the apply; only then is it OFFSET_OUT_OF_RANGE.
        Returns (high watermark, log start) as offsets to answer with, or None."""
        if (not isinstance(exc, OffsetOutOfRange) or exc.sequence < exc.log_start
                or not identity.clustered(self.ctx.broker)
                or self.ctx.broker.reactor.seconds() >= self.deadline):
            return None
        return exc.next_sequence - 1, exc.log_start - 1

    def _satisfied(self, total: int, errors: bool) -> bool:
        return (errors or total >= self.min_bytes or not self.fctx.wanted
                or self.ctx.broker.reactor.seconds() >= self.deadline)

    # -- parking ---------------------------------------------------------------------------

    def _park(self, results: list[_Result]) -> None:
        watches = []
        wanted = {w.key: w for w in self.fctx.wanted}
        for key, _code, hw, _start, _batches, _n, _lso, _aborted in results:
            channel = self._channel(key)
            if channel is not None:
                # Wake on anything durable past what was readable (hw is an offset).
                watches.append((channel, max(wanted[key].fetch_offset + 1, hw + 1)))
        remaining = self.deadline - self.ctx.broker.reactor.seconds()
        self.parked = results
        self.wait = self.store.wait_any(watches, remaining)
        self.wait.addCallbacks(self._woke, self._wait_failed)

    def _woke(self, ready: bool) -> None:
        """``ready`` False: the wait ran out, or the broker is shutting down and answers every
        parked fetch with what it has (as Kafka completes its delayed fetches on shutdown)."""
        self.wait = None
        if self.deferred is None or self.deferred.called:
            return
        parked, self.parked = self.parked, None
        try:
            if not ready and parked is not None and not self.ahead:
                # Nothing watched moved since the read the wait started from, so reading
                # every partition again would find the same: a consumer idling on 6,000
                # partitions cost the reactor 315 ms a fetch, half of it this second read.
                self.deferred.callback(self._respond(parked))
                return
            self._recheck_topics()
            results, total, errors = self._read()
            if not ready or self._satisfied(total, errors):
                self.deferred.callback(self._respond(results))
            else:
                self._park(results)
        except Exception:
            self.fctx.done()
            self.deferred.errback()

    def _recheck_topics(self) -> None:
        """Look the request's topics up again after a wait, before reading again.

        A DeleteTopics wakes the fetch as its first channel goes, while the others still
        exist: read through the topics resolved before the wait, the response would answer
        some partitions of the deleted topic as if nothing had happened. Kafka stops hosting
        every partition of a deleted topic at once and answers each UNKNOWN_TOPIC_OR_PARTITION,
        at v13+ too (the id was resolved when the request came), so a topic gone from the
        catalog is gone for the whole response."""
        catalog = self.catalog
        stamp = catalog.stamp()
        if stamp[0] is self.stamp[0] and stamp[1] == self.stamp[1]:
            return  # no topic changed: the common wake-up costs nothing more
        self.stamp = stamp
        for key, topic in self.topics.items():
            if topic is None:
                continue
            fresh = catalog.by_id(key) if self.uses_ids else catalog.get(key)
            if fresh is None:
                self.gone.add(key)
            self.topics[key] = fresh

    def _wait_failed(self, failure: Any) -> None:
        self.wait = None
        if failure.check(CancelledError):
            return None
        if self.deferred is not None and not self.deferred.called:
            self.fctx.done()
            self.deferred.errback(failure)
        return None

    def _cancel(self, _d: Deferred) -> None:
        self.fctx.done()
        wait, self.wait = self.wait, None
        if wait is not None:
            wait.cancel()

    # -- answering -------------------------------------------------------------------------

    def _respond(self, results: list[_Result]) -> Any:
        ctx = self.ctx
        t = types_of(ctx)
        fctx = self.fctx
        uses_ids = self.uses_ids
        partition_cls = t.PartitionData
        topic_cls = t.FetchableTopicResponse
        sessionless = fctx.session is None
        metrics = ctx.broker.metrics
        by_topic: dict[Hashable, list[Any]] = {}
        committed = self.committed
        aborted_cls = self.aborted_cls
        for key, code, hw, start, batches, nbytes, lso, aborted in results:
            error = code is not ErrorCode.none
            if lso < 0 or error:
                lso = hw
            if not sessionless and not fctx.include(key, error=error, has_records=nbytes > 0,
                                              high_watermark=hw, log_start_offset=start,
                                              last_stable_offset=lso):
                continue
            records = _records_value(batches)
            if nbytes:
                topic = self._topic(key[0])
                if topic is not None:
                    metrics.bytes_out(topic.name).inc(nbytes)
            by_topic.setdefault(key[0], []).append(make(
                partition_cls,
                partition_index=key[1],
                error_code=code,
                high_watermark=hw,
                last_stable_offset=lso,
                log_start_offset=start,
                aborted_transactions=None if not committed else tuple(
                    aborted_cls(producer_id=a.producer_id, first_offset=a.first - 1)
                    for a in aborted or ()),
                preferred_read_replica=-1,
                records=records,
            ))
        fctx.done()
        if uses_ids:
            responses = tuple(topic_cls(topic_id=k, partitions=tuple(ps))
                              for k, ps in by_topic.items())
        else:
            responses = tuple(topic_cls(topic=k, partitions=tuple(ps))
                              for k, ps in by_topic.items())
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                    session_id=fctx.session_id, responses=responses)


def _records_value(batches: list[memoryview]) -> bytes | memoryview | RecordChain:
    """The partition's batches as kio's ``records`` value, uncopied.

    One batch is passed as its memoryview (or the pread ``bytes`` it spans exactly); several
    as a ``RecordChain``. The connection joins the encoded response once on its way to the
    transport (see ``KafkaProtocol._write``), so stored bytes are copied exactly once.
    """
    if not batches:
        return b""
    if len(batches) == 1:
        view = batches[0]
        whole = view.obj
        if type(whole) is bytes and len(whole) == view.nbytes:
            return whole
        return view
    return RecordChain(batches)


def register(dispatcher: Dispatcher) -> None:
    """Register Fetch v4..v18 (clipped to what kio provides), answered through the
    hand-written response encoder."""
    fetch_response.install()
    dispatcher.register(API_KEY, handle, MIN_VERSION, MAX_VERSION, wait_only=True)
