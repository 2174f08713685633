"""State-machine snapshots as a directory tree of hard links.

A snapshot is what Raft installs on a lagging follower and what bounds log
replay: a copy of ``channels/`` and ``coordinator/`` taken right after a
flush, plus ``snapshot.json`` with the last applied command index.

Closed segments and their indexes are immutable (compaction and retention
replace or unlink them, never rewrite them in place), so they are hard
linked: a snapshot of a large store costs metadata, not a copy. The active
segment of each log keeps growing after the snapshot, so its bytes up to
the snapshot point are copied; its derived indexes are left to recovery to
rebuild. Unfinished files (``.part``, ``.cleaned``, ``.deleted``) are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kmqkafka.store.fsutil import fsync_dir, write_atomic
from kmqkafka.store.pagecache import drop_file, drop_tree

META = "snapshot.json"
TREES = ("channels", "coordinator")
_SKIP = (".part", ".cleaned", ".deleted")
_INDEXES = (".index", ".timeindex")


def take(data_dir: Path, dest: Path, last_applied: int) -> None:
    """Write a snapshot of ``data_dir`` into the new directory ``dest``.

    Reactor thread, with every log flushed (nothing may be appended meanwhile).
    """
    dest.mkdir(parents=True)
    for tree in TREES:
        src = data_dir / tree
        if src.exists():
            _copy_tree(src, dest / tree)
    write_atomic(dest / META, json.dumps({"last_applied": last_applied}).encode())
    fsync_dir(dest)


def _copy_tree(src: Path, dest: Path) -> None:
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not d.endswith(_SKIP) and ".deleted" not in d]
        rel = Path(root).relative_to(src)
        out = dest / rel
        out.mkdir(parents=True, exist_ok=True)
        logs = sorted(f for f in files if f.endswith(".log"))
        active = logs[-1] if logs else None
        active_stem = active[: -len(".log")] if active else None
        for name in files:
            if name.endswith(_SKIP):
                continue
            source = Path(root) / name
            if name == active:
                _copy_prefix(source, out / name, source.stat().st_size)
            elif active_stem and name.startswith(active_stem) and name.endswith(_INDEXES):
                continue  # derived from the active segment; recovery rebuilds it
            else:
                try:
                    os.link(source, out / name)
                except OSError:
                    shutil.copy2(source, out / name)
        fsync_dir(out)


def _copy_prefix(src: Path, dest: Path, size: int) -> None:
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        remaining = size
        while remaining:
            chunk = fin.read(min(remaining, 1 << 20))
            if not chunk:
                break
            fout.write(chunk)
            remaining -= len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
        drop_file(fout.fileno())  # a snapshot's copy, or an installed log's old data: cold


def last_applied(snapshot: Path) -> int:
    return int(json.loads((snapshot / META).read_bytes())["last_applied"])


def install(snapshot: Path, data_dir: Path) -> None:
    """Replace ``data_dir``'s trees with the snapshot's (the machine must be closed).

    The old trees are renamed aside first and removed only once the new ones
    are in place, so a crash leaves one complete generation.
    """
    for tree in TREES:
        current = data_dir / tree
        aside = data_dir / f"{tree}.deleted"
        if aside.exists():
            shutil.rmtree(aside)
        staged = data_dir / f"{tree}.part"
        if staged.exists():
            shutil.rmtree(staged)
        if (snapshot / tree).exists():
            _copy_tree(snapshot / tree, staged)
        else:
            staged.mkdir(parents=True)
        if current.exists():
            os.replace(current, aside)
        os.replace(staged, current)
        fsync_dir(data_dir)
        shutil.rmtree(aside, ignore_errors=True)
    drop_tree(snapshot)  # read by the copy above; its closed segments are the new ones
