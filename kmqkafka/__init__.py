"""kmqkafka: a Kafka-wire-compatible broker on a durable, Raft-replicated channel store."""
from __future__ import annotations

import sys


def _load_codec_without_hypothesis() -> None:
    """Import kio's type layer with Hypothesis hidden from it.

    Wherever Hypothesis is installed (it is a test dependency, so any machine that ran the
    tests), kio registers a search strategy for each of its types as they are defined, and
    Hypothesis builds its Unicode tables for that: about 2 s and 180 MB at every start of
    the daemon (its peak RSS was 253 MB while the resident set was 70 MB), plus a
    ``.hypothesis`` directory in its working directory. The broker never generates test
    data; a process that imported Hypothesis first (a test run) is left as it is."""
    if "hypothesis" in sys.modules or "kio.static._phantom" in sys.modules:
        return
    sys.modules["hypothesis"] = None  # type: ignore[assignment]  # import fails: ImportError
    try:
        import kio.static._phantom  # noqa: F401
    finally:
        del sys.modules["hypothesis"]


_load_codec_without_hypothesis()
