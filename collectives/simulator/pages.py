"""Memory pages for costing huge clusters: numpy's huge-page advice off while the engine runs.

On Linux numpy advises the kernel to back every array of 4 MiB or more with transparent huge pages
(madvise(MADV_HUGEPAGE); numpy's NUMPY_MADVISE_HUGEPAGE). Where the kernel answers that advice by compacting
memory until it finds a free 2 MiB page (/sys/kernel/mm/transparent_hugepage/defrag = madvise, a common
default), each such array costs a fault that can take milliseconds once the process holds a few GiB, as the
analytic model's caches of a 331,776-GPU cluster do. Costing such a cluster allocates thousands of short-lived
arrays of millions of elements (a pipeline's hops, loads, groups), and with the advice the kernel's share of its
time reached that of numpy's own work. `ordinary_pages()` switches the advice off for the duration of an engine
call on a cluster above the analytic model's dataflow limit and restores it afterwards (nested and concurrent
calls keep it off until the last one returns). Results do not change: only where the kernel takes pages from.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np


def _advice_switch():
    """numpy's setter of the huge-page advice (returns the previous setting), or None where numpy has none."""
    for module in (getattr(np, "_core", None), getattr(np, "core", None)):
        multiarray = getattr(module, "multiarray", None)
        setter = getattr(multiarray, "_set_madvise_hugepage", None)
        if setter is not None:
            return setter
    return None


_SET_ADVICE = _advice_switch()
_LOCK = threading.Lock()
_ACTIVE = 0  # engine calls inside ordinary_pages() right now
_SAVED: bool | None = None  # the advice as the first of them found it


@contextlib.contextmanager
def ordinary_pages(enabled: bool = True) -> Iterator[None]:
    """Within the block numpy gives no huge-page advice for new arrays (when `enabled`); the advice as it was is
    restored when the last block still open exits."""
    global _ACTIVE, _SAVED
    if not enabled or _SET_ADVICE is None:
        yield
        return
    with _LOCK:
        if _ACTIVE == 0:
            _SAVED = bool(_SET_ADVICE(False))
        _ACTIVE += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE -= 1
            if _ACTIVE == 0:
                _SET_ADVICE(_SAVED)


__all__ = ["ordinary_pages"]
