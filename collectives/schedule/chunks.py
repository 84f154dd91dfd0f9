"""Chunk tables: how a phase splits its share of the buffer into element ranges."""

from __future__ import annotations

import numpy as np


def split_points(length, parts: int, index):
    """Start offset of part `index` when `length` elements are split into `parts` near-equal parts.

    The first `length % parts` parts get one element more. Works elementwise on numpy arrays; index may
    equal `parts` (giving `length`), so part i spans [split_points(i), split_points(i + 1)).
    """
    q, r = np.divmod(length, parts)
    return index * q + np.minimum(index, r)


class ChunkTable:
    """Per group g: elements [offset[g], offset[g] + length[g]) split into `blocks` near-equal blocks, and each
    block into `sub` near-equal sub-chunks; chunk id b*sub + s is sub-chunk s of block b.

    Two levels keep block boundaries where a collective's contract needs them (reduce_scatter's output block r
    is exactly [r*k, (r+1)*k)) while pipelining splits each block further. A range of chunk ids [lo, hi) maps to
    one contiguous element range; empty chunks are legal (counts smaller than the chunk count) and cost only
    latency.
    """

    __slots__ = ("offset", "length", "blocks", "sub")

    def __init__(self, offset, length, blocks: int, sub: int = 1) -> None:
        if blocks < 1 or sub < 1:
            raise ValueError(f"a chunk table needs at least one block and one sub-chunk, got {blocks} x {sub}")
        self.offset = np.asarray(offset, dtype=np.int64)
        self.length = np.asarray(length, dtype=np.int64)
        if np.any(self.length < 0):
            raise ValueError("chunk table lengths must be >= 0")
        self.blocks = int(blocks)
        self.sub = int(sub)

    @property
    def nchunks(self) -> int:
        return self.blocks * self.sub

    @classmethod
    def whole(cls, count: int, blocks: int, sub: int = 1, groups: int = 1) -> ChunkTable:
        """Every group splits the whole buffer [0, count)."""
        return cls(np.zeros(groups, np.int64), np.full(groups, count, np.int64), blocks, sub)

    def _start(self, length, chunk):
        block, s = np.divmod(chunk, self.sub)
        b0 = split_points(length, self.blocks, block)
        if self.sub == 1:
            return b0
        blen = split_points(length, self.blocks, np.minimum(block + 1, self.blocks)) - b0
        return b0 + split_points(blen, self.sub, s)

    def elements(self, group, lo, hi):
        """Element range [start, stop) of chunks [lo, hi) in `group` (elementwise on arrays)."""
        off = self.offset[group] if self.offset.ndim else self.offset
        length = self.length[group] if self.length.ndim else self.length
        return off + self._start(length, lo), off + self._start(length, hi)
