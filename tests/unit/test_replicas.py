"""Messages inside NVLink domains costed once per kind of domain (simulator/replicas.py) give what all the
messages give, and a cluster whose domains differ takes the general path.

Each test lowers DATAFLOW_MAX_NODES so a small cluster takes the bulk model (as 331,776 GPUs do), and compares
the shortcut with the general path (replicas switched off) figure by figure: exact equality.
"""

from __future__ import annotations

import numpy as np
import pytest

from collectives.simulate import simulate
from collectives.simulator import analytic, flows, replicas
from collectives.simulator.engine import build_schedule, count_for
from collectives.simulator.model import CostRules
from collectives.topology import preset


@pytest.fixture
def bulk(monkeypatch):
    monkeypatch.setattr(analytic, "DATAFLOW_MAX_NODES", 0)
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)  # the shortcut wherever some copies drop


def _figures(r) -> tuple:
    return (r.time, [p.time for p in r.phases], r.tier_bytes, r.max_link_utilization, r.bottleneck, r.protocol)


def _both(monkeypatch, make_topology, name: str, nbytes: int, **params) -> tuple[tuple, tuple, list]:
    """simulate() with the shortcut and without it (each on a fresh topology: no cache shared), and what
    domain_replicas answered on the first."""
    answers = []
    real = replicas.domain_replicas

    def spy(*args):
        out = real(*args)
        answers.append(out)
        return out

    monkeypatch.setattr(replicas, "domain_replicas", spy)
    fast = simulate(name, make_topology(), nbytes, mode="analytic", **params)
    monkeypatch.setattr(replicas, "domain_replicas", lambda *a: None)
    general = simulate(name, make_topology(), nbytes, mode="analytic", **params)
    return _figures(fast), _figures(general), answers


def _symmetric():
    return preset("gb200-nvl72", racks=4, gpus_per_domain=4)


@pytest.mark.parametrize("name,params", [("hierarchical", {}), ("hierarchical", {"inter": "double_binary_tree"}),
                                         ("nvls_tree", {}), ("double_binary_tree", {}), ("ring", {})])
@pytest.mark.parametrize("nbytes", [4096, 64 << 20])
def test_alike_domains_cost_as_all_messages(bulk, monkeypatch, name, params, nbytes):
    fast, general, answers = _both(monkeypatch, _symmetric, name, nbytes, **params)
    assert fast == general
    taken = [a for a in answers if a is not None]
    if name == "hierarchical" and not params:  # NVLS + SHARP: every domain's NVLS stages alike
        assert taken and all(a.kinds == 1 for a in taken)
    if name == "nvls_tree":  # a rank reduces what the trees across domains send it: a kind per place in them
        assert any(1 < a.kinds < 4 for a in taken)


@pytest.mark.parametrize("name", ["ring", "double_binary_tree", "nvls_tree"])
def test_call_latency_of_alike_domains_is_every_messages(bulk, monkeypatch, name):
    """The per-call step latency (latency.py) of a structure holding one domain's messages: costed by the bulk
    rules, as every message's would be. 40 DGX nodes: leaves and spines; at 4 KiB the step latency is most of
    the call, and taking the dataflow recurrence over the kept messages alone would miss most of a ring's steps."""
    fast, general, answers = _both(monkeypatch, lambda: preset("dgx-h100", nodes=40), name, 4096)
    assert any(a is not None for a in answers)
    assert fast == general


@pytest.mark.parametrize("nbytes", [4096, 64 << 20])
def test_a_tree_across_domains_costs_as_all_messages(bulk, monkeypatch, nbytes):
    """16 domains of 2 GPUs: a double binary tree over them puts several in the same place (a kind each)."""
    fast, general, answers = _both(monkeypatch, lambda: preset("gb200-nvl72", racks=16, gpus_per_domain=2),
                                   "double_binary_tree", nbytes)
    assert fast == general
    assert any(a is not None and 1 < a.kinds < 16 for a in answers)


@pytest.mark.parametrize("overrides", [dict(domain_sizes=[4, 4, 3, 4]),  # an uneven domain
                                       dict(placement=[[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14],
                                                       [3, 7, 11, 15]])])  # ranks placed round-robin
def test_unlike_domains_take_the_general_path(bulk, monkeypatch, overrides):
    def make():
        return preset("gb200-nvl72", racks=4, gpus_per_domain=4, **overrides)

    fast, general, answers = _both(monkeypatch, make, "hierarchical", 64 << 20)
    assert fast == general
    assert answers and all(a is None for a in answers)


def _stage_flows(topology, name: str = "hierarchical"):
    """The steady-state messages of `name`'s pipeline on `topology`, as analytic._stage_hops gathers them."""
    rules = CostRules(topology, "float32", 64 << 20, "Simple")
    sched = build_schedule(name, topology, "allreduce", count_for("allreduce", 64 << 20, topology.world_size, 4))
    phase = next(ph for ph in sched.phases if getattr(ph.rounds[0].slots, "pipeline", None))
    info = phase.rounds[0].slots.pipeline
    node = phase.groups[0]
    srcs, dsts, units, lags, rn, ru = [], [], [], [], [], []
    for kind, m, peer, lag, n in info["stages"]():
        if kind.name == "SEND":
            srcs.append(node[m]), dsts.append(node[peer]), units.append(n), lags.append(lag)
        elif kind.name == "RECV_REDUCE":
            rn.append(node[m]), ru.append(n)
    cat = np.concatenate
    f = (cat(srcs), cat(dsts), cat(units).astype(np.float64), cat(rn), cat(ru).astype(np.float64))
    return rules, f, cat(lags)


@pytest.mark.parametrize("name", ["hierarchical", "nvls_tree", "double_binary_tree"])
def test_kept_messages_cost_what_they_cost_among_all(monkeypatch, name):
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)
    # a double binary tree over 4 domains puts each in another place: 16 domains of 2 GPUs repeat some
    topology = preset("gb200-nvl72", racks=16, gpus_per_domain=2) if name == "double_binary_tree" else _symmetric()
    rules, f, lag = _stage_flows(topology, name)
    rep = replicas.domain_replicas(rules, f, lag, True)
    assert rep is not None and rep.kept.size < f[0].size
    whole = flows.flow_hops(rules, f)
    hops, kept_lag = replicas.replicated_hops(rules, f, lag, True)
    k = rep.kept
    assert hops.replicas is not None and np.array_equal(kept_lag, lag[k])
    assert np.array_equal(hops.src, f[0][k]) and np.array_equal(hops.dst, f[1][k])
    assert np.array_equal(hops.lat, whole.lat[k]) and np.array_equal(hops.net, whole.net[k])
    # per flow its busiest hop's load per bandwidth, and the busiest link
    per = lambda h: np.maximum.reduceat(h.hop_load / h.raw_bw, h.starts)  # noqa: E731
    assert np.array_equal(per(hops), per(whole)[np.isin(np.flatnonzero(np.bincount(whole.fidx)), k)])
    assert np.array_equal(hops.hop_load, whole.hop_load[np.isin(whole.fidx, k)])
    assert hops.load_coef == whole.load_coef and np.array_equal(hops.tier, whole.tier)
    # every message is a kept one, or a copy of one with the same values
    assert np.array_equal(rep.expand(hops.lat), whole.lat)
    assert float(rep.copies.sum()) == f[0].size


def test_a_domain_that_differs_is_its_own_kind(monkeypatch):
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)
    rules, f, lag = _stage_flows(_symmetric())
    src, dst, units, rn, ru = f
    G, N = 4, rules.topology.world_size
    base = replicas.domain_replicas(rules, f, lag, True)
    assert base is not None and base.kinds == 1
    local = np.flatnonzero((src < N) & (dst >= N) & (dst < N + 4) & (src // G == 2))  # domain 2 into its switch
    assert local.size

    def own_kind(rep, d):  # domain d is costed as itself: all its in-domain messages kept
        mine = np.flatnonzero(((src // G == d) & (src < N)) | (src == N + d))
        return rep is not None and rep.kinds == 2 and set(mine.tolist()) <= set(rep.kept.tolist())
    more = units.copy()
    more[local[0]] += 1  # one message of domain 2 carries a chunk more
    assert own_kind(replicas.domain_replicas(rules, (src, dst, more, rn, ru), lag, True), 2)
    late = lag.copy()
    late[local[0]] += 1  # one stage later
    assert own_kind(replicas.domain_replicas(rules, f, late, True), 2)
    # a receiver in domain 1 reduces more than its counterparts
    into = np.flatnonzero((dst < N) & (src == N + 1))[0]
    assert own_kind(replicas.domain_replicas(rules, (src, dst, units, np.r_[rn, dst[into]], np.r_[ru, 1.0]), lag,
                                             True), 1)
    assert replicas.domain_replicas(rules, f, lag, False) is None  # chunk counts that are not whole
    # every domain different: nothing to drop
    for d in range(4):
        more[np.flatnonzero((src < N) & (dst >= N) & (src // G == d))[d]] += 1
    assert replicas.domain_replicas(rules, (src, dst, more, rn, ru), lag, True) is None


def test_messages_between_domains_on_nvlink_are_caught(monkeypatch):
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)
    rules, f, lag = _stage_flows(_symmetric())
    rep = replicas.domain_replicas(rules, f, lag, True)
    hops = flows.flow_hops(rules, tuple(x[rep.kept] if i < 3 else x for i, x in enumerate(f)))
    assert rep.separate(hops.fidx, hops.hl)
    hl = hops.hl.copy()
    between = np.flatnonzero(~rep.local[hops.fidx])
    hl[between[0]] = 0  # a PXN-like hop over rank 0's NVLink
    assert not rep.separate(hops.fidx, hl)


@pytest.mark.parametrize("name", ["hierarchical", "nvls_tree", "double_binary_tree"])
def test_messages_in_runs_lay_out_as_the_sort_does(monkeypatch, name):
    """Lanes list members in order: each run of in-domain messages over every domain in order is laid out as
    its (D, c) block (replicas._domain_runs); a stable sort of the messages' domains gives the same Replicas."""
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)
    topology = preset("gb200-nvl72", racks=16, gpus_per_domain=2) if name == "double_binary_tree" else _symmetric()
    rules, f, lag = _stage_flows(topology, name)
    seen = []
    real = replicas._domain_runs
    monkeypatch.setattr(replicas, "_domain_runs", lambda dom, D: seen.append(real(dom, D)) or seen[-1])
    runs = replicas.domain_replicas(rules, f, lag, True)
    monkeypatch.setattr(replicas, "_domain_runs", lambda dom, D: None)
    sort = replicas.domain_replicas(rules, f, lag, True)
    assert runs is not None and sort is not None
    for field in ("kept", "originals", "dropped", "copies", "local"):
        assert np.array_equal(getattr(runs, field), getattr(sort, field)), field
    assert runs.kinds == sort.kinds
    if name != "double_binary_tree":  # NVLS stages: every lane over all domains (a tree's chains are not)
        assert seen and seen[0] is not None


def test_domain_runs_need_every_domain_in_order():
    dom = np.array([0, 0, 1, 1, 2, 2, 0, 1, 2])
    assert replicas._domain_runs(dom, 3) == [(0, 6), (6, 9)]
    assert replicas._domain_runs(np.array([0, 1, 1, 2, 0, 1, 2, 2]), 3) is None  # unequal counts in a run
    assert replicas._domain_runs(np.array([0, 2, 0, 1]), 3) is None  # a run missing a domain


@pytest.mark.parametrize("name", ["hierarchical", "nvls_tree", "double_binary_tree"])
def test_stage_hops_gather_each_members_node(monkeypatch, name):
    """analytic._stage_hops takes a member below the first that is not its own node id as that id (ranks and
    domain switches before a hierarchical pipeline's fabric switches) and looks the others up: the messages
    and stages every member's node gives."""
    monkeypatch.setattr(replicas, "domain_replicas", lambda *a: None)  # every message kept, in order
    # 160 one-GPU racks: SHARP's trees use some of the fabric's switches, members after the ranks
    topology = preset("gb200-nvl72", racks=160, gpus_per_domain=1) if name == "hierarchical" else _symmetric()
    rules, f, lag = _stage_flows(topology, name)
    sched = build_schedule(name, topology, "allreduce", count_for("allreduce", 64 << 20, topology.world_size, 4))
    phase = next(ph for ph in sched.phases if getattr(ph.rounds[0].slots, "pipeline", None))
    if name == "hierarchical":
        node = phase.groups[0]
        assert not np.array_equal(node, np.arange(node.size)), "fabric switches among the members"
    analytic._STAGES.clear()
    hops, got_lag = analytic._stage_hops(rules, phase, phase.rounds[0].slots.pipeline)
    assert np.array_equal(hops.src, f[0]) and np.array_equal(hops.dst, f[1]) and np.array_equal(got_lag, lag)
    assert np.array_equal(hops.units, f[2]) and np.array_equal(hops.rn, np.unique(f[3]))


def _laid(x: np.ndarray, spans, D: int) -> np.ndarray:
    """The (D, c) rows `spans` lay out (domain_replicas' `laid`), written out the plain way."""
    return np.concatenate([x[a:b].reshape(m, D, w).transpose(1, 0, 2).reshape(D, m * w) for a, b, m, w in spans],
                          axis=1)


@pytest.mark.parametrize("kinds_of,answers", [([0] * 6, True), ([0, 1, 1, 1, 1, 1], True),
                                              ([0, 1, 0, 1, 0, 1], True), ([0, 0, 0, 0, 4, 5], True),
                                              ([0, 0, 0, 3, 3, 5], False), ([0, 1, 2, 3, 4, 5], False)])
def test_block_kinds_are_the_hashed_kinds(kinds_of, answers):
    """replicas._block_kinds compares the domains' messages where they lie in (m, D, w) blocks: where it answers,
    the kinds that hashing the laid-out rows gives (the first domain of each kind; a first domain of its own
    kind found by the middle domain's probe); None where the middle domain's kind is under half of the domains
    or the kinds are more than MAX_PROBES."""
    D = len(kinds_of)
    spans, start = [], 0
    for m, w in ((1, 3), (4, 1), (2, 2)):  # a (D, w) block, an (m, D) block, an (m, D, w) block
        spans.append((start, start + m * D * w, m, w))
        start += m * D * w
    rng = np.random.default_rng(7)
    per_kind = {k: (rng.integers(0, 5, start // D), rng.random(start // D)) for k in set(kinds_of)}
    fields = []
    for f in range(2):
        rows = np.stack([per_kind[k][f] for k in kinds_of])  # (D, c): domain d's values in row order
        x = np.empty(start, rows.dtype)
        col = 0
        for a, b, m, w in spans:  # write the rows back into the blocks' message order
            x[a:b] = rows[:, col:col + m * w].reshape(D, m, w).transpose(1, 0, 2).ravel()
            col += m * w
        fields.append(x)
    for f, x in enumerate(fields):
        assert np.array_equal(_laid(x, spans, D), np.stack([per_kind[k][f] for k in kinds_of]))
    hashed = replicas._kinds([_laid(x, spans, D) for x in fields])
    probed = replicas._block_kinds(fields, spans, D)
    if not answers:
        assert probed is None
    else:
        assert probed is not None and np.array_equal(probed, hashed)
        assert np.array_equal(probed, [kinds_of.index(k) for k in kinds_of])


def _brute_balanced(src: np.ndarray, dst: np.ndarray) -> bool:
    n = max(int(src.max()), int(dst.max())) + 1
    return bool(np.array_equal(np.bincount(src, minlength=n), np.bincount(dst, minlength=n)))


@pytest.mark.parametrize("name", ["hierarchical", "nvls_tree"])
def test_balance_counted_on_the_kept_messages(monkeypatch, name):
    """Replicas.balanced (every node sends as many messages as it receives) from the kept messages and the
    copied domains' moved counts: what counting every message gives, balanced or not, including where only the
    copies are out of balance."""
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)
    rules, f, lag = _stage_flows(_symmetric(), name)
    rep = replicas.domain_replicas(rules, f, lag, True)
    assert rep is not None and rep.balanced == _brute_balanced(f[0], f[1])
    topology = _symmetric()
    N, D, G = topology.world_size, topology.D, topology.G
    fabric = N + D  # a node outside every domain
    # each domain's first GPU sends to its switch (alike: domain 0's kept, the others copies); a fabric node takes
    # domain 0's switch's message and gives its GPU one, so domain 0 balances and only the copies do not
    src = np.r_[np.arange(D) * G, N, fabric]
    dst = np.r_[N + np.arange(D), fabric, 0]
    flows_ = (src, dst, np.ones(src.size), np.zeros(0, np.int64), np.zeros(0))
    rules = CostRules(topology, "float32", 1 << 20, "Simple")
    lone = replicas.domain_replicas(rules, flows_, np.zeros(src.size, np.int64), True)
    assert lone is not None and lone.kinds == 1 and lone.kept.size == 3
    assert not _brute_balanced(src, dst) and not lone.balanced
    # the fabric node does the same for every domain: balanced
    src = np.r_[np.arange(D) * G, N + np.arange(D), np.full(D, fabric)]
    dst = np.r_[N + np.arange(D), np.full(D, fabric), np.arange(D) * G]
    flows_ = (src, dst, np.ones(src.size), np.zeros(0, np.int64), np.zeros(0))
    every = replicas.domain_replicas(rules, flows_, np.zeros(src.size, np.int64), True)
    assert every is not None and _brute_balanced(src, dst) and every.balanced


def test_whole_numbers_block_by_block():
    """replicas.whole_numbers reads WHOLE_BLOCK elements at a time: np.array_equal(x, np.floor(x)) wherever the
    one value that is not whole lies (first block, a block's last element, the last, partial block)."""
    n = 3 * replicas.WHOLE_BLOCK + 5
    base = np.arange(n, dtype=np.float64) % 17
    assert replicas.whole_numbers(base) and replicas.whole_numbers(np.zeros(0))
    for at, value in ((0, 0.5), (replicas.WHOLE_BLOCK - 1, 2.25), (n - 1, 1e-9), (n // 2, np.nan), (7, np.inf)):
        x = base.copy()
        x[at] = value
        assert replicas.whole_numbers(x) == bool(np.array_equal(x, np.floor(x))), (at, value)


class _LinksOnly:
    """A topology's link attributes without its link blocks: _alike_nvlink then reads every NVLink link."""

    def __init__(self, topology) -> None:
        self.link_attributes = topology.link_attributes


@pytest.mark.parametrize("make", [lambda: preset("gb200-nvl72", racks=4, gpus_per_domain=4),
                                  lambda: preset("dgx-h100", nodes=2), lambda: preset("gb300-nvl72")])
def test_nvlink_links_alike_by_blocks_as_link_by_link(make):
    topo = make()
    N, D, G = topo.world_size, topo.D, topo.G
    assert replicas._alike_nvlink(topo, N, D, G) is True
    assert replicas._alike_nvlink(_LinksOnly(topo), N, D, G) is True


def test_nvlink_blocks_that_split_a_domain_are_read_link_by_link():
    """Blocks that end inside the up or down links leave the answer to the links' attributes."""
    N, D, G = 8, 2, 4

    class Split:
        def __init__(self, bw):
            self.bw = np.asarray(bw, np.float64)

        def link_blocks(self):
            return np.array([0, 2, N, 2 * N]), None, None, None

        def link_attributes(self, links):
            return self.bw[links], np.zeros(links.size), np.zeros(links.size, np.int64)

    assert replicas._alike_nvlink(Split([1.0] * 2 + [2.0] * 6 + [1.0] * 8), N, D, G) is False
    assert replicas._alike_nvlink(Split([1.0] * 16), N, D, G) is True


@pytest.mark.parametrize("n", [1, 7, 129, 65536, 65537, 3 * 65536 + 17, 1_000_003])
def test_pairwise_sum_is_numpys(n):
    """replicas._pairwise_sum adds as numpy's sum does (the same float), MEAN_LEAF values at a time."""
    x = np.random.default_rng(n).random(n) * np.logspace(0, 9, n)
    assert replicas._PAIRWISE
    assert replicas._pairwise_sum(lambda a, b: x[a:b], 0, n) == float(np.add.reduce(x))


def test_replicas_mean_is_the_expanded_mean(monkeypatch):
    """Replicas.mean: the mean over every message, the float that expand(x).mean() gives."""
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)
    monkeypatch.setattr(replicas, "MEAN_LEAF", 256)  # many leaves on a small cluster (numpy splits above 128)
    rules, f, lag = _stage_flows(_symmetric(), "nvls_tree")
    rep = replicas.domain_replicas(rules, f, lag, True)
    assert rep is not None
    x = np.random.default_rng(5).random(rep.kept.size) * np.logspace(0, 9, rep.kept.size)
    assert rep.mean(x) == float(rep.expand(x).mean())
