"""Split one large reduction across threads: each thread folds a contiguous slice of the elements.

One core cannot saturate memory bandwidth (it is bound by how many cache-line misses it keeps in flight), so
a reduction of a large array finishes sooner when two or more cores fold disjoint slices of it. Every backend
releases the GIL (cffi calls, ``nogil`` Numba functions, numpy ufuncs), so plain Python threads run in
parallel. Results are bitwise identical to the single-threaded fold: every element is still folded left to
right over the inputs, only by a different core.

Threads used per call: ``set_threads(n)``, else the environment variable ``COLLECTIVES_KERNEL_THREADS``, else
the CPUs this process may run on (``os.sched_getaffinity``), at most 8. Under ``mpiexec`` the transport lowers
it to the CPUs per rank on the host, so ranks do not oversubscribe cores. Small calls stay on the calling
thread: a slice below ``MIN_SLICE_BYTES`` costs more to hand over than it gains (measurements below).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .. import environment

MAX_DEFAULT_THREADS = 8
# Bytes of out per thread below which splitting does not pay. Measured (2-core EPYC VM, float32 2-input sum,
# median of 30-200 calls, 1 thread vs 2): 1 MiB out 27 vs 51 us, 4 MiB 105 vs 143 us, 8 MiB 191 vs 170 us,
# 16 MiB 717 vs 586 us: handing a slice to a pool thread costs ~25 us, and arrays that fit the L3 gain little.
MIN_SLICE_BYTES = 4 << 20
ALIGN_ELEMENTS = 4096  # slice boundaries on whole pages / cache lines for every dtype

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_threads: int | None = None


def _default_threads() -> int:
    value = environment.get("COLLECTIVES_KERNEL_THREADS")
    if value is not None:
        return value
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_THREADS))


def get_threads() -> int:
    """Threads one large reduction is split across."""
    global _threads
    if _threads is None:
        _threads = _default_threads()
    return _threads


def set_threads(n: int | None) -> None:
    """Split large reductions across ``n`` threads (1: never split; None: back to the default)."""
    global _threads
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be a positive integer or None, got {n!r}")
    _threads = n if n is not None else _default_threads()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collectives-kernel")
            _pool_size = workers
        return _pool


def run_split(fold: Callable[[np.ndarray, list[np.ndarray]], None], out: np.ndarray,
              inputs: list[np.ndarray]) -> None:
    """``fold(out, inputs)`` on flat arrays, split into per-thread slices when large enough."""
    n = out.size
    parts = min(get_threads(), n * out.itemsize // MIN_SLICE_BYTES)
    if parts < 2:
        fold(out, inputs)
        return
    step = -(-n // parts)
    step = -(-step // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
    bounds = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    pool = _executor(len(bounds) - 1)
    futures: list[Future] = [pool.submit(fold, out[lo:hi], [x[lo:hi] for x in inputs]) for lo, hi in bounds[1:]]
    lo, hi = bounds[0]
    try:
        fold(out[lo:hi], [x[lo:hi] for x in inputs])  # the calling thread takes the first slice
    finally:
        for f in futures:
            f.result()  # re-raises a worker's exception
