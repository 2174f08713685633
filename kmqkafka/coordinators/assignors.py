"""Server-side partition assignors for KIP-848 consumer groups: ``uniform`` and ``range``.

An assignor is a pure function::

    assign(subscriptions, partition_counts, current) -> target

* ``subscriptions``: member id -> the topic ids it subscribes to (resolved, existing topics);
* ``partition_counts``: topic id -> number of partitions;
* ``current``: member id -> the previous target assignment (topic id -> partitions), used for
  stickiness;
* ``target``: member id -> topic id -> frozenset of partitions, one entry per member (possibly
  empty). Every partition of a subscribed topic is assigned to exactly one member subscribed to
  that topic; no partition is given to two members.

Topic ids are strings (``str(uuid)``) so the result is JSON-friendly. Both assignors are
deterministic: equal inputs give equal outputs (ties break on member id).
"""
from __future__ import annotations

from typing import Callable, Mapping

Assignment = dict[str, frozenset[int]]
Target = dict[str, Assignment]
Assignor = Callable[[Mapping[str, frozenset[str]], Mapping[str, int], Mapping[str, Assignment]],
                    Target]
TopicPartition = tuple[str, int]


def uniform(subscriptions: Mapping[str, frozenset[str]], partition_counts: Mapping[str, int],
            current: Mapping[str, Assignment]) -> Target:
    """Balanced and sticky: every member ends within one partition of every other member that
    could take its partitions, and keeps as many of its previous partitions as balance allows.

    Keeps previous owners first, hands unowned partitions to the least-loaded eligible member,
    then moves single partitions from the most to the least loaded eligible member while the
    gap is more than one (each move lowers the sum of squared loads, so this terminates).
    """
    members = sorted(subscriptions)
    load: dict[str, set[TopicPartition]] = {m: set() for m in members}
    owner: dict[TopicPartition, str] = {}
    for m in members:
        for topic, parts in sorted(current.get(m, {}).items()):
            if topic not in subscriptions[m] or topic not in partition_counts:
                continue
            for p in sorted(parts):
                if p < partition_counts[topic] and (topic, p) not in owner:
                    owner[(topic, p)] = m
                    load[m].add((topic, p))
    wanted = sorted(t for t in partition_counts if any(t in s for s in subscriptions.values()))
    for topic in wanted:
        eligible = [m for m in members if topic in subscriptions[m]]
        for p in range(partition_counts[topic]):
            if (topic, p) in owner:
                continue
            m = min(eligible, key=lambda m: (len(load[m]), m))
            owner[(topic, p)] = m
            load[m].add((topic, p))
    moved = True
    while moved:
        moved = False
        for donor in sorted(members, key=lambda m: (-len(load[m]), m)):
            for tp in sorted(load[donor], reverse=True):
                takers = [m for m in members if tp[0] in subscriptions[m]
                          and len(load[m]) < len(load[donor]) - 1]
                if takers:
                    taker = min(takers, key=lambda m: (len(load[m]), m))
                    load[donor].discard(tp)
                    load[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
    return {m: _by_topic(load[m]) for m in members}


def range_(subscriptions: Mapping[str, frozenset[str]], partition_counts: Mapping[str, int],
           current: Mapping[str, Assignment]) -> Target:
    """Per topic, contiguous ranges over the subscribed members sorted by member id; the first
    ``partitions % members`` members get one extra partition (Kafka's range layout, so
    co-partitioned topics land together). Not sticky."""
    out: Target = {m: {} for m in subscriptions}
    for topic, count in sorted(partition_counts.items()):
        members = sorted(m for m, subs in subscriptions.items() if topic in subs)
        if not members:
            continue
        per, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = per + (1 if i < extra else 0)
            if n:
                out[m][topic] = frozenset(range(start, start + n))
            start += n
    return out


def _by_topic(parts: set[TopicPartition]) -> Assignment:
    out: dict[str, set[int]] = {}
    for topic, p in parts:
        out.setdefault(topic, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
DEFAULT_ASSIGNOR = "uniform"

__all__ = ["ASSIGNORS", "Assignment", "Assignor", "DEFAULT_ASSIGNOR", "Target", "range_",
           "uniform"]
