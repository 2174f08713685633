"""Replication errors a store caller can see; all are ``StoreError``s.

Kafka handlers map ``NoLeaderError``/``NotLeaderError`` to NOT_LEADER_OR_FOLLOWER (6) and
``CommitTimeout``/``ProposalLost`` to REQUEST_TIMED_OUT (7): the outcome of the latter is unknown.
"""
from __future__ import annotations

from kmqkafka.store.errors import StoreError


class ReplicationError(StoreError):
    """A command could not be (or is not known to have been) committed."""


class NoLeaderError(ReplicationError):
    """No leader was known within the proposal timeout; the command was never proposed."""


class NotLeaderError(ReplicationError):
    """This node cannot order the command; ``leader`` is the best-known leader (or None)."""

    def __init__(self, message: str, leader: int | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class MalformedCommand(ReplicationError):
    """A forwarded command this node could not apply: refused before it reaches the log, where
    every member would meet it at apply."""


class ProposalLost(ReplicationError):
    """The command's log entry was replaced by another leader's: it was not applied."""


class CommitTimeout(ReplicationError):
    """The command was proposed but not applied here within the timeout (outcome unknown)."""


class TransportError(ReplicationError):
    """A peer could not be reached or the connection dropped mid-request."""
