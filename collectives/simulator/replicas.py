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
* the cycle rate's means (recurrence.cycle_rows) are over every message (`Replicas.mean`: the full array's
  values summed a block at a time in numpy's order, the same float as `expand(x).mean()`); its balance test
  counts each node's messages on the kept ones, a copied domain's in-domain counts moved to its copies
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

from dataclasses import dataclass

import numpy as np

from ..topology import TIERS
from .flows import Hops, flow_hops, path_cache
from .model import CostRules
from .rails import RailRows, rail_rows


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
    # the messages between domains as rows of a rail-0 message and its copies on rails 1.. (rails.rail_rows);
    # None where the rails are not costed once
    rail_rows: RailRows | None = None
    rails: int = 1  # R: rank r is on rail r % R
    _full: np.ndarray | None = None
    _balanced: bool | None = None

    @property
    def full_index(self) -> np.ndarray:
        """Per message: the kept message it equals (itself, or its original)."""
        if self._full is None:
            # (32-bit indices where the kept messages allow: half the memory to write and to read per expand)
            full = np.zeros(self.messages, np.int32 if self.kept.size < 2 ** 31 else np.int64)
            full[self.kept] = np.arange(self.kept.size)
            full[self.dropped] = full[self.originals]
            if self.rail_rows is not None:
                self.rail_rows.copy_originals(full)
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
            if self.rail_rows is not None:
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

    def mean(self, x: np.ndarray) -> float:
        """float(self.expand(x).mean()), the same float, summed MEAN_LEAF messages at a time as numpy sums the
        whole (pairwise_sum) instead of laying out every message's value."""
        full = self.full_index
        if x.dtype != np.float64 or not _PAIRWISE:
            return float(self.expand(x).mean())
        return _pairwise_sum(lambda lo, hi: x[full[lo:hi]], 0, full.size) / full.size

    def separate(self, fidx: np.ndarray, hl: np.ndarray) -> bool:
        """Whether the kept messages' hops keep the domains apart: in-domain messages on NVLink links only,
        messages between domains on none (a PXN hop would share a domain's links with them)."""
        return bool(np.array_equal(self.local[fidx], hl < self.nvlink_links))


MEAN_LEAF = 1 << 16  # messages Replicas.mean sums at a time (at least 128: numpy halves no block of 128 or fewer)


def _pairwise_sum(values, lo: int, n: int) -> float:
    """np.add.reduce of the n float64 values from lo, `values(a, b)` giving [a, b) as a contiguous array: numpy
    sums such an array pairwise, its two halves (the first a multiple of 8 long, n // 2 rounded down to one)
    apart down to blocks of 128, so halving the same way down to MEAN_LEAF values and letting numpy sum those
    adds the same numbers in the same order (checked at import: _PAIRWISE)."""
    if n <= MEAN_LEAF:
        return float(np.add.reduce(values(lo, lo + n)))
    half = n // 2
    half -= half % 8
    return _pairwise_sum(values, lo, half) + _pairwise_sum(values, lo + half, n - half)


def _pairwise_is_numpys() -> bool:
    """Whether _pairwise_sum gives numpy's sum, bit for bit, on an array of random values several MEAN_LEAF
    long (another order of additions would differ in the last bits; Replicas.mean then lays the values out)."""
    x = np.random.default_rng(0x5EED).random(3 * MEAN_LEAF + 1001) * np.logspace(0, 12, 3 * MEAN_LEAF + 1001)
    return float(np.add.reduce(x)) == _pairwise_sum(lambda a, b: x[a:b], 0, x.size)


_PAIRWISE = _pairwise_is_numpys()

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
    indices) where rail 0's messages between domains stand for every rail's (rails.rail_rows): every message inside
    a domain kept, or None where the rails are not copies or the copies are too few (MIN_DROPPED)."""
    src, dst, units = flows[:3]
    N, G, D = int(topo.world_size), int(topo.G), int(topo.D)
    keep = np.ones(src.size, bool)
    keep[inside] = False
    rails = rail_rows(topo, src, dst, (units, lag), () if reduced is None else (reduced,), np.flatnonzero(keep))
    if rails is None or rails.rows * (rails.R - 1) < MIN_DROPPED * src.size:
        return None
    keep[:] = True
    rails.set_copies(keep, False)
    kept = np.flatnonzero(keep)
    copies = np.ones(kept.size)
    copies[np.searchsorted(kept, rails.rail0)] = float(topo.R)  # itself and one copy per other rail
    local = np.zeros(kept.size, bool)
    local[np.searchsorted(kept, inside)] = True
    none = np.zeros((0, 0), np.int64)  # no domain copies another: each its own kind
    return Replicas(kept, none, none, copies, local, 2 * N, src[kept], dst[kept], D, np.arange(D), G, src.size,
                    rails, int(topo.R))


INSIDE_BLOCK = 1 << 16  # messages _inside and _fields read at a time


def _one_value(x: np.ndarray) -> bool:
    """Whether x's least and largest values are equal (as _fields leaves a field out: a NaN never is)."""
    return bool(x.size) and float(x.min()) == float(x.max())


def _inside(src: np.ndarray, dst: np.ndarray, domain: np.ndarray, receiver: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inside, pos, dom): per message whether it stays inside a domain, the indices of those that do
    (increasing) and their domains; read INSIDE_BLOCK messages at a time, so that the temporary arrays stay in
    the processor's caches."""
    inside = np.empty(src.size, bool)
    doms = []
    for lo in range(0, src.size, INSIDE_BLOCK):
        ds = domain[src[lo:lo + INSIDE_BLOCK]]
        here = inside[lo:lo + INSIDE_BLOCK]
        np.equal(ds, receiver[dst[lo:lo + INSIDE_BLOCK]], out=here)
        doms.append(ds[here])
    return inside, np.flatnonzero(inside), np.concatenate(doms) if doms else np.zeros(0, domain.dtype)


def _fields(messages: np.ndarray, src: np.ndarray, dst: np.ndarray, units: np.ndarray, lag: np.ndarray,
            reduced: np.ndarray | None, place: np.ndarray, G: int, top: int) -> list[np.ndarray]:
    """The fields that tell one domain's in-domain messages from another's, per message of `messages` (indices,
    in the order given): its ends within the domain and its stage in one integer (as 64-bit words), then its
    chunks and its receiver's reduction, each only where it is not one value for all of them (such a field
    tells no domain from another). Read INSIDE_BLOCK messages at a time into arrays of their final size (a
    block of consecutive messages in place), so that the temporary arrays stay in the processor's caches and
    the process takes no more fresh memory than the fields need."""
    n = messages.size
    code = np.empty(n, np.int64)
    # a field with one value over every message (or node) has one over these: not laid out
    chunks = None if _one_value(units) else np.empty(n, units.dtype)
    into = None if reduced is None or _one_value(reduced) else np.empty(n, reduced.dtype)
    for lo in range(0, n, INSIDE_BLOCK):
        at = messages[lo:lo + INSIDE_BLOCK]
        hi = lo + at.size
        if int(at[-1]) - int(at[0]) == at.size - 1:  # consecutive messages (an NVLS stage's lanes): in place
            at = slice(int(at[0]), int(at[-1]) + 1)
        s, to = src[at], dst[at]
        c = code[lo:hi]
        c[:] = place[s]
        c *= G + 1
        c += place[to]
        c *= top
        c += lag[at]
        if chunks is not None:
            chunks[lo:hi] = units[at]
        if into is not None:
            into[lo:hi] = reduced[to]
    # (and one over these messages tells none of their domains apart either)
    return [code] + [x for x in (chunks, into) if x is not None and x.size and not _one_value(x)]


def _between(inside: np.ndarray, n: int) -> np.ndarray | range:
    """The messages not `inside` (n of them), increasing: a range where they lie in one (read by its ends, not
    listed), else their indices."""
    if n and int(inside.size) > 0:
        lo = int(np.argmin(inside))  # the first message between domains
        hi = inside.size - int(np.argmin(inside[::-1]))
        if hi - lo == n and not inside[lo]:
            return range(lo, hi)
    return np.flatnonzero(~inside)


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
    top = int(lag.max()) + 1 if lag.size else 1
    # the stage fits the in-domain messages' code (and no stage is negative): else no domain is compared
    coded = (G + 1) ** 2 * top < 2 ** 62 and not (lag.size and int(lag.min()) < 0)
    reduced = _reduced(rn, ru, N + D)
    inside, pos, dom = _inside(src, dst, domain, receiver)
    if not pos.size or pos.size < MIN_DROPPED * src.size:  # mostly between domains: only the rails may repeat
        return _rails_alone(topo, flows, lag, pos, reduced)
    if pos.size % D or not coded:
        return None
    # laid out domain by domain, each domain's messages in their order: row d of P is domain d's. Lanes list
    # their members in order, so the messages are runs over every domain in order (_domain_runs): the runs'
    # (D, c_r) blocks side by side; otherwise a stable sort of the domains (the same rows)
    runs = _domain_runs(dom, D)
    if runs is None:
        if not np.array_equal(np.bincount(dom, minlength=D), np.full(D, pos.size // D)):
            return None
        P = pos[np.argsort(dom, kind="stable")].reshape(D, -1)
        # the fields read domain by domain (rows of P), not in message order and then sorted
        rows = [x.reshape(D, -1) for x in _fields(P.ravel(), src, dst, units, lag, reduced, place, G, top)]
        rep = None
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
        fields = _fields(pos, src, dst, units, lag, reduced, place, G, top)
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
    # the messages between domains (all kept): on a fabric whose rails are copies, rail 0's stand for all rails'
    rails = rail_rows(topo, src, dst, (units, lag), () if reduced is None else (reduced,),
                      _between(inside, src.size - pos.size))
    rail0 = np.zeros(0, np.int64) if rails is None else rails.rail0
    keep = np.ones(src.size, bool)
    keep[dropped.ravel()] = False
    if rails is not None:
        rails.set_copies(keep, False)
    kept = np.flatnonzero(keep)
    local = inside[kept]
    kept_src, kept_dst = src[kept], dst[kept]
    copies = np.ones(kept.size)
    kinds = np.flatnonzero(rep == np.arange(D))
    copies[np.searchsorted(kept, P[kinds])] = np.bincount(rep, minlength=D)[kinds][:, None]
    if rail0.size:
        copies[np.searchsorted(kept, rail0)] = float(topo.R)  # itself and one copy per other rail
    return Replicas(kept, originals, dropped, copies, local, 2 * N, kept_src, kept_dst, kinds.size, rep, G,
                    src.size, rails, int(topo.R) if rails is not None else 1)


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
            return hops, lag[k].astype(np.int64)
    return flow_hops(rules, flows, cache, share=share), lag.astype(np.int64, copy=False)


__all__ = ["RailRows", "Replicas", "domain_replicas", "rail_rows", "replicated_hops", "whole_numbers"]
