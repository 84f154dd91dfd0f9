"""Hierarchical alltoall: aggregate inside each scale-up domain first, then one message per domain pair per rail.

Vocabulary. D *domains* of G GPUs (`topology.domain_groups()`); GPU j of domain d is rank d*G + j, its *local
index* is j, and the GPUs of one local index form a *rail* (one per domain). Rank r's input is p *blocks*, block
t for rank t; its output is p blocks, block s from rank s (the alltoall contract). Domains are named relative to
the group that works on them: domain d + delta (mod D) is *relative domain* delta of domain d, so one slot
pattern serves every domain.

* Within domains (one round): GPU (d, j) sends to every GPU (d, j') of its domain (itself included, as local
  copies) the D blocks destined to the GPUs of rail j' (ranks (d + delta, j'), delta = 0..D-1): several
  messages of one round. Blocks for the receiver's own domain (delta = 0) land in its output block (d, j);
  the others wait in its *staging* area: staging(delta) holds the blocks from (d, 0), ..., (d, G-1) to
  (d + delta, j'), in local-index order, contiguous.
* Across domains (one round per rail, all rails at once): GPU (d, j') sends staging(delta) to GPU
  (d + delta, j'), delta = 1..D-1: ONE message per domain pair per rail, which lands contiguously in the
  receiver's output blocks (d, 0), ..., (d, G-1) (the source ranks of domain d are consecutive).

The fabric carries what it must (every block between domains, once) in D - 1 messages per GPU instead of
p - G, at the price of one NVLink hop for every block (the intra-domain round moves all of a GPU's input).
alltoallv: the same pattern over the counts matrix; a staging area is sized by the blocks it holds.
Domains of unequal size or of scattered ranks (a cluster placement) run _alltoall_placed.py's form of the same
two rounds: one message per (domain, destination rank) pair, unpacked locally when the sources' ranks are not
consecutive.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import BlockTable, Phase, Regions, Round, Schedule, recv, send

from ._alltoall import AlltoallBlocks
from ._alltoall_placed import placed_phases
from ._uneven import layout_text


class _Staging:
    """Where staging(delta) block j sits at each rank: base + offsets in (delta, j) order."""

    def __init__(self, blocks: AlltoallBlocks, D: int, G: int) -> None:
        self.blocks, self.D, self.G = blocks, D, G
        self.base = blocks.work
        if blocks.uniform:
            self.capacity = D * G * blocks.k
            return
        # size of staging (delta, j) at rank (d, m): block from (d, j) to (d + delta, m)
        r = np.arange(D * G)
        d, m = np.divmod(r, G)
        delta, j = np.meshgrid(np.arange(D), np.arange(G), indexing="ij")
        sizes = blocks.counts[d[:, None, None] * G + j[None], ((d[:, None, None] + delta[None]) % D) * G + m[:, None, None]]
        flat = sizes.reshape(D * G, D * G)
        self.offsets = (np.cumsum(flat, axis=1) - flat).reshape(D * G, D, G)
        self.sizes = sizes
        self.capacity = int(flat.sum(axis=1).max(initial=0))

    def block(self, rank, delta, j):
        """(start, size) of staging (delta, j) at `rank`."""
        if self.blocks.uniform:
            k = self.blocks.k
            return self.base + (np.asarray(delta) * self.G + j) * k + 0 * np.asarray(rank), \
                np.broadcast_to(np.int64(k), np.broadcast_shapes(np.shape(rank), np.shape(delta), np.shape(j)))
        return self.base + self.offsets[rank, delta, j], self.sizes[rank, delta, j]

    def area(self, rank, delta):
        """(start, size) of the whole staging(delta) at `rank` (blocks j = 0..G-1)."""
        start, _ = self.block(rank, delta, 0)
        end, last = self.block(rank, delta, self.G - 1)
        return start, end + last - start


def domain_phase(blocks: AlltoallBlocks, staging: _Staging, dom: np.ndarray) -> Phase:
    """Groups: domains (member = local index). Chunks: [0, p) input blocks by (relative domain, local index) of
    the destination, [p, 2p) output blocks by (relative domain, local index) of the source, [2p, 3p) staging
    (delta, j)."""
    D, G = dom.shape
    p = D * G

    def layout(g, m, b):
        g, m, b = (np.asarray(x, dtype=np.int64) for x in (g, m, b))
        rank = g * G + m
        kind, rel = np.divmod(b, p)
        delta, j = np.divmod(rel, G)
        other = ((g + delta) % D) * G + j
        start = np.select([kind == 0, kind == 1], [blocks.in_at(rank, other), blocks.out_at(rank, other)],
                          staging.block(rank, delta, j)[0])
        size = np.select([kind == 0, kind == 1], [blocks.size(rank, other), blocks.size(other, rank)],
                         staging.block(rank, delta, j)[1])
        return start, size

    def slots(m, it):
        out = []
        for t in range(G):  # t = 0: the GPU itself (local copies)
            to = (m + t) % G
            for delta in range(D):
                out.append(send(to, delta * G + to, remote=p + m if delta == 0 else 2 * p + delta * G + m))
        for t in range(G):
            frm = (m - t) % G
            for delta in range(D):
                out.append(recv(frm, p + frm if delta == 0 else 2 * p + delta * G + frm, remote=delta * G + m))
        return out

    return Phase("alltoall within domains", dom, BlockTable(layout, 3 * p, groups=D),
                 [Round(slots, repeats=1, uniform=blocks.uniform, name="aggregate within the domain")])


def rail_phase(blocks: AlltoallBlocks, staging: _Staging, dom: np.ndarray) -> Phase:
    """Groups: rails (member = domain). Chunks: [0, D) staging(delta) whole, [D, 2D) the output blocks of relative
    source domain delta, whole (G consecutive source ranks)."""
    D, G = dom.shape

    def layout(g, m, b):
        g, m, b = (np.asarray(x, dtype=np.int64) for x in (g, m, b))
        rank = m * G + g
        delta = b % D
        first = ((m + delta) % D) * G  # first source rank of relative domain delta
        out_start = blocks.out_at(rank, first)
        out_end = blocks.out_at(rank, first + G - 1) + blocks.size(first + G - 1, rank)
        st, sz = staging.area(rank, delta)
        return np.where(b < D, st, out_start), np.where(b < D, sz, out_end - out_start)

    def slots(m, it):
        out = [send((m + t) % D, t, remote=D + (D - t) % D) for t in range(1, D)]
        out += [recv((m - t) % D, D + (D - t) % D, remote=t) for t in range(1, D)]
        return out

    return Phase("alltoall across domains", dom.T.copy(), BlockTable(layout, 2 * D, groups=G),
                 [Round(slots, repeats=1 if D > 1 else 0, uniform=blocks.uniform, name="one message per domain")])


PLACED_MAX_RANKS = 2048  # the placed form's per-rank tables: ~6 s and 0.75 GB to build at 1,023 ranks


@register("hierarchical_alltoall", ("alltoall", "alltoallv"), needs_topology=True,
          summary="aggregate inside each scale-up domain, then one message per domain pair on each rail")
def build_hierarchical_alltoall(collective: str, world_size: int, count: int, *, root=None, topology=None,
                                counts=None) -> Schedule:
    if topology is None or not hasattr(topology, "domain_groups"):
        raise ValueError("hierarchical_alltoall aggregates inside scale-up domains: it needs a topology with "
                         "domains (collectives.topology.preset(...) or cluster(...))")
    if world_size != topology.world_size:
        raise ValueError(f"hierarchical_alltoall: world_size={world_size} but the topology {topology.name!r} has "
                         f"{topology.world_size} GPUs; build with world_size=topology.world_size")
    dom = np.asarray(topology.domain_groups(), dtype=np.int64)
    D, G = dom.shape
    blocks = AlltoallBlocks(collective, world_size, count, counts)
    if not np.array_equal(dom.ravel(), np.arange(world_size)):
        # unequal or scattered domains: per-rank tables (_alltoall_placed.py), O(p^2) to build
        if world_size > PLACED_MAX_RANKS:
            raise ValueError(f"hierarchical_alltoall on placed domains ({layout_text(topology)} ranks in "
                             f"{topology.name!r}) builds per-rank tables and serves up to {PLACED_MAX_RANKS} "
                             f"ranks, not {world_size}: use pairwise, or equal domains of consecutive ranks")
        phases, capacity = placed_phases(blocks, dom)
        sizes = [int(n) for n in (dom >= 0).sum(axis=1)]
        return Schedule("hierarchical_alltoall", collective, world_size, count, phases, topology=topology,
                        counts=counts, regions=Regions(blocks.work + capacity),
                        params={"domains": D, "gpus_per_domain": G, "domain_sizes": sizes},
                        notes=[f"placed domains of {layout_text(topology)} ranks: one message per (domain, "
                               "destination rank) pair across domains"
                               + ("" if len(phases) == 2 else ", then local copies to the output blocks of "
                                  "sources whose domain is not consecutive ranks")])
    staging = _Staging(blocks, D, G)
    phases = [domain_phase(blocks, staging, dom), rail_phase(blocks, staging, dom)]
    return Schedule("hierarchical_alltoall", collective, world_size, count, phases, topology=topology,
                    counts=counts, regions=Regions(blocks.work + staging.capacity),
                    params={"domains": D, "gpus_per_domain": G})
