"""Reserve a segment's disk blocks ahead of its writes, without changing its size.

Why: appending to a file makes ext4 allocate blocks at writeback, a piece at a time; blocks
reserved in larger steps beforehand (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``, as Kafka's
``log.preallocate`` does with a fixed-size file) cost less. Measured on this project's VM,
a 3-node cluster on loopback took 5-10 % less broker CPU per acknowledged record.

The file's size stays that of its data, so readers, recovery and retention see nothing
different; ``trim`` gives back what a closed segment did not use (a same-size truncate
frees the blocks past the end). Where ``fallocate`` is missing or refused (another
filesystem, a full disk) nothing is reserved and appends allocate as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

STEP = 8 << 20
"""The most bytes reserved at a time past the end of the data."""
MIN_STEP = 64 << 10
"""The least: a new or small segment reserves about as much as it already holds."""

_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE (linux/falloc.h)


def _load_fallocate():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):  # no libc found, or not Linux
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()


def reserve(fd: int, start: int, length: int) -> bool:
    """Reserve ``length`` bytes of blocks at ``start`` of ``fd``; False if that was not done."""
    return _fallocate is not None and _fallocate(fd, _KEEP_SIZE, start, length) == 0


def trim(fd: int, size: int) -> None:
    """Free the blocks reserved past ``size``, the end of the file's data."""
    try:
        os.ftruncate(fd, size)
    except OSError:  # the blocks stay reserved until the file goes; nothing is lost
        pass
