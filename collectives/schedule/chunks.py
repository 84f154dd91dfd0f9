"""Chunk tables: how a phase splits its share of the buffer into element ranges.

Two kinds, one interface (`nchunks`, `length`, `elements(group, lo, hi, member)`):

* `ChunkTable`: per group, one element range split into near-equal blocks and sub-chunks; every member of a
  group sees the same ranges (the position invariant's tables).
* `BlockTable`: per member, blocks at per-member offsets with per-member sizes, given by a function evaluated
  lazily (an alltoallv's blocks are a counts matrix's rows and columns; one rank's program evaluates only the
  blocks it touches).
"""

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

    def elements(self, group, lo, hi, member=None):
        """Element range [start, stop) of chunks [lo, hi) in `group` (elementwise on arrays); every member of a
        group sees the same ranges, so `member` is not used."""
        off = self.offset[group] if self.offset.ndim else self.offset
        length = self.length[group] if self.length.ndim else self.length
        # split_points(length, blocks, block) inlined, with the quotient computed once for both ends
        q, r = np.divmod(length, self.blocks)
        if self.sub == 1:  # chunk i is block i
            return off + (lo * q + np.minimum(lo, r)), off + (hi * q + np.minimum(hi, r))
        return off + self._start(q, r, lo), off + self._start(q, r, hi)

    def _start(self, q, r, chunk):
        """First element of `chunk` (sub > 1), relative to the group's offset, given divmod(length, blocks)."""
        block, s = np.divmod(chunk, self.sub)
        b0 = block * q + np.minimum(block, r)
        nxt = np.minimum(block + 1, self.blocks)
        return b0 + split_points(nxt * q + np.minimum(nxt, r) - b0, self.sub, s)


class BlockTable:
    """Per member m of group g: `blocks` blocks, block b at elements [start, start + size) where
    `(start, size) = layout(g, m, b)`, each block split into `sub` near-equal sub-chunks; chunk id b*sub + s.

    `layout` must work elementwise on numpy arrays (g, m and b broadcast together) and is called only for the
    chunks a program touches, so a table over p members costs nothing until used. Blocks may overlap (two views
    of one scratch slot holding blocks of different sizes in different rounds) and need not be adjacent: a range
    of chunk ids [lo, hi) is [start of chunk lo, end of chunk hi - 1), so a range that spans non-adjacent blocks
    also covers what lies between them. `length` (per group) is the group's buffer share the analytic simulator
    uses for a chunk's mean size (default: the sum of member 0's block sizes).
    """

    __slots__ = ("layout", "blocks", "sub", "length", "offset")

    def __init__(self, layout, blocks: int, sub: int = 1, groups: int = 1, length=None) -> None:
        if blocks < 1 or sub < 1:
            raise ValueError(f"a block table needs at least one block and one sub-chunk, got {blocks} x {sub}")
        self.layout = layout
        self.blocks = int(blocks)
        self.sub = int(sub)
        if length is None:
            g = np.arange(int(groups), dtype=np.int64)[:, None]
            _, size = layout(g, np.zeros_like(g), np.arange(self.blocks, dtype=np.int64)[None, :])
            length = np.broadcast_to(np.asarray(size, dtype=np.int64), (int(groups), self.blocks)).sum(axis=1)
        self.length = np.atleast_1d(np.asarray(length, dtype=np.int64))
        self.offset = np.zeros_like(self.length)

    @property
    def nchunks(self) -> int:
        return self.blocks * self.sub

    def _chunk(self, group, member, chunk, end: bool):
        block, s = np.divmod(np.asarray(chunk, dtype=np.int64), self.sub)
        inside = (block >= 0) & (block < self.blocks)
        start, size = self.layout(group, member, np.minimum(np.maximum(block, 0), self.blocks - 1))
        start, size = np.asarray(start, dtype=np.int64), np.asarray(size, dtype=np.int64)
        if np.any(~inside):
            raise ValueError(f"chunk ids must be in [0, {self.nchunks}), got {np.asarray(chunk)[~inside].ravel()[:4]}")
        return start + split_points(size, self.sub, s + 1 if end else s)

    def elements(self, group, lo, hi, member=None):
        """Element range [start, stop) of chunks [lo, hi) of `member` in `group` (elementwise on arrays); an
        empty range sits at the start of chunk lo (at the end of the last chunk when lo == nchunks)."""
        if member is None:
            raise ValueError("a BlockTable's ranges differ per member: pass member=")
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        n = self.nchunks
        past = lo >= n
        start = self._chunk(group, member, np.where(past, n - 1, lo), False)
        start = np.where(past, self._chunk(group, member, np.full_like(lo, n - 1), True), start)
        stop = self._chunk(group, member, np.where(hi > lo, hi - 1, np.minimum(lo, n - 1)), True)
        return start, np.where(hi > lo, stop, start)
