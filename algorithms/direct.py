"""Direct: the deterministic reduction. Every element is reduced in ONE fused kernel call, operands in rank order.

Vocabulary. The buffer is cut into p *blocks*, block j belonging to rank j; `chunks` cuts every block into
*segments* (segment s of every block moves in round s of the first phase).

* reduce-scatter (rounds 0..chunks-1): in round s every rank m sends segment s of block j to rank j, for every
  j != m, and reduce-receives segment s of its own block m from every other rank. All p-1 receives of a round
  land in the same range, so `collectives.execution.land_receives` fuses them with the local value into ONE
  kernel call whose operands are sorted by source node: element i of block m is
  ``x_0[i] op x_1[i] op ... op x_{p-1}[i]``, folded left to right in rank order (float16/bfloat16 widened to
  float32 and rounded once).
* allreduce: then a ring allgather of the blocks (copies only: no arithmetic, so no change of bits).
* reduce: then every rank sends its block to the root (copies only).

Because the fold is fixed by the rank order alone, the result is bitwise the same for every chunk count, every
world layout (domains, daemons) and every executor, and equal to `functools.reduce(op, [x_0, ..., x_{p-1}])`
evaluated element-wise (16-bit: in float32, rounded once). This is what `deterministic=True` selects.

Cost: each rank sends (p-1)/p of the buffer in the reduce-scatter (p-1 messages per segment, all in one round),
like a ring's reduce-scatter but in one round instead of p-1; receivers reduce p operands at once. Good for
small and medium worlds; at large p the p-1 simultaneous messages per rank (incast) cost latency.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send

from .ring import ring_allgather_phase


def direct_reduce_scatter_phase(p: int, table: ChunkTable, chunks: int) -> Phase:
    """Round s: member m sends segment s of block j to member j (j != m) and reduce-receives segment s of its
    own block from every other member. Sends first, then the receives in source order d = 1..p-1."""
    c = int(chunks)

    def slots(m, it):
        out = [send((m + d) % p, ((m + d) % p) * c + it) for d in range(1, p)]
        out += [recv_reduce((m - d) % p, m * c + it) for d in range(1, p)]
        return out

    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Phase("direct reduce-scatter", ranks, table,
                 [Round(slots, repeats=c if p > 1 else 0, uniform=True, name="direct exchange")])


def gather_to_root_phase(p: int, root: int, table: ChunkTable, chunks: int) -> Phase:
    """One round: every member m != root sends its whole block m to the root, which stores it."""
    c = int(chunks)

    def slots(m, it):
        out = []
        for d in range(1, p):
            q = (root + d) % p
            out.append(send(np.where(m == q, root, -1) + 0 * it, m * c, c))
        for d in range(1, p):
            q = (root + d) % p
            out.append(recv(np.where(m == root, q, -1) + 0 * it, q * c, c))
        return out

    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Phase("direct gather to root", ranks, table, [Round(slots, repeats=1 if p > 1 else 0, name="gather")])


@register("direct", ("allreduce", "reduce_scatter", "reduce"),
          summary="deterministic: one-round direct reduce-scatter (every element folded once, in rank order) "
                  "then ring allgather / gather to the root; bitwise identical across chunkings and layouts")
def build_direct(collective: str, world_size: int, count: int, *, root=None, topology=None,
                 chunks: int = 1) -> Schedule:
    check_chunks("direct", chunks, "segments per block")
    if collective not in ("allreduce", "reduce_scatter", "reduce"):
        raise ValueError(f"direct implements allreduce, reduce_scatter and reduce, not {collective}")
    p, c = world_size, int(chunks)
    table = ChunkTable.whole(count, p, c)
    phases = [direct_reduce_scatter_phase(p, table, c)]
    if collective == "allreduce":
        phases.append(ring_allgather_phase("ring allgather", np.arange(p, dtype=np.int64)[None, :], table, c,
                                           owned=0))
    elif collective == "reduce":
        phases.append(gather_to_root_phase(p, int(root), table, c))
    return Schedule("direct", collective, p, count, phases, root=root, params={"chunks": c}, topology=topology)
