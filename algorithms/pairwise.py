"""Pairwise exchange: alltoall in p - 1 rounds, one partner each way per round.

Vocabulary (the alltoall contract): rank r's input is p *blocks*, block d for rank d; its output is p blocks,
block s from rank s. At *shift* t = 1..p-1, rank r sends input block r+t to rank r+t, which stores it as its
output block r, and receives from rank r-t that rank's input block r into its output block r-t (mod p). Before
the first shift each rank copies its own block r from input to output (a message to itself: no link crossed).

Every message lands at a different offset than it is read from (input region -> output region): each slot
names the peer's chunk with `remote`. alltoallv uses the same pattern over the counts matrix's blocks (empty
blocks are empty messages). Cost: p - 1 rounds, each rank sends (p-1)/p of its input, one message per round;
the fewest bytes and the most latency terms of the three alltoall schedules (compare bruck, hierarchical_alltoall).
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import BlockTable, Phase, Round, Schedule, recv, send

from ._alltoall import AlltoallBlocks, local_block_slots


def pairwise_table(blocks: AlltoallBlocks) -> BlockTable:
    """Chunk b < p: input block b (for rank b); chunk p + s: output block s (from rank s)."""
    return BlockTable(lambda g, m, b: blocks.in_out_layout(m, b), 2 * blocks.p)


@register("pairwise", ("alltoall", "alltoallv"),
          summary="pairwise exchange: p-1 rounds, at shift t send input block r+t to rank r+t, receive from r-t")
def build_pairwise(collective: str, world_size: int, count: int, *, root=None, topology=None,
                   counts=None) -> Schedule:
    p = world_size
    blocks = AlltoallBlocks(collective, p, count, counts)

    def shift(m, it):
        t = np.asarray(it) + 1
        to, frm = (m + t) % p, (m - t) % p
        return [send(to, to, remote=p + m), recv(frm, p + frm, remote=m)]

    rounds = [Round(local_block_slots(p), repeats=1, name="local block"),
              Round(shift, repeats=p - 1, uniform=blocks.uniform, name="pairwise shift")]
    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Schedule("pairwise", collective, p, count, [Phase("pairwise exchange", ranks, pairwise_table(blocks),
                                                             rounds)], topology=topology, counts=counts)
