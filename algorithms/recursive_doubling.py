"""Recursive doubling: lg p exchanges with partners at distance 1, 2, 4, ..., each doubling what a rank holds.

Vocabulary. p' is the largest power of two <= p and e = p - p' the *extra* ranks. The *core* is p' ranks that
run the power-of-two algorithm; *core index* c numbers them. With e > 0 the first 2e ranks form *pairs*
(2i, 2i+1): the even rank joins the core (core index i), the odd rank is *folded* into it; ranks 2e..p-1 join
the core as indices e..p'-1. Each phase lists exactly the ranks that take part, in member order (pairs as
groups of two, the core as one group of p'), so the round patterns are plain bit arithmetic on the member index.

* allreduce: *fold* (odd rank of a pair sends its whole buffer to the even one, which reduces), lg p' exchange
  steps in the core (step j: swap the whole buffer with core partner c ^ 2^j and reduce), *unfold* (even sends
  the result back). Cost lg p·(a + n·b + n·g) for p a power of two, two more steps otherwise. Partners compute
  a op b and b op a: the same bits for sum and prod (IEEE + and * commute); min and max agree in value, but a
  tie between +0.0 and -0.0 may keep a different sign on the two partners.
* allgather: block q of the result is rank q's input. The fold sends the odd rank's block to its even partner,
  so core index c then holds the *super-block* of blocks [start(c), start(c+1)), start(c) = c + min(c, e): two
  blocks for the first e core ranks, one after. Step j swaps the aligned window of 2^j super-blocks that
  contains c with the partner's window (a contiguous block range, because super-blocks are in core order), so
  after lg p' steps the core holds everything; the unfold sends the whole result to each odd rank (one message,
  its own block included: rewriting it with the same data is cheaper than a second message's latency).
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, recv, recv_reduce, send


def fold_layout(p: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(p', e, pairs, core): pairs is an (e, 2) array of (even, odd) ranks, core the p' core ranks in core order."""
    core_size = 1 << (p.bit_length() - 1)
    e = p - core_size
    ranks = np.arange(p, dtype=np.int64)
    pairs = ranks[: 2 * e].reshape(e, 2)
    core = np.concatenate((pairs[:, 0], ranks[2 * e:]))
    return core_size, e, pairs, core


def pair_phase(name: str, pairs: np.ndarray, table: ChunkTable, sender: int, reduce: bool) -> Phase:
    """One round within every pair: member `sender` sends its table range to the other member."""

    def slots(m, it):
        me_sends = np.asarray(m) == sender
        other = 1 - np.asarray(m)
        receive = recv_reduce if reduce else recv
        return [send(np.where(me_sends, other, -1), 0, table.nchunks),
                receive(np.where(me_sends, -1, other), 0, table.nchunks)]

    return Phase(name, pairs, table, [Round(slots, repeats=1, uniform=True, name=name)])


def super_block_start(e: int):
    """start(c): first block of core index c's super-block when pair i's two blocks go to core index i < e.

    Works for c = p' too (giving p), so core index c holds blocks [start(c), start(c + 1)).
    """
    return lambda c: c + np.minimum(c, e)


def doubling_allgather_round(steps: int, start) -> Round:
    """Recursive doubling allgather over the core: at step j, swap the aligned window of 2^j super-blocks
    holding c with partner c ^ 2^j, whose window is the other half of the next larger window."""

    def exchange(c, it):
        size = np.left_shift(1, it)  # super-blocks per window at step it
        mine = np.bitwise_and(c, -size)  # my window: core indices [mine, mine + size)
        theirs = np.bitwise_xor(mine, size)
        partner = np.bitwise_xor(c, size)
        return [send(partner, start(mine), start(mine + size) - start(mine)),
                recv(partner, start(theirs), start(theirs + size) - start(theirs))]

    return Round(exchange, repeats=steps, uniform=False, name="doubling exchange")


@register("recursive_doubling", ("allreduce", "allgather"),
          summary="recursive doubling (whole buffer each step for allreduce, doubling windows for allgather); "
                  "non-power-of-two worlds fold the extra ranks into partners first")
def build_recursive_doubling(collective: str, world_size: int, count: int, *, root=None,
                             topology=None) -> Schedule:
    if collective not in ("allreduce", "allgather"):
        raise ValueError(f"recursive_doubling implements allreduce and allgather, not {collective}")
    p = world_size
    core_size, e, pairs, core = fold_layout(p)
    steps = core_size.bit_length() - 1
    phases = []
    if collective == "allreduce":
        if e:
            phases.append(pair_phase("fold", pairs, ChunkTable.whole(count, 1, groups=e), sender=1, reduce=True))

        def exchange(c, it):
            partner = np.bitwise_xor(c, np.left_shift(1, it))
            return [send(partner, 0), recv_reduce(partner, 0)]

        phases.append(Phase("recursive doubling", core[None, :], ChunkTable.whole(count, 1),
                            [Round(exchange, repeats=steps, uniform=False, name="exchange")]))
        if e:
            phases.append(pair_phase("unfold", pairs, ChunkTable.whole(count, 1, groups=e), sender=0, reduce=False))
    else:
        k = count
        if e:  # the odd rank's block only: group i's table is block 2i+1
            odd_blocks = ChunkTable(pairs[:, 1] * k, np.full(e, k, np.int64), 1)
            phases.append(pair_phase("fold", pairs, odd_blocks, sender=1, reduce=False))

        phases.append(Phase("recursive doubling", core[None, :], ChunkTable.whole(p * k, p),
                            [doubling_allgather_round(steps, super_block_start(e))]))
        if e:
            phases.append(pair_phase("unfold", pairs, ChunkTable.whole(p * k, 1, groups=e), sender=0, reduce=False))
    return Schedule("recursive_doubling", collective, p, count, phases, topology=topology)
