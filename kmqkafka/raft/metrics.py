"""Prometheus view of this node's Raft state, read at scrape time.

Operators of a cluster need to see who leads, whether terms churn (elections), how far commit
and apply trail the log, which peer links are up, and how far each follower lags the leader;
none of it costs anything between scrapes.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kmqkafka.raft.core import Role


class RaftCollector:
    """Collects from the proposer ``get_proposer()`` returns (None before the store opened)."""

    def __init__(self, get_proposer: Callable[[], Any], election_timeout_s: float) -> None:
        self._get = get_proposer
        self._window = election_timeout_s

    def collect(self) -> Iterator[Any]:
        proposer = self._get()
        driver = getattr(proposer, "driver", None)
        if driver is None:
            return
        node = driver.node
        yield _gauge("kmqkafka_raft_term", "Current Raft term", node.term)
        yield _gauge("kmqkafka_raft_leader_id", "Node id of the known Raft leader (-1: none)",
                     node.leader if node.leader is not None else -1)
        role = GaugeMetricFamily("kmqkafka_raft_role", "1 for this node's current Raft role",
                                 labels=["role"])
        for r in Role:
            role.add_metric([r.value], 1 if node.role is r else 0)
        yield role
        yield _gauge("kmqkafka_raft_last_log_index", "Index of the last entry in the Raft log",
                     node.last_index)
        yield _gauge("kmqkafka_raft_commit_index", "Highest Raft index known committed",
                     node.commit_index)
        yield _gauge("kmqkafka_raft_applied_index", "Highest Raft index applied to the store",
                     node.applied_index)
        yield _gauge("kmqkafka_raft_snapshot_index", "Raft index the log was compacted to",
                     node.snapshot_index)
        yield _gauge("kmqkafka_raft_voters", "Voting members in the current configuration",
                     len(node.voters))
        storage = getattr(driver, "storage", None)
        if storage is not None and hasattr(storage, "wal_bytes"):
            yield _gauge("kmqkafka_raft_log_bytes", "Bytes in the Raft log files",
                         storage.wal_bytes)
        readies = CounterMetricFamily("kmqkafka_raft_readies", "Raft Ready batches processed")
        readies.add_metric([], driver.ready_count)
        yield readies
        transport = getattr(proposer, "transport", None)
        if transport is not None:
            up = GaugeMetricFamily("kmqkafka_raft_peer_up",
                                   "1 while this node has a working Raft link to the peer",
                                   labels=["peer"])
            live = transport.live_peers(self._window)
            for peer in sorted(node.voters - {node.id}):
                up.add_metric([str(peer)], 1 if peer in live else 0)
            yield up
        match = node.match_indexes()
        if match:
            lag = GaugeMetricFamily("kmqkafka_raft_peer_lag_entries",
                                    "Leader only: entries the peer's log trails this log by",
                                    labels=["peer"])
            for peer, index in sorted(match.items()):
                lag.add_metric([str(peer)], max(node.last_index - index, 0))
            yield lag


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g
