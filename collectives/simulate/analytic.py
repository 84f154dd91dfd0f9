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
    recv_coef: np.ndarray = field(default=None)  # per flow: coef + the receiver's red_coef


@dataclass
class Structure:
    phase_names: list[str]
    rounds: list[RoundCost]
    num_nodes: int


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


def round_flows(phase, rnd, it: int) -> tuple[np.ndarray, ...]:
    """(src, dst, chunks) of every message of one round iteration, and (node, chunks) of every reduction."""
    M = phase.group_size
    members = np.arange(M, dtype=np.int64)
    groups = phase.groups
    G = groups.shape[0]
    srcs, dsts, units, red_nodes, red_units = [], [], [], [], []
    for slot in rnd.slots(members, np.int64(it)):
        if slot.kind == OpKind.RECV:
            continue
        peer, _, n = evaluate_slot(slot, members.shape)
        m = np.flatnonzero(peer >= 0)
        if m.size == 0:
            continue
        u = np.broadcast_to(n[m].astype(np.float64), (G, m.size)).ravel()
        if slot.kind == OpKind.SEND:
            s, d = groups[:, m].ravel(), groups[:, peer[m]].ravel()
            ok = (s >= 0) & (d >= 0)
            srcs.append(s[ok]), dsts.append(d[ok]), units.append(u[ok])
        else:  # RECV_REDUCE: the receiver reduces n chunks
            v = groups[:, m].ravel()
            ok = v >= 0
            red_nodes.append(v[ok]), red_units.append(u[ok])
    cat = lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs else np.zeros(0, dt)  # noqa: E731
    return (cat(srcs, np.int64), cat(dsts, np.int64), cat(units, np.float64), cat(red_nodes, np.int64),
            cat(red_units, np.float64))


def _round_cost(rules: CostRules, pi: int, flows: tuple, repeats: int, collapsed: bool) -> RoundCost:
    src, dst, u, rn, ru = flows
    F = src.size
    topo = rules.topology
    links = topo.path_links(src, dst) if F else np.zeros((0, 1), np.int64)
    # work on the used hops only, flattened row by row (flow-major, so each flow's hops are contiguous)
    fidx, hidx = np.nonzero(links >= 0)
    hl = links[fidx, hidx]
    raw_bw = topo.link_bandwidth(hl) if hl.size else np.zeros(0)
    bw, factor = raw_bw, np.ones(hl.size)
    if hl.size and _touches_switch(rules, src, dst):
        bw_full, fac_full = rules.hop_bandwidth(src[:, None], dst[:, None], links)
        bw, factor = bw_full[fidx, hidx], fac_full[fidx, hidx]
    load = np.bincount(hl, weights=u[fidx], minlength=topo.num_links) if hl.size else np.zeros(0)
    per_hop = load[hl] / bw if hl.size else np.zeros(0)
    lat = np.bincount(fidx, weights=topo.link_latency(hl), minlength=F) if hl.size else np.zeros(F)
    coef = np.zeros(F)
    crit_link = np.full(F, -1, np.int64)
    crit_factor = np.ones(F)
    if hl.size:
        starts = np.flatnonzero(np.r_[True, fidx[1:] != fidx[:-1]])
        rows = fidx[starts]
        best = np.maximum.reduceat(per_hop, starts)
        coef[rows] = best
        # the first hop of each flow that attains its maximum
        at = np.flatnonzero(per_hop == coef[fidx])
        first = at[np.r_[True, fidx[at][1:] != fidx[at][:-1]]]
        crit_link[fidx[first]] = hl[first]
        crit_factor[fidx[first]] = factor[first]
        used = np.flatnonzero(load)
        load_coef = float((load[used] / topo.link_bandwidth(used)).max()) if used.size else 0.0
        tier = np.bincount(topo.link_tier(hl).astype(np.int64), weights=u[fidx], minlength=len(TIERS))[:len(TIERS)]
    else:
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
    rc_flow = coef.copy()
    if F and rn.size:
        # receivers' reduction per flow (the flows into a node share its one fused reduction)
        pos = np.minimum(np.searchsorted(rn, dst), rn.size - 1)
        hit = rn[pos] == dst
        rc_flow[hit] += rc[pos[hit]]
    if F:
        # distinct (latency, seconds per byte) rows, minus those another row dominates in both
        keys, idx = np.unique(lat + 1j * rc_flow, return_index=True)
        uniq = np.stack([keys.real, keys.imag], axis=1)
        keep = np.ones(uniq.shape[0], bool)
        if uniq.shape[0] > 1:
            best_b = np.maximum.accumulate(uniq[::-1, 1])[::-1]
            keep[:-1] = uniq[:-1, 1] > best_b[1:]
        uniq, idx = uniq[keep], idx[keep]
    else:
        uniq, idx = np.zeros((0, 2)), np.zeros(0, np.int64)
    return RoundCost(pi, repeats, collapsed, src, dst, lat, coef, crit_link, crit_factor, rn, rc, tier, load_coef,
                     uniq, idx, rc_flow)


def _touches_switch(rules: CostRules, src: np.ndarray, dst: np.ndarray) -> bool:
    return bool(max(int(src.max()), int(dst.max())) >= rules.world_size)


def _has_fabric_switches(schedule, rules: CostRules) -> bool:
    return any(ph.groups.size and int(ph.groups.max()) >= rules.fabric_start for ph in schedule.phases)


def structure(schedule, rules: CostRules) -> Structure:
    """Size-independent costing of every round of `schedule` (cached by algorithm, parameters, topology)."""
    topo = rules.topology
    key = (schedule.algorithm, schedule.collective, schedule.world_size, schedule.root, _freeze(schedule.params),
           _fingerprint(schedule), id(topo), rules.dtype, schedule.num_nodes,
           rules.protocol if _has_fabric_switches(schedule, rules) else None)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is topo:
        return hit[1]
    fkey = key[:-1]  # the messages do not depend on the SHARP protocol: evaluate the slots once
    flows = _FLOWS.get(fkey)
    if flows is None or flows[0] is not topo:
        flows = (topo, [])
        for pi, phase in enumerate(schedule.phases):
            for rnd in phase.rounds:
                if rnd.repeats == 0:
                    continue
                its = [0] if rnd.uniform else range(rnd.repeats)
                for it in its:
                    flows[1].append((pi, rnd.repeats if rnd.uniform else 1, rnd.uniform,
                                     round_flows(phase, rnd, it)))
        if len(_FLOWS) >= _CACHE_MAX:
            _FLOWS.pop(next(iter(_FLOWS)))
        _FLOWS[fkey] = flows
    rounds = [_round_cost(rules, pi, fl, reps, coll) for pi, reps, coll, fl in flows[1]]
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
        if rc.red_node.size:
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
