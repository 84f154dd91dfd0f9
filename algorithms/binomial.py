"""Binomial tree: reduce and broadcast in ceil(lg p) steps, allreduce as a reduce then a broadcast through rank 0.

Vocabulary. *Members* are numbered relative to the root, v = (rank - root) mod p: the phase's group lists the
ranks in that order, so member 0 is the root and the arithmetic below never mentions the root again. There are
L = ceil(lg p) *steps*; step k pairs each member v whose low k+1 bits are zero (a *parent* at step k) with its
*child* v + 2^k, if that exists (v + 2^k < p).

* reduce: steps k = 0, 1, ..., L-1. At step k the child sends its partial result to the parent, which reduces
  it into its own. A member v sends at step lowbit(v) = the index of its lowest set bit, after it has received
  from all its children v + 2^j, j < lowbit(v), in earlier steps; the root only receives.
* broadcast: the same tree walked the other way, steps k = L-1, ..., 0: at step k the parent sends to the child.
* allreduce: reduce to member 0 then broadcast from it (root 0, no rotation).

Each member sends or receives the whole buffer once per step, so reduce costs lg p·(a + n·b + n·g) and
broadcast lg p·(a + n·b) (models.md).

Pipelining. `chunks` cuts the buffer into *segments*; the steps become *stages* of a pipeline: at round t,
stage i works on segment t - i (when 0 <= t - i < chunks). Stages are ordered so that every segment reaches a
member in a strictly earlier round than the member passes it on (a reduce sender's last child arrives at stage
lowbit(v) - 1; a broadcast receiver forwards at later stages), so chunks > 1 keeps the data dependencies while
overlapping the steps. The allreduce runs the broadcast stages right after the reduce stages in one pipeline,
so segment s starts down the tree as soon as the root holds its full reduction.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send

from .chain import pipeline_rounds


def num_steps(p: int) -> int:
    """L = ceil(lg p): the steps of a binomial tree over p members."""
    return (p - 1).bit_length()


def binomial_stages(collective: str, p: int) -> list[tuple[int, bool]]:
    """The pipeline's stages in order, each (step k, upward?): upward = reduce towards the root."""
    L = num_steps(p)
    reduce = [(k, True) for k in range(L)]
    broadcast = [(k, False) for k in reversed(range(L))]
    return {"reduce": reduce, "broadcast": broadcast, "allreduce": reduce + broadcast}[collective]


def binomial_rounds(p: int, chunks: int, stages: list[tuple[int, bool]]) -> list[Round]:
    """Round t runs stage i on segment t - i; member roles at step k follow from the low bits of v."""

    def slots(v, t):
        out = []
        for i, (k, upward) in enumerate(stages):
            seg = t - i
            on = (seg >= 0) & (seg < chunks)
            seg = np.minimum(np.maximum(seg, 0), chunks - 1)
            low = np.bitwise_and(v, (2 << k) - 1)
            is_parent = (low == 0) & (v + (1 << k) < p)  # receives (reduce) / sends (broadcast) at step k
            is_child = low == (1 << k)  # its parent v - 2^k exists since v >= 2^k
            child, parent = np.where(on & is_parent, v + (1 << k), -1), np.where(on & is_child, v - (1 << k), -1)
            if upward:
                out += [send(parent, seg), recv_reduce(child, seg)]
            else:
                out += [send(child, seg), recv(parent, seg)]
        return out

    return pipeline_rounds(slots, len(stages), chunks, "binomial stage")


@register("binomial", ("allreduce", "broadcast", "reduce"),
          summary="binomial tree reduce/broadcast (any root); allreduce = reduce + broadcast via rank 0; "
                  "`chunks` pipelines segments through the steps")
def build_binomial(collective: str, world_size: int, count: int, *, root=None, topology=None,
                   chunks: int = 1) -> Schedule:
    p, c = world_size, check_chunks("binomial", chunks)
    if collective not in ("allreduce", "broadcast", "reduce"):
        raise ValueError(f"binomial implements allreduce, broadcast and reduce, not {collective}")
    origin = 0 if root is None else int(root)
    # member v is rank (origin + v) mod p: the tree is always rooted at member 0
    members = ((np.arange(p, dtype=np.int64) + origin) % p)[None, :]
    phase = Phase(f"binomial {collective}", members, ChunkTable.whole(count, c),
                  binomial_rounds(p, c, binomial_stages(collective, p)))
    return Schedule("binomial", collective, p, count, [phase], root=root, params={"chunks": c},
                    topology=topology)
