"""KIP-227 fetch-session cache: session kinds, epochs, incremental selection, eviction."""
from __future__ import annotations

import random

from kio.schema.errors import ErrorCode

from kmqkafka.kafka.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    MAX_EPOCH,
    SessionCache,
    Wanted,
    next_epoch,
)

A0 = ("a", 0)
A1 = ("a", 1)
B0 = ("b", 0)


def cache(capacity: int = 10, evict_after_s: float = 120.0) -> SessionCache:
    return SessionCache(capacity, evict_after_s, random.Random(7))


def want(*keys: tuple[str, int], offset: int = 0) -> list[Wanted]:
    return [Wanted(k, offset, 1024) for k in keys]


def respond(ctx, key, *, hw: int, records: bool = False, error: bool = False) -> bool:
    return ctx.include(key, error=error, has_records=records, high_watermark=hw,
                       log_start_offset=0, last_stable_offset=hw)


def test_sessionless_full_fetch_creates_nothing() -> None:
    c = cache()
    ctx = c.new_context(0, FINAL_EPOCH, want(A0, B0), [], uses_topic_ids=False, now=0)
    assert ctx.session_id == 0 and ctx.session is None and len(c) == 0
    assert [w.key for w in ctx.wanted] == [A0, B0]
    assert respond(ctx, A0, hw=5) and respond(ctx, B0, hw=5)


def test_initial_epoch_opens_a_session_answering_every_partition() -> None:
    c = cache()
    ctx = c.new_context(0, INITIAL_EPOCH, want(A0, B0), [], uses_topic_ids=False, now=0)
    assert ctx.session_id != 0 and ctx.session_id in c and not ctx.incremental
    assert respond(ctx, A0, hw=3) and respond(ctx, B0, hw=3)
    assert c.get(ctx.session_id).epoch == 1


def test_incremental_fetch_uses_cached_partitions_and_answers_only_news() -> None:
    c = cache()
    full = c.new_context(0, INITIAL_EPOCH, want(A0, B0), [], uses_topic_ids=False, now=0)
    sid = full.session_id
    respond(full, A0, hw=3)
    respond(full, B0, hw=3)
    # Nothing changed on the client side: no partitions in the request.
    inc = c.new_context(sid, 1, [], [], uses_topic_ids=False, now=1)
    assert inc.incremental and inc.error is ErrorCode.none
    assert [w.key for w in inc.wanted] == [A0, B0]
    assert not respond(inc, A0, hw=3)          # nothing new
    assert respond(inc, B0, hw=4)              # high watermark moved
    # The client moved its position on A0 only; B0 keeps its cached offset.
    inc2 = c.new_context(sid, 2, want(A0, offset=3), [], uses_topic_ids=False, now=2)
    offsets = {w.key: w.fetch_offset for w in inc2.wanted}
    assert offsets == {A0: 3, B0: 0}
    assert respond(inc2, A0, hw=3, records=True)  # data is always answered
    assert not respond(inc2, B0, hw=4)


def test_partitions_that_returned_records_rotate_to_the_back() -> None:
    """Kafka's rotation: the next incremental fetch starts with partitions that had nothing,
    so a partition with a deep backlog cannot starve the others under a small max_bytes."""
    c = cache()
    full = c.new_context(0, INITIAL_EPOCH, want(A0, A1, B0), [], uses_topic_ids=False, now=0)
    sid = full.session_id
    for key in (A0, A1, B0):
        respond(full, key, hw=9, records=key == A0)
    inc = c.new_context(sid, 1, [], [], uses_topic_ids=False, now=1)
    assert [w.key for w in inc.wanted] == [A0, A1, B0]  # a full fetch does not rotate
    respond(inc, A0, hw=9, records=True)
    respond(inc, A1, hw=9)
    respond(inc, B0, hw=9)
    inc.done()
    inc = c.new_context(sid, 2, [], [], uses_topic_ids=False, now=2)
    assert [w.key for w in inc.wanted] == [A1, B0, A0]


def test_errors_are_always_answered_and_resent_once_cleared() -> None:
    c = cache()
    full = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=0)
    respond(full, A0, hw=3)
    inc = c.new_context(full.session_id, 1, [], [], uses_topic_ids=False, now=1)
    assert respond(inc, A0, hw=-1, error=True)
    inc = c.new_context(full.session_id, 2, [], [], uses_topic_ids=False, now=2)
    assert respond(inc, A0, hw=3)  # error went away: same hw as before, still re-sent


def test_forgotten_partitions_leave_the_session_and_new_ones_join() -> None:
    c = cache()
    full = c.new_context(0, INITIAL_EPOCH, want(A0, A1), [], uses_topic_ids=False, now=0)
    inc = c.new_context(full.session_id, 1, want(B0), [A1], uses_topic_ids=False, now=1)
    assert [w.key for w in inc.wanted] == [A0, B0]


def test_an_incremental_fetch_that_empties_the_session_closes_it() -> None:
    """Kafka's FetchManager removes a session left without partitions and serves that
    request sessionless (session id 0); the next incremental fetch in it is
    FETCH_SESSION_ID_NOT_FOUND, so the client starts over with a full fetch."""
    c = cache()
    full = c.new_context(0, INITIAL_EPOCH, want(A0, A1), [], uses_topic_ids=False, now=0)
    full.done()
    inc = c.new_context(full.session_id, 1, [], [A0, A1], uses_topic_ids=False, now=1)
    assert inc.error is ErrorCode.none and inc.session_id == 0 and inc.session is None
    assert inc.wanted == [] and full.session_id not in c
    after = c.new_context(full.session_id, 2, want(B0), [], uses_topic_ids=False, now=2)
    assert after.error is ErrorCode.fetch_session_id_not_found


def test_unknown_session_and_wrong_epoch_are_top_level_errors() -> None:
    c = cache()
    ctx = c.new_context(12345, 1, [], [], uses_topic_ids=False, now=0)
    assert ctx.error is ErrorCode.fetch_session_id_not_found and ctx.session_id == 0
    full = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=0)
    bad = c.new_context(full.session_id, 5, [], [], uses_topic_ids=False, now=1)
    assert bad.error is ErrorCode.invalid_fetch_session_epoch and bad.wanted == []
    # A wrong epoch does not consume the expected one.
    ok = c.new_context(full.session_id, 1, [], [], uses_topic_ids=False, now=1)
    assert ok.error is ErrorCode.none


def test_topic_id_mismatch_between_session_and_request() -> None:
    c = cache()
    full = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=True, now=0)
    ctx = c.new_context(full.session_id, 1, [], [], uses_topic_ids=False, now=1)
    assert ctx.error is ErrorCode.fetch_session_topic_id_error


def test_full_fetch_with_a_session_id_closes_it() -> None:
    c = cache()
    first = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=0)
    again = c.new_context(first.session_id, INITIAL_EPOCH, want(B0), [], uses_topic_ids=False,
                          now=1)
    assert first.session_id not in c and again.session_id in c
    closed = c.new_context(again.session_id, FINAL_EPOCH, want(B0), [], uses_topic_ids=False,
                           now=2)
    assert closed.session_id == 0 and len(c) == 0


def test_full_cache_evicts_only_stale_sessions() -> None:
    c = cache(capacity=2, evict_after_s=10)
    s1 = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=0)
    s1.done()
    s2 = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=5)
    s2.done()
    refused = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=6)
    assert refused.session_id == 0 and len(c) == 2  # served sessionless
    s3 = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=11)
    assert s3.session_id != 0 and s1.session_id not in c and s2.session_id in c


def test_full_cache_lets_a_larger_session_evict_the_smallest_settled_one() -> None:
    """Kafka's tryEvict: with no stale session, a new session with more partitions evicts
    the smallest session created more than the eviction time ago; never a younger one, an
    equal one, or one in use."""
    c = cache(capacity=3, evict_after_s=10)
    big = c.new_context(0, INITIAL_EPOCH, want(A0, A1, B0), [], uses_topic_ids=False, now=0)
    small = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=1)
    busy = c.new_context(0, INITIAL_EPOCH, want(B0), [], uses_topic_ids=False, now=2)
    big.done()
    small.done()
    # Keep every session fresh (none stale), busy still serving its first request.
    for t, s in ((8, big), (9, small)):
        c.new_context(s.session_id, 1, [], [], uses_topic_ids=False, now=t).done()
    young = c.new_context(0, INITIAL_EPOCH, want(A0, A1), [], uses_topic_ids=False, now=9.5)
    assert young.session_id == 0 and len(c) == 3  # the small one is not settled yet
    equal = c.new_context(0, INITIAL_EPOCH, want(A1), [], uses_topic_ids=False, now=12)
    assert equal.session_id == 0 and len(c) == 3  # one partition does not beat one
    larger = c.new_context(0, INITIAL_EPOCH, want(A0, A1), [], uses_topic_ids=False, now=12)
    assert larger.session_id != 0
    assert small.session_id not in c
    assert {big.session_id, busy.session_id, larger.session_id} <= set(
        s.session_id for s in c.sessions())
    larger.done()
    again = c.new_context(0, INITIAL_EPOCH, want(A0, A1, B0, ("c", 3)), [],
                          uses_topic_ids=False, now=13)
    # busy is the smallest but in use, larger is young: big goes.
    assert again.session_id != 0
    assert big.session_id not in c and busy.session_id in c and larger.session_id in c


def test_using_a_session_protects_it_from_eviction() -> None:
    c = cache(capacity=1, evict_after_s=10)
    s1 = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=0)
    s1.done()
    c.new_context(s1.session_id, 1, [], [], uses_topic_ids=False, now=9).done()
    refused = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=15)
    assert refused.session_id == 0 and s1.session_id in c


def test_epoch_wraps_to_one() -> None:
    assert next_epoch(1) == 2 and next_epoch(MAX_EPOCH) == 1


def test_below_v7_there_are_no_sessions() -> None:
    c = cache()
    ctx = c.new_context(0, INITIAL_EPOCH, want(A0), [], uses_topic_ids=False, now=0,
                        sessions_supported=False)
    assert ctx.session_id == 0 and len(c) == 0


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

KEYS = [("a", 0), ("a", 1), ("b", 0), ("c", 3)]
step = st.tuples(
    st.dictionaries(st.sampled_from(KEYS), st.integers(0, 100), max_size=3),  # (re)fetched
    st.sets(st.sampled_from(KEYS), max_size=2),                              # forgotten
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 100), min_size=1),
       st.lists(step, max_size=12))
def test_session_partitions_follow_the_requests(initial: dict, steps: list) -> None:
    """After any sequence of incremental fetches the session holds exactly what a model says:
    forgotten partitions leave, fetched ones join or move, everything else keeps its offset."""
    c = cache()
    model = dict(initial)
    full = c.new_context(0, INITIAL_EPOCH, [Wanted(k, o, 1) for k, o in initial.items()], [],
                         uses_topic_ids=False, now=0)
    sid, epoch = full.session_id, 1
    for fetched, forgotten in steps:
        ctx = c.new_context(sid, epoch, [Wanted(k, o, 1) for k, o in fetched.items()], forgotten,
                            uses_topic_ids=False, now=epoch)
        model.update(fetched)
        for k in forgotten:  # forgetting wins over fetching in the same request, as in Kafka
            model.pop(k, None)
        assert ctx.error is ErrorCode.none
        if not model:  # emptied: Kafka closes the session and answers sessionless
            assert ctx.session_id == 0 and sid not in c
            break
        assert {w.key: w.fetch_offset for w in ctx.wanted} == model
        ctx.done()
        epoch += 1
