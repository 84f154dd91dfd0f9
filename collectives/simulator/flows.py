"""The messages of a round and the links they cross, for the analytic simulator.

A round's slot functions are evaluated once for all members of all groups (`round_flows`: source, destination
and chunks per message); `flow_hops` maps the messages to their links' hops with `path_links` (cached per
topology: `path_cache`), and `frontier` reduces a round's flows to the few (latency, seconds per byte) rows that
can be its slowest at any message size.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from ..schedule.ops import OpKind
from ..schedule.phase import evaluate_slot
from ..topology import TIERS
from .model import CostRules


def member_blocks(phase, world_size: int | None) -> list[np.ndarray] | None:
    """Member columns holding ranks and those holding switch nodes, when a phase has both (else None).

    In-network slot functions compute their many child lanes over the switch members of the array they are
    given only, so evaluating the two blocks apart avoids rank-sized work per child lane."""
    groups = phase.groups
    if world_size is None or groups.size == 0 or top_node(groups) < world_size:  # (no switch among them)
        return None
    # kept per array while it lives, as top_node: a sweep's builds share their phases' member arrays
    hit = _BLOCKS.get((id(groups), world_size))
    if hit is not None and hit[0]() is groups:
        return hit[1]
    col_switch = (groups >= world_size).any(axis=0)
    blocks = None if col_switch.all() or not col_switch.any() else \
        [np.flatnonzero(~col_switch), np.flatnonzero(col_switch)]
    if len(_BLOCKS) >= 64:
        _BLOCKS.pop(next(iter(_BLOCKS)))
    _BLOCKS[(id(groups), world_size)] = (weakref.ref(groups), blocks)
    return blocks


_BLOCKS: dict[tuple, tuple] = {}


def top_node(groups: np.ndarray) -> int:
    """groups.max() (-1 if empty), kept per array while it lives: a sweep's builds share their phases' member
    arrays, of up to hundreds of thousands of nodes (checked by identity; member arrays are never written)."""
    hit = _TOP.get(id(groups))
    if hit is not None and hit[0]() is groups:
        return hit[1]
    top = int(groups.max()) if groups.size else -1
    if len(_TOP) >= 256:
        _TOP.pop(next(iter(_TOP)))
    _TOP[id(groups)] = (weakref.ref(groups), top)
    return top


_TOP: dict[int, tuple] = {}


def _idle(slot) -> bool:
    return np.ndim(slot.peer) == 0 and int(slot.peer) < 0


def _lanes(rnd, blocks: list[np.ndarray], it: int):
    """Per lane: (kind, member indices in increasing order, their peers, their chunk counts), idle lanes left
    out; the members of several blocks are merged as one evaluation over all of them would list them. None if
    the blocks disagree on the lanes (a slot function whose lane list depends on the members given)."""
    per_block = [rnd.slots(b, np.int64(it)) for b in blocks]
    if len({len(x) for x in per_block}) != 1:
        return None
    out = []
    for lane in zip(*per_block, strict=True):
        busy = [(b, s) for b, s in zip(blocks, lane, strict=True) if not _idle(s)]
        kinds = {s.kind for _, s in busy}
        if len(kinds) > 1:
            return None
        if not busy:
            continue
        kind = busy[0][1].kind
        if kind == OpKind.RECV:
            out.append((kind, None, None, None))
            continue
        ms, ps, ns = [], [], []
        for b, s in busy:
            peer, _, n = evaluate_slot(s, b.shape)
            at = np.flatnonzero(peer >= 0)
            ms.append(b[at]), ps.append(peer[at]), ns.append(n[at])
        m, peer, n = (np.concatenate(x) for x in (ms, ps, ns))
        firsts = [x[0] for x in ms if x.size]
        lasts = [x[-1] for x in ms if x.size]
        if len(firsts) > 1 and not all(a < b for a, b in zip(lasts[:-1], firsts[1:], strict=True)):
            order = np.argsort(m, kind="stable")  # interleaved blocks: back to member order
            m, peer, n = m[order], peer[order], n[order]
        out.append((kind, m, peer, n))
    return out


def _members_are_nodes(groups: np.ndarray) -> bool:
    """One group whose members are nodes 0..M-1 (a ring over all ranks): each member stands for its node."""
    return groups.shape[0] == 1 and np.array_equal(groups[0], np.arange(groups.shape[1]))


def round_flows(phase, rnd, it: int, blocks: list[np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """(src, dst, chunks) of every message of one round iteration, and (node, chunks) of every reduction.

    `blocks` (see member_blocks) evaluates the slots over those member blocks apart; the flows come out the
    same, in the same order."""
    M = phase.group_size
    members = np.arange(M, dtype=np.int64)
    groups = phase.groups
    G = groups.shape[0]
    sparse = getattr(rnd.slots, "lanes", None)  # optional: a slot function's busy members, lane by lane
    lanes = None
    if sparse is not None:
        lanes = [(kind, m, peer, n) for kind, m, peer, n in sparse(it) if kind != OpKind.RECV]
    elif blocks:
        lanes = _lanes(rnd, blocks, it)
    if lanes is None:
        lanes = []
        for slot in rnd.slots(members, np.int64(it)):
            if slot.kind == OpKind.RECV or _idle(slot):
                continue
            peer, _, n = evaluate_slot(slot, members.shape)
            m = np.flatnonzero(peer >= 0)
            lanes.append((slot.kind, m, peer[m], n[m]))
    srcs, dsts, units, red_nodes, red_units = [], [], [], [], []
    node = (lambda x: x) if _members_are_nodes(groups) else (lambda x: groups[:, x].ravel())  # noqa: E731
    keep = lambda x, ok, every: x if every else x[ok]  # noqa: E731  (every member kept: the array as it is)
    for kind, m, peer, n in lanes:
        if kind == OpKind.RECV or m.size == 0:
            continue
        u = np.broadcast_to(n.astype(np.float64), (G, m.size)).ravel()
        if kind == OpKind.SEND:
            s, d = node(m), node(peer)
            ok = (s >= 0) & (d >= 0)
            every = bool(ok.all())
            srcs.append(keep(s, ok, every)), dsts.append(keep(d, ok, every)), units.append(keep(u, ok, every))
        else:  # RECV_REDUCE: the receiver reduces n chunks
            v = node(m)
            ok = v >= 0
            every = bool(ok.all())
            red_nodes.append(keep(v, ok, every)), red_units.append(keep(u, ok, every))
    cat = lambda xs, dt: np.concatenate(xs, dtype=dt, casting="unsafe") if xs else np.zeros(0, dt)  # noqa: E731
    return (cat(srcs, np.int64), cat(dsts, np.int64), cat(units, np.float64), cat(red_nodes, np.int64),
            cat(red_units, np.float64))


@dataclass
class Hops:
    """The protocol-independent part of a round's costing: paths, loads, latencies, reductions."""

    src: np.ndarray
    dst: np.ndarray
    fidx: np.ndarray  # flow of each used hop (flow-major)
    hl: np.ndarray  # link of each used hop
    raw_bw: np.ndarray
    hop_lat: np.ndarray
    hop_load: np.ndarray  # chunks on each used hop's link
    lat: np.ndarray  # path latency per flow
    starts: np.ndarray  # first hop of each flow with hops
    load_coef: float
    tier: np.ndarray
    rn: np.ndarray
    rc: np.ndarray
    rc_add: np.ndarray  # per flow: the receiver's reduction seconds per chunk-byte (0 if it does not reduce)
    switch: bool  # some message starts or ends at a switch node
    fabric: bool  # some message starts or ends at a fabric switch (its cost depends on the SHARP protocol)
    net: np.ndarray = None  # per flow: its path crosses a NIC (a network step, for NCCL's per-step latency)
    costs: dict = field(default_factory=dict)  # full-rate RoundCosts by rules.key, shared by the protocols
    hop_tier: np.ndarray = None  # tier of each used hop
    units: np.ndarray = None  # chunks of each flow
    raw_per_hop: np.ndarray | None = None  # hop_load / raw_bw (None where hop_load is a shared_load)
    # a pipeline costed on one domain's in-domain messages (replicas.py): what each flow stands for, or None
    replicas: object = None


PATH_BLOCK = 1 << 16  # flows whose paths are found at a time: a block's temporaries stay in the CPU's caches


def _paths(rules: CostRules, src: np.ndarray, dst: np.ndarray) -> tuple:
    """The messages' hops (flow-major, so each flow's hops are contiguous), their links' bandwidth, latency
    and tier, and each path's latency: what a round's costing needs of its (src, dst) pairs alone. Many flows
    are taken PATH_BLOCK at a time (a path depends on its own flow only, and a path's latency adds its own hops
    in order: the same arrays)."""
    F = src.size
    topo = rules.topology
    if F > PATH_BLOCK and hasattr(topo, "hop_list") and hasattr(topo, "link_attributes"):
        firsts = range(0, F, PATH_BLOCK)
        try:
            blocks = [_paths(rules, src[lo:lo + PATH_BLOCK], dst[lo:lo + PATH_BLOCK]) for lo in firsts]
        except ValueError:
            blocks = None  # a pair without a path: the error as all the flows at once report it, below
        if blocks is not None:
            hops = np.cumsum([0] + [b[1].size for b in blocks]).tolist()
            fidx = np.concatenate([b[0] + lo for b, lo in zip(blocks, firsts, strict=True)])
            starts = np.concatenate([b[6] + h for b, h in zip(blocks, hops, strict=False)])
            return (fidx, *(np.concatenate([b[i] for b in blocks]) for i in range(1, 6)), starts)
    if not F:
        fidx = hl = np.zeros(0, np.int64)
    elif hasattr(topo, "hop_list"):
        fidx, hl = topo.hop_list(src, dst)
    else:
        links = topo.path_links(src, dst)
        fidx, hidx = np.nonzero(links >= 0)
        hl = links[fidx, hidx]
    if not hl.size:
        raw_bw, hop_lat, hop_tier = np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    elif hasattr(topo, "link_attributes"):
        raw_bw, hop_lat, hop_tier = topo.link_attributes(hl)
    else:
        raw_bw, hop_lat, hop_tier = topo.link_bandwidth(hl), topo.link_latency(hl), topo.link_tier(hl)
    lat = np.bincount(fidx, weights=hop_lat, minlength=F) if hl.size else np.zeros(F)
    starts = np.flatnonzero(np.r_[True, fidx[1:] != fidx[:-1]]) if hl.size else np.zeros(0, np.int64)
    return fidx, hl, raw_bw, hop_lat, hop_tier.astype(np.int64), lat, starts


class PathCache:
    """Paths of the (src, dst) pairs of rounds already costed on one topology: the two halves of a ring or NVLS
    allreduce send over the same pairs, and so do the schedules a sweep builds for each size, so such rounds
    reuse the paths (the most recent PATH_CACHE_MAX pair sets per topology, in `path_cache`)."""

    def __init__(self) -> None:
        self.seen: list[tuple[np.ndarray, np.ndarray, tuple]] = []

    def get(self, rules: CostRules, src: np.ndarray, dst: np.ndarray) -> tuple:
        for i, (s, d, paths) in enumerate(self.seen):
            if s.shape == src.shape and np.array_equal(s, src) and np.array_equal(d, dst):
                if i:  # most recently used first
                    self.seen.insert(0, self.seen.pop(i))
                return paths
        paths = _paths(rules, src, dst)
        self.seen.insert(0, (src, dst, paths))
        del self.seen[PATH_CACHE_MAX:]
        return paths


PATH_CACHE_MAX = 16
_PATH_CACHES: dict[int, tuple] = {}


def path_cache(topology) -> PathCache:
    """The topology's path cache (a few topologies at a time)."""
    hit = _PATH_CACHES.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    if len(_PATH_CACHES) >= 4:
        _PATH_CACHES.pop(next(iter(_PATH_CACHES)))
    cache = PathCache()
    _PATH_CACHES[id(topology)] = (topology, cache)
    return cache


def shared_load(links: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Per hop: the chunks its link carries until this hop's flow has passed, under the event model's sharing
    (a link divided evenly among the messages crossing it, all starting together): sum over the link's flows j
    of min(units_j, units_i). A flow no larger than the others waits for the link's total; a smaller one
    leaves once every flow has moved as much as it has (a shard beside two whole pieces: 3 shards, not 2
    pieces + a shard). Equal flows: the link's total."""
    order = np.lexsort((units, links))
    hl, u = links[order], units[order]
    first = np.flatnonzero(np.r_[True, hl[1:] != hl[:-1]])
    group = np.repeat(np.arange(first.size), np.diff(np.r_[first, hl.size]))
    done = np.cumsum(u) - u
    smaller = done - done[first][group]  # the link's flows sorted before this one (units <= its own)
    rest = np.r_[first[1:], hl.size][group] - np.arange(hl.size)  # this one and those after (units >= its own)
    out = np.empty(hl.size)
    out[order] = smaller + rest * u
    return out


def flow_hops(rules: CostRules, flows: tuple, cache: PathCache | None = None, share: bool = False) -> Hops:
    """Paths, link loads and latencies of one set of flows. `share`: each hop's load is `shared_load` (a round's
    flows, which start together) instead of its link's total (a pipeline's stages priced at once)."""
    src, dst, u, rn, ru = flows
    F = src.size
    fidx, hl, raw_bw, hop_lat, hop_tier, lat, starts = (cache.get if cache else
                                                        lambda r, a, b: _paths(r, a, b))(rules, src, dst)
    if hl.size:
        uh = u[fidx]
        # chunks on each hop's link: over the links up to the highest used when the hops are many, over the
        # links used when few (the same sums, in the same order)
        if 8 * hl.size > int(hl.max()):
            hop_load = np.bincount(hl, weights=uh)[hl]
        else:
            _, inv = np.unique(hl, return_inverse=True)
            hop_load = np.bincount(inv, weights=uh)[inv]
        # the busiest link: a maximum over the hops is one over the links carrying anything
        raw_per_hop = hop_load / raw_bw
        load_coef = float(raw_per_hop.max())
        if share and uh.size and uh.min() != uh.max():  # unequal flows: each leaves when its share is through
            hop_load = shared_load(hl, uh)
            raw_per_hop = None
        tier = np.bincount(hop_tier, weights=uh, minlength=len(TIERS))[:len(TIERS)]
    else:
        hop_load = raw_per_hop = np.zeros(0)
        load_coef = 0.0
        tier = np.zeros(len(TIERS))
    if rn.size:
        # the chunks each node reduces, summed in the flows' order (bincount adds each bin's weights in input
        # order, as a stable sort by node and add.reduceat would), its nodes in increasing order
        n = int(rn.max()) + 1
        rn_all = rn
        ru = np.bincount(rn_all, weights=ru, minlength=n)
        rn = np.flatnonzero(np.bincount(rn_all, minlength=n))
        ru = ru[rn]
        rc = ru / rules.reduce_rate(rn)
    else:
        rc = np.zeros(0)
    rc_add = None
    if F and rn.size:
        # receivers' reduction per flow (the flows into a node share its one fused reduction)
        slot = np.full(max(int(rn[-1]), int(dst.max())) + 1, -1, np.int64)
        slot[rn] = np.arange(rn.size)
        pos = slot[dst]
        hit = pos >= 0
        rc_add = (hit, rc[pos[hit]])
    top = max(int(src.max()), int(dst.max())) if F else -1
    switch = bool(hl.size) and top >= rules.world_size
    fabric = switch and top >= rules.fabric_start
    net = np.zeros(F, bool)
    if hl.size:
        net[fidx[hop_tier == TIERS.index("nic")]] = True
    return Hops(src, dst, fidx, hl, raw_bw, hop_lat, hop_load, lat, starts, load_coef, tier, rn, rc, rc_add, switch,
                 fabric, net, hop_tier=hop_tier, units=u, raw_per_hop=raw_per_hop)


FEW_VALUES = 64  # group_values: at most this many distinct values are located by binary search


def group_values(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(x, return_inverse=True) for a float array of few distinct values (a round's path latencies):
    the distinct values by hashing, each element's by binary search among them, without sorting all of x
    (the same arrays as np.unique's; many distinct values take np.unique itself)."""
    if x.size < 4096:
        return np.unique(x, return_inverse=True)
    # a round's latencies are one array for every protocol (and the rounds that share its flows): grouped once
    hit = _GROUPS.get(id(x))
    if hit is not None and hit[0] is x:
        return hit[1]
    values = np.unique(x, sorted=False)
    if values.size > FEW_VALUES:
        out = np.unique(x, return_inverse=True)
    else:
        values = np.sort(values)
        out = values, np.searchsorted(values, x)
    if len(_GROUPS) >= 16:
        _GROUPS.pop(next(iter(_GROUPS)))
    _GROUPS[id(x)] = (x, out)
    return out


_GROUPS: dict[int, tuple] = {}  # group_values of large arrays, by identity (the arrays are never written to)


class CriticalHops:
    """Per flow, the first of its hops whose seconds per chunk attain the flow's (the link that sets its rate),
    found when asked: a round's bottleneck names a few of its millions of flows. `link[f]` and `factor[f]` read
    like arrays."""

    def __init__(self, fidx: np.ndarray, hl: np.ndarray, per_hop: np.ndarray, coef: np.ndarray,
                 factor: np.ndarray | None) -> None:
        self.fidx, self.hl, self.per_hop, self.coef, self.factors = fidx, hl, per_hop, coef, factor
        self._hop: dict[int, int] = {}
        self.link = _Indexed(self, lambda f: -1 if (i := self.hop(f)) < 0 else int(self.hl[i]))
        self.factor = _Indexed(self, lambda f: 1.0 if (i := self.hop(f)) < 0 or self.factors is None
                               else float(self.factors[i]))

    def hop(self, f) -> int:
        """Index into the hop arrays of flow f's critical hop (-1: no hops, or no hop attains its maximum)."""
        f = int(f)
        hit = self._hop.get(f)
        if hit is None:
            # the flow's hops are contiguous (flow-major)
            lo, hi = (int(x) for x in np.searchsorted(self.fidx, [f, f + 1]))
            at = np.flatnonzero(self.per_hop[lo:hi] == self.coef[f]) if hi > lo else ()
            hit = lo + int(at[0]) if len(at) else -1
            self._hop[f] = hit
        return hit


class _Indexed:
    """An array-like view: view[f] = get(f); `owner` is the CriticalHops it reads."""

    def __init__(self, owner: CriticalHops, get) -> None:
        self.owner, self._get = owner, get

    def __getitem__(self, f):
        return self._get(f)


def frontier(lat: np.ndarray, per_byte: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (latency, seconds per byte) rows of the flows, minus those another row dominates in both, and a
    flow of each: max over flows of lat + per_byte x c is the max over these rows, for every c >= 0. Latencies
    are few (sums of a few hop latencies), so the flows are grouped by latency first."""
    lats, inv = group_values(lat)
    top = np.full(lats.size, -np.inf)
    np.maximum.at(top, inv, per_byte)
    # a flow attaining each group's maximum
    flow = np.full(lats.size, -1, np.int64)
    hit = np.flatnonzero(per_byte == top[inv])
    flow[inv[hit[::-1]]] = hit[::-1]
    keep = np.ones(lats.size, bool)
    if lats.size > 1:
        best_b = np.maximum.accumulate(top[::-1])[::-1]
        keep[:-1] = top[:-1] > best_b[1:]
    return np.stack([lats[keep], top[keep]], axis=1), flow[keep]


__all__ = ["CriticalHops", "Hops", "PathCache", "flow_hops", "frontier", "member_blocks", "path_cache", "round_flows",
           "shared_load", "top_node"]
