"""The dynamic broker defaults of topic configs against a change made at the same time, on a real
store over ``task.Clock``: whichever of a topic's creation and a defaults change is applied
last, the topic's channel ends with the log config the defaults in force call for (on a
cluster both are proposed before either applies)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from kmqkafka.kafka.topics import TopicCatalog
from kmqkafka.store.store import ChannelStore


class HeldProposals:
    """The store, with proposals held until ``release`` applies them in a chosen order."""

    def __init__(self, store: ChannelStore) -> None:
        self._store = store
        self.held: list[tuple[Any, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def propose(self, command: Any) -> Any:
        from twisted.internet.defer import Deferred

        d: Deferred = Deferred()
        self.held.append((command, d))
        return d

    def release(self, index: int) -> None:
        command, d = self.held.pop(index)
        self._store.propose(command).chainDeferred(d)


@pytest.mark.parametrize("create_first", [True, False])
def test_a_topic_created_during_a_defaults_change_follows_it(tmp_path: Path,
                                                            create_first: bool) -> None:
    clock = Clock()
    clock.advance(1_700_000_000)
    store = ChannelStore(tmp_path / "data", clock, threaded_io=False)
    store.start()
    held = HeldProposals(store)
    catalog = TopicCatalog(held)
    created = catalog.create("late", 1)
    changed = catalog.set_cluster_defaults({"retention.ms": "60000"}, replace=False)
    # Apply them in the order under test; anything they propose afterwards applies at once.
    held.release(0 if create_first else 1)
    held.release(0)
    while held.held:
        held.release(0)
    clock.advance(1)
    assert created.called and changed.called
    while held.held:
        held.release(0)
    clock.advance(1)
    assert store.config("kafka.late").retention_ms == 60000
