"""Incremental fetch sessions (KIP-227): the broker-side cache and the per-request context.

A consumer that opens a session (session id 0, epoch 0) gets a session id back; afterwards it
sends only the partitions whose fetch position changed (plus ``forgotten_topics_data`` for the
ones it drops) with the next epoch, and the broker answers only the partitions with something new
(records, a moved high watermark / log start / last stable offset, or an error). Request kinds:

============  =========  ===========================================================
session id    epoch      meaning
============  =========  ===========================================================
0             -1         sessionless full fetch (no session is created)
0             0          full fetch that opens a session (when the cache has room)
N             0          closes session N, then full fetch that opens a new session
N             -1         closes session N, then sessionless full fetch
N             > 0        incremental fetch in session N; the epoch must be the next one
                         (one that leaves the session empty closes it: sessionless)
============  =========  ===========================================================

This module is pure logic: no reactor, no store, no wire types. Time comes in as ``now``
(seconds) and session ids from an injected ``random.Random``. A partition is named by a
``PartitionKey`` = (topic key, partition index), where the topic key is the topic id for sessions
opened at Fetch v13+ and the topic name before. Reactor-thread only.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Iterator

from kio.schema.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
NO_SESSION = 0
MAX_EPOCH = 2**31 - 1

PartitionKey = tuple[Hashable, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``; wraps to 1 (0 and -1 are reserved)."""
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """What the session remembers of one partition: the client's position and what we last sent."""

    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1

    def must_respond(self, error: bool, has_records: bool, high_watermark: int,
                     log_start_offset: int, last_stable_offset: int) -> bool:
        """Whether an incremental response includes this partition; updates the cached state.

        Kafka's rule: records, an error, or a moved watermark / log start / LSO. After an error
        the cached high watermark is reset so the partition is re-sent once the error clears.
        """
        respond = has_records
        if error:
            self.high_watermark = -1
            return True
        if self.high_watermark != high_watermark:
            self.high_watermark = high_watermark
            respond = True
        if self.log_start_offset != log_start_offset:
            self.log_start_offset = log_start_offset
            respond = True
        if self.last_stable_offset != last_stable_offset:
            self.last_stable_offset = last_stable_offset
            respond = True
        return respond


@dataclass(slots=True)
class FetchSession:
    """One cached session. ``epoch`` is the epoch the next request must carry."""

    session_id: int
    epoch: int
    uses_topic_ids: bool
    partitions: OrderedDict[PartitionKey, CachedPartition] = field(default_factory=OrderedDict)
    last_used: float = 0.0
    in_use: int = 0
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class Wanted:
    """One partition the request (or the session) asks to read."""

    key: PartitionKey
    fetch_offset: int
    max_bytes: int


class FetchContext:
    """How one Fetch request is served: which partitions to read and which to answer.

    Built by ``SessionCache.new_context``. ``error`` is a top-level error (no partitions are read
    and the response carries ``session_id`` 0 and no topics).
    """

    def __init__(self, *, session_id: int, wanted: list[Wanted],
                 session: FetchSession | None = None, incremental: bool = False,
                 error: ErrorCode = ErrorCode.none) -> None:
        self.session_id = session_id
        self.wanted = wanted
        self.session = session
        self.incremental = incremental
        self.error = error

    def include(self, key: PartitionKey, *, error: bool, has_records: bool, high_watermark: int,
                log_start_offset: int, last_stable_offset: int) -> bool:
        """Record the outcome of reading ``key``; return whether the response carries it.

        Full fetches carry every partition (a session still caches what was sent); incremental
        fetches carry only partitions with news. Call once per wanted partition, at response time.
        """
        if self.session is None:
            return True
        cached = self.session.partitions.get(key)
        if cached is None:  # forgotten or evicted meanwhile: still answer what was read
            return True
        changed = cached.must_respond(error, has_records, high_watermark, log_start_offset,
                                      last_stable_offset)
        if self.incremental and has_records:
            # Kafka's rotation: a partition that returned records goes to the back of the
            # session, so the next fetch starts with the others and none starves.
            self.session.partitions.move_to_end(key)
        return changed or not self.incremental

    def done(self) -> None:
        """The response has been built (or the request was abandoned)."""
        if self.session is not None and self.session.in_use > 0:
            self.session.in_use -= 1


class SessionCache:
    """A bounded cache of fetch sessions with least-recently-used eviction.

    When the cache is full, a new session evicts, as Kafka's ``FetchSessionCache.tryEvict``
    does, the least recently used one if it has been idle for ``evict_after_s``; failing that,
    the smallest session created more than ``evict_after_s`` ago, if the new one has more
    partitions (a consumer of many partitions gains the most from a session). Otherwise the
    request is served sessionless (session id 0), which every client handles. A session a
    request is using right now is never evicted.
    """

    def __init__(self, capacity: int = 1000, evict_after_s: float = 120.0,
                 rng: random.Random | None = None) -> None:
        self.capacity = capacity
        self.evict_after_s = evict_after_s
        self._rng = rng if rng is not None else random.Random()
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        return self._sessions.pop(session_id, None)

    def new_context(
        self,
        session_id: int,
        epoch: int,
        requested: Iterable[Wanted],
        forgotten: Iterable[PartitionKey],
        *,
        uses_topic_ids: bool,
        now: float,
        sessions_supported: bool = True,
    ) -> FetchContext:
        """Interpret one Fetch request's session fields; mutates the cache (Kafka's newContext).

        ``requested`` is the request's partitions in request order; ``forgotten`` the keys of
        ``forgotten_topics_data``. ``sessions_supported`` is False below Fetch v7.
        """
        requested = list(requested)
        if not sessions_supported:
            return FetchContext(session_id=NO_SESSION, wanted=requested)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != NO_SESSION:
                self._sessions.pop(session_id, None)
            if epoch == FINAL_EPOCH:
                return FetchContext(session_id=NO_SESSION, wanted=requested)
            session = self._create(requested, uses_topic_ids, now)
            if session is None:
                return FetchContext(session_id=NO_SESSION, wanted=requested)
            session.in_use += 1
            return FetchContext(session_id=session.session_id, wanted=requested, session=session)
        session = self._sessions.get(session_id)
        if session is None:
            return FetchContext(session_id=NO_SESSION, wanted=[],
                                error=ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return FetchContext(session_id=NO_SESSION, wanted=[],
                                error=ErrorCode.invalid_fetch_session_epoch)
        if session.uses_topic_ids != uses_topic_ids:
            return FetchContext(session_id=NO_SESSION, wanted=[],
                                error=ErrorCode.fetch_session_topic_id_error)
        # Kafka's order: add or update the requested partitions, then drop the forgotten ones.
        for w in requested:
            cached = session.partitions.get(w.key)
            if cached is None:
                session.partitions[w.key] = CachedPartition(w.fetch_offset, w.max_bytes)
            else:
                cached.fetch_offset = w.fetch_offset
                cached.max_bytes = w.max_bytes
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            # Kafka's FetchManager: a session its incremental fetch left empty is closed and
            # the request served sessionless (session id 0); a later fetch in it finds no
            # session (FETCH_SESSION_ID_NOT_FOUND).
            del self._sessions[session_id]
            return FetchContext(session_id=NO_SESSION, wanted=requested)
        session.epoch = next_epoch(epoch)
        session.last_used = now
        session.in_use += 1
        self._sessions.move_to_end(session_id)
        wanted = [Wanted(k, p.fetch_offset, p.max_bytes) for k, p in session.partitions.items()]
        return FetchContext(session_id=session_id, wanted=wanted, session=session,
                            incremental=True)

    def _create(self, requested: list[Wanted], uses_topic_ids: bool,
                now: float) -> FetchSession | None:
        if self.capacity <= 0:
            return None
        partitions: OrderedDict[PartitionKey, CachedPartition] = OrderedDict(
            (w.key, CachedPartition(w.fetch_offset, w.max_bytes)) for w in requested)
        if len(self._sessions) >= self.capacity and not self._evict_one(now, len(partitions)):
            return None
        session_id = self._fresh_id()
        session = FetchSession(session_id, next_epoch(INITIAL_EPOCH), uses_topic_ids,
                               partitions, last_used=now, created=now)
        self._sessions[session_id] = session
        return session

    def _evict_one(self, now: float, size: int) -> bool:
        """Make room for a session of ``size`` partitions: drop the least recently used
        session if it is stale (LRU order: if the oldest is not stale, none is), else the
        smallest one older than ``evict_after_s`` if it is smaller than ``size``."""
        sid, oldest = next(iter(self._sessions.items()))
        if now - oldest.last_used >= self.evict_after_s and oldest.in_use == 0:
            del self._sessions[sid]
            return True
        settled = [s for s in self._sessions.values()
                   if s.in_use == 0 and now - s.created >= self.evict_after_s]
        if not settled:
            return False
        smallest = min(settled, key=lambda s: len(s.partitions))
        if len(smallest.partitions) >= size:
            return False
        del self._sessions[smallest.session_id]
        return True

    def _fresh_id(self) -> int:
        while True:
            sid = self._rng.randint(1, MAX_EPOCH)
            if sid not in self._sessions:
                return sid

    def sessions(self) -> Iterator[FetchSession]:
        return iter(self._sessions.values())


def describe(session: FetchSession) -> dict[str, Any]:
    """A loggable summary of a session."""
    return {"id": session.session_id, "epoch": session.epoch,
            "partitions": len(session.partitions)}
