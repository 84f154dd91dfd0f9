"""Bruck's alltoall: ceil(lg p) rounds instead of p - 1, each moving about half of every rank's data.

Vocabulary (the alltoall contract): rank r's input is p *blocks*, block d for rank d; its output is p blocks,
block s from rank s. Bruck's algorithm names the block of rank r destined to rank r + i (mod p) by its
*position* i: it must travel i ranks forward. In *round* k = 0, 1, ..., every rank sends to rank r + 2^k (and
receives from r - 2^k) every block whose position has bit k set, so a block at position i hops once per set bit
of i, lowest bit first, and arrives after round (highest bit of i). The classic algorithm rotates the input
into a temporary array before the rounds and back after them; with per-end ranges no rotation is needed:

* a block's first hop (its lowest set bit) reads it straight from the sender's input block;
* its last hop (its highest set bit) writes it straight into the receiver's output block (from rank r' - i);
* between hops it waits in the holder's *slot* i of a scratch region (p slots of the largest block size):
  a slot is overwritten in the round its old block leaves (reads see the round's start), never earlier.

Position 0 (a rank's own block) is a local copy. A round sends the positions with bit k set as several
messages (slots) of one round, so the simulators charge one round's latency for all of them: lg p latency
terms against pairwise's p - 1, for about (lg p)/2 times the bytes. alltoallv: a slot holds different blocks in
different rounds, so each round has its own block table (one phase per round) giving each slot the size of the
block it holds then.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import BlockTable, Phase, Regions, Round, Schedule, recv, send

from ._alltoall import AlltoallBlocks, local_block_slots
from .pairwise import pairwise_table


def num_rounds(p: int) -> int:
    return (p - 1).bit_length()


def round_table(blocks: AlltoallBlocks, k: int) -> BlockTable:
    """Round k's chunks: [0, p) input blocks, [p, 2p) output blocks, 2p + i slot i as the sender reads it
    (its block before round k), 3p + i slot i as the receiver writes it (after round k)."""
    p, base, cap = blocks.p, blocks.work, blocks.largest

    def layout(g, m, b):
        m, b = np.asarray(m, dtype=np.int64), np.asarray(b, dtype=np.int64)
        start, size = blocks.in_out_layout(m, np.minimum(b, 2 * p - 1))
        i = b % p
        done = np.where(b < 3 * p, (1 << k) - 1, (2 << k) - 1)  # position bits hopped so far
        origin = (m - (i & done)) % p
        slot_size = blocks.size(origin, (origin + i) % p)
        in_slot = b >= 2 * p
        return np.where(in_slot, base + i * cap, start), np.where(in_slot, slot_size, size)

    return BlockTable(layout, 4 * p)


def round_phase(blocks: AlltoallBlocks, k: int) -> Phase:
    p = blocks.p
    hop = 1 << k
    positions = [i for i in range(1, p) if i >> k & 1]
    first = [(i & -i).bit_length() - 1 == k for i in positions]  # this hop is the block's first
    last = [i.bit_length() - 1 == k for i in positions]  # ... its last

    def slots(m, it):
        to, frm = (m + hop) % p, (m - hop) % p
        out = []
        for i, f, la in zip(positions, first, last, strict=True):
            out.append(send(to, (m + i) % p if f else 2 * p + i, remote=p + (to - i) % p if la else 3 * p + i))
        for i, f, la in zip(positions, first, last, strict=True):
            out.append(recv(frm, p + (m - i) % p if la else 3 * p + i, remote=(frm + i) % p if f else 2 * p + i))
        return out

    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Phase(f"bruck round {k}", ranks, round_table(blocks, k),
                 [Round(slots, repeats=1, uniform=blocks.uniform, name=f"bruck hop 2^{k}")])


@register("bruck", ("alltoall", "alltoallv"),
          summary="Bruck's alltoall: ceil(lg p) rounds; in round k every block whose position has bit k set hops "
                  "2^k ranks (several messages per round, scratch for blocks between hops)")
def build_bruck(collective: str, world_size: int, count: int, *, root=None, topology=None,
                counts=None) -> Schedule:
    p = world_size
    blocks = AlltoallBlocks(collective, p, count, counts)
    ranks = np.arange(p, dtype=np.int64)[None, :]
    phases = [Phase("local block", ranks, pairwise_table(blocks), [Round(local_block_slots(p), repeats=1,
                                                                          name="local block")])]
    phases += [round_phase(blocks, k) for k in range(num_rounds(p))]
    return Schedule("bruck", collective, p, count, phases, topology=topology, counts=counts,
                    regions=Regions(blocks.work + p * blocks.largest))
