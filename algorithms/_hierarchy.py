"""Shards and pieces: the buffer layout of a pipelined hierarchical allreduce, and the stages it is built from.

Vocabulary. D domains of G GPUs; GPU j of domain d is rank `topology.domain_groups()[d, j]` (d·G + j unless
the cluster has a placement). The buffer is cut into `pieces` that stream
through the stages one round apart; each piece into G *shards* (shard j belongs to the GPUs of local index j, the
*inter group* j on NIC rail j), each shard into `sub` *parts* when the inter-domain stage splits it further (the
double binary tree's two halves). Piece-major table: chunk id = (piece x G + shard) x sub + part.

A pipelined hierarchical allreduce is three stages, each a list of lanes (_pipeline.py) at its own lags:
intra-domain reduce-scatter (GPU j ends with shard j of the piece reduced over its domain), inter-domain
allreduce of shard j over group j (all groups at once, each on its own rail), intra-domain allgather. Stage
builders: `intra_reduce_scatter`, `inter_allreduce`, `intra_allgather`; `hierarchical.py`, `nvls_tree.py`,
`collnet_direct.py` and `collnet_chain.py` compose them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.schedule import ChunkTable

from ._pipeline import memo
from .double_binary_tree import double_binary_tree, tree_lanes
from .nvls import DomainRows, domain_rows, gather_lanes, multicast_lanes, reduce_lanes, scatter_lanes
from .ring import ring_lanes
from .sharp import allreduce_lanes, build_forest


@dataclass(frozen=True)
class Shards:
    """The piece-major layout: `pieces` x G shards x `sub` parts."""

    pieces: int
    G: int
    sub: int = 1

    def table(self, work: int) -> ChunkTable:
        return ChunkTable.whole(work, self.pieces, self.G * self.sub)

    def piece(self, k):
        return k * self.G * self.sub, self.G * self.sub

    def shard(self, k, j):
        return (k * self.G + j) * self.sub, self.sub

    def part(self, k, j, b):
        return (k * self.G + j) * self.sub + b, 1

    @property
    def piece_count(self) -> int:
        """The chunk count of every piece (piece(k)'s, whatever k)."""
        return self.G * self.sub


def members(topology, nvswitches: bool, fabric: np.ndarray = ()) -> np.ndarray:
    """Node ids of a composed phase's members, increasing: every rank, then (if used) every domain switch, then
    the fabric switches used; rank r is member r, domain d's switch member N + d when `nvswitches`."""
    parts = [np.arange(topology.world_size, dtype=np.int64)]
    if nvswitches:
        parts.append(topology.nvswitches())
    parts.append(np.unique(np.asarray(fabric, np.int64)))
    return np.concatenate(parts)


def nvls_rows(topology) -> DomainRows:
    """The member arrays of the NVLS stages in every domain (GPU members: the ranks; switch members: N + d), for
    the reduce-scatter and the allgather of one build to share."""
    N, D = topology.world_size, topology.num_domains
    return domain_rows(topology.domain_groups(), N + np.arange(D, dtype=np.int64))


def intra_reduce_scatter(topology, intra: str, layout: Shards, lag: int, rows: DomainRows | None = None
                         ) -> tuple[list, int]:
    """GPU j of every domain ends with shard j of each piece reduced over its domain: by the domain's switch
    (NVLS reduce at `lag`, scatter at lag + 1) or a ring inside the domain (G - 1 steps). (lanes, next lag).
    `rows`: nvls_rows(topology), where the caller has them."""
    G = topology.gpus_per_domain
    if G == 1:
        return [], lag
    if intra == "nvls":
        r = nvls_rows(topology) if rows is None else rows
        gpus = r.flat.reshape(r.switches.size, G)  # (domain_groups(), as the rows hold it)
        return reduce_lanes(gpus, r.switches, lag, layout.piece, r, layout.piece_count) + \
            scatter_lanes(gpus, r.switches, lag + 1, layout.shard, r, layout.sub), lag + 2
    return ring_lanes(topology.domain_groups(), lag, lambda k, r, b: layout.shard(k, b), reduce=True), lag + G - 1


def intra_allgather(topology, intra: str, layout: Shards, lag: int, rows: DomainRows | None = None
                    ) -> tuple[list, int]:
    """Every GPU gets every shard of each piece from its domain: GPU j gives shard j to the switch, which
    multicasts the piece (NVLS), or a ring inside the domain. (lanes, next lag). `rows` as for
    intra_reduce_scatter."""
    G = topology.gpus_per_domain
    if G == 1:
        return [], lag
    if intra == "nvls":
        r = nvls_rows(topology) if rows is None else rows
        gpus = r.flat.reshape(r.switches.size, G)  # (domain_groups(), as the rows hold it)
        return gather_lanes(gpus, r.switches, lag, layout.shard, r, layout.sub) + \
            multicast_lanes(gpus, r.switches, lag + 1, layout.piece, r, layout.piece_count), lag + 2
    return ring_lanes(topology.domain_groups(), lag, lambda k, r, b: layout.shard(k, b), reduce=False), \
        lag + G - 1


def rail_trees(topology) -> list:
    """One SHARP aggregation tree per inter group j (the GPUs of local index j, on rail j), climbing through
    rail j's up ports (kept per topology: memo)."""

    def make():
        groups = topology.domain_groups().T
        return [topology.sharp_tree(ranks=groups[j], port=int(topology.rank_rail(int(groups[j, 0]))))
                for j in range(groups.shape[0])]

    return memo(topology, ("rail_trees",), make)


def inter_allreduce(topology, inter: str, layout: Shards, lag: int, nodes: np.ndarray, trees=None) -> tuple[list, int]:
    """Shard j of each piece allreduced over inter group j, every group at once: up and down rail j's SHARP
    tree (`trees`, members among `nodes`; results by multicast: a unicast descent is slower than a piece per
    round, so it does not pipeline with the stages around it), or NCCL's double binary tree over the domains
    (each tree one half of the shard). (lanes, next lag)."""
    D = topology.num_domains
    if D == 1:
        return [], lag
    if inter == "sharp":
        forest = build_forest(trees, nodes)
        data = lambda k, v: layout.shard(k, forest.tree[v])  # noqa: E731  (tree j reduces shard j)
        lanes = allreduce_lanes(forest, data, lag, count=layout.sub)  # (a shard is `sub` chunks)
        return lanes, lag + 2 * int(forest.depth.max())
    trees2 = double_binary_tree(D)
    H = max(int(t.height.max(initial=0)) for t in trees2)
    group_members = topology.domain_groups().T  # (G, D): member of (j, d)
    lanes = []
    for b, tree in enumerate(trees2):
        lanes += tree_lanes(tree, group_members, lambda k, j, b=b: layout.part(k, j, b), lag, height=H)
    return lanes, lag + 2 * H


__all__ = ["Shards", "inter_allreduce", "intra_allgather", "intra_reduce_scatter", "members", "nvls_rows",
           "rail_trees"]
