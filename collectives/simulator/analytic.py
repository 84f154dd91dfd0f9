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
from ..topology import TIERS
from .flows import Hops, flow_hops, frontier, member_blocks, path_cache, round_flows
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
                  tuple((r.name, r.repeats, r.uniform, r.content) for r in ph.rounds)) for ph in schedule.phases)


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


def _round_cost(rules: CostRules, pi: int, h: Hops, repeats: int, collapsed: bool) -> RoundCost:
    src, dst, fidx, hl = h.src, h.dst, h.fidx, h.hl
    F = src.size
    if rules.efficiency != 1.0 and not h.switch:
        # a protocol's wire format divides every rank-to-rank hop's rate by its efficiency: the round's costs
        # are the full-rate costs scaled (computed once, shared by the protocols)
        base = _round_cost(rules.at_full_rate(), pi, h, repeats, collapsed)
        coef = base.coef / rules.efficiency
        rc_flow = rules.reduce_end(coef, base.red_flow)
        uniq, idx = frontier(base.lat, rc_flow) if F else (np.zeros((0, 2)), np.zeros(0, np.int64))
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
        uniq, idx = frontier(lat, rc_flow)
    else:
        uniq, idx = np.zeros((0, 2)), np.zeros(0, np.int64)
    rc = RoundCost(pi, repeats, collapsed, src, dst, lat, coef, crit_link, crit_factor, h.rn, h.rc, h.tier,
                   h.load_coef, uniq, idx, rc_flow, red_flow, rules.overlap_reduce, h.net)
    if rules.efficiency == 1.0:
        h.costs[rules.key] = rc
    return rc


_ROUND_HOPS: dict[tuple, tuple] = {}


def _round_hops(rules: CostRules, phase, rnd, it: int, blocks, paths) -> Hops:
    """`flow_hops` of one round iteration, kept per Round object (and groups array): a builder that reuses its
    rounds for every size of a sweep (their messages count chunks, not elements) is costed once."""
    key = (id(rnd), it, id(phase.groups), id(rules.topology), rules.dtype)
    hit = _ROUND_HOPS.get(key)
    if hit is not None and hit[0] is rnd and hit[1] is phase.groups and hit[2] is rules.topology:
        return hit[3]
    hops = flow_hops(rules, round_flows(phase, rnd, it, blocks), paths)
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
    staged = (flow_hops(rules, flows, path_cache(rules.topology)), cat(lags, np.int64))
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
                rows, at = frontier(full.lat[fl], full.recv_coef[fl])
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


def _stage_tiers(hops: Hops, lag: np.ndarray, S: int) -> np.ndarray:
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
