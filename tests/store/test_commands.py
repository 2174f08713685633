"""Commands survive encode/decode exactly, so Raft can carry them."""

from hypothesis import given, strategies as st

from kmqkafka.store import commands as c

names = st.text(min_size=1, max_size=30)
blobs = st.binary(max_size=200)


@given(names, st.integers(0, 2**62), blobs)
def test_append_round_trip(name, now, batch):
    cmd = c.Append(name, now, batch)
    assert c.decode(c.encode(cmd)) == cmd


@given(st.lists(st.tuples(blobs, st.one_of(st.none(), blobs)), max_size=5), st.integers(0, 2**40))
def test_keyed_put_round_trip(pairs, now):
    cmd = c.KeyedPut("offsets", tuple(pairs), now)
    back = c.decode(c.encode(cmd))
    assert back.family == "offsets" and back.now_ms == now
    assert [tuple(p) for p in back.pairs] == pairs


def test_nested_batch_round_trip():
    cmd = c.Batch((
        c.CreateChannel("kafka.t", "events", {"retention_ms": 1000}, False),
        c.CreateChannel("kafka.t~1"),
        c.Append("kafka.t", 5, b"\x00\x01"),
        c.QueueAck("q", (1, 2, 3)),
    ))
    back = c.decode(c.encode(cmd))
    assert back.commands[0] == cmd.commands[0]
    assert back.commands[2] == cmd.commands[2]
    assert back.commands[3].sequences == (1, 2, 3)
    assert back.commands[0].config == {"retention_ms": 1000}


def test_garbage_is_rejected():
    import pytest

    with pytest.raises(ValueError):
        c.decode(b"\xff\x00\x00\x00\x00")
    with pytest.raises(ValueError):
        c.decode(b"\x01")


def test_a_checked_append_is_encoded_as_any_other():
    """``checked`` is this node's knowledge (the produce path validated the batch): it never
    reaches the Raft log, so every other node, and a replay, checks the batch itself."""
    checked = c.Append("kafka.t", 5, b"batch", checked=True)
    assert c.encode(checked) == c.encode(c.Append("kafka.t", 5, b"batch"))
    assert c.decode(c.encode(checked)).checked is False
