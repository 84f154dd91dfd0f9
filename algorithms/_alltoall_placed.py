"""Hierarchical alltoall on a placed cluster: domains of unequal size (3 + 2, 4 + 4 + 1) or of scattered ranks
(round-robin), where hierarchical_alltoall.py's closed form (domain d = ranks d*G..d*G+G-1) does not hold.

Vocabulary. `dom` is the (D, G) domain table (`topology.domain_groups()`, -1 in empty slots); domain d holds
n_d ranks dom[d, 0..n_d-1], the rank in slot l has *local index* l. For a destination rank t outside domain d,
the *aggregator* of t in domain d is the rank in slot (local index of t) mod n_d of domain d: t's own rail
when domain d has that slot, else a rank of domain d chosen round-robin over its slots.

* Within domains (one round): rank s of domain d sends each of its p blocks once: a block for its own domain
  straight to its destination's output; a block for t outside d to t's aggregator in d, into its *staging*:
  at aggregator q, staging(t) holds the blocks of dom[d, 0], ..., dom[d, n_d - 1] to t, in that (table)
  order, contiguous.
* Across domains (one round): every aggregator sends each of its staging(t) to t: ONE message per (domain,
  destination rank) pair. It lands in t's output blocks from dom[d, 0..n_d-1] when those are consecutive
  ranks in increasing order (output blocks are in source-rank order), else in t's *receive staging* of
  domain d.
* Unpack (only when some domain's ranks are not consecutive): local copies from the receive staging to the
  output blocks.

The tables are dense per rank (O(p^2) entries): this path serves placed layouts of moderate size; equal
domains of consecutive ranks keep the closed form.
"""

from __future__ import annotations

import numpy as np

from collectives.schedule import BlockTable, Phase, Round, recv, send

from ._alltoall import AlltoallBlocks


class MessageLists:
    """Per-rank message lists of one round, turned into a Round over dense padded tables."""

    def __init__(self, p: int) -> None:
        self.sends: list[list[tuple]] = [[] for _ in range(p)]
        self.recvs: list[list[tuple]] = [[] for _ in range(p)]

    def add(self, src: int, dst: int, src_chunk: int, dst_chunk: int, nchunks: int = 1) -> None:
        """A message of `nchunks` chunks from src's chunk `src_chunk` to dst's chunk `dst_chunk`; lists grow in
        program order, so both ends of a (src, dst) pair list its messages alike."""
        self.sends[src].append((dst, src_chunk, nchunks, dst_chunk))
        self.recvs[dst].append((src, dst_chunk, nchunks, src_chunk))

    @staticmethod
    def _dense(lists: list[list[tuple]]) -> np.ndarray:
        width = max((len(x) for x in lists), default=0)
        table = np.zeros((len(lists), width, 4), np.int64)
        table[:, :, 0] = -1  # idle
        table[:, :, 2] = 1
        for r, ops in enumerate(lists):
            if ops:
                table[r, :len(ops)] = ops
        return table

    def round(self, name: str) -> Round:
        out, into = self._dense(self.sends), self._dense(self.recvs)

        def slots(m, it):
            m = np.asarray(m, np.int64)
            return [send(out[m, i, 0], out[m, i, 1], out[m, i, 2], remote=out[m, i, 3])
                    for i in range(out.shape[1])] + \
                   [recv(into[m, i, 0], into[m, i, 1], into[m, i, 2], remote=into[m, i, 3])
                    for i in range(into.shape[1])]

        return Round(slots, repeats=1, name=name)


def placed_phases(blocks: AlltoallBlocks, dom: np.ndarray) -> tuple[list[Phase], int]:
    """(phases, staging capacity in elements) of a hierarchical alltoall(v) over the domain table `dom`."""
    p = blocks.p
    D = dom.shape[0]
    sizes = (dom >= 0).sum(axis=1)
    domain_of = np.empty(p, np.int64)
    local_of = np.empty(p, np.int64)
    for d in range(D):
        domain_of[dom[d, :sizes[d]]] = d
        local_of[dom[d, :sizes[d]]] = np.arange(sizes[d])
    direct = [bool(np.array_equal(dom[d, :sizes[d]], dom[d, 0] + np.arange(sizes[d]))) for d in range(D)]

    def aggregator(d: int, t: int) -> int:
        return int(dom[d, local_of[t] % sizes[d]])

    # chunk ids at every rank: [0, p) input blocks by destination, [p, 2p) output blocks by source, then its
    # staging blocks, then its receive-staging blocks; (source, destination) of each staging block per rank
    staged: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    area: dict[tuple[int, int], int] = {}  # (aggregator, destination) -> its first staging block
    for t in range(p):
        for d in range(D):
            if d == domain_of[t]:
                continue
            q = aggregator(d, t)
            area[q, t] = len(staged[q])
            staged[q] += [(int(s), t) for s in dom[d, :sizes[d]]]
    landing: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    lands_at: dict[tuple[int, int], int] = {}  # (destination, source domain) -> its first receive-staging block
    for t in range(p):
        for d in range(D):
            if d != domain_of[t] and not direct[d]:
                lands_at[t, d] = len(landing[t])
                landing[t] += [(int(s), t) for s in dom[d, :sizes[d]]]
    first_stage = 2 * p
    first_landing = first_stage + max(len(x) for x in staged)
    nblocks = first_landing + max((len(x) for x in landing), default=0)

    r = np.arange(p, dtype=np.int64)[:, None]
    b = np.arange(p, dtype=np.int64)[None, :]
    start = np.full((p, nblocks), blocks.work, np.int64)
    size = np.zeros((p, nblocks), np.int64)
    start[:, :p], size[:, :p] = blocks.in_at(r, b), blocks.size(r, b)
    start[:, p:2 * p], size[:, p:2 * p] = blocks.out_at(r, b), blocks.size(b, r)
    capacity = 0
    for q in range(p):
        extra = [(first_stage + i, s, t) for i, (s, t) in enumerate(staged[q])] + \
                [(first_landing + i, s, t) for i, (s, t) in enumerate(landing[q])]
        if extra:
            ids = np.array([e[0] for e in extra])
            lengths = blocks.size(np.array([e[1] for e in extra]), np.array([e[2] for e in extra]))
            size[q, ids] = lengths
            start[q, ids] = blocks.work + np.cumsum(lengths) - lengths
            capacity = max(capacity, int(lengths.sum()))
    mean = (blocks.k if blocks.uniform else float(blocks.counts.mean()))

    def layout(g, m, c):
        return start[m, c], size[m, c]

    def table() -> BlockTable:  # the mean block stands for a chunk in the analytic costing
        return BlockTable(layout, nblocks, length=int(round(mean * nblocks)))

    within, across, unpack = MessageLists(p), MessageLists(p), MessageLists(p)
    for s in range(p):
        d = int(domain_of[s])
        for i in range(p):
            t = (s + i) % p  # i = 0: the rank's own block, a local copy
            if domain_of[t] == d:
                within.add(s, t, t, p + s)
            else:
                q = aggregator(d, t)
                within.add(s, q, t, first_stage + area[q, t] + int(local_of[s]))
    for q in range(p):
        d = int(domain_of[q])
        for t in range(p):
            if (q, t) not in area:
                continue
            first = area[q, t]
            if direct[d]:
                across.add(q, t, first_stage + first, p + int(dom[d, 0]), int(sizes[d]))
            else:
                across.add(q, t, first_stage + first, first_landing + lands_at[t, d], int(sizes[d]))
    for t in range(p):
        for i, (s, _) in enumerate(landing[t]):
            unpack.add(t, t, first_landing + i, p + s)

    everyone = np.arange(p, dtype=np.int64)[None, :]
    phases = [Phase("alltoall within domains", everyone, table(), [within.round("aggregate within the domain")]),
              Phase("alltoall across domains", everyone, table(),
                    [across.round("one message per domain and destination")])]
    if any(landing):
        phases.append(Phase("unpack scattered sources", everyone, table(),
                            [unpack.round("receive staging to the output blocks")]))
    return phases, capacity


__all__ = ["MessageLists", "placed_phases"]
