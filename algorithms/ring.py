"""Ring: every rank talks only to its two neighbours, rank+1 (downstream) and rank-1 (upstream).

Vocabulary. The buffer is cut into p *blocks*, one per rank; pipelining cuts every block into `chunks`
*segments*, and segment s of all blocks travels round the ring as its own wave, started one round after wave
s-1 (so a receiver can reduce one segment while the next is in flight). Chunk id = block * chunks + segment.

* reduce-scatter, p-1 steps: at step k, rank r sends block (r - k + shift) to r+1 and reduce-receives block
  (r - k - 1 + shift) from r-1; after p-1 steps rank r holds block (r + 1 + shift) reduced over all ranks.
  shift = 0 for allreduce; shift = -1 for reduce_scatter so that rank r ends with its own block r, as the
  contract requires.
* allgather, p-1 steps: at step j, rank r sends block (r + g - j) and stores block (r + g - j - 1) from r-1,
  where g is the block rank r owns when the allgather starts (g = 1 after the reduce-scatter, 0 for a plain
  allgather, whose input is block r).

Each rank sends 2(p-1)/p of the buffer for allreduce, the bandwidth-optimal amount over point-to-point links.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send


def ring_round(p: int, waves: int, steps: int, step_slots) -> Round:
    """A round pattern in which wave s runs ring step (it - s), for `steps` steps; step_slots(m, step, s, on)."""

    def slots(m, it):
        out = []
        for s in range(waves):
            step = np.asarray(it) - s
            on = (step >= 0) & (step < steps)
            out += step_slots(m, np.clip(step, 0, max(steps - 1, 0)), s, on)
        return out

    return Round(slots, repeats=(steps + waves - 1) if steps else 0, uniform=waves == 1, name="ring step")


def ring_reduce_scatter_phase(name: str, groups, table: ChunkTable, chunks: int, shift: int) -> Phase:
    """Ring reduce-scatter inside every group (member m = ring position m) over `table` (blocks = members,
    `chunks` segments each): after it, member m holds block (m + 1 + shift) reduced over its group."""
    groups = np.atleast_2d(np.asarray(groups, dtype=np.int64))
    p, c = groups.shape[1], int(chunks)
    assert table.blocks == p and table.sub == c, "a ring phase needs one table block per member"

    def step_slots(m, k, s, on):
        return [send(np.where(on, (m + 1) % p, -1), ((m - k + shift) % p) * c + s),
                recv_reduce(np.where(on, (m - 1) % p, -1), ((m - k - 1 + shift) % p) * c + s)]

    return Phase(name, groups, table, [ring_round(p, c, p - 1, step_slots)])


def ring_allgather_phase(name: str, groups, table: ChunkTable, chunks: int, owned: int) -> Phase:
    """Ring allgather inside every group over `table`: member m starts holding block (m + owned)."""
    groups = np.atleast_2d(np.asarray(groups, dtype=np.int64))
    p, c = groups.shape[1], int(chunks)
    assert table.blocks == p and table.sub == c, "a ring phase needs one table block per member"

    def step_slots(m, j, s, on):
        return [send(np.where(on, (m + 1) % p, -1), ((m + owned - j) % p) * c + s),
                recv(np.where(on, (m - 1) % p, -1), ((m + owned - j - 1) % p) * c + s)]

    return Phase(name, groups, table, [ring_round(p, c, p - 1, step_slots)])


@register("ring", ("allreduce", "reduce_scatter", "allgather"),
          summary="ring reduce-scatter and/or allgather; `chunks` pipelines each block into segments")
def build_ring(collective: str, world_size: int, count: int, *, root=None, topology=None,
               chunks: int = 1) -> Schedule:
    p, c = world_size, check_chunks("ring", chunks)
    work = count * p if collective == "allgather" else count
    table = ChunkTable.whole(work, p, c)
    ranks = np.arange(p, dtype=np.int64)[None, :]
    phases = []
    if collective in ("allreduce", "reduce_scatter"):
        shift = 0 if collective == "allreduce" else -1
        phases.append(ring_reduce_scatter_phase("ring reduce-scatter", ranks, table, c, shift))
    if collective in ("allreduce", "allgather"):
        owned = 1 if collective == "allreduce" else 0
        phases.append(ring_allgather_phase("ring allgather", ranks, table, c, owned))
    return Schedule("ring", collective, p, count, phases, params={"chunks": c}, topology=topology)
