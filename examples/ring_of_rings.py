"""Ring of rings: a two-level allreduce written as one file outside the library (see docs/algorithms.md).

Vocabulary. The p ranks form p/g *groups* of g consecutive ranks (rank r is member r % g of group r // g).
The buffer is cut into g *blocks*, one per member; a member's *shard* is the block it holds reduced over its
group after the first phase. Ranks with the same local index in different groups form a *column*.

1. reduce-scatter ring inside each group (g - 1 steps): member l ends with block (l + 1) % g reduced over its
   group;
2. allreduce ring across groups inside each column, over that column's shard (2(G - 1) steps, G = p/g):
   every member of the column ends with its shard reduced over all p ranks;
3. allgather ring inside each group (g - 1 steps): every member ends with every block.

Only the middle phase crosses groups, and it moves 1/g of the buffer, which is the point when groups are
fast domains (NVLink) joined by a slower network.
"""

from __future__ import annotations

import numpy as np

from collectives import algorithms
from collectives.schedule import ChunkTable, Phase, Round, Schedule, recv, recv_reduce, send, split_points


def reduce_scatter_ring(n: int) -> Round:
    """n - 1 steps over n members: at step k member m sends block m - k downstream and reduce-receives block
    m - k - 1 from upstream, so member m ends with block m + 1 reduced over all n members."""

    def slots(m, k):
        return [send((m + 1) % n, (m - k) % n), recv_reduce((m - 1) % n, (m - k - 1) % n)]

    return Round(slots, repeats=n - 1, uniform=True, name="ring reduce-scatter step")


def allgather_ring(n: int) -> Round:
    """n - 1 steps over n members, each starting with block m + 1 (where reduce_scatter_ring leaves it): at
    step j member m sends block m + 1 - j downstream and stores block m - j from upstream."""

    def slots(m, j):
        return [send((m + 1) % n, (m + 1 - j) % n), recv((m - 1) % n, (m - j) % n)]

    return Round(slots, repeats=n - 1, uniform=True, name="ring allgather step")


@algorithms.register("ring_of_rings", ("allreduce",),
          summary="ring reduce-scatter in groups of group_size, ring allreduce across groups, ring allgather")
def build_ring_of_rings(collective: str, world_size: int, count: int, *, root=None, topology=None,
                        group_size: int = 2) -> Schedule:
    g = int(group_size)
    if g < 1 or world_size % g:
        raise ValueError(f"ring_of_rings needs world_size divisible by group_size: got world_size={world_size}, "
                         f"group_size={group_size}")
    groups = world_size // g
    ranks = np.arange(world_size, dtype=np.int64).reshape(groups, g)  # row: a group; column: a local index
    blocks = ChunkTable.whole(count, g, groups=groups)
    # after phase 1, member l of every group holds block (l + 1) % g: column l allreduces that shard
    shard = (np.arange(g) + 1) % g
    start, stop = split_points(count, g, shard), split_points(count, g, shard + 1)
    shards = ChunkTable(start, stop - start, groups)
    phases = [
        Phase("reduce-scatter in each group", ranks, blocks, [reduce_scatter_ring(g)]),
        Phase("allreduce across groups", ranks.T, shards, [reduce_scatter_ring(groups), allgather_ring(groups)]),
        Phase("allgather in each group", ranks, blocks, [allgather_ring(g)]),
    ]
    return Schedule("ring_of_rings", collective, world_size, count, phases, params={"group_size": g},
                    topology=topology)


if __name__ == "__main__":
    from collectives import emulate, verify

    for p, g in [(1, 1), (6, 3), (8, 4), (12, 4), (16, 4)]:
        schedule = algorithms.build("ring_of_rings", collective="allreduce", world_size=p, count=3 * p + 1,
                                    group_size=g)
        print(f"group_size={g}: {verify(schedule).summary()}")
    schedule = algorithms.build("ring_of_rings", world_size=8, count=10, group_size=4)
    outputs = emulate(schedule, [np.full(10, r, dtype=np.float32) for r in range(8)])
    print("emulated sum over 8 ranks:", outputs[0])
