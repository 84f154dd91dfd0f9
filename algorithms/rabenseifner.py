"""Rabenseifner: allreduce = recursive-halving reduce-scatter + recursive-doubling allgather; reduce_scatter =
recursive halving alone.

Vocabulary (shared with recursive_doubling.py). p' is the largest power of two <= p, e = p - p' the *extra*
ranks; the first 2e ranks form *pairs* (2i, 2i+1) whose odd rank is *folded* into the even one (core index i);
ranks 2e..p-1 are core indices e..p'-1. The buffer is cut into *blocks*; core index c owns the *super-block*
of blocks [start(c), start(c+1)).

* recursive halving, lg p' steps with mask = p'/2, p'/4, ..., 1: core index c holds (partially reduced) the
  aligned window of 2·mask super-blocks that contains c. It keeps the half holding c, sends the other half to
  partner c ^ mask, and reduce-receives the partner's copy of the half it keeps. Invariant after the step at
  mask: c holds its window of `mask` super-blocks reduced over both halves' contributions, so after the last
  step c holds its own super-block reduced over all core ranks, each of which already holds its folded
  partner's data. The data halves each step: (p'-1)/p'·n elements sent in total.
* recursive doubling allgather, lg p' steps with the window doubling back (recursive_doubling.py).

allreduce: blocks = p' (one per core rank, start(c) = c); fold the odd ranks' whole buffers in, halve, double,
then send the whole result back to each odd rank. That is Thakur, Rabenseifner & Gropp (2005):
2 lg p'·a + 2(p'-1)/p'·n·b for p a power of two, plus one a + n·b each for the fold and the unfold otherwise.

reduce_scatter (the contract: rank r ends with block r of p blocks): blocks = p and start(c) = c + min(c, e),
so core index i < e owns blocks 2i and 2i+1 (its own and its folded partner's) and core index c >= e owns block
c + e, its own. After the fold and the halving, each even rank of a pair sends block 2i+1 to its odd partner.
Also known as recursive halving; registered here under one name for both collectives.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, recv_reduce, send

from .recursive_doubling import doubling_allgather_round, fold_layout, pair_phase, super_block_start


def halving_round(core_size: int, steps: int, start) -> Round:
    """Recursive halving over the core: at step it (mask = p'/2 >> it) keep my half, send the partner's."""

    def exchange(c, it):
        mask = np.right_shift(core_size >> 1, it)
        keep = np.bitwise_and(c, -mask)  # my window of `mask` super-blocks
        give = np.bitwise_and(np.bitwise_xor(c, mask), -mask)  # the partner's window: the other half
        partner = np.bitwise_xor(c, mask)
        return [send(partner, start(give), start(give + mask) - start(give)),
                recv_reduce(partner, start(keep), start(keep + mask) - start(keep))]

    return Round(exchange, repeats=steps, uniform=False, name="halving exchange")


@register("rabenseifner", ("allreduce", "reduce_scatter"),
          summary="recursive-halving reduce-scatter (+ recursive-doubling allgather for allreduce); "
                  "non-power-of-two worlds fold the extra ranks into partners first")
def build_rabenseifner(collective: str, world_size: int, count: int, *, root=None, topology=None) -> Schedule:
    if collective not in ("allreduce", "reduce_scatter"):
        raise ValueError(f"rabenseifner implements allreduce and reduce_scatter, not {collective}")
    p = world_size
    core_size, e, pairs, core = fold_layout(p)
    steps = core_size.bit_length() - 1
    phases = []
    if e:  # every odd rank of a pair hands its whole buffer to its even partner
        phases.append(pair_phase("fold", pairs, ChunkTable.whole(count, 1, groups=e), sender=1, reduce=True))
    if collective == "allreduce":
        rounds = [halving_round(core_size, steps, lambda c: c),
                  doubling_allgather_round(steps, lambda c: c)]
        phases.append(Phase("halving-doubling", core[None, :], ChunkTable.whole(count, core_size), rounds))
        if e:
            phases.append(pair_phase("unfold", pairs, ChunkTable.whole(count, 1, groups=e), sender=0, reduce=False))
    else:
        k = count // p
        phases.append(Phase("recursive halving", core[None, :], ChunkTable.whole(count, p),
                            [halving_round(core_size, steps, super_block_start(e))]))
        if e:  # group i's table is block 2i+1, the odd rank's output
            odd_blocks = ChunkTable(pairs[:, 1] * k, np.full(e, k, np.int64), 1)
            phases.append(pair_phase("unfold", pairs, odd_blocks, sender=0, reduce=False))
    return Schedule("rabenseifner", collective, p, count, phases, topology=topology)
