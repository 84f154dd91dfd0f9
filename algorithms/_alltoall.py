"""Block geometry shared by the alltoall builders: sizes and places of every block, uniform or alltoallv.

Vocabulary (the contract, collectives/schedule/collective.py): rank r's input is p *blocks*, block d for rank d;
its output is p blocks, block s from rank s. Block (s -> d) has `size(s, d)` elements: k for alltoall,
counts[s, d] for alltoallv. It starts at `in_at(s, d)` in rank s's work buffer (the input region) and lands at
`out_at(d, s)` in rank d's (the output region). Everything is numpy-elementwise and, for the uniform form,
closed-form: a rank's program evaluates only the blocks it moves.
"""

from __future__ import annotations

import numpy as np

from collectives.schedule import recv, send
from collectives.schedule.collective import displacements, work_size


class AlltoallBlocks:
    def __init__(self, collective: str, world_size: int, count: int, counts=None) -> None:
        if collective not in ("alltoall", "alltoallv"):
            raise ValueError(f"alltoall builders implement alltoall and alltoallv, not {collective}")
        self.p = world_size
        self.count = count
        self.uniform = collective == "alltoall"
        self.work = work_size(collective, world_size, count, counts)  # the contract's input + output regions
        if self.uniform:
            self.k = count // world_size
            self.largest = self.k
        else:
            self.counts = np.asarray(counts, dtype=np.int64)
            self.send_at, self.recv_at = displacements(self.counts)
            self.largest = int(self.counts.max(initial=0))

    def size(self, src, dst):
        if self.uniform:
            return np.broadcast_to(np.int64(self.k), np.broadcast_shapes(np.shape(src), np.shape(dst)))
        return self.counts[src, dst]

    def in_at(self, rank, dst):
        """Where block (rank -> dst) starts in rank's input region."""
        if self.uniform:
            return np.asarray(dst, dtype=np.int64) * self.k + 0 * np.asarray(rank)
        return self.send_at[rank, dst]

    def out_at(self, rank, src):
        """Where block (src -> rank) starts in rank's output region."""
        if self.uniform:
            return self.count + np.asarray(src, dtype=np.int64) * self.k + 0 * np.asarray(rank)
        return self.count + self.recv_at[src, rank]

    def in_out_layout(self, rank, b):
        """(start, size) of block b of `rank` when blocks 0..p-1 are its input blocks (by destination) and blocks
        p..2p-1 its output blocks (by source)."""
        p = self.p
        is_in = b < p
        other = np.where(is_in, b, b - p)
        start = np.where(is_in, self.in_at(rank, other), self.out_at(rank, other))
        size = np.where(is_in, self.size(rank, other), self.size(other, rank))
        return start, size


def local_block_slots(p: int):
    """Slot function of the local step: member m copies its input block m to its output block m (a message to
    itself; chunk ids of an `in_out_layout` table)."""

    def slots(m, it):
        return [send(m, m, remote=p + m), recv(m, p + np.asarray(m), remote=m)]

    return slots
