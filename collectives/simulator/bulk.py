"""The analytic simulator's bulk model for many rounds at once: what analytic.evaluate's loop over the rounds
computes above DATAFLOW_MAX_NODES, as arrays.

Per round the bulk model takes its slowest flow (the first row of its frontier attaining the maximum at the
round's chunk size), classifies it (a reduction, a link, or latency: analytic._classify), weighs the class by
the round's time, and adds the round's time (its slowest flow, plus the cycle rate per further iteration) and
chunk-hops per tier. Here the rounds' rows, phases, repeats and tiers are gathered once per structure; the slowest
flows of all rounds come from one reduceat, the classifications from one comparison per set of flows' arrays,
and the sums from np.cumsum and np.bincount, which add one term after another in the rounds' order: the same
floats as the loop (tests/unit/test_simulator_fast_paths.py compares them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..topology import TIERS


@dataclass
class Timing:
    time: float
    phase_times: list[float]
    tier_bytes: np.ndarray
    bottleneck: tuple  # (kind, id, factor) of the resource with the largest share of the time
    utilization: float


def evaluate_bulk(st, cb: np.ndarray, slowest: tuple[list, list]) -> Timing:
    """evaluate's bulk model with every round's slowest flow known (bulk_slowest): the same floats, summed in
    the same order (np.cumsum and np.bincount add one term after another), with the per-round arrays gathered
    once per structure and one classification per (flows' arrays, flow, phase) in the call."""
    lay = st.memo.get("bulk layout")
    if lay is None:
        lay = _bulk_layout(st)
        st.memo["bulk layout"] = lay
    phase, repeats, tiers, load, busy, group, members, repeated = lay
    cb = np.asarray(cb, np.float64)
    c = cb[phase]
    tier = np.cumsum(tiers * c[:, None] * repeats[:, None], axis=0)[-1] if phase.size else np.zeros(len(TIERS))
    f_of, lam_of = slowest
    nphase = len(st.phase_names)
    if not busy:
        return Timing(0.0, [0.0] * nphase, tier, ("latency",), 0.0)
    lam = np.array([lam_of[i] for i in busy], np.float64)
    b = np.asarray(busy, np.int64)
    f = np.array([f_of[i] for i in busy], np.int64)
    kind = np.empty(len(busy), np.int8)
    for first, at in members:  # _classify's tests for all rounds over one set of flows' arrays at once
        kind[at] = _kinds(st.rounds[first], f[at], c[b[at]])
    keys: list[tuple] = []  # the bottleneck classes in the order evaluate's loop meets them
    index: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}
    cls = np.empty(len(busy), np.int64)
    for j, (i, g, fj, kj) in enumerate(zip(busy, group, f.tolist(), kind.tolist(), strict=True)):
        at = (g, fj, kj)
        k = seen.get(at)
        if k is None:
            key = _class_key(st.rounds[i], fj, kj)
            k = index.setdefault(key, len(keys))
            if k == len(keys):
                keys.append(key)
            seen[at] = k
        cls[j] = k
    weights = np.bincount(cls, weights=lam * repeats[b], minlength=len(keys))
    bottleneck = keys[int(np.argmax(weights))]
    ratio = load[b] * c[b] / np.where(lam > 0, lam, np.nan)
    top = np.fmax.reduce(ratio)
    util = top if top > 0.0 else 0.0  # max(0, ...) over the rounds with lam > 0, as evaluate's loop (nan: none)
    cost = lam.copy()
    more: dict[tuple, float] = {}
    for j, i in repeated:  # (position among the busy rounds, round) of the rounds repeated more than once
        rc = st.rounds[i]
        at = (id(rc.rate_rows() if rc.slots > 1 else rc.rows), int(phase[i]))
        if at not in more:
            more[at] = float(rc.repeat_cost(cb[phase[i]])[0])
        cost[j] = lam_of[i] + (rc.repeats - 1) * more[at]
    total = float(np.cumsum(cost)[-1])
    phase_time = np.bincount(phase[b], weights=cost, minlength=nphase).tolist()
    return Timing(total, phase_time, tier, bottleneck, min(util, 1.0))


def _bulk_layout(st) -> tuple:
    """Per round of `st`: phase, repeats, chunk-hops per tier, load_coef; the rounds with messages, an id of
    their flows' arrays (rounds sharing them share classifications), and the busy rounds repeated more than
    once (their position among the busy rounds, their index)."""
    rounds = st.rounds
    phase = np.array([rc.phase for rc in rounds], np.int64)
    repeats = np.array([rc.repeats for rc in rounds], np.float64)
    tiers = np.array([rc.tier_chunks for rc in rounds], np.float64).reshape(len(rounds), len(TIERS))
    load = np.array([rc.load_coef for rc in rounds], np.float64)
    busy = [i for i, rc in enumerate(rounds) if rc.src.size]
    ids: dict[tuple, int] = {}
    group = []
    for i in busy:
        rc = rounds[i]
        group.append(ids.setdefault((id(rc.src), id(rc.dst), id(rc.lat), id(rc.coef), id(rc.recv_coef),
                                     id(rc.red_flow), id(rc.crit_link), id(rc.crit_factor), rc.overlap), len(ids)))
    by = np.asarray(group, np.int64)
    # per set of flows' arrays: its first round and the positions (among the busy rounds) of its rounds
    order = np.argsort(by, kind="stable")
    ends = np.cumsum(np.bincount(by, minlength=len(ids))).tolist()
    members = [(busy[int(order[lo])], order[lo:hi]) for lo, hi in zip([0] + ends[:-1], ends, strict=True)]
    repeated = [(j, i) for j, i in enumerate(busy) if rounds[i].repeats > 1]
    return phase, repeats, tiers, load, busy, group, members, repeated


LATENCY, REDUCE, LINK = 0, 1, 2


def _kinds(rc, f: np.ndarray, cb: np.ndarray) -> np.ndarray:
    """_classify's verdict (LATENCY, REDUCE or LINK) for flows f of rc's arrays at chunk bytes cb (per flow),
    by the same floating-point operations and tests."""
    lat, coef = rc.lat[f], rc.coef[f]
    ser = coef * cb
    red = (rc.recv_coef[f] - coef) * cb
    reduce = np.zeros(f.size, bool)
    if rc.overlap:  # streamed: the reduction is the bottleneck when it is slower than the transfer
        streamed = rc.red_flow[f] * cb
        reduce = (streamed > ser) & (streamed >= lat)
        red = np.zeros(f.size)
    reduce |= (red >= ser) & (red >= lat)
    return np.where(reduce, REDUCE, np.where(ser >= lat, LINK, LATENCY)).astype(np.int8)


def _class_key(rc, f: int, kind: int) -> tuple:
    """_classify's key for flow f of rc in verdict `kind` (_kinds)."""
    if kind == REDUCE:
        return ("reduce", int(rc.dst[f]), 1.0)
    if kind == LINK:
        return ("link", int(rc.crit_link[f]), float(rc.crit_factor[f]), int(rc.src[f]), int(rc.dst[f]))
    return ("latency",)


def bulk_slowest(st, cb: np.ndarray) -> tuple[list, list] | None:
    """Per round of the bulk model: the flow of its slowest row at chunk bytes cb[phase] and that row's
    duration (what evaluate's per-round argmax over rc.rows gives, the same floats), for all rounds at once;
    None when a round with messages has no rows (evaluate then takes them one by one)."""
    layout = st.memo.get("bulk rows")
    if layout is None:
        busy = [i for i, rc in enumerate(st.rounds) if rc.src.size]
        sizes = np.array([st.rounds[i].rows.shape[0] for i in busy], np.int64)
        if busy and not sizes.all():
            layout = ()
        elif busy:
            rows = np.concatenate([st.rounds[i].rows for i in busy])
            flows = np.concatenate([st.rounds[i].row_flow for i in busy]).astype(np.int64, copy=False)
            phase = np.repeat(np.array([st.rounds[i].phase for i in busy], np.int64), sizes)
            starts = np.r_[0, np.cumsum(sizes)[:-1]]
            layout = (busy, rows, flows, phase, starts, sizes)
        else:
            layout = ([], None, None, None, None, None)
        st.memo["bulk rows"] = layout
    if not layout:
        return None
    busy, rows, flows, phase, starts, sizes = layout
    f_of, lam_of = [None] * len(st.rounds), [None] * len(st.rounds)
    if not busy:
        return f_of, lam_of
    dur = rows[:, 0] + rows[:, 1] * np.asarray(cb, np.float64)[phase]
    top = np.maximum.reduceat(dur, starts)
    # np.argmax's choice: the first row of each round attaining its maximum
    hit = np.flatnonzero(dur == np.repeat(top, sizes))
    seg = np.searchsorted(starts, hit, side="right") - 1
    first = hit[np.r_[True, seg[1:] != seg[:-1]]] if hit.size else hit
    if first.size != len(busy):  # a round whose durations are not numbers (nan): argmax's own rule applies
        return None
    for i, f, lam in zip(busy, flows[first].tolist(), dur[first].tolist(), strict=True):
        f_of[i], lam_of[i] = f, lam
    return f_of, lam_of


__all__ = ["Timing", "bulk_slowest", "evaluate_bulk"]
