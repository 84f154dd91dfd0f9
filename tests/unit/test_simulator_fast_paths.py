"""The analytic simulator's shortcuts at scale give what their general forms give, on small clusters.

Above DATAFLOW_MAX_NODES the analytic model costs a huge pipeline's stages from one grouping of all its flows
(stages.stage_groups / stage_frontiers) instead of a `frontier` per stage, and all rounds' slowest rows at
once (bulk.bulk_slowest) instead of an argmax per round, and the rounds' sums and classifications as arrays
(bulk.evaluate_bulk) instead of evaluate's loop; `flows.group_values` replaces np.unique and
`flow_hops` sums each node's reductions with bincount. Each test lowers the threshold so a small cluster takes
the bulk path, and compares the shortcut with the general form element by element (exact equality).
"""

from __future__ import annotations

import numpy as np
import pytest

from collectives.simulate import simulate
from collectives.simulator import analytic, flows, stages
from collectives.simulator.engine import build_schedule, count_for
from collectives.simulator.model import CostRules
from collectives.topology import fully_connected, preset


@pytest.mark.parametrize("values,n", [(5, 100), (5, 20_000), (3, 50_000), (20_000, 20_000)])
def test_group_values_is_numpy_unique(values, n):
    rng = np.random.default_rng(values + n)
    x = rng.choice(rng.random(values) * 1e-5, n)
    x[:3] = 0.0
    got, inv = flows.group_values(x)
    want, want_inv = np.unique(x, return_inverse=True)
    assert np.array_equal(got, want) and np.array_equal(inv, want_inv)


@pytest.fixture
def bulk(monkeypatch):
    """Every cluster takes the bulk model (as 331,776 GPUs do), with fresh caches."""
    monkeypatch.setattr(analytic, "DATAFLOW_MAX_NODES", 0)
    return preset("gb200-nvl72", racks=3, gpus_per_domain=4)


PIPELINES = ["double_binary_tree", "nvls_tree", "hierarchical", "collnet_direct"]


@pytest.mark.parametrize("name", PIPELINES)
def test_stage_frontiers_are_each_stages_frontier(bulk, name):
    topo = bulk
    simulate(name, topo, 1 << 20, mode="analytic")
    staged = [v[1] for v in analytic._STAGES.values() if v[0] is topo]
    assert staged, "the bulk model costs the pipeline stage by stage"
    rules = CostRules(topo, "float32", 1 << 20, "Simple")
    rng = np.random.default_rng(0)
    for hops, lag in staged:
        S = int(lag.max()) + 1
        # few distinct costs per byte: many ties, where the choice of a row's flow matters
        per_byte = rng.integers(0, 3, hops.src.size) * 1e-10
        rows, flw, bounds = stages.stage_frontiers(stages.stage_groups(rules, hops, lag, S), per_byte, S)
        for st in range(S):
            fl = np.flatnonzero(lag == st)
            want_rows, at = flows.frontier(hops.lat[fl], per_byte[fl]) if fl.size else (np.zeros((0, 2)), fl)
            got = slice(int(bounds[st]), int(bounds[st + 1]))
            assert np.array_equal(rows[got], want_rows), (name, st)
            assert np.array_equal(flw[got], fl[at]), (name, st)


@pytest.mark.parametrize("name", ["double_binary_tree", "ring", "hierarchical"])
def test_bulk_slowest_rows_are_each_rounds_argmax(bulk, name):
    topo = bulk
    for nbytes in (4096, 16 << 20):
        count = count_for("allreduce", nbytes, topo.world_size, 4)
        schedule = build_schedule(name, topo, "allreduce", count, "float32", "sum", None, "Simple")
        st = analytic.structure(schedule, CostRules(topo, "float32", nbytes, "Simple"))
        cb = analytic.chunk_bytes(schedule, 4)
        got_flow, got_lam = analytic._bulk_slowest(st, cb)
        busy = 0
        for i, rc in enumerate(st.rounds):
            if not rc.src.size:
                continue
            busy += 1
            dur = rc.rows[:, 0] + rc.rows[:, 1] * cb[rc.phase]
            j = int(np.argmax(dur))
            assert (got_flow[i], got_lam[i]) == (int(rc.row_flow[j]), float(dur[j])), (name, nbytes, i)
        assert busy


@pytest.mark.parametrize("name", ["double_binary_tree", "ring", "hierarchical", "nvls_tree"])
def test_bulk_evaluate_is_the_per_round_loop(bulk, name, monkeypatch):
    """evaluate's vectorised bulk model (bulk.evaluate_bulk) gives the per-round loop's figures exactly, for one
    structure at two chunk sizes (its per-structure layout is read at each), and for two protocols' structures."""
    topo = bulk
    fast = []
    for nbytes, protocol in ((4096, "Simple"), (16 << 20, "Simple"), (16 << 20, "LL")):
        count = count_for("allreduce", nbytes, topo.world_size, 4)
        schedule = build_schedule(name, topo, "allreduce", count, "float32", "sum", None, protocol)
        st = analytic.structure(schedule, CostRules(topo, "float32", nbytes, protocol))
        for scale in (1.0, 1e-4, 1e3):  # tiny chunks: latency-bound rounds; big ones: link-bound
            cb = analytic.chunk_bytes(schedule, 4) * scale
            cb = cb * (1.0 + np.arange(cb.size))  # phases at different chunk sizes: a phase's own is read
            fast.append((nbytes, protocol, scale, analytic.evaluate(st, cb, dataflow=False)))
            assert "bulk layout" in st.memo, "the bulk model took the vectorised path"
    monkeypatch.setattr(analytic, "_bulk_slowest", lambda st, cb: None)  # the loop over every round's rows
    kinds = set()
    for nbytes, protocol, scale, got in fast:
        count = count_for("allreduce", nbytes, topo.world_size, 4)
        schedule = build_schedule(name, topo, "allreduce", count, "float32", "sum", None, protocol)
        st = analytic.structure(schedule, CostRules(topo, "float32", nbytes, protocol))
        cb = analytic.chunk_bytes(schedule, 4) * scale
        want = analytic.evaluate(st, cb * (1.0 + np.arange(cb.size)), dataflow=False)
        at = (name, nbytes, protocol, scale)
        assert got.time == want.time and got.phase_times == want.phase_times, at
        assert np.array_equal(got.tier_bytes, want.tier_bytes), at
        assert got.bottleneck == want.bottleneck and got.utilization == want.utilization, at
        kinds.add(want.bottleneck[0])
    assert len(kinds) > 1, kinds  # both latency- and link- (or reduction-) bound rounds were classified


@pytest.mark.parametrize("name", ["double_binary_tree", "hierarchical"])
def test_stage_rounds_shared_between_sizes_are_a_fresh_costing(bulk, name, monkeypatch):
    """A huge pipeline's rounds are kept per (busy stages, repeats) and shared by the sizes of a sweep whose piece
    counts differ: each size's figures are those of a costing from scratch (a key that mixed two rounds' busy
    stages or repeats would price one size with another's rounds)."""
    topo = bulk
    sizes = [1 << 16, 3 << 20, 16 << 20, 64 << 20]  # 1, several and many pieces, in every protocol

    def figures(r):
        return r.time, [p.time for p in r.phases], r.tier_bytes, r.bottleneck, r.max_link_utilization

    swept = [figures(simulate(name, topo, n, mode="analytic")) for n in sizes]
    rounds = [rc for topo_, st in analytic._CACHE.values() if topo_ is topo for rc in st.rounds]
    assert len({id(rc) for rc in rounds}) < len(rounds), "the sizes' structures share rounds"
    for n, got in zip(sizes, swept, strict=True):
        for cache in ("_CACHE", "_FLOWS", "_STAGES", "_ROUND_HOPS", "_RATES", "_PAIRS"):
            monkeypatch.setattr(analytic, cache, {})
        assert figures(simulate(name, topo, n, mode="analytic")) == got, (name, n)


def test_reductions_per_node_sum_in_flow_order():
    topo = fully_connected(8, latency=1e-6, bandwidth=20e9, reduce_bandwidth=50e9)
    rules = CostRules(topo, "float32", 1 << 20, None)
    src, dst = np.array([0, 1, 2, 3, 4]), np.array([5, 3, 5, 7, 6])
    units = np.array([1.0, 2.0, 0.1, 0.2, 0.3])
    rn, ru = np.array([5, 3, 5, 7, 3, 5]), np.array([0.1, 0.2, 0.7, 1.0, 3.0, 1e-17])
    h = flows.flow_hops(rules, (src, dst, units, rn, ru))
    assert h.rn.tolist() == [3, 5, 7]
    sums = [0.2 + 3.0, (0.1 + 0.7) + 1e-17, 1.0]  # each node's chunks added in the flows' order
    assert h.rc.tolist() == (np.array(sums) / rules.reduce_rate(np.array([3, 5, 7]))).tolist()
    hit, add = h.rc_add
    assert hit.tolist() == [True, True, True, True, False]  # flows into 5, 3, 5, 7 reduce; into 6 not
    assert add.tolist() == [h.rc[1], h.rc[0], h.rc[1], h.rc[2]]


@pytest.mark.parametrize("name", ["hierarchical", "double_binary_tree"])
def test_critical_hops_are_each_flows_first_slowest_hop(bulk, name):
    """The link that sets a flow's rate, found when asked, is the one a pass over all hops gives: the first hop
    of the flow attaining its largest seconds per chunk (-1 and factor 1 for a flow without hops)."""
    topo = bulk
    simulate(name, topo, 1 << 20, mode="analytic")
    staged = [v[1][0] for v in analytic._STAGES.values() if v[0] is topo]
    assert staged
    for hops in staged:
        fidx, hl, F = hops.fidx, hops.hl, hops.src.size
        for protocol in ("Simple", "LL"):
            rc = analytic._round_cost(CostRules(topo, "float32", 1 << 20, protocol), 0, hops, 1, False)
            crit = rc.crit_link.owner
            at = np.flatnonzero(crit.per_hop == crit.coef[fidx])
            first = at[np.r_[True, fidx[at][1:] != fidx[at][:-1]]]
            want_link, want_factor = np.full(F, -1, np.int64), np.ones(F)
            want_link[fidx[first]] = hl[first]
            if crit.factors is not None:
                want_factor[fidx[first]] = crit.factors[first]
            assert [rc.crit_link[f] for f in range(F)] == want_link.tolist(), (name, protocol)
            assert [rc.crit_factor[f] for f in range(F)] == want_factor.tolist(), (name, protocol)


@pytest.mark.parametrize("whole", [True, False])
def test_window_sums_are_each_rounds_slice(whole):
    """A pipeline pattern's per-round tier sums and step kinds come from prefix sums over its stages: the sums
    and `any` over each round's busy stages, exactly (whole chunk-hop counts; other values sum slice by slice)."""
    rng = np.random.default_rng(3)
    S = 40
    tier = rng.integers(0, 10 ** 6, (S, 8)).astype(np.float64)
    if not whole:
        tier *= 0.1
    kinds = rng.random((S, 2)) < 0.2
    lo, hi = rng.integers(0, S, 300), rng.integers(0, S + 1, 300)
    busy = hi > lo
    lo, hi = np.where(busy, lo, 0), np.where(busy, hi, 0)
    tiers, held = stages.window_sums(tier, kinds, lo, hi, busy)
    for i in range(lo.size):
        want = tier[lo[i]:hi[i]].sum(axis=0) if busy[i] else np.zeros(8)
        assert tiers[i].tolist() == want.tolist()
        assert held[i] == (tuple(kinds[lo[i]:hi[i]].any(axis=0).tolist()) if busy[i] else (False, False))


@pytest.mark.parametrize("name", ["double_binary_tree", "nvls_tree"])
def test_stage_rounds_tiers_are_their_busy_stages(bulk, name):
    """Every round of a pipeline in the bulk model carries the chunk-hops and step kinds of its busy stages."""
    topo = bulk
    nbytes = 4 << 20
    count = count_for("allreduce", nbytes, topo.world_size, 4)
    schedule = build_schedule(name, topo, "allreduce", count, "float32", "sum", None, "Simple")
    rules = CostRules(topo, "float32", nbytes, "Simple")
    st = analytic.structure(schedule, rules)
    staged = [v[1] for v in analytic._STAGES.values() if v[0] is topo]
    hops, lag = staged[-1]
    S = int(lag.max()) + 1
    groups = stages.stage_groups(rules, hops, lag, S)
    P = int(schedule.params["chunks"])
    t = 0
    assert len(st.rounds) > 2
    for rc in st.rounds:  # fill rounds one by one, the steady state once (from its first round), then drain
        lo, hi = max(0, t - P + 1), min(t, S - 1)
        assert rc.tier_chunks.tolist() == groups.tiers[lo:hi + 1].sum(axis=0).tolist(), (name, t)
        assert rc.step_kinds == tuple(groups.kinds[lo:hi + 1].any(axis=0).tolist()), (name, t)
        t += rc.repeats


def _huge_page_advice():
    for module in (getattr(np, "_core", None), getattr(np, "core", None)):
        get = getattr(getattr(module, "multiarray", None), "_get_madvise_hugepage", None)
        if get is not None:
            return bool(get())
    pytest.skip("this numpy has no huge-page advice")


def test_ordinary_pages_switch_the_advice_off_and_back():
    from collectives.simulator.pages import ordinary_pages

    before = _huge_page_advice()
    with ordinary_pages():
        assert _huge_page_advice() is False
        with ordinary_pages():  # nested: still off, and still off after the inner block
            assert _huge_page_advice() is False
        assert _huge_page_advice() is False
        with ordinary_pages(enabled=False):
            assert _huge_page_advice() is False
    assert _huge_page_advice() is before
    with ordinary_pages(enabled=False):
        assert _huge_page_advice() is before


@pytest.fixture
def advice_on():
    """numpy's huge-page advice on (its Linux default), as it was afterwards."""
    from collectives.simulator import pages

    _huge_page_advice()
    before = pages._SET_ADVICE(True)
    yield
    pages._SET_ADVICE(before)


def test_the_engine_costs_huge_clusters_without_huge_page_advice(bulk, advice_on, monkeypatch):
    """Above the dataflow limit (every cluster here, as at 331,776 GPUs) the engine builds and costs with the
    advice off, and leaves it on as it found it; below the limit it leaves the advice alone."""
    seen = []
    structure = analytic.structure

    def spy(schedule, rules):
        seen.append(_huge_page_advice())
        return structure(schedule, rules)

    monkeypatch.setattr(analytic, "structure", spy)
    simulate("double_binary_tree", bulk, 1 << 20, mode="analytic")
    assert seen and not any(seen)
    assert _huge_page_advice() is True
    monkeypatch.setattr(analytic, "DATAFLOW_MAX_NODES", 1 << 30)
    seen.clear()
    simulate("double_binary_tree", preset("gb200-nvl72", racks=2, gpus_per_domain=4), 1 << 20, mode="analytic")
    assert seen and all(seen)


def test_top_node_is_the_arrays_max_while_it_lives():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert flows.top_node(a) == 11 and flows.top_node(a) == 11  # computed, then kept
    assert flows.top_node(np.zeros((0, 4), np.int64)) == -1
    for k in range(300):  # arrays that die and whose ids numpy may hand out again: never a stale maximum
        b = np.full((2, 3), k, np.int64)
        assert flows.top_node(b) == k


def test_paths_block_by_block_are_all_at_once(monkeypatch):
    """flows._paths takes many flows PATH_BLOCK at a time: the same hops, attributes, path latencies and
    starts as all at once (every pair of ranks, and ranks to and from their NVSwitch and leaf), and the same
    error for a pair without a path."""
    topo = preset("gb200-nvl72", racks=3, gpus_per_domain=4)
    rules = CostRules(topo, "float32", 1 << 20, "Simple")
    ranks = np.arange(topo.world_size)
    s, d = (x.ravel() for x in np.meshgrid(ranks, ranks, indexing="ij"))
    s = np.concatenate([s, ranks, topo.nvswitch_of(ranks), ranks, topo.leaf_of(ranks)])
    d = np.concatenate([d, topo.nvswitch_of(ranks), ranks, topo.leaf_of(ranks), ranks])
    whole = flows._paths(rules, s, d)
    monkeypatch.setattr(flows, "PATH_BLOCK", 37)
    blocked = flows._paths(rules, s, d)
    for a, b in zip(blocked, whole, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    nvs = topo.nvswitch_of(np.array([0, topo.world_size - 1]))
    bad = np.r_[s, nvs[0]], np.r_[d, nvs[1]]  # two domains' NVSwitches: no link joins them
    monkeypatch.setattr(flows, "PATH_BLOCK", 1 << 30)
    with pytest.raises(ValueError) as all_at_once:
        flows._paths(rules, *bad)
    monkeypatch.setattr(flows, "PATH_BLOCK", 37)
    with pytest.raises(ValueError) as by_block:
        flows._paths(rules, *bad)
    assert str(by_block.value) == str(all_at_once.value)


def test_member_blocks_kept_per_array_and_world_size():
    """flows.member_blocks is kept per groups array (while it lives) and world size: another array, or the same
    one split at another world size, gets its own answer; a phase's groups over one member array are one view
    (_pipeline._row), so the builds of a sweep's sizes share it."""
    from types import SimpleNamespace

    from collectives.algorithms import _pipeline

    nodes = np.arange(12, dtype=np.int64)
    row = _pipeline._row(nodes)
    assert _pipeline._row(nodes) is row and _pipeline._row(nodes.copy()) is not row
    phase = SimpleNamespace(groups=row)
    assert flows.member_blocks(phase, 12) is None  # every member a rank
    ranks, switches = flows.member_blocks(phase, 8)
    assert np.array_equal(ranks, np.arange(8)) and np.array_equal(switches, np.arange(8, 12))
    assert flows.member_blocks(phase, 8)[1] is switches  # kept
    again = flows.member_blocks(phase, 10)
    assert np.array_equal(again[1], [10, 11])
    other = SimpleNamespace(groups=np.array([[0, 1, 20, 21, 22]], np.int64))
    assert np.array_equal(flows.member_blocks(other, 8)[1], [2, 3, 4])
    assert flows.member_blocks(SimpleNamespace(groups=np.full((1, 3), 30, np.int64)), 8) is None  # all switches


@pytest.mark.parametrize("pairs,many", [(6, False), (2000, True)])
def test_hop_loads_are_each_links_sum_in_flow_order(pairs, many):
    """flow_hops' chunks per link (a bincount up to the highest link used where the hops are many, over the
    links used where they are few): each hop's link's sum of its flows' chunks, added in the flows' order."""
    topo = preset("gb300-nvl72", racks=64, gpus_per_domain=4)
    rules = CostRules(topo, "float32", 1 << 20, "Simple")
    rng = np.random.default_rng(pairs)
    src, dst = rng.integers(0, topo.world_size, (2, pairs))
    keep = src != dst
    src, dst = src[keep], dst[keep]
    units = rng.integers(1, 9, src.size).astype(np.float64) / 3
    hops = flows.flow_hops(rules, (src, dst, units, np.zeros(0, np.int64), np.zeros(0)))
    assert (8 * hops.hl.size > int(hops.hl.max())) == many  # which of the two ways
    total: dict[int, float] = {}
    for link, u in zip(hops.hl.tolist(), units[hops.fidx].tolist(), strict=True):
        total[link] = total.get(link, 0.0) + u
    assert hops.hop_load.tolist() == [total[link] for link in hops.hl.tolist()]


@pytest.mark.parametrize("name", ["ring", "nvls_tree", "double_binary_tree"])
def test_round_flows_of_members_that_are_their_nodes(monkeypatch, name):
    """flows.round_flows takes a single group over nodes 0..M-1 member for node, and keeps a lane's arrays as
    they are when every message of it is kept: the flows of looking every member up."""
    topo = preset("gb200-nvl72", racks=3, gpus_per_domain=4)
    sched = build_schedule(name, topo, "allreduce", count_for("allreduce", 1 << 20, topo.world_size, 4))
    fast, general = [], []
    for ph in sched.phases:
        for rnd in ph.rounds:
            fast.append(flows.round_flows(ph, rnd, 0, flows.member_blocks(ph, topo.world_size)))
    monkeypatch.setattr(flows, "_members_are_nodes", lambda groups: False)
    for ph in sched.phases:
        for rnd in ph.rounds:
            general.append(flows.round_flows(ph, rnd, 0, flows.member_blocks(ph, topo.world_size)))
    assert any(f[0].size for f in fast)
    for a, b in zip(fast, general, strict=True):
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))
