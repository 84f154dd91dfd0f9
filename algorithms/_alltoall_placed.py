"""Hierarchical alltoall on a placed cluster: domains of unequal size (3 + 2, 4 + 4 + 1) or of scattered ranks
(round-robin), where hierarchical_alltoall.py's closed form (domain d = ranks d*G..d*G+G-1) does not hold.

Vocabulary. `dom` is the (D, G) domain table (`topology.domain_groups()`, -1 in empty slots); domain d holds
n_d ranks dom[d, 0..n_d-1], the rank in slot l has *local index* l. For a destination rank t outside domain d
whose local index l is < n_d, the *aggregator* of t in domain d is the rank in slot l of domain d (t's rail).

* Within domains (one round): rank s of domain d sends a block for its own domain straight to its
  destination's output, and a block for t outside d that has an aggregator in d to that aggregator, into its
  *staging*: at aggregator q, staging(t) holds the blocks of dom[d, 0], ..., dom[d, n_d - 1] to t, in that
  (table) order, contiguous.
* Across domains (one round): every aggregator sends each of its staging(t) to t: ONE message per (domain,
  destination rank) pair. It lands in t's output blocks from dom[d, 0..n_d-1] when those are consecutive
  ranks in increasing order (output blocks are in source-rank order), else in t's *receive staging* of
  domain d. A destination t whose local index has no slot in the smaller domain d (slot 7 seen from a domain
  of 7) has no aggregator there: the rank q in slot m of d appends its own blocks for such ranks of t's
  domain to its staging message for the rank in slot m of that domain, their *proxy* (a local copy into its
  staging in the first round). Every NIC of d then carries the same load (aggregating t's blocks on one rank
  of d would double that NIC's), in one message per rail and domain pair; the message then lands in the
  proxy's receive staging.
* Deliver (only when some domain's ranks are not consecutive, or a domain is smaller than another): local
  copies from the receive staging to the output blocks, and every proxy's blocks to their destination over
  the domain's links.

The tables are dense per rank (O(p^2) entries): this path serves placed layouts up to
hierarchical_alltoall.PLACED_MAX_RANKS; equal domains of consecutive ranks keep the closed form.
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
        """t's aggregator in domain d, or -1 when d has no slot of t's local index (t's blocks go by proxy)."""
        return int(dom[d, local_of[t]]) if local_of[t] < sizes[d] else -1

    # chunk ids at every rank: [0, p) input blocks by destination, [p, 2p) output blocks by source, then its
    # staging blocks and its receive-staging blocks, each list of (source, final destination) pairs
    staged: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    area: dict[tuple[int, int], tuple[int, int]] = {}  # (aggregator, destination) -> (first staging block, count)
    stage_of: dict[tuple[int, int, int], int] = {}  # (aggregator, source, final destination) -> staging block
    landing: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    lands_at: dict[tuple[int, int], int] = {}  # (destination, source domain) -> its first receive-staging block
    for t in range(p):
        e = int(domain_of[t])
        for d in range(D):
            q = aggregator(d, t)
            if d == e or q < 0:
                continue
            carried = [(int(s), t) for s in dom[d, :sizes[d]]]
            if local_of[t] == local_of[q]:  # q proxies its own blocks for t's domain-mates beyond d's slots
                carried += [(q, int(x)) for x in dom[e, sizes[d]:sizes[e]]]
            area[q, t] = (len(staged[q]), len(carried))
            stage_of.update({(q, s, x): len(staged[q]) + i for i, (s, x) in enumerate(carried)})
            staged[q] += carried
            if not direct[d] or len(carried) > sizes[d]:
                lands_at[t, d] = len(landing[t])
                landing[t] += carried
    first_stage = 2 * p
    first_landing = first_stage + max((len(x) for x in staged), default=0)
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
            ids = np.array([x[0] for x in extra])
            lengths = blocks.size(np.array([x[1] for x in extra]), np.array([x[2] for x in extra]))
            size[q, ids] = lengths
            start[q, ids] = blocks.work + np.cumsum(lengths) - lengths
            capacity = max(capacity, int(lengths.sum()))
    mean = (blocks.k if blocks.uniform else float(blocks.counts.mean()))

    def layout(g, m, c):
        return start[m, c], size[m, c]

    def table() -> BlockTable:  # the mean block stands for a chunk in the analytic costing
        return BlockTable(layout, nblocks, length=int(round(mean * nblocks)))

    within, across, deliver = MessageLists(p), MessageLists(p), MessageLists(p)
    for s in range(p):
        d = int(domain_of[s])
        for i in range(p):
            t = (s + i) % p  # i = 0: the rank's own block, a local copy
            if domain_of[t] == d:
                within.add(s, t, t, p + s)
                continue
            q = aggregator(d, t)
            q = s if q < 0 else q  # no aggregator: s proxies its own block (a local copy into its staging)
            within.add(s, q, t, first_stage + stage_of[q, s, t])
    for q in range(p):
        d = int(domain_of[q])
        for t in range(p):
            if (q, t) not in area:
                continue
            first, n = area[q, t]
            into = first_landing + lands_at[t, d] if (t, d) in lands_at else p + int(dom[d, 0])
            across.add(q, t, first_stage + first, into, n)
    for x in range(p):  # own blocks by local copy, proxied ones on to their destination
        for i, (s, t) in enumerate(landing[x]):
            deliver.add(x, t, first_landing + i, p + s)

    everyone = np.arange(p, dtype=np.int64)[None, :]
    phases = [Phase("alltoall within domains", everyone, table(), [within.round("aggregate within the domain")]),
              Phase("alltoall across domains", everyone, table(),
                    [across.round("one message per domain and destination")])]
    if any(landing):
        phases.append(Phase("deliver within domains", everyone, table(),
                            [deliver.round("receive staging and proxy blocks to the output blocks")]))
    return phases, capacity


__all__ = ["MessageLists", "placed_phases"]
