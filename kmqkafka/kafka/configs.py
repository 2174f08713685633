"""Placeholder: handlers of this area register here (being written)."""

from kmqkafka.dispatch import Dispatcher


def register(dispatcher: Dispatcher) -> None:
    """Register this area's handlers on ``dispatcher``."""
