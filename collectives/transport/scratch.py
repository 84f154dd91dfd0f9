"""Reusable work buffers for the collectives whose work buffer is not a caller's array.

reduce_scatter and a non-root reduce need a work buffer of the whole input (the schedule reduces into it;
the caller's buffers must not hold partial sums). A fresh `np.empty` per call costs more than the collective
at large sizes: glibc serves big allocations with a new mmap, so every page is faulted in again on first
touch and unmapped at free (4 MiB: ~1,000 faults; reduce_scatter measured slower than allreduce of the same
size before this pool). The pool hands out a buffer that outlives the call and takes it back when the call
has finished with it. A buffer is only ever in one call: taken at call set-up, returned by the call's
finish (a call that fails or times out never returns its buffer, so it cannot be reused while a peer may
still be writing into it).
"""

from __future__ import annotations

import numpy as np

MAX_POOLED = 4  # buffers kept between calls (several calls may be in flight with async_op)


class ScratchPool:
    def __init__(self, max_pooled: int = MAX_POOLED) -> None:
        self._free: list[np.ndarray] = []  # uint8 buffers, not in use
        self._max = max_pooled

    def take(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A 1-D array of `count` elements of `dtype` (contents undefined), owned by the caller until give()."""
        nbytes = count * dtype.itemsize
        fitting = [i for i, b in enumerate(self._free) if b.size >= nbytes]
        if fitting:  # (indices: list.remove would compare arrays elementwise)
            raw = self._free.pop(min(fitting, key=lambda i: self._free[i].size))
        else:
            raw = np.empty(max(nbytes, 1), np.uint8)
        return raw[:nbytes].view(dtype)

    def give(self, work: np.ndarray) -> None:
        """Return a buffer from take() (its base is the pooled allocation)."""
        raw = work.base if work.base is not None else work
        while isinstance(raw.base, np.ndarray):
            raw = raw.base
        self._free.append(raw)
        if len(self._free) > self._max:
            self._free.pop(min(range(len(self._free)), key=lambda i: self._free[i].size))

    def clear(self) -> None:
        self._free.clear()

    @property
    def pooled_bytes(self) -> int:
        return sum(b.size for b in self._free)
