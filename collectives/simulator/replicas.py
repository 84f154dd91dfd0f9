"""Alike scale-up domains: a huge pipeline's messages inside its NVLink domains costed once per kind of domain.

On a cluster without a placement, domain d is ranks [d G, (d + 1) G) and its switch node N + d (cluster.py), and a
message between two nodes of one domain crosses that domain's NVLink links only (rank r's up link r and down
link N + r: Cluster.hop_list), which carry nothing else unless a message between domains takes a PXN hop. Two
domains whose in-domain messages are the same up to the domain's offset - the same ends within the domain,
chunks and stage, message by message in the same order, into receivers that reduce the same - over NVLink
links of the same bandwidth and latency have the same paths, link loads, latencies and seconds per byte. Most
schedules have few kinds of domain (every domain alike in an NVLS stage; a handful of places in a tree across
domains), so the analytic bulk model costs the messages between domains and the in-domain messages of the first
domain of each kind only (`Replicas.kept`), and what reads every message gets the copies back:

* the chunk-hops per tier count each kept in-domain message once per domain of its kind (`copies`; chunk
  counts are whole numbers, so the sums are exact, as stages.window_sums also relies on);
* the cycle rate's means (recurrence.cycle_rows) read the full arrays (`expand`); its balance test counts
  each node's messages on the kept ones, a copied domain's in-domain counts moved to its copies
  (`Replicas.balanced`);
* everything else takes maxima, or the first message attaining one, which the kept messages give unchanged:
  every copy has the values of its original, which comes first in the message order and in the node order
  (both are checked).

Domains whose in-domain messages lie in runs over every domain are compared where the messages lie, a probe
domain's with every other's element by element (`_block_kinds`); otherwise they are sorted into kinds by a hash
of their messages, and every domain is then compared with the first of its kind element by element. Where a
condition fails, `domain_replicas` returns None and the general path (every message) runs. Results are the same
floats either way (tests/unit/test_replicas.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..topology import TIERS
from .flows import PATH_BLOCK, Hops, flow_hops, path_cache
from .model import CostRules


@dataclass
class Replicas:
    """The messages kept for costing when domains repeat the in-domain messages of the first of their kind."""

    kept: np.ndarray  # indices (increasing) of the messages kept: all between domains, the first domains' inside
    originals: np.ndarray  # (copies, c): the messages the dropped ones (rows of `dropped`) are copies of
    dropped: np.ndarray  # (copies, c): the dropped messages, a domain per row, in the order of its original's
    copies: np.ndarray  # per kept message: how many messages it stands for, as float
    local: np.ndarray  # per kept message: it stays inside one domain
    nvlink_links: int  # links [0, nvlink_links) are the ranks' NVLink links
    src: np.ndarray  # the kept messages' ends
    dst: np.ndarray
    kinds: int  # kinds of domain (each costed once)
    rep: np.ndarray  # per domain: the first domain of its kind (itself for those costed)
    gpus_per_domain: int  # G: domain d is ranks [d G, (d + 1) G) and switch node N + d, N = nvlink_links / 2
    messages: int  # all of them, kept and dropped
    # messages between domains on rails 1.. that copy a rail-0 message (`rail_copies`), and their originals;
    # empty where the rails are not costed once
    rail_originals: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rail_dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rails: int = 1  # R: rank r is on rail r % R
    _full: np.ndarray | None = None
    _balanced: bool | None = None

    @property
    def full_index(self) -> np.ndarray:
        """Per message: the kept message it equals (itself, or its original)."""
        if self._full is None:
            full = np.zeros(self.messages, np.int64)
            full[self.kept] = np.arange(self.kept.size)
            full[self.dropped] = full[self.originals]
            full[self.rail_dropped] = full[self.rail_originals]
            self._full = full
        return self._full

    @property
    def balanced(self) -> bool:
        """Every node sends as many messages as it receives (over all messages), counted on the kept ones: a
        node's sends less its receives are those of the kept messages, plus, in a domain that copies another,
        those of the copied domain's in-domain messages at the same place (all kept: every copy is one of
        them, moved to its domain)."""
        if self._balanced is None:
            src, dst, G = self.src, self.dst, self.gpus_per_domain
            N = self.nvlink_links // 2
            D = N // G
            n = max(int(src.max()) + 1, int(dst.max()) + 1, N + D) if src.size else N + D
            net = np.bincount(src, minlength=n) - np.bincount(dst, minlength=n)
            copy = np.flatnonzero(self.rep != np.arange(D))
            if copy.size:
                def at(nodes):  # (domain, place) of in-domain nodes as one index; the switch's place is G
                    return np.where(nodes < N, nodes + nodes // G, (nodes - N) * (G + 1) + G)
                ls, ld = src[self.local], dst[self.local]
                size = D * (G + 1)
                inside = (np.bincount(at(ls), minlength=size) - np.bincount(at(ld), minlength=size)).reshape(D, G + 1)
                moved = inside[self.rep[copy]]
                net[:N].reshape(D, G)[copy] += moved[:, :G]
                net[N + copy] += moved[:, G]
            if self.rail_dropped.size:
                # a copy on rail j sends and receives as its rail-0 original, j ranks on: rail 0's messages
                # between domains (every one has a copy on each other rail) moved to every other rail
                between = ~self.local  # every kept message between domains is a rail-0 original
                rail0 = np.bincount(src[between], minlength=N)[:N] - np.bincount(dst[between], minlength=N)[:N]
                net[:N].reshape(-1, self.rails)[:, 1:] += rail0.reshape(-1, self.rails)[:, :1]
            self._balanced = not bool(net.any())
        return self._balanced

    def expand(self, x: np.ndarray) -> np.ndarray:
        """A per-kept-message array as the array over every message (each copy with its original's value)."""
        return x[self.full_index]

    def separate(self, fidx: np.ndarray, hl: np.ndarray) -> bool:
        """Whether the kept messages' hops keep the domains apart: in-domain messages on NVLink links only,
        messages between domains on none (a PXN hop would share a domain's links with them)."""
        return bool(np.array_equal(self.local[fidx], hl < self.nvlink_links))


_TABLES: dict[int, tuple] = {}  # per topology: node tables and whether every domain's NVLink links are alike


def _tables(topo) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per node: its domain as a message's sender (ranks and domain switches; -1 for other nodes) and as its
    receiver (-2 for other nodes: a message stays inside one domain exactly where the two agree); its place in
    the domain (a rank's index, G for the switch; -1 elsewhere); and whether every domain's NVLink links have
    the same bandwidths, latencies and tiers. Kept per topology."""
    hit = _TABLES.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    N, D, G = int(topo.world_size), int(topo.D), int(topo.G)
    dtype = np.int32 if topo.num_nodes < 2 ** 31 else np.int64
    domain = np.full(topo.num_nodes, -1, dtype)
    place = np.full(topo.num_nodes, -1, dtype)
    domain[:N] = np.arange(N) // G
    domain[N:N + D] = np.arange(D)
    receiver = domain.copy()
    receiver[domain < 0] = -2
    place[:N] = np.arange(N) % G
    place[N:N + D] = G
    value = (domain, receiver, place, _alike_nvlink(topo, N, D, G))
    if len(_TABLES) >= 4:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[id(topo)] = (topo, value)
    return value


def _alike_nvlink(topo, N: int, D: int, G: int) -> bool:
    """Whether every domain's NVLink links (rank r's up link r and down link N + r) have the same bandwidths,
    latencies and tiers, place by place. Where the topology lists its links as blocks of alike links
    (link_blocks) and the up links [0, N) and the down links [N, 2N) are one block each, they are alike
    without reading every link's attributes; otherwise every domain's are compared with the first's."""
    blocks = getattr(topo, "link_blocks", None)
    if blocks is not None:
        starts = blocks()[0]
        inside = starts[(starts > 0) & (starts < 2 * N)]
        if inside.size == 1 and int(inside[0]) == N and int(starts[0]) == 0:
            return True
    bw, lat, tier = topo.link_attributes(np.arange(2 * N, dtype=np.int64))
    per_domain = (x.reshape(2, D, G).transpose(1, 0, 2).reshape(D, 2 * G) for x in (bw, lat, tier))
    return all(bool((x[1:] == x[:1]).all()) for x in per_domain)


def _kinds(rows: list[np.ndarray]) -> np.ndarray:
    """Per domain (row of each (D, c_i) array in `rows`): the first domain whose rows are all equal to its own,
    by a hash of each row, then checked element by element against that first domain (a hash collision would
    fail the check: -1)."""
    D = rows[0].shape[0]
    rng = np.random.default_rng(0x5EED)
    h = np.zeros(D, np.uint64)
    with np.errstate(over="ignore"):
        for x in rows:
            h = h * np.uint64(0x9E3779B97F4A7C15) + (x.view(np.uint64) @ rng.integers(1, 2 ** 63, x.shape[1],
                                                                                       np.uint64))
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    rep = first[inverse]
    copy = np.flatnonzero(rep != np.arange(D))
    if copy.size == 0:
        return rep
    # the copies kind by kind, each compared with its kind's first domain (broadcast), a few million elements at
    # a time; consecutive copies (every domain alike) as a view
    by_kind = copy[np.argsort(rep[copy], kind="stable")]
    cuts = np.flatnonzero(np.r_[True, rep[by_kind[1:]] != rep[by_kind[:-1]], True]).tolist()
    step = max(1, (1 << 22) // max(sum(x.shape[1] for x in rows), 1))
    for lo_k, hi_k in zip(cuts[:-1], cuts[1:], strict=True):
        k = int(rep[by_kind[lo_k]])
        for lo in range(lo_k, hi_k, step):
            at = by_kind[lo:min(lo + step, hi_k)]
            a, b = int(at[0]), int(at[-1]) + 1
            sel = slice(a, b) if b - a == at.size else at
            if not all(bool((x[sel] == x[k]).all()) for x in rows):
                return np.full(D, -1, np.int64)
    return rep


# kinds found by comparing domains with a first one, at most this many times, before hashing every row
MAX_PROBES = 4


def _block_kinds(fields: list[np.ndarray], spans: list[tuple[int, int, int, int]], D: int) -> np.ndarray | None:
    """_kinds of the rows that `spans` lay out (each (start, end, m, w): the fields' elements [start, end) are an
    (m, D, w) block, domain d's the [:, d, :] slice), compared block by block where they lie, without laying
    them out: a domain without a kind (the middle one first: the first domains are where a tree across
    domains is rooted, a kind of their own) and every domain equal to it, element by element, take the kind of
    the first of them, up to MAX_PROBES times. Few kinds (one in NVLS stages, every domain alike) are found so;
    None where more remain or the first probe matches under half of the domains (hashing every row pays then)."""
    rows, cols = [], []  # (D, w) blocks (a row per domain); (m, D) and (m, D, w) blocks (domains on axis 1)
    for x in fields:
        for a, b, m, w in spans:
            blk = x[a:b].reshape(m, D, w)
            if m == 1:
                rows.append(blk[0])
            else:
                cols.append(blk[:, :, 0] if w == 1 else blk)
    rep = np.full(D, -1, np.int64)
    left = np.arange(D)
    for probe in range(MAX_PROBES):
        k = int(left[left.size // 2 if probe == 0 else 0])
        every = left.size == D
        same = np.ones(left.size, bool)
        for blk in rows:
            same &= ((blk if every else blk[left]) == blk[k]).all(axis=1)
        for blk in cols:
            same &= ((blk if every else blk[:, left]) == blk[:, k:k + 1]).all(axis=(0,) if blk.ndim == 2 else (0, 2))
        if probe == 0 and 2 * int(same.sum()) < D:
            return None
        rep[left[same]] = left[same][0]  # (left is increasing)
        left = left[~same]
        if not left.size:
            return rep
    return None


def _domain_runs(dom: np.ndarray, D: int) -> list[tuple[int, int]] | None:
    """The runs of `dom` (the domains of the in-domain messages, in message order) when each run lists every
    domain equally often in increasing order, as a lane over members in order does: (start, end) of each; else
    None. Row d of P (domain d's messages in their order) is then each run's block of domain d, run after run."""
    cut = (np.flatnonzero(dom[1:] < dom[:-1]) + 1).tolist()
    runs = list(zip([0] + cut, cut + [dom.size], strict=True))
    ids = np.arange(D, dtype=dom.dtype)[:, None]
    for a, b in runs:
        if (b - a) % D or not bool((dom[a:b].reshape(D, -1) == ids).all()):
            return None
    return runs


def rail_copies(topo, src: np.ndarray, dst: np.ndarray, fields: tuple, receiver_fields: tuple, between: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(originals, copies, rail 0's): of the messages between domains `between` (indices, increasing), those on
    rails 1.., the rail-0 message each copies, and those on rail 0, where every message between domains is a
    copy of one on rail 0 moved by its rail: the message between two ranks on rail j > 0 has one between the
    rail-0 GPUs of the same domains (ranks src - j, dst - j), with the same `fields` (per message: chunks,
    stage) and `receiver_fields` (per node, read at the receiver: what it reduces), j places before it in the
    list of messages between domains (rows of R messages, rail 0 to R - 1: NCCL's NVLS trees and SHARP's rail
    trees) or j blocks of n / R before it (rail after rail: a ring over the domains per rail). On a fabric
    whose rails are copies of one another for such messages (Cluster.rail_link_steps: paths moved link by
    link, the rails' links disjoint) rail j's links then carry rail 0's loads, so a copy has its original's
    path latency and seconds per byte, and its original comes first in the message order and the node order.
    Messages to or from fabric switches (SHARP's rail trees) are copies on the same terms where every message
    between domains has a fabric switch at one end (`_fabric_rails_alike`). None where any message between
    domains is not of either form (one between rails, a mix of the two forms: they could share links), or the
    rails are not copies."""
    R = int(getattr(topo, "R", 1))
    if R < 2 or not between.size or between.size % R:
        return None
    steps = getattr(topo, "rail_link_steps", None)
    N, n = int(topo.world_size), between.size
    rank_rails = steps is not None and steps() is not None
    fabric = int(getattr(topo, "fabric_base", topo.num_nodes))
    lo, hi = int(between[0]), int(between[-1]) + 1
    if hi - lo == n:  # one range: read where the messages lie, as (n / R, R) views (column j: rail j)
        s, d = src[lo:hi], dst[lo:hi]
        ranks = int(s.max()) < N and int(d.max()) < N
        if (ranks and not rank_rails) or (not ranks and not (hasattr(topo, "adjacent_links") and
                                                             bool(((s >= fabric) | (d >= fabric)).all()))):
            return None
        for rails_last in (True, False):
            index = np.arange(lo, hi).reshape(-1, R) if rails_last else np.arange(lo, hi).reshape(R, -1).T
            alike = (_rails_alike(index, src, dst, fields, receiver_fields, R, N, lo) if ranks else
                     _fabric_rails_alike(topo, index, src, dst, fields, receiver_fields, R, N, fabric, lo))
            if alike:
                return np.repeat(index[:, 0], R - 1), index[:, 1:].ravel(), index[:, 0].copy()
        return None
    if not rank_rails:
        return None
    s, d = src[between], dst[between]
    if int(s.max()) >= N or int(d.max()) >= N:
        return None
    rail = s % R
    if not np.array_equal(rail, d % R):
        return None
    for index in (np.arange(n).reshape(-1, R), np.arange(n).reshape(R, -1).T):
        if np.array_equal(rail[index], np.broadcast_to(np.arange(R), index.shape)):
            at = between[index]
            if _rails_alike(at, src, dst, fields, receiver_fields, R, N, None):
                return np.repeat(at[:, 0], R - 1), at[:, 1:].ravel(), at[:, 0].copy()
    return None


def _laid(x: np.ndarray, index: np.ndarray, lo: int | None) -> np.ndarray:
    """x[index] for an (copies, R) `index`; where it lays out the range of messages from `lo` (rows of R, or R
    blocks side by side), a view of x."""
    if lo is None:
        return x[index]
    y = x[lo:lo + index.size]
    return y.reshape(index.shape) if index[0, -1] == lo + index.shape[1] - 1 else y.reshape(index.shape[1], -1).T


def _rails_alike(index: np.ndarray, src: np.ndarray, dst: np.ndarray, fields: tuple, receiver_fields: tuple,
                 R: int, N: int, lo: int | None) -> bool:
    """Whether the messages `index` ((copies, R): column j on rail j) are rail-0 messages between ranks (column
    0) and their copies moved by j ranks with the same fields. `lo`: `index` lays out the range of messages
    from lo, read as views of the arrays (None: gathered)."""
    S, D = _laid(src, index, lo), _laid(dst, index, lo)
    step = np.broadcast_to(np.arange(R), S.shape)
    if int(S.max()) >= N or int(D.max()) >= N or (S[:, 0] % R).any() or (D[:, 0] % R).any():
        return False
    if not (np.array_equal(S - S[:, :1], step) and np.array_equal(D - D[:, :1], step)):
        return False
    return all(bool((X == X[:, :1]).all()) for X in [_laid(x, index, lo) for x in fields] +
               [x[D] for x in receiver_fields])


def _fabric_rails_alike(topo, index: np.ndarray, src: np.ndarray, dst: np.ndarray, fields: tuple,
                        receiver_fields: tuple, R: int, N: int, fabric: int, lo: int | None) -> bool:
    """Whether the messages `index` ((copies, R)), each with a fabric switch (node >= `fabric`) at one end and a
    rank or a fabric switch at the other, are rail-0 messages (column 0) and copies (column j) under a map of
    the nodes that moves a rank by j (rail 0's ranks to rail j's) and a fabric switch to a fabric switch, one
    per rail, distinct across rails and after its original in the node order, with the same fields. Such a
    message crosses the one link between its two adjacent ends (Cluster.hop_list's path; `adjacent_links` finds
    it, and raises for ends that are not adjacent, as costing the message would), so a copy crosses the image
    of its original's link: the map of the links is one-to-one and the rails' links are disjoint, as the
    nodes' are; the links' attributes are compared, as are the fields. Messages between a rank and a switch
    need only rail 0's links where each copy's switch is its original's moved by the topology's rail_leaf_step
    (that makes it the copy's rank's leaf, over a cable with the original's attributes)."""
    S, D = _laid(src, index, lo), _laid(dst, index, lo)
    for X in (S, D):
        rank = X[:, 0] < N
        if not np.array_equal(X < N, np.broadcast_to(rank[:, None], X.shape)):
            return False  # a rank's copy is a rank, a switch's a switch
        if rank.any():
            r = X[rank]
            if (r[:, 0] % R).any() or not np.array_equal(r - r[:, :1], np.broadcast_to(np.arange(R), r.shape)):
                return False
        if not rank.all() and int(X[~rank].min()) < fabric:
            return False  # a domain's switch at a message between domains
    # the switches' map: each rail-0 switch to one switch per rail (one row wherever it appears), all distinct
    sw = np.concatenate([S[S[:, 0] >= fabric], D[D[:, 0] >= fabric]]) - fabric
    size = int(sw.max()) + 1
    some = np.zeros(size, np.int64)
    some[sw[:, 0]] = np.arange(sw.shape[0])  # a row of each rail-0 switch (any: every row must equal it)
    if not np.array_equal(sw[some[sw[:, 0]]], sw) or bool((sw[:, 1:] <= sw[:, :1]).any()):
        return False
    distinct = np.count_nonzero(np.bincount(sw[:, 0], minlength=size))
    if np.count_nonzero(np.bincount(sw.ravel(), minlength=size)) != R * distinct:
        return False  # two switches of rail 0 map to one, or a rail's switch is another rail's
    if not all(bool((X == X[:, :1]).all()) for X in [_laid(x, index, lo) for x in fields] +
               [x[D] for x in receiver_fields]):
        return False
    links = topo.adjacent_links
    leaf_step = getattr(topo, "rail_leaf_step", None)
    step = None if leaf_step is None else leaf_step()
    if step is not None:
        # messages between a rank and a switch: where each copy's switch is its original's moved by j leaf steps
        # (rail_leaf_step), the copy's switch is its rank's leaf once rail 0's is, and the cable between them
        # has rail 0's attributes; so rail 0's links alone are found (each a rank and its leaf: adjacent_links
        # raises otherwise, as costing the message would)
        from_rank = S[:, 0] < N
        rank_row = from_rank | (D[:, 0] < N)
        switch = np.where(from_rank[:, None], D, S)[rank_row]
        if np.array_equal(switch - switch[:, :1], np.broadcast_to(np.arange(R) * step, switch.shape)):
            links(S[rank_row, 0], D[rank_row, 0])
            S, D = S[~rank_row], D[~rank_row]
    # the links (hop_list's one hop of a message with a switch at one end) and their attributes, PATH_BLOCK
    # messages at a time (a block's temporaries stay in the processor's caches)
    s, d = S.ravel(), D.ravel()
    rows = max(1, PATH_BLOCK // R)
    for a in range(0, S.shape[0], rows):
        hl = links(s[a * R:(a + rows) * R], d[a * R:(a + rows) * R])
        for x in (topo.link_attributes(hl) if hasattr(topo, "link_attributes") else
                  (topo.link_bandwidth(hl), topo.link_latency(hl), topo.link_tier(hl))):
            x = x.reshape(-1, R)
            if not bool((x == x[:, :1]).all()):
                return False
    return True


# the least share of a pipeline's messages the copies must be for the shortcut to pay for its checks
MIN_DROPPED = 0.4


def _reduced(rn: np.ndarray, ru: np.ndarray, nodes: int) -> np.ndarray | None:
    """Per node: what it reduces in the round (its reduction time's share), -1 for nothing; None when no node
    reduces."""
    if not rn.size:
        return None
    size = max(int(rn.max()) + 1, nodes)
    return np.where(np.bincount(rn, minlength=size) > 0, np.bincount(rn, weights=ru, minlength=size), -1.0)


def _rails_alone(topo, flows: tuple, lag: np.ndarray, inside: np.ndarray, reduced: np.ndarray | None
                 ) -> Replicas | None:
    """The Replicas of messages with too few inside domains for domains to be costed once (`inside`: their
    indices) where rail 0's messages between domains stand for every rail's (rail_copies): every message inside
    a domain kept, or None where the rails are not copies or the copies are too few (MIN_DROPPED)."""
    src, dst, units = flows[:3]
    N, G, D = int(topo.world_size), int(topo.G), int(topo.D)
    keep = np.ones(src.size, bool)
    keep[inside] = False
    rails = rail_copies(topo, src, dst, (units, lag), () if reduced is None else (reduced,), np.flatnonzero(keep))
    if rails is None or rails[1].size < MIN_DROPPED * src.size:
        return None
    originals, dropped, rail0 = rails
    keep[:] = True
    keep[dropped] = False
    kept = np.flatnonzero(keep)
    copies = np.ones(kept.size)
    copies[np.searchsorted(kept, rail0)] = float(topo.R)  # itself and one copy per other rail
    local = np.zeros(kept.size, bool)
    local[np.searchsorted(kept, inside)] = True
    none = np.zeros((0, 0), np.int64)  # no domain copies another: each its own kind
    return Replicas(kept, none, none, copies, local, 2 * N, src[kept], dst[kept], D, np.arange(D), G, src.size,
                    originals, dropped, int(topo.R))


def domain_replicas(rules: CostRules, flows: tuple, lag: np.ndarray, integral: bool) -> Replicas | None:
    """The Replicas of messages `flows` (src, dst, chunks, reducing nodes, their chunks) at stages `lag`
    (`integral`: the chunk counts are whole numbers), or None where the copies would be too few of the messages
    (MIN_DROPPED), or the cluster's domains are not alike (a placement, uneven domains, another topology)."""
    topo = rules.topology
    if getattr(topo, "_slot", 1) is not None or not hasattr(topo, "hop_list") or not hasattr(topo, "D"):
        return None
    N, G, D = int(topo.world_size), int(topo.G), int(topo.D)
    src, dst, units, rn, ru = flows
    if D < 2 or N != G * D or src.size == 0 or not integral or float(units.sum()) * 64 >= 2.0 ** 53:
        return None  # (chunk-hop sums are exact in any order for whole chunks far below 2**53)
    domain, receiver, place, alike = _tables(topo)
    if not alike:
        return None
    ds = domain[src]
    pos = np.flatnonzero(ds == receiver[dst])
    if not pos.size or pos.size < MIN_DROPPED * src.size:  # mostly between domains: only the rails may repeat
        return _rails_alone(topo, flows, lag, pos, _reduced(rn, ru, N + D))
    if pos.size % D:
        return None
    dom = ds[pos]
    del ds
    top = int(lag.max()) + 1 if lag.size else 1
    if (G + 1) ** 2 * top >= 2 ** 62 or (lag.size and int(lag.min()) < 0):
        return None
    reduced = _reduced(rn, ru, N + D)
    # per in-domain message, read in message order: its ends within the domain and its stage in one integer (as
    # 64-bit words), its chunks and its receiver's reduction; a field with one value for all of them tells no
    # domain from another, and is left out
    to = dst[pos]
    code = place[src[pos]].astype(np.int64)
    code *= G + 1
    code += place[to]
    code *= top
    code += lag[pos]
    fields = [code, units[pos]] + ([] if reduced is None else [reduced[to]])
    del to, code
    fields = fields[:1] + [x for x in fields[1:] if not float(x.min()) == float(x.max())]
    # laid out domain by domain, each domain's messages in their order: row d of P is domain d's. Lanes list
    # their members in order, so the messages are runs over every domain in order (_domain_runs): the runs'
    # (D, c_r) blocks side by side; otherwise a stable sort of the domains (the same rows)
    runs = _domain_runs(dom, D)
    if runs is None:
        if not np.array_equal(np.bincount(dom, minlength=D), np.full(D, pos.size // D)):
            return None
        order = np.argsort(dom, kind="stable")
        P = pos[order].reshape(D, -1)
        rows = [x[order].reshape(D, -1) for x in fields]
        rep = None
        del order
    else:
        # consecutive runs of one width w (m of them) are one (m, D, w) block, read domain by domain
        spans, i = [], 0
        while i < len(runs):
            w, j = (runs[i][1] - runs[i][0]) // D, i + 1
            while j < len(runs) and (runs[j][1] - runs[j][0]) // D == w:
                j += 1
            spans.append((runs[i][0], runs[j - 1][1], j - i, w))
            i = j

        def laid(x):
            blocks = [x[a:b].reshape(m, D, w)[0] if m == 1 else
                      x[a:b].reshape(m, D, w).transpose(1, 0, 2).reshape(D, m * w) for a, b, m, w in spans]
            return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)

        P = laid(pos)
        rep = _block_kinds(fields, spans, D)
        rows = [laid(x) for x in fields] if rep is None else None
    del fields
    if rep is None:
        rep = _kinds(rows)
    del rows
    copy = np.flatnonzero(rep != np.arange(D))
    if rep[0] < 0 or copy.size == 0 or copy.size * P.shape[1] < MIN_DROPPED * src.size:
        return None
    # consecutive copies of one kind (every domain alike but the first): a view of P and its first row, not
    # gathers of every copy's row
    consecutive = int(copy[-1]) - int(copy[0]) + 1 == copy.size
    dropped = P[int(copy[0]):int(copy[-1]) + 1] if consecutive else P[copy]
    first = rep[copy]
    one_kind = bool((first == first[0]).all())
    originals = np.broadcast_to(P[int(first[0])], dropped.shape) if one_kind else P[first]
    if not bool((dropped > originals).all()):  # an original comes before its copies
        return None
    keep = np.ones(src.size, bool)
    keep[dropped.ravel()] = False
    kept = np.flatnonzero(keep)
    kept_src, kept_dst = src[kept], dst[kept]
    local = domain[kept_src] == receiver[kept_dst]
    # the messages between domains (all kept): on a fabric whose rails are copies, rail 0's stand for all rails'
    rails = rail_copies(topo, src, dst, (units, lag), () if reduced is None else (reduced,), kept[~local])
    no_rails = np.zeros(0, np.int64)
    rail_originals, rail_dropped, rail0 = (no_rails,) * 3 if rails is None else rails
    if rail_dropped.size:
        still = local.copy()
        still[np.searchsorted(kept, rail0)] = True
        kept, kept_src, kept_dst, local = kept[still], kept_src[still], kept_dst[still], local[still]
    copies = np.ones(kept.size)
    kinds = np.flatnonzero(rep == np.arange(D))
    copies[np.searchsorted(kept, P[kinds])] = np.bincount(rep, minlength=D)[kinds][:, None]
    if rail0.size:
        copies[np.searchsorted(kept, rail0)] = float(topo.R)  # itself and one copy per other rail
    return Replicas(kept, originals, dropped, copies, local, 2 * N, kept_src, kept_dst, kinds.size, rep, G,
                    src.size, rail_originals, rail_dropped, int(topo.R) if rails is not None else 1)


WHOLE_BLOCK = 1 << 16  # elements whole_numbers reads at a time


def whole_numbers(x: np.ndarray) -> bool:
    """np.array_equal(x, np.floor(x)) read WHOLE_BLOCK elements at a time: the block's floor stays in the
    processor's caches instead of a fresh array as large as x (millions of chunk counts)."""
    return all(bool((np.floor(x[lo:lo + WHOLE_BLOCK]) == x[lo:lo + WHOLE_BLOCK]).all())
               for lo in range(0, x.size, WHOLE_BLOCK))


def replicated_hops(rules: CostRules, flows: tuple, lag: np.ndarray | None = None, whole: bool | None = None,
                    share: bool = False) -> tuple[Hops, np.ndarray]:
    """flow_hops of messages `flows` at stages `lag` (a pipeline's stages; None: one round's messages, all at
    lag 0), and the lags of the messages costed: the messages between domains and the in-domain messages of the
    first domain of each kind only where domains repeat others (domain_replicas; the Hops then carry the
    Replicas), else all. `whole`: the chunk counts are whole numbers (None: read them). For the bulk model only,
    which reads maxima and sums over the messages."""
    cache = path_cache(rules.topology)
    units = flows[2]
    lag = np.zeros(units.size, np.int64) if lag is None else lag
    whole = whole_numbers(units) if whole is None else whole
    rep = domain_replicas(rules, flows, lag, whole)
    if rep is not None:
        k = rep.kept
        hops = flow_hops(rules, (rep.src, rep.dst, flows[2][k], flows[3], flows[4]), cache, share=share)
        if rep.separate(hops.fidx, hops.hl):
            hops.replicas = rep
            if hops.hl.size:  # chunk-hops per tier: each kept in-domain message once per domain of its kind
                hops.tier = np.bincount(hops.hop_tier, weights=(hops.units * rep.copies)[hops.fidx],
                                        minlength=len(TIERS))[:len(TIERS)]
            return hops, lag[k]
    return flow_hops(rules, flows, cache, share=share), lag


__all__ = ["Replicas", "domain_replicas", "replicated_hops", "whole_numbers"]
