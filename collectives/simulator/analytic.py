"""The analytic simulator: cost each round of a schedule from its slot functions, vectorized over all members.

For every round (uniform rounds: iteration 0 only, standing for all `repeats`; others: every iteration) the
slots are evaluated once for all members of all groups, the messages (flows) mapped to links with
`path_links`, and the links' loads summed with one `bincount`, in units of *chunks*. Everything up to here is
independent of the message size, so it is computed once per (schedule structure, topology, protocol) and
cached; a size only scales it by the phase's chunk size in bytes (chunk elements are taken as the continuous
share length / nchunks, exact when counts divide evenly).

Per flow: arrival = start + path latency + chunk bytes x max over its hops of (chunks on the link / effective
bandwidth) (a link's bandwidth is shared by the messages of the round crossing it: fair share, which for
equal messages ends when FIFO service would; a message smaller than others on the link is through once every
message has moved as much as it has, sum over the link's messages of min(theirs, its own) chunks, as the event
model's even split lets it: flows.shared_load); the receiver then reduces what it received. Two ways to combine
flows into a time, both following the rules of model.py:

* dataflow (default up to `DATAFLOW_MAX_NODES` nodes): a ready time per node, and the last few rounds' for
  the credit window; the recurrence of recurrence.py (a message starts when both its ends are ready, or its
  sender is within the credit window; a node's round ends when its sends have left and its receives have
  landed and been reduced), exactly the one the event simulator executes. A uniform round of R repeats is
  evaluated once; under rendezvous it then advances its nodes by (R - 1) x (its slowest flow's duration), the
  slowest receiver's chain setting the rate; under a credit window the recurrence is iterated (recurrence.
  iterate), and a uniform round whose pairs change between iterations (relabelled) is costed iteration by
  iteration while that stays affordable. In a single round, messages that share a link but start apart share
  it over time, and a message yields to an earlier round's messages on its links, as in the event simulator
  (sharing.py).
* bulk (above): each round costs its slowest flow, a repeated round that plus its cycle rate per further
  iteration (recurrence.cycle_rows; its slowest flow under rendezvous); rounds add up. O(1) per size since a
  round reduces to a few distinct (latency, seconds per byte) rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..schedule.ops import OpKind
from ..topology import TIERS
from .bulk import Timing, bulk_slowest, evaluate_bulk
from .flows import CriticalHops, Hops, flow_hops, frontier, member_blocks, path_cache, round_flows, top_node
from .model import CostRules
from .recurrence import EXACT_UPDATES, advance_history, cycle_rows, iterate, rate_at, reverse_pairs, scatter
from .replicas import replicated_hops
from .sharing import LinkClock, SharedLinks, shared_flows, staggered, stream_ends
from .stages import stage_frontiers, stage_groups, window_sums

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
    crit_link: object  # crit_link[f]: the link that sets coef[f] (-1: empty path); a CriticalHops view
    crit_factor: object  # crit_factor[f]: the in-network factor on that hop (< 1: switch aggregation rate)
    red_node: np.ndarray  # nodes that reduce in this round
    red_coef: np.ndarray  # their reduction seconds per chunk-byte (chunks reduced / rate)
    tier_chunks: np.ndarray  # chunk-hops per link tier
    load_coef: float  # max over links of chunks / raw bandwidth (utilization check)
    # (R, 2) distinct (latency, s per chunk-byte) of receivers and a flow of each (the `rows` and `row_flow`
    # properties); None: frontier(lat, recv_coef), computed when first read (a pipeline's whole set of flows
    # never needs it: its rounds read their stages' rows)
    _rows: np.ndarray = field(default=None)
    _row_flow: np.ndarray = field(default=None)
    recv_coef: np.ndarray = field(default=None)  # per flow: coef and the receiver's red_coef (model.reduce_end)
    red_flow: np.ndarray = field(default=None)  # per flow: the receiver's red_coef (0 if it does not reduce)
    overlap: bool = False  # reductions stream with the transfer (rules.overlap_reduce)
    net: np.ndarray = field(default=None)  # per flow: crosses a NIC
    # the kinds of rank-to-rank flows in the round, (over NVLink, over the network), when the round is a set of
    # a huge pipeline's stages (its arrays are the whole pipeline's: _stage_rounds); None: read the arrays
    step_kinds: tuple | None = None
    slots: int = 1  # the most rounds a message may run ahead of its receiver (rules.credit_slots; recurrence.py)
    units: np.ndarray = field(default=None)  # per flow: chunks it carries (its credit depends on its bytes)
    hops: Hops | None = field(default=None, repr=False)  # the round's hops, for sharing.shared_flows
    hop_bw: np.ndarray | None = field(default=None, repr=False)  # their effective bandwidth
    _scatter: object = field(default=None, repr=False)
    _shared: object = field(default=False, repr=False)
    _rates: np.ndarray = field(default=None, repr=False)
    replicas: object = field(default=None, repr=False)  # the flows stand for more (replicas.py), or None

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._frontier()
        return self._rows

    @property
    def row_flow(self) -> np.ndarray:
        if self._row_flow is None:
            self._frontier()
        return self._row_flow

    def _frontier(self) -> None:
        if self.src.size:
            self._rows, self._row_flow = frontier(self.lat, self.recv_coef)
        else:
            self._rows, self._row_flow = np.zeros((0, 2)), np.zeros(0, np.int64)

    def scatter(self):
        """The round's messages grouped by receiver and sender (recurrence.scatter), computed once."""
        if self._scatter is None:
            self._scatter = scatter(self.src, self.dst, self.red_node)
        return self._scatter

    def shared_links(self) -> SharedLinks | None:
        """The round's messages that share a link with others, and their hops (sharing.py), computed once."""
        if self._shared is False:
            h = self.hops
            self._shared = None if h is None or self.hop_bw is None else \
                shared_flows(h.fidx, h.hl, h.hop_load, self.hop_bw, h.units)
        return self._shared

    def rate_rows(self) -> np.ndarray:
        """(latency, s per chunk-byte) rows of the round's cycle rate when repeated (recurrence.cycle_rows);
        shared by the rounds over one set of flows (a huge pipeline's stages)."""
        if self._rates is None:
            key = (id(self.src), id(self.lat), id(self.recv_coef), self.slots)
            hit = _RATES.get(key)
            if hit is not None and hit[0] is self.src and hit[1] is self.lat and hit[2] is self.recv_coef:
                self._rates = hit[3]
            else:
                own = max(float(self.coef.max()) if self.coef.size else 0.0,
                          float(self.red_coef.max()) if self.red_coef.size else 0.0)
                n = int(max(self.src.max(), self.dst.max())) + 1 if self.src.size else 1
                flow_rows = self.rows if self.row_flow is not None and self.rows.shape[0] and \
                    self.step_kinds is None else None
                pairs, shared = round_pairs(self.src, self.dst, n, self.lat)
                self._rates = cycle_rows(self.src, self.dst, self.lat, self.recv_coef, own, n, self.slots,
                                         flow_rows, pairs, shared=shared, full=self.replicas)
                if len(_RATES) >= 64:
                    _RATES.pop(next(iter(_RATES)))
                _RATES[key] = (self.src, self.lat, self.recv_coef, self._rates)
        return self._rates

    def repeat_cost(self, c) -> np.ndarray:
        """Seconds per further iteration of a repeated round in the bulk model, at chunk bytes c (array): the
        cycle rate under a credit window, else its slowest message (both ends wait for each other)."""
        rows = self.rate_rows() if self.slots > 1 else self.rows
        c = np.atleast_1d(np.asarray(c, np.float64))
        return (rows[:, 0][None, :] + rows[:, 1][None, :] * c[:, None]).max(axis=1)


@dataclass
class Structure:
    phase_names: list[str]
    rounds: list[RoundCost]
    num_nodes: int
    memo: dict = field(default_factory=dict)  # derived figures (latency.step_depth's), per their arguments
    credit: object = None  # rules.credit: rounds a message of n bytes may run ahead of its receiver


_CACHE: dict[tuple, tuple[object, Structure]] = {}
_RATES: dict[tuple, tuple] = {}  # RoundCost.rate_rows by the flows' arrays (checked by identity)
# recurrence.reverse_pairs by the flows' (src, dst) arrays, and cycle_rows' part that no protocol changes by
# their (src, dst, lat) arrays (checked by identity)
_PAIRS: dict[tuple, tuple] = {}


def round_pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int, lat: np.ndarray | None = None
                ) -> tuple[tuple, dict]:
    """reverse_pairs(src, dst, num_nodes), computed once for a round's flows whatever the protocol and whoever
    asks (the cycle rate, the step latency's depth), and a dict for cycle_rows' `shared` (kept with `lat`)."""
    key = (id(src), id(dst), num_nodes)
    hit = _PAIRS.get(key)
    if hit is None or hit[0] is not src or hit[1] is not dst:
        hit = (src, dst, reverse_pairs(src, dst, num_nodes), {})
        if len(_PAIRS) >= 64:
            _PAIRS.pop(next(iter(_PAIRS)))
        _PAIRS[key] = hit
    shared = hit[3]
    if lat is None:
        return hit[2], {}
    if shared.get("lat") is not lat:  # cycle_rows' shared part belongs to one latency array
        shared.clear()
        shared["lat"] = lat
    return hit[2], shared


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


def _round_cost(rules: CostRules, pi: int, h: Hops, repeats: int, collapsed: bool, sharing: bool = True
                ) -> RoundCost:
    """The round's costs under `rules`; `sharing=False`: without the per-hop bandwidths that sharing over time
    reads (a pipeline's stages, priced in the bulk model only, never share over time)."""
    src, dst, fidx, hl = h.src, h.dst, h.fidx, h.hl
    F = src.size
    if rules.efficiency != 1.0 and not h.switch:
        # a protocol's wire format divides every rank-to-rank hop's rate by its efficiency: the round's costs
        # are the full-rate costs scaled (computed once, shared by the protocols)
        base = _round_cost(rules.at_full_rate(), pi, h, repeats, collapsed)
        coef = base.coef / rules.efficiency
        rc_flow = rules.reduce_end(coef, base.red_flow)
        return RoundCost(pi, repeats, collapsed, src, dst, base.lat, coef, base.crit_link, base.crit_factor,
                         base.red_node, base.red_coef, base.tier_chunks, base.load_coef / rules.efficiency, None,
                         None, rc_flow, base.red_flow, rules.overlap_reduce, h.net, slots=rules.credit_slots,
                         units=h.units, hops=h,
                         hop_bw=None if base.hop_bw is None or not sharing else base.hop_bw * rules.efficiency,
                         replicas=h.replicas)
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
    per_hop = np.zeros(0)
    if hl.size:
        # at the links' raw rates the ratios flow_hops computed for the busiest link (the same divisions)
        per_hop = h.raw_per_hop if factor is None and h.raw_per_hop is not None else h.hop_load / bw
        starts = h.starts
        rows = fidx[starts]
        best = np.maximum.reduceat(per_hop, starts)
        coef[rows] = best
    crit = CriticalHops(fidx, hl, per_hop, coef, factor)
    crit_link, crit_factor = crit.link, crit.factor
    red_flow = np.zeros(F)
    if h.rc_add is not None:
        hit, add = h.rc_add
        red_flow[hit] = add
    rc_flow = rules.reduce_end(coef, red_flow)
    rc = RoundCost(pi, repeats, collapsed, src, dst, h.lat, coef, crit_link, crit_factor, h.rn, h.rc, h.tier,
                   h.load_coef, None, None, rc_flow, red_flow, rules.overlap_reduce, h.net, slots=rules.credit_slots,
                   units=h.units, hops=h, hop_bw=bw, replicas=h.replicas)
    if rules.efficiency == 1.0:
        h.costs[rules.key] = rc
    return rc


_ROUND_HOPS: dict[tuple, tuple] = {}


def _round_hops(rules: CostRules, phase, rnd, it: int, blocks, paths) -> Hops:
    """`flow_hops` of one round iteration, kept per Round object (and groups array): a builder that reuses its
    rounds for every size of a sweep (their messages count chunks, not elements) is costed once."""
    bulk = rules.topology.num_nodes > DATAFLOW_MAX_NODES
    key = (id(rnd), it, id(phase.groups), id(rules.topology), rules.dtype, bulk)
    hit = _ROUND_HOPS.get(key)
    if hit is not None and hit[0] is rnd and hit[1] is phase.groups and hit[2] is rules.topology:
        return hit[3]
    flows = round_flows(phase, rnd, it, blocks)
    # the bulk model reads maxima and sums over the flows only: alike domains costed once (replicas.py)
    hops = replicated_hops(rules, flows, share=True)[0] if bulk else flow_hops(rules, flows, paths, share=True)
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
    node = phase.groups[0]
    # members numbered as their nodes (a pipeline over all nodes in order, or over the ranks and domain switches
    # first, then some fabric switches): members below `same` stand for themselves, others are looked up
    off = np.flatnonzero(node != np.arange(node.size)) if node.dtype == np.int64 else np.zeros(1, np.int64)
    same = int(off[0]) if off.size else node.size

    def of(m):  # (every member is below node.size: where all stand for themselves, none is looked up)
        return m if not m.size or same == node.size or int(m.max()) < same else node[m]

    srcs, dsts, units, lags, rn, ru = [], [], [], [], [], []
    for kind, m, peer, lag, n in info["stages"]():
        if kind == OpKind.SEND:
            srcs.append(of(m)), dsts.append(of(peer)), units.append(n), lags.append(lag)
        elif kind == OpKind.RECV_REDUCE:
            rn.append(of(m)), ru.append(n)
    cat = lambda xs, dt: np.concatenate(xs, dtype=dt, casting="unsafe") if xs else np.zeros(0, dt)  # noqa: E731
    flows = (cat(srcs, np.int64), cat(dsts, np.int64), cat(units, np.float64), cat(rn, np.int64),
             cat(ru, np.float64))
    # the paths do not depend on the piece count (only the chunk counts do): the topology's cache shares them.
    # A message's stage is its lane's lag, 0 .. stage_count - 1: 32-bit integers while every message's is
    # listed (replicated_hops returns the costed messages' as 64-bit ones)
    stage = cat(lags, np.int32 if int(info["stage_count"]) <= 2 ** 31 else np.int64)
    staged = replicated_hops(rules, flows, stage)
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
        full = _round_cost(rules, pi, hops, 1, False, sharing=False)
        groups = stage_groups(rules, hops, lag, S)
        memo = (full, *stage_frontiers(groups, full.recv_coef, S), groups.tiers, groups.kinds)
        hops.costs[memo_key] = memo
    full, rows_all, flows_all, bounds, tier, kinds = memo
    if full.src.size == 0:
        return []
    n = 1 if rnd.uniform else rnd.repeats
    t = first + np.arange(n)
    lo, hi = np.maximum(0, t - P + 1), np.minimum(t, S - 1)
    busy = hi >= lo
    lo_b, hi_b = np.where(busy, lo, 0), np.where(busy, hi + 1, 0)
    # a round is its busy stages [lo, hi) and its repeats: the sizes of a sweep (other piece counts) share
    # most of their fill and drain rounds, kept with the stages' costs (the rounds' own caches with them)
    made = hops.costs.setdefault(("stage rounds",) + memo_key, {})
    reps = rnd.repeats if rnd.uniform else 1
    keys = [(pi, reps, rnd.uniform, x, y) for x, y in zip(lo_b.tolist(), hi_b.tolist(), strict=True)]
    miss = np.array([i for i, k in enumerate(keys) if k not in made], np.int64)
    if miss.size:
        lo_m, hi_m, busy_m = lo_b[miss], hi_b[miss], busy[miss]
        # the busy stages' rows side by side (a few per stage: the max over them is the round's cost)
        a, b = np.where(busy_m, bounds[lo_m], 0).tolist(), np.where(busy_m, bounds[hi_m], 0).tolist()
        tiers, kind = window_sums(tier, kinds, lo_m, hi_m, busy_m)
        for j, i in enumerate(miss.tolist()):
            made[keys[i]] = RoundCost(pi, reps, rnd.uniform, full.src, full.dst, full.lat, full.coef,
                                      full.crit_link, full.crit_factor, full.red_node, full.red_coef, tiers[j],
                                      full.load_coef, rows_all[a[j]:b[j]], flows_all[a[j]:b[j]], full.recv_coef,
                                      full.red_flow, full.overlap, full.net, kind[j], slots=rules.credit_slots,
                                      units=full.units, replicas=hops.replicas)
    return [made[k] for k in keys]


_bulk_slowest = bulk_slowest  # (a module global, so tests can take the loop over every round's rows instead)


def _has_fabric_switches(schedule, rules: CostRules) -> bool:
    return any(top_node(ph.groups) >= rules.fabric_start for ph in schedule.phases)


def structure(schedule, rules: CostRules) -> Structure:
    """Size-independent costing of every round of `schedule` (cached by algorithm, parameters, topology)."""
    topo = rules.topology
    key = (schedule.algorithm, schedule.collective, schedule.world_size, schedule.root, _freeze(schedule.params),
           _fingerprint(schedule), id(topo), rules.dtype, schedule.num_nodes, rules.efficiency, rules.overlap_reduce,
           rules.sharp_protocol if _has_fabric_switches(schedule, rules) else None, rules.slot_bytes)
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
                collapse = rnd.uniform
                if collapse and not bulk and rules.credit_slots > 1 and rnd.repeats > 1:
                    # a uniform round's iterations cost alike up to relabelling, but under the credit window
                    # the recurrence follows the actual pairs: cost each iteration when they change (and that
                    # stays affordable), the repeated pattern once when they do not (ring steps, steady states)
                    first = _round_hops(rules, phase, rnd, 0, blocks, paths)
                    second = _round_hops(rules, phase, rnd, 1, blocks, paths)
                    same = np.array_equal(first.src, second.src) and np.array_equal(first.dst, second.dst)
                    collapse = same or rnd.repeats * first.src.size > EXACT_UPDATES
                its = [0] if collapse else range(rnd.repeats)
                for it in its:
                    hops = _round_hops(rules, phase, rnd, it, blocks, paths)
                    flows[1].append((pi, rnd.repeats if collapse else 1, collapse, hops))
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
    st = Structure([ph.name for ph in schedule.phases], rounds, max(schedule.num_nodes, topo.num_nodes),
                   credit=rules.credit)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (topo, st)
    return st


def chunk_bytes(schedule, itemsize: int) -> np.ndarray:
    """Bytes of one chunk in each phase (continuous share: mean group length / chunks)."""
    return np.array([float(np.mean(ph.chunks.length)) * itemsize / ph.chunks.nchunks if ph.chunks.length.size
                     else 0.0 for ph in schedule.phases])


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
        # ready times after each of the last `slots` rounds, oldest first (the credit window, recurrence.py)
        slots = max((rc.slots for rc in st.rounds), default=1)
        hist = [np.zeros(st.num_nodes)] * slots
        phase_end = [0.0] * nphase
        clock = LinkClock()
    total = 0.0
    slowest = None if dataflow else _bulk_slowest(st, cb)
    if slowest is not None:  # every round's slowest flow known: the rounds as arrays (bulk.py)
        return evaluate_bulk(st, cb, slowest)
    # a pipeline's rounds share their flows' arrays, mostly their slowest flow and their cycle rate: each
    # classification and repeat cost once per (arrays, flow, chunk bytes) in this call
    memo: dict[tuple, object] = {}
    for ri, rc in enumerate(st.rounds):
        c = cb[rc.phase]
        tier += rc.tier_chunks * c * rc.repeats
        if rc.src.size == 0:
            if dataflow:  # rounds without messages still count for the credit window
                hist = (hist + [hist[-1]] * min(rc.repeats, slots))[-slots:]
            continue
        if dataflow:
            dur_flow = rc.lat + rc.recv_coef * c
            f = int(np.argmax(dur_flow))
            lam = float(dur_flow[f])
        elif slowest is not None:
            f, lam = slowest[0][ri], slowest[1][ri]
        else:  # the few distinct rows stand for all flows
            dur_row = rc.rows[:, 0] + rc.rows[:, 1] * c
            i = int(np.argmax(dur_row))
            f, lam = int(rc.row_flow[i]), float(dur_row[i])
        at = (id(rc.src), id(rc.lat), id(rc.coef), id(rc.recv_coef), id(rc.red_flow), id(rc.crit_link), f, c)
        key = memo[at] if at in memo else memo.setdefault(at, _classify(rc, f, c)[0])
        weights[key] = weights.get(key, 0.0) + lam * rc.repeats
        if lam > 0:
            util = max(util, rc.load_coef * c / lam)
        if not dataflow:
            if rc.repeats > 1:
                at = (id(rc.rate_rows() if rc.slots > 1 else rc.rows), c)
                more = memo[at] if at in memo else memo.setdefault(at, float(rc.repeat_cost(c)[0]))
            cost = lam + (rc.repeats - 1) * more if rc.repeats > 1 else lam
            phase_time[rc.phase] += cost
            total += cost
            continue
        hist = _advance_round(rc, c, lam, hist, st.credit, clock)
        phase_end[rc.phase] = max(phase_end[rc.phase], float(hist[-1].max()))
    if dataflow:
        total = float(hist[-1].max())
        prev = 0.0
        for i in range(nphase):
            end = max(phase_end[i], prev)
            phase_time[i] = end - prev
            prev = end
    bottleneck = max(weights, key=weights.get) if weights else ("latency",)
    return Timing(total, phase_time, tier, bottleneck, min(util, 1.0))


def _advance_round(rc: RoundCost, c: float, lam: float, hist: list[np.ndarray], credit,
                   clock: LinkClock | None = None) -> list[np.ndarray]:
    """The ready-time history (oldest first) after the rc.repeats rounds of `rc` at chunk bytes c (its slowest
    flow: lam); `credit(bytes)`: the rounds each message may run ahead of its receiver (model.CostRules);
    `clock`: the links' spans of earlier rounds' messages (sharing.LinkClock), followed in single rounds."""
    slots = len(hist)
    sc = rc.scatter()
    ser = rc.coef * c
    red = rc.red_coef * c if rc.red_node.size else None
    back = np.minimum(credit(rc.units * c), slots) if slots > 1 else np.ones(rc.src.size, np.int64)
    H = np.stack([h[sc.nodes] for h in hist])

    def advance(X, sc=sc, back=back, rc=rc, ser=ser, red=red):
        return advance_history(X, sc, back, rc.lat, ser, red, rc.overlap)

    if rc.repeats > 1 and slots > 1:
        H = iterate(H, rc.repeats, advance, rate_at(rc.rate_rows(), c), sc.src.size + sc.nodes.size)
        fresh = H[-min(rc.repeats, slots):]
    else:
        if rc.repeats == 1 and clock is not None and rc.hops is not None:
            # a message waits for earlier rounds' messages on its links, and messages sharing a link but
            # starting apart share it over time (sharing.py)
            start = np.maximum(H[-1][sc.src], H[H.shape[0] - back, sc.dst])
            spans = clock.spans(rc.hops)
            go = clock.waits(rc.hops, spans, start)
            end = go + ser
            sh = rc.shared_links()
            if sh is not None and staggered(sh, go[sh.flows]):
                end[sh.flows] = stream_ends(sh, go[sh.flows], rc.units[sh.flows] * c)
            end = clock.paused(rc.hops, spans, go, end)
            clock.record(rc.hops, go, end)
            ser = end - start
        new = advance(H, ser=ser)
        if rc.repeats > 1:  # rendezvous: the slowest receiver's chain sets the rate of a repeated round
            new = new + (rc.repeats - 1) * lam
        fresh = new[None, :]
    out = []
    for x in fresh:
        full = hist[-1].copy()
        full[sc.nodes] = x
        out.append(full)
    return (hist + out)[-slots:]


def bulk_times(st: Structure, cb: np.ndarray) -> np.ndarray:
    """Bulk-model times for many sizes at once: cb is (S, phases); O(rows) per round per size."""
    cb = np.atleast_2d(cb)
    total = np.zeros(cb.shape[0])
    for rc in st.rounds:
        if rc.rows.shape[0] == 0:
            continue
        c = cb[:, rc.phase]
        total += (rc.rows[:, 0][None, :] + rc.rows[:, 1][None, :] * c[:, None]).max(axis=1)
        if rc.repeats > 1:
            total += (rc.repeats - 1) * rc.repeat_cost(c)
    return total


__all__ = ["DATAFLOW_MAX_NODES", "RoundCost", "Structure", "Timing", "bulk_times", "chunk_bytes", "evaluate",
           "structure"]
