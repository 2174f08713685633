"""Responses handed unchanged to many clients, encoded once.

A full Metadata response of a quiet cluster is the same object for every client that asks
(``kafka/metadata.py`` keeps it); encoding its thousands of topics field by field took as long
as building it. A handler marks such a response with ``share``; the protocol then encodes its
body the first time it is written and reuses those bytes for as long as the response is
among the newest ``SIZE`` shared ones. Only the body is kept: the header (correlation id)
is encoded per request.

Reactor thread only.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, TypeVar

SIZE = 16

_R = TypeVar("_R")
_bodies: OrderedDict[int, tuple[Any, bytes | None]] = OrderedDict()


def share(response: _R) -> _R:
    """Mark ``response`` as sent to many clients unchanged (a kio response, immutable)."""
    key = id(response)
    if key in _bodies and _bodies[key][0] is response:
        _bodies.move_to_end(key)
        return response
    _bodies[key] = (response, None)
    while len(_bodies) > SIZE:
        _bodies.popitem(last=False)
    return response


def body(response: Any) -> bytes | None:
    """The encoded body of a shared response, if it was encoded already."""
    found = _bodies.get(id(response))
    return found[1] if found is not None and found[0] is response else None


def encoded(response: Any, encode: Callable[[Any], bytes]) -> bytes | None:
    """The body of a shared response, encoded with ``encode`` the first time it is asked
    for; None for a response that is not (or no longer) shared."""
    key = id(response)
    found = _bodies.get(key)
    if found is None or found[0] is not response:
        return None
    if found[1] is None:
        found = _bodies[key] = (response, encode(response))
    return found[1]
