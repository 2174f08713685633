"""An in-memory stand-in for the store's keyed families (durable at once unless held)."""
from __future__ import annotations

from typing import Iterable, Iterator

from twisted.internet.defer import Deferred, succeed


class KeyedStore:
    """``keyed_put``/``keyed_items`` over dicts; ``hold = True`` parks puts until ``release()``."""

    def __init__(self) -> None:
        self.families: dict[str, dict[bytes, bytes]] = {}
        self.hold = False
        self.held: list[Deferred] = []
        self.puts = 0

    def keyed_put(self, family: str, pairs: Iterable[tuple[bytes, bytes | None]]) -> Deferred:
        data = self.families.setdefault(family, {})
        for k, v in pairs:
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        self.puts += 1
        if self.hold:
            d: Deferred = Deferred()
            self.held.append(d)
            return d
        return succeed(None)

    def keyed_items(self, family: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        return iter([(k, v) for k, v in self.families.get(family, {}).items()
                     if k.startswith(prefix)])

    def release(self) -> None:
        held, self.held = self.held, []
        for d in held:
            d.callback(None)
