"""Parked waiters fire on data, on timeout, or never after cancel — driven by a fake clock."""

from twisted.internet.task import Clock

from kmqkafka.store.waiters import Waiters


def make():
    ends = {"a": 1, "b": 1}
    clock = Clock()
    return clock, ends, Waiters(clock, lambda n: ends.get(n, 0))


def test_fires_immediately_when_data_is_there():
    clock, ends, w = make()
    ends["a"] = 5
    fired = []
    w.wait("a", 3, 10).addCallback(fired.append)
    assert fired == [True]


def test_parks_until_notify_then_fires_true():
    clock, ends, w = make()
    fired = []
    w.wait("a", 1, 10).addCallback(fired.append)
    w.notify("a")
    assert fired == []  # end did not move past 1
    ends["a"] = 2
    w.notify("a")
    assert fired == [True]
    assert len(w) == 0
    clock.advance(20)
    assert fired == [True]


def test_times_out_false():
    clock, ends, w = make()
    fired = []
    w.wait("a", 1, 0.5).addCallback(fired.append)
    clock.advance(0.49)
    assert fired == []
    clock.advance(0.02)
    assert fired == [False]
    assert len(w) == 0


def test_wait_any_fires_once_for_first_channel():
    clock, ends, w = make()
    fired = []
    w.wait_any([("a", 1), ("b", 1)], 5).addCallback(fired.append)
    ends["b"] = 3
    w.notify("b")
    ends["a"] = 3
    w.notify("a")
    assert fired == [True]
    assert len(w) == 0


def test_cancel_removes_waiter_and_timer():
    clock, ends, w = make()
    d = w.wait("a", 1, 5)
    d.addErrback(lambda f: None)
    d.cancel()
    assert len(w) == 0
    assert clock.getDelayedCalls() == []


def test_zero_timeout_without_data_is_false():
    clock, ends, w = make()
    fired = []
    w.wait("a", 1, 0).addCallback(fired.append)
    assert fired == [False]
