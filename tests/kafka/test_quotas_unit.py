"""Byte-rate quota arithmetic, on explicit time."""

import pytest

from kmqkafka.kafka.quotas import ByteRateQuota


def test_zero_rate_never_throttles():
    q = ByteRateQuota(0)
    assert q.record("c", 10**9, 0.0) == 0.0


def test_one_second_of_burst_then_delay_proportional_to_debt():
    q = ByteRateQuota(1000)
    assert q.record("c", 1000, 0.0) == 0.0          # the burst allowance
    assert q.record("c", 500, 0.0) == pytest.approx(0.5)  # 500 bytes of debt at 1000 B/s
    # After the debt is repaid and half a second more, 500 bytes are free again.
    assert q.record("c", 500, 1.0) == 0.0


def test_clients_are_charged_separately():
    q = ByteRateQuota(100)
    assert q.record("a", 300, 0.0) == pytest.approx(2.0)
    assert q.record("b", 100, 0.0) == 0.0


def test_sustained_rate_converges_to_the_quota():
    q = ByteRateQuota(10_000)
    now, sent = 0.0, 0
    for _ in range(1000):
        now += q.record("c", 1000, now)  # a client that waits out every throttle
        sent += 1000
    assert sent / now == pytest.approx(10_000, rel=0.02)
