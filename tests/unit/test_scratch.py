"""The transport's pool of work buffers (collectives/transport/scratch.py)."""

import numpy as np

from collectives.transport.scratch import ScratchPool


def test_buffers_are_reused_only_after_they_are_given_back():
    pool = ScratchPool(max_pooled=2)
    a = pool.take(1000, np.dtype(np.float32))
    b = pool.take(1000, np.dtype(np.float32))
    assert a.shape == (1000,) and a.dtype == np.float32
    assert not np.shares_memory(a, b)  # both in use: distinct memory
    pool.give(a)
    c = pool.take(10, np.dtype(np.int64))  # smaller request, other dtype: served from a's memory
    assert np.shares_memory(a, c) and c.shape == (10,) and c.dtype == np.int64
    pool.give(b)
    pool.give(c)
    assert pool.pooled_bytes == 8000


def test_pool_keeps_at_most_max_and_drops_the_smallest():
    pool = ScratchPool(max_pooled=2)
    bufs = [pool.take(n, np.dtype(np.uint8)) for n in (10, 300, 20)]
    for b in bufs:
        pool.give(b)
    assert pool.pooled_bytes == 320  # 10 dropped
    big = pool.take(250, np.dtype(np.uint8))
    assert np.shares_memory(big, bufs[1])  # the smallest buffer that fits
    pool.clear()
    assert pool.pooled_bytes == 0
