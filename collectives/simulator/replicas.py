"""Identical scale-up domains: a huge pipeline's messages inside its NVLink domains costed on one domain.

On a cluster without a placement, domain d is ranks [d G, (d + 1) G) and its switch node N + d (cluster.py), and a
message between two nodes of one domain crosses that domain's NVLink links only (rank r's up link r and down
link N + r: Cluster.hop_list), which carry nothing else unless a message between domains takes a PXN hop. When
every domain's in-domain messages are domain 0's shifted by the domain's offset - the same ends within the
domain, chunks and stage, in the same order, into receivers that reduce the same - over NVLink links of the same
bandwidth and latency, their paths, link loads, latencies and seconds per byte are domain 0's. The analytic bulk
model then costs the messages between domains and domain 0's in-domain messages only (`Replicas.kept`), and
what reads every message gets the copies back:

* the chunk-hops per tier count each kept in-domain message D times (`copies`; chunk counts are whole numbers,
  so the sums are exact, as stages.window_sums also relies on);
* the cycle rate's balance test and means (recurrence.cycle_rows) read the full arrays (`expand`);
* everything else takes maxima, or the first message attaining one, which the kept messages give unchanged:
  every copy has the values of its domain-0 original, which comes first in the message order and in the node
  order (both are checked).

Every condition is checked on the arrays; where one fails, `domain_replicas` returns None and the general path
(every message) runs. Results are the same floats either way (tests/unit/test_replicas.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import CostRules
from .stages import stable_order


@dataclass
class Replicas:
    """The messages of a pipeline kept for costing when its domains repeat domain 0's in-domain messages."""

    kept: np.ndarray  # indices (increasing) of the messages kept: all between domains, domain 0's inside one
    full_index: np.ndarray  # per message: the kept message it equals (itself, or its domain-0 original)
    copies: np.ndarray  # per kept message: how many messages it stands for (D or 1), as float
    local: np.ndarray  # per kept message: it stays inside one domain
    nvlink_links: int  # links [0, nvlink_links) are the ranks' NVLink links
    src: np.ndarray  # every message's ends
    dst: np.ndarray
    gpus_per_domain: int
    # per kept message: 1 where it counts towards its links' loads, 0 for a copy kept in a domain other than
    # domain 0 (its links load as domain 0's: `load_links`); None when no copy is kept
    own_load: np.ndarray | None = None

    def load_links(self, hl: np.ndarray) -> np.ndarray:
        """Links as their loads are summed: every domain's NVLink links as domain 0's (rank r's up link r and
        down link N + r as those of rank r mod G), other links as themselves."""
        N, G = self.nvlink_links // 2, self.gpus_per_domain
        return np.where(hl < N, hl % G, np.where(hl < 2 * N, N + (hl - N) % G, hl))

    @property
    def balanced(self) -> bool:
        """Every node sends as many messages as it receives (over all messages)."""
        n = max(int(self.src.max()), int(self.dst.max())) + 1
        return bool(np.array_equal(np.bincount(self.src, minlength=n), np.bincount(self.dst, minlength=n)))

    def expand(self, x: np.ndarray) -> np.ndarray:
        """A per-kept-message array as the array over every message (each copy with its original's value)."""
        return x[self.full_index]

    def separate(self, fidx: np.ndarray, hl: np.ndarray) -> bool:
        """Whether the kept messages' hops keep the domains apart: in-domain messages on NVLink links only,
        messages between domains on none (a PXN hop would share a domain's links with them)."""
        return bool(np.array_equal(self.local[fidx], hl < self.nvlink_links))


_TABLES: dict[int, tuple] = {}  # per topology: node tables and whether every domain's NVLink links are alike


def _tables(topo) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per node: its domain (ranks and domain switches; -1 for other nodes) and its place in the domain (a
    rank's index, G for the switch; -1 elsewhere); and whether every domain's NVLink links have the same
    bandwidths, latencies and tiers. Kept per topology."""
    hit = _TABLES.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    N, D, G = int(topo.world_size), int(topo.D), int(topo.G)
    dtype = np.int32 if topo.num_nodes < 2 ** 31 else np.int64
    domain = np.full(topo.num_nodes, -1, dtype)
    place = np.full(topo.num_nodes, -1, dtype)
    domain[:N] = np.arange(N) // G
    domain[N:N + D] = np.arange(D)
    place[:N] = np.arange(N) % G
    place[N:N + D] = G
    bw, lat, tier = topo.link_attributes(np.arange(2 * N, dtype=np.int64))
    alike = all(_rows_equal(x.reshape(2, D, G).transpose(1, 0, 2).reshape(D, 2 * G)) for x in (bw, lat, tier))
    value = (domain, place, alike)
    if len(_TABLES) >= 4:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[id(topo)] = (topo, value)
    return value


def _rows_equal(x: np.ndarray) -> bool:
    """Every row of the (D, c) array x equals its first."""
    return bool((x[1:] == x[:1]).all())


def _columns_equal(x: np.ndarray) -> np.ndarray:
    """Per column of the (D, c) array x: every row holds its first row's value."""
    return (x[1:] == x[:1]).all(axis=0)


def _copies(P: np.ndarray, src, dst, units, lag, place: np.ndarray, reduced) -> np.ndarray:
    """Per column of P (row d: domain d's in-domain messages, in order): whether every row's message is a copy
    of row 0's (same stage, a receiver that reduces the same: `reduced`, per node the chunks it reduces and
    whether it reduces, or None); all False unless every row loads its domain's links as row 0 does (the same
    ends within the domain and chunks, message by message)."""
    if not all(_rows_equal(x) for x in (place[src[P]], place[dst[P]], units[P])):
        return np.zeros(P.shape[1], bool)
    same = _columns_equal(lag[P])
    if reduced is not None:  # what each in-domain receiver reduces in the round (its reduction time's share)
        to = dst[P]
        same &= _columns_equal(reduced[0][to]) & _columns_equal(reduced[1][to])
    return same


# the least share of a pipeline's messages the copies must be for the shortcut to pay for its checks
MIN_DROPPED = 0.4


def domain_replicas(rules: CostRules, flows: tuple, lag: np.ndarray, integral: bool) -> Replicas | None:
    """The Replicas of a pipeline's messages `flows` (src, dst, chunks, reducing nodes, their chunks) with
    stages `lag` (`integral`: the chunk counts are whole numbers), or None where no in-domain message of domain
    0 has its copies in every other domain (or the cluster's domains are not alike: a placement, uneven
    domains, another topology).

    Every domain's in-domain messages must load its links as domain 0's do (the same ends within the domain and
    chunks, message by message); a message of domain 0 then stands for its copies when they also run at its
    stage into receivers that reduce what its receiver reduces. Copies that do not (a rank that reduces what a
    tree across domains sends it, depending on its place in that tree) are kept as messages of their own."""
    topo = rules.topology
    if getattr(topo, "_slot", 1) is not None or not hasattr(topo, "hop_list") or not hasattr(topo, "D"):
        return None
    N, G, D = int(topo.world_size), int(topo.G), int(topo.D)
    src, dst, units, rn, ru = flows
    if D < 2 or N != G * D or src.size == 0 or not integral or float(units.sum()) * 64 >= 2.0 ** 53:
        return None  # (chunk-hop sums are exact in any order for whole chunks far below 2**53)
    domain, place, alike = _tables(topo)
    if not alike:
        return None
    ds = domain[src]
    local = (ds == domain[dst]) & (ds >= 0)
    pos = np.flatnonzero(local)
    if pos.size == 0 or pos.size % D:
        return None
    dom = ds[pos]
    if not np.array_equal(np.bincount(dom, minlength=D), np.full(D, pos.size // D)):
        return None
    reduced = None
    if rn.size:
        size = max(int(rn.max()) + 1, N + D)
        reduced = (np.bincount(rn, weights=ru, minlength=size), np.bincount(rn, minlength=size) > 0)
    # domain 1 against domain 0 first (a small share of the work): worth going on only if enough copies drop
    pair = np.stack([pos[dom == 0], pos[dom == 1]])
    if _copies(pair, src, dst, units, lag, place, reduced).sum() * (D - 1) < MIN_DROPPED * src.size:
        return None
    # each domain's in-domain messages in their order, domain by domain: row d of P is domain d's
    P = pos[stable_order(dom)].reshape(D, -1)
    if not bool((P[1:] > P[:1]).all()):  # an original comes before its copies
        return None
    same = _copies(P, src, dst, units, lag, place, reduced)
    if not same.any():
        return None
    keep = np.ones(src.size, bool)
    keep[P[1:, same].ravel()] = False
    kept = np.flatnonzero(keep)
    full_index = np.empty(src.size, np.int64)
    full_index[kept] = np.arange(kept.size, dtype=np.int64)
    full_index[P[1:, same]] = full_index[P[:1, same]]
    copies = np.bincount(full_index, minlength=kept.size).astype(np.float64)
    own = None
    if not same.all():  # the copies kept load their domains' links, which load as domain 0's: counted there
        own = np.ones(kept.size)
        own[full_index[P[1:, ~same].ravel()]] = 0.0
    return Replicas(kept, full_index, copies, local[kept], 2 * N, src, dst, G, own)


__all__ = ["Replicas", "domain_replicas"]
