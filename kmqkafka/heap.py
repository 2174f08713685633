"""Keep the garbage collector's full passes and the kernel's page faults off the request path.

A full (generation 2) collection walks every tracked object. Right after start-up that is some
75,000 objects (modules, the codec's classes, recovered store state) and each pass stalled the
reactor for 25-50 ms on a 2-vCPU VM: every produce acknowledged and every parked fetch answered
in that window waited for it. Those objects live as long as the process, so once the broker is
ready they are collected once and frozen: later full passes walk only what was made since.

Every produced MiB arrives in a buffer of its own and is copied once or twice more on its way to
the log (and to each follower). glibc gives such blocks fresh pages from the kernel and hands
them back when freed, so each one was paid for again in page faults: on the 2-vCPU VM these
were the hottest lines of a cluster leader and its followers. ``keep_freed_memory`` lets freed
blocks of up to 32 MiB go back to the heap and be reused instead.
"""
from __future__ import annotations

import ctypes
import gc

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts; bigger blocks (rare) still come from mmap
TRIM_THRESHOLD = 128 << 20  # free memory kept at the heap's top before it is given back


def settle_heap() -> int:
    """Collect, then freeze what survives; returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD,
                      trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Serve large blocks from the heap and keep freed ones there (glibc); False where the C
    library has no such knobs (musl, macOS), which is harmless: only speed depends on it."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_threshold))
