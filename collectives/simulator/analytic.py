"""The analytic simulator: cost each round of a schedule from its slot functions, vectorized over all members.

For every round (uniform rounds: iteration 0 only, standing for all `repeats`; others: every iteration) the
slots are evaluated once for all members of all groups, the messages (flows) mapped to links with
`path_links`, and the links' loads summed with one `bincount`, in units of *chunks*. Everything up to here is
independent of the message size, so it is computed once per (schedule structure, topology, protocol) and
cached; a size only scales it by the phase's chunk size in bytes (chunk elements are taken as the continuous
share length / nchunks, exact when counts divide evenly).

Per flow: arrival = start + path latency + chunk bytes x max over its hops of (chunks on the link / effective
bandwidth) (a link's bandwidth is shared by the messages of the round crossing it: fair share, which for
equal messages ends when FIFO service would); the receiver then reduces what it received. Two ways to combine
flows into a time, both following the rules of model.py:

* dataflow (default up to `DATAFLOW_MAX_NODES` nodes): a ready time per node; a message starts when both its
  ends are ready, a node's round ends when its sends have left and its receives have landed and been reduced,
  exactly the recurrence the event simulator executes. A uniform round of R repeats is evaluated once and then
  advances its nodes by (R - 1) x (its slowest flow's duration): with both ends waiting for each other, the
  slowest receiver's chain sets the rate of a repeated round.
* bulk (above): each round costs its slowest flow; rounds add up. An upper bound of the dataflow answer, equal to
  it for uniform rounds from an even start, and O(1) per size since a round reduces to a few distinct
  (latency, seconds per byte) rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..schedule.ops import OpKind
from ..schedule.phase import evaluate_slot
from ..topology import TIERS
from .model import CostRules

DATAFLOW_MAX_NODES = 65_536


@dataclass
class RoundCost:
    """One evaluated round iteration, in chunk units (size independent)."""

    phase: int
    repeats: int
    collapsed: bool  # a uniform round evaluated once for `repeats` iterations
    src: np.ndarray
    dst: np.ndarray
    lat: np.ndarray  # path latency (s)
    coef: np.ndarray  # s per chunk-byte: max over hops of (chunks on link / effective bandwidth)
    crit_link: np.ndarray  # the hop that sets coef (-1: empty path)
    crit_factor: np.ndarray  # in-network factor on that hop (< 1: switch aggregation rate)
    red_node: np.ndarray  # nodes that reduce in this round
    red_coef: np.ndarray  # their reduction seconds per chunk-byte (chunks reduced / rate)
    tier_chunks: np.ndarray  # chunk-hops per link tier
    load_coef: float  # max over links of chunks / raw bandwidth (utilization check)
    rows: np.ndarray = field(default=None)  # (R, 2) distinct (latency, s per chunk-byte) of receivers
    row_flow: np.ndarray = field(default=None)  # a flow of each row
    recv_coef: np.ndarray = field(default=None)  # per flow: coef and the receiver's red_coef (model.reduce_end)
    red_flow: np.ndarray = field(default=None)  # per flow: the receiver's red_coef (0 if it does not reduce)
    overlap: bool = False  # reductions stream with the transfer (rules.overlap_reduce)
    net: np.ndarray = field(default=None)  # per flow: crosses a NIC
    # the kinds of rank-to-rank flows in the round, (over NVLink, over the network), when the round is a set of
    # a huge pipeline's stages (its arrays are the whole pipeline's: _stage_rounds); None: read the arrays
    step_kinds: tuple | None = None


@dataclass
class Structure:
    phase_names: list[str]
    rounds: list[RoundCost]
    num_nodes: int
    memo: dict = field(default_factory=dict)  # derived figures (latency.step_depth's), per their arguments


_CACHE: dict[tuple, tuple[object, Structure]] = {}
_CACHE_MAX = 64
_FLOWS: dict[tuple, tuple[object, list]] = {}


def _fingerprint(schedule) -> tuple:
    return tuple((ph.name, ph.groups.shape, ph.chunks.nchunks,
                  tuple((r.name, r.repeats, r.uniform) for r in ph.rounds)) for ph in schedule.phases)


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.shape, value.tobytes())
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def member_blocks(phase, world_size: int | None) -> list[np.ndarray] | None:
    """Member columns holding ranks and those holding switch nodes, when a phase has both (else None).

    In-network slot functions compute their many child lanes over the switch members of the array they are
    given only, so evaluating the two blocks apart avoids rank-sized work per child lane."""
    if world_size is None or phase.groups.size == 0:
        return None
    col_switch = (phase.groups >= world_size).any(axis=0)
    if col_switch.all() or not col_switch.any():
        return None
    return [np.flatnonzero(~col_switch), np.flatnonzero(col_switch)]


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
    for kind, m, peer, n in lanes:
        if kind == OpKind.RECV or m.size == 0:
            continue
        u = np.broadcast_to(n.astype(np.float64), (G, m.size)).ravel()
        if kind == OpKind.SEND:
            s, d = groups[:, m].ravel(), groups[:, peer].ravel()
            ok = (s >= 0) & (d >= 0)
            srcs.append(s[ok]), dsts.append(d[ok]), units.append(u[ok])
        else:  # RECV_REDUCE: the receiver reduces n chunks
            v = groups[:, m].ravel()
            ok = v >= 0
            red_nodes.append(v[ok]), red_units.append(u[ok])
    cat = lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs else np.zeros(0, dt)  # noqa: E731
    return (cat(srcs, np.int64), cat(dsts, np.int64), cat(units, np.float64), cat(red_nodes, np.int64),
            cat(red_units, np.float64))


@dataclass
class _Hops:
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


def _paths(rules: CostRules, src: np.ndarray, dst: np.ndarray) -> tuple:
    """The messages' hops (flow-major, so each flow's hops are contiguous), their links' bandwidth, latency
    and tier, and each path's latency: what a round's costing needs of its (src, dst) pairs alone."""
    F = src.size
    topo = rules.topology
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


class _PathCache:
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


def path_cache(topology) -> _PathCache:
    """The topology's path cache (a few topologies at a time)."""
    hit = _PATH_CACHES.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    if len(_PATH_CACHES) >= 4:
        _PATH_CACHES.pop(next(iter(_PATH_CACHES)))
    cache = _PathCache()
    _PATH_CACHES[id(topology)] = (topology, cache)
    return cache


def _hops(rules: CostRules, flows: tuple, cache: _PathCache | None = None) -> _Hops:
    src, dst, u, rn, ru = flows
    F = src.size
    topo = rules.topology
    fidx, hl, raw_bw, hop_lat, hop_tier, lat, starts = (cache.get if cache else
                                                        lambda r, a, b: _paths(r, a, b))(rules, src, dst)
    if hl.size:
        uh = u[fidx]
        # chunks on each hop's link: over all links when the hops are many, over the links used when few
        # (the same sums, in the same order)
        if 8 * hl.size >= topo.num_links:
            hop_load = np.bincount(hl, weights=uh, minlength=topo.num_links)[hl]
        else:
            _, inv = np.unique(hl, return_inverse=True)
            hop_load = np.bincount(inv, weights=uh)[inv]
        # the busiest link: a maximum over the hops is one over the links carrying anything
        load_coef = float((hop_load / raw_bw).max())
        tier = np.bincount(hop_tier, weights=uh, minlength=len(TIERS))[:len(TIERS)]
    else:
        hop_load = np.zeros(0)
        load_coef = 0.0
        tier = np.zeros(len(TIERS))
    if rn.size:
        order = np.argsort(rn, kind="stable")
        rn, ru = rn[order], ru[order]
        first_r = np.flatnonzero(np.r_[True, rn[1:] != rn[:-1]])
        rn, ru = rn[first_r], np.add.reduceat(ru, first_r)
        rc = ru / rules.reduce_rate(rn)
    else:
        rc = np.zeros(0)
    rc_add = None
    if F and rn.size:
        # receivers' reduction per flow (the flows into a node share its one fused reduction)
        pos = np.minimum(np.searchsorted(rn, dst), rn.size - 1)
        hit = rn[pos] == dst
        rc_add = (hit, rc[pos[hit]])
    top = max(int(src.max()), int(dst.max())) if F else -1
    switch = bool(hl.size) and top >= rules.world_size
    fabric = switch and top >= rules.fabric_start
    net = np.zeros(F, bool)
    if hl.size:
        net[fidx[hop_tier == TIERS.index("nic")]] = True
    return _Hops(src, dst, fidx, hl, raw_bw, hop_lat, hop_load, lat, starts, load_coef, tier, rn, rc, rc_add, switch,
                 fabric, net, hop_tier=hop_tier, units=u)


def _frontier(lat: np.ndarray, per_byte: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (latency, seconds per byte) rows of the flows, minus those another row dominates in both, and a
    flow of each: max over flows of lat + per_byte x c is the max over these rows, for every c >= 0. Latencies
    are few (sums of a few hop latencies), so the flows are grouped by latency first."""
    lats, inv = np.unique(lat, return_inverse=True)
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


def _round_cost(rules: CostRules, pi: int, h: _Hops, repeats: int, collapsed: bool) -> RoundCost:
    src, dst, fidx, hl = h.src, h.dst, h.fidx, h.hl
    F = src.size
    if rules.efficiency != 1.0 and not h.switch:
        # a protocol's wire format divides every rank-to-rank hop's rate by its efficiency: the round's costs
        # are the full-rate costs scaled (computed once, shared by the protocols)
        base = _round_cost(rules.at_full_rate(), pi, h, repeats, collapsed)
        coef = base.coef / rules.efficiency
        rc_flow = rules.reduce_end(coef, base.red_flow)
        uniq, idx = _frontier(base.lat, rc_flow) if F else (np.zeros((0, 2)), np.zeros(0, np.int64))
        return RoundCost(pi, repeats, collapsed, src, dst, base.lat, coef, base.crit_link, base.crit_factor,
                         base.red_node, base.red_coef, base.tier_chunks, base.load_coef / rules.efficiency, uniq,
                         idx, rc_flow, base.red_flow, rules.overlap_reduce, h.net)
    memo = h.costs.get(rules.key)
    if memo is not None and memo.repeats == repeats and memo.phase == pi:
        return memo
    bw, factor = h.raw_bw, None
    if h.switch:
        factor = rules.hop_factor(src[fidx], dst[fidx], h.raw_bw, h.hop_lat)
    if rules.efficiency != 1.0 and hl.size:
        # the protocol's wire format: rank-to-rank messages carry data at `efficiency` of each hop's rate
        p2p = (src[fidx] < rules.world_size) & (dst[fidx] < rules.world_size)
        factor = (np.ones(hl.size) if factor is None else factor) * np.where(p2p, rules.efficiency, 1.0)
    if factor is not None:
        bw = h.raw_bw * factor
    coef = np.zeros(F)
    crit_link = np.full(F, -1, np.int64)
    crit_factor = np.ones(F)
    if hl.size:
        per_hop = h.hop_load / bw
        starts = h.starts
        rows = fidx[starts]
        best = np.maximum.reduceat(per_hop, starts)
        coef[rows] = best
        # the first hop of each flow that attains its maximum
        at = np.flatnonzero(per_hop == coef[fidx])
        first = at[np.r_[True, fidx[at][1:] != fidx[at][:-1]]]
        crit_link[fidx[first]] = hl[first]
        if factor is not None:
            crit_factor[fidx[first]] = factor[first]
    red_flow = np.zeros(F)
    if h.rc_add is not None:
        hit, add = h.rc_add
        red_flow[hit] = add
    rc_flow = rules.reduce_end(coef, red_flow)
    lat = h.lat
    if F:
        uniq, idx = _frontier(lat, rc_flow)
    else:
        uniq, idx = np.zeros((0, 2)), np.zeros(0, np.int64)
    rc = RoundCost(pi, repeats, collapsed, src, dst, lat, coef, crit_link, crit_factor, h.rn, h.rc, h.tier,
                   h.load_coef, uniq, idx, rc_flow, red_flow, rules.overlap_reduce, h.net)
    if rules.efficiency == 1.0:
        h.costs[rules.key] = rc
    return rc


_ROUND_HOPS: dict[tuple, tuple] = {}


def _round_hops(rules: CostRules, phase, rnd, it: int, blocks, paths) -> _Hops:
    """`_hops` of one round iteration, kept per Round object (and groups array): a builder that reuses its
    rounds for every size of a sweep (their messages count chunks, not elements) is costed once."""
    key = (id(rnd), it, id(phase.groups), id(rules.topology), rules.dtype)
    hit = _ROUND_HOPS.get(key)
    if hit is not None and hit[0] is rnd and hit[1] is phase.groups and hit[2] is rules.topology:
        return hit[3]
    hops = _hops(rules, round_flows(phase, rnd, it, blocks), paths)
    if len(_ROUND_HOPS) >= 4096:
        _ROUND_HOPS.pop(next(iter(_ROUND_HOPS)))
    _ROUND_HOPS[key] = (rnd, phase.groups, rules.topology, hops)
    return hops


_STAGES: dict[tuple, tuple] = {}


def _stage_hops(rules: CostRules, phase, info: dict):
    """A huge pipeline's messages of every stage at once (its steady state: all stages busy), their paths and
    loads, and each message's stage (its lag): computed once per pipeline and shared by its fill, steady-state
    and drain rounds (and by the builds that reuse its lanes)."""
    key = (info["key"], id(rules.topology), rules.dtype)
    hit = _STAGES.get(key)
    if hit is not None and hit[0] is rules.topology and hit[2] is info["lanes"]:  # ids are reused: check objects
        return hit[1]
    groups = phase.groups
    srcs, dsts, units, lags, rn, ru = [], [], [], [], [], []
    for kind, m, peer, lag, n in info["stages"]():
        if kind == OpKind.SEND:
            srcs.append(groups[0, m]), dsts.append(groups[0, peer]), units.append(n), lags.append(lag)
        elif kind == OpKind.RECV_REDUCE:
            rn.append(groups[0, m]), ru.append(n)
    cat = lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs else np.zeros(0, dt)  # noqa: E731
    flows = (cat(srcs, np.int64), cat(dsts, np.int64), cat(units, np.float64), cat(rn, np.int64),
             cat(ru, np.float64))
    # the paths do not depend on the piece count (only the chunk counts do): the topology's cache shares them
    staged = (_hops(rules, flows, path_cache(rules.topology)), cat(lags, np.int64))
    if len(_STAGES) >= 16:
        _STAGES.pop(next(iter(_STAGES)))
    _STAGES[key] = (rules.topology, staged, info["lanes"])
    return staged


def _stage_rounds(rules: CostRules, pi: int, rnd, info: dict, staged) -> list[RoundCost]:
    """The bulk costs of one round pattern of a huge pipeline: each iteration's rows are the frontier of its
    busy stages' flows, every flow priced under the steady state's link loads (an upper bound of the fill and
    drain rounds, which load the links less; exact where stages share no link)."""
    hops, lag = staged
    S, P, first = int(info["stage_count"]), int(info["pieces"]), int(info["first"])
    memo_key = ("stages", rules.key, rules.efficiency, S)
    memo = hops.costs.get(memo_key)
    if memo is None:
        full = _round_cost(rules, pi, hops, 1, False)
        per_stage = []
        if full.src.size:
            order = np.argsort(lag, kind="stable")
            bounds = np.searchsorted(lag[order], np.arange(S + 1))
            for st in range(S):
                fl = order[bounds[st]:bounds[st + 1]]
                if fl.size == 0:
                    per_stage.append((np.zeros((0, 2)), fl))
                    continue
                rows, at = _frontier(full.lat[fl], full.recv_coef[fl])
                per_stage.append((rows, fl[at]))
        # per stage: does it hold rank-to-rank flows over NVLink, over the network (for NCCL's step latency)
        kinds = np.zeros((S, 2), bool)
        if full.src.size:
            p2p = (full.src < rules.world_size) & (full.dst < rules.world_size)
            np.logical_or.at(kinds[:, 0], lag[p2p & ~full.net], True)
            np.logical_or.at(kinds[:, 1], lag[p2p & full.net], True)
        memo = (full, per_stage, _stage_tiers(hops, lag, S), kinds)
        hops.costs[memo_key] = memo
    full, per_stage, tier, kinds = memo
    if full.src.size == 0:
        return []
    out = []
    its = [0] if rnd.uniform else range(rnd.repeats)
    for it in its:
        t = first + it
        lo, hi = max(0, t - P + 1), min(t, S - 1)
        # the busy stages' rows side by side (a few per stage: the max over them is the round's cost)
        rows = np.concatenate([per_stage[x][0] for x in range(lo, hi + 1)]) if hi >= lo else np.zeros((0, 2))
        flw = np.concatenate([per_stage[x][1] for x in range(lo, hi + 1)]) if hi >= lo else np.zeros(0, np.int64)
        rc = RoundCost(pi, rnd.repeats if rnd.uniform else 1, rnd.uniform, full.src, full.dst, full.lat, full.coef,
                       full.crit_link, full.crit_factor, full.red_node, full.red_coef,
                       tier[lo:hi + 1].sum(axis=0) if hi >= lo else np.zeros(len(TIERS)), full.load_coef, rows,
                       flw, full.recv_coef, full.red_flow, full.overlap, full.net,
                       tuple(kinds[lo:hi + 1].any(axis=0).tolist()) if hi >= lo else (False, False))
        out.append(rc)
    return out


def _stage_tiers(hops: _Hops, lag: np.ndarray, S: int) -> np.ndarray:
    """(S, tiers): chunk-hops per link tier of each stage's flows."""
    if not hops.hl.size:
        return np.zeros((S, len(TIERS)))
    tiers = hops.hop_tier
    units = hops.units[hops.fidx]
    cell = lag[hops.fidx] * len(TIERS) + tiers
    return np.bincount(cell, weights=units, minlength=S * len(TIERS))[:S * len(TIERS)].reshape(S, len(TIERS))


def _has_fabric_switches(schedule, rules: CostRules) -> bool:
    return any(ph.groups.size and int(ph.groups.max()) >= rules.fabric_start for ph in schedule.phases)


def structure(schedule, rules: CostRules) -> Structure:
    """Size-independent costing of every round of `schedule` (cached by algorithm, parameters, topology)."""
    topo = rules.topology
    key = (schedule.algorithm, schedule.collective, schedule.world_size, schedule.root, _freeze(schedule.params),
           _fingerprint(schedule), id(topo), rules.dtype, schedule.num_nodes, rules.efficiency, rules.overlap_reduce,
           rules.sharp_protocol if _has_fabric_switches(schedule, rules) else None)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is topo:
        return hit[1]
    # the messages, their paths and loads depend on neither the protocol nor the SHARP protocol: evaluate the
    # slots once per schedule and topology, cost them per protocol
    fkey = key[:9]
    bulk = max(schedule.num_nodes, topo.num_nodes) > DATAFLOW_MAX_NODES
    flows = _FLOWS.get(fkey)
    if flows is None or flows[0] is not topo:
        flows = (topo, [])
        paths = path_cache(topo)
        for pi, phase in enumerate(schedule.phases):
            blocks = member_blocks(phase, schedule.world_size)
            for rnd in phase.rounds:
                if rnd.repeats == 0:
                    continue
                info = getattr(rnd.slots, "pipeline", None)
                if bulk and info is not None:  # a huge pipeline: costed stage by stage (_stage_rounds)
                    flows[1].append((pi, rnd, info, _stage_hops(rules, phase, info)))
                    continue
                its = [0] if rnd.uniform else range(rnd.repeats)
                for it in its:
                    hops = _round_hops(rules, phase, rnd, it, blocks, paths)
                    flows[1].append((pi, rnd.repeats if rnd.uniform else 1, rnd.uniform, hops))
        if len(_FLOWS) >= _CACHE_MAX:
            _FLOWS.pop(next(iter(_FLOWS)))
        _FLOWS[fkey] = flows
    rounds = []
    for entry in flows[1]:
        if isinstance(entry[1], int):
            pi, reps, coll, hops = entry
            rounds.append(_round_cost(rules, pi, hops, reps, coll))
        else:
            pi, rnd, info, staged = entry
            rounds += _stage_rounds(rules, pi, rnd, info, staged)
    st = Structure([ph.name for ph in schedule.phases], rounds, max(schedule.num_nodes, topo.num_nodes))
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (topo, st)
    return st


def chunk_bytes(schedule, itemsize: int) -> np.ndarray:
    """Bytes of one chunk in each phase (continuous share: mean group length / chunks)."""
    return np.array([float(np.mean(ph.chunks.length)) * itemsize / ph.chunks.nchunks if ph.chunks.length.size
                     else 0.0 for ph in schedule.phases])


@dataclass
class Timing:
    time: float
    phase_times: list[float]
    tier_bytes: np.ndarray
    bottleneck: tuple  # (kind, id, factor) of the resource with the largest share of the time
    utilization: float


def _classify(rc: RoundCost, f: int, cb: float) -> tuple[tuple, float]:
    lat, ser = float(rc.lat[f]), float(rc.coef[f]) * cb
    red = (float(rc.recv_coef[f]) - float(rc.coef[f])) * cb
    if rc.overlap:  # streamed: the reduction is the bottleneck when it is slower than the transfer
        red = float(rc.red_flow[f]) * cb
        if red > ser and red >= lat:
            return ("reduce", int(rc.dst[f]), 1.0), lat + max(ser, red)
        red = 0.0
    if red >= ser and red >= lat:
        return ("reduce", int(rc.dst[f]), 1.0), lat + ser + red
    if ser >= lat:
        return ("link", int(rc.crit_link[f]), float(rc.crit_factor[f]), int(rc.src[f]), int(rc.dst[f])), \
            lat + ser + red
    return ("latency",), lat + ser + red


def evaluate(st: Structure, cb: np.ndarray, dataflow: bool) -> Timing:
    """Time of the schedule whose phases have chunk sizes `cb` (bytes per chunk, per phase)."""
    weights: dict[tuple, float] = {}
    tier = np.zeros(len(TIERS))
    util = 0.0
    nphase = len(st.phase_names)
    phase_time = [0.0] * nphase
    if dataflow:
        T = np.zeros(st.num_nodes)
        phase_end = [0.0] * nphase
    total = 0.0
    for rc in st.rounds:
        c = cb[rc.phase]
        tier += rc.tier_chunks * c * rc.repeats
        if rc.src.size == 0:
            continue
        if dataflow:
            dur_flow = rc.lat + rc.recv_coef * c
            f = int(np.argmax(dur_flow))
            lam = float(dur_flow[f])
        else:  # the few distinct rows stand for all flows
            dur_row = rc.rows[:, 0] + rc.rows[:, 1] * c
            i = int(np.argmax(dur_row))
            f, lam = int(rc.row_flow[i]), float(dur_row[i])
        key, _ = _classify(rc, f, c)
        weights[key] = weights.get(key, 0.0) + lam * rc.repeats
        if lam > 0:
            util = max(util, rc.load_coef * c / lam)
        if not dataflow:
            phase_time[rc.phase] += lam * rc.repeats
            total += lam * rc.repeats
            continue
        start = np.maximum(T[rc.src], T[rc.dst])
        ser = rc.coef * c
        recv_end = T.copy()
        np.maximum.at(recv_end, rc.dst, start + rc.lat + ser)
        if rc.red_node.size and rc.overlap:
            # streamed (model.CostRules.overlap_reduce): the reduction runs from the round's first arriving
            # byte at the kernel's rate, and the round ends no earlier than its last byte
            first = np.full(T.shape, np.inf)
            np.minimum.at(first, rc.dst, start + rc.lat)
            recv_end[rc.red_node] = np.maximum(recv_end[rc.red_node], first[rc.red_node] + rc.red_coef * c)
        elif rc.red_node.size:
            recv_end[rc.red_node] += rc.red_coef * c
        send_end = T.copy()
        np.maximum.at(send_end, rc.src, start + ser)
        newT = np.maximum(recv_end, send_end)
        if rc.repeats > 1:
            part = np.union1d(rc.src, rc.dst)
            newT[part] += (rc.repeats - 1) * lam
        T = newT
        phase_end[rc.phase] = max(phase_end[rc.phase], float(T.max()))
    if dataflow:
        total = float(T.max())
        prev = 0.0
        for i in range(nphase):
            end = max(phase_end[i], prev)
            phase_time[i] = end - prev
            prev = end
    bottleneck = max(weights, key=weights.get) if weights else ("latency",)
    return Timing(total, phase_time, tier, bottleneck, min(util, 1.0))


def bulk_times(st: Structure, cb: np.ndarray) -> np.ndarray:
    """Bulk-model times for many sizes at once: cb is (S, phases); O(rows) per round per size."""
    cb = np.atleast_2d(cb)
    total = np.zeros(cb.shape[0])
    for rc in st.rounds:
        if rc.rows.shape[0] == 0:
            continue
        c = cb[:, rc.phase]
        total += (rc.rows[:, 0][None, :] + rc.rows[:, 1][None, :] * c[:, None]).max(axis=1) * rc.repeats
    return total


__all__ = ["DATAFLOW_MAX_NODES", "RoundCost", "Structure", "Timing", "bulk_times", "chunk_bytes", "evaluate",
           "structure"]
