"""collectives.topology: construction, rank mapping, routing, SHARP trees, presets, persistence, CLI."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from collectives import topology as T
from collectives.cli import topo as topo_cli

SMALL = [
    dict(domains=3, gpus_per_domain=4),  # one leaf
    dict(domains=8, gpus_per_domain=2, radix=4),  # 3 levels
    dict(domains=20, gpus_per_domain=4, radix=8),  # 3 levels, partial pods and leaves
    dict(domains=9, gpus_per_domain=4, radix=8, rail_fabric="per-rail"),  # PXN
    dict(domains=12, gpus_per_domain=4, radix=8, oversubscription=3.0),
    dict(domains=6, gpus_per_domain=4, rails=2, radix=4),
    dict(domains=5, gpus_per_domain=3, radix=4, levels=4),
]


def all_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    s, d = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return s.ravel(), d.ravel()


@pytest.mark.parametrize("params", SMALL)
def test_paths_are_connected_up_down_routes(params):
    c = T.cluster(**params)
    s, d = all_pairs(c.world_size)
    paths = c.path_links(s, d)
    assert paths.shape == (s.size, c.max_hops)
    # padding only at the end: each row is its links, then -1s
    hops = (paths >= 0).sum(axis=1)
    assert np.all(paths[np.arange(c.max_hops)[None, :] >= hops[:, None]] == -1)
    # every flow's links looked up in one call per property (a call per flow made this test ~10x slower)
    links = paths[paths >= 0]
    a_all, b_all = (x.tolist() for x in c.link_endpoints(links))
    tier_all = [T.TIERS[t] for t in c.link_tier(links).tolist()]
    nvswitch = c.nvswitch_of(s).tolist()
    level = {}  # fabric switch -> its level
    ends = np.concatenate(([0], np.cumsum(hops))).tolist()
    for f, (src, dst) in enumerate(zip(s.tolist(), d.tolist(), strict=True)):
        lo, hi = ends[f], ends[f + 1]
        if src == dst:
            assert hi == lo
            continue
        a, b = a_all[lo:hi], b_all[lo:hi]
        assert a[0] == src and b[-1] == dst, (params, src, dst)
        assert a[1:] == b[:-1], "consecutive links must share a node"
        same_domain = src // c.G == dst // c.G
        tiers = tier_all[lo:hi]
        if same_domain:
            assert tiers == ["nvlink", "nvlink"]
            assert b[0] == nvswitch[f]
            continue
        fabric = [n for n in b[:-1] if n >= c.fabric_base]
        levels = [level[n] if n in level else level.setdefault(n, c.switch_level(n)) for n in fabric]
        top = max(levels)
        # climbs to the top once, then descends: a valley-free up/down route
        assert levels == list(range(1, top + 1)) + list(range(top - 1, 0, -1))
        assert len(set(fabric)) == len(fabric), "no switch visited twice"
    # loads never exceed what the flows carry; every link id is valid
    assert paths.max() < c.num_links


@pytest.mark.parametrize("params", SMALL)
def test_hop_list_is_path_links_row_by_row(params):
    """hop_list (the analytic simulator's flat paths) lists exactly path_links' hops, flow by flow, in order:
    every pair of ranks, and ranks to and from their NVSwitch and their leaf (adjacent: one link)."""
    c = T.cluster(**params)
    ranks = np.arange(c.world_size)
    nvs = np.array([c.nvswitch_of(int(r)) for r in ranks])
    s, d = all_pairs(c.world_size)
    s, d = [s, ranks, nvs], [d, nvs, ranks]
    if c.world_size > c.G:  # the first hop towards the next domain's same GPU is the NIC's link to its leaf
        leaves = c.link_endpoints(c.path_links(ranks, (ranks + c.G) % c.world_size)[:, 0])[1]
        assert (leaves >= c.fabric_base).all()
        s, d = s + [ranks, leaves], d + [leaves, ranks]
    s, d = np.concatenate(s), np.concatenate(d)
    paths = c.path_links(s, d)
    fidx, hl = c.hop_list(s, d)
    rows, cols = np.nonzero(paths >= 0)
    assert np.array_equal(fidx, rows)
    assert np.array_equal(hl, paths[rows, cols])


def _route_every_level(tree, src, dst):
    """FatTree.route's general form: every level computed for every flow, kept where the flow climbs to it."""
    a = tree.nca_level(src, dst)
    F = src.size
    up = np.full((F, tree.levels), -1, dtype=np.int64)
    down = np.full((F, tree.levels), -1, dtype=np.int64)
    Y = np.zeros(F, dtype=np.int64)
    for lv in range(1, tree.levels + 1):
        port = np.zeros(F, dtype=np.int64) if lv == 1 else (dst // tree.D[lv]) % tree.up[lv - 1]
        lower_s = (src // tree.M[lv - 1]) * tree.W[lv - 1] + Y
        lower_d = (dst // tree.M[lv - 1]) * tree.W[lv - 1] + Y
        on = lv <= a
        up[:, lv - 1] = np.where(on, lower_s * tree.up[lv - 1] + port, -1)
        down[:, lv - 1] = np.where(on, lower_d * tree.up[lv - 1] + port, -1)
        Y = Y * tree.w[lv] + port // tree.p[lv]
    return a, up, down


@pytest.mark.parametrize("params", SMALL)
def test_route_level_by_level_is_every_level_at_once(params):
    """FatTree.route climbs each level over the flows that reach it only: the same cables as computing every
    level for every flow (every pair of host slots, one to four levels)."""
    tree = T.cluster(**params).tree
    hosts = np.arange(tree.slots, dtype=np.int64)
    s, d = (x.ravel() for x in np.meshgrid(hosts, hosts, indexing="ij"))
    for got, want in zip(tree.route(s, d), _route_every_level(tree, s, d), strict=True):
        assert np.array_equal(got, want)


def test_floor_divmod_is_numpy_divmod():
    from collectives.topology.base import floor_divmod

    x = np.arange(-1000, 5000, 7, dtype=np.int64)
    for k in (1, 3, 72, 4096):
        q, r = floor_divmod(x, k)
        want_q, want_r = np.divmod(x, k)
        assert np.array_equal(q, want_q) and np.array_equal(r, want_r)


@pytest.mark.parametrize("params", SMALL)
def test_adjacent_links_are_link_between(params):
    """hop_list's links between a rank and its own NVSwitch or its own leaf skip link_between's search: the
    same links, and the other adjacent pairs (a switch and its parent) still take link_between; a rank and
    another leaf are no pair, as link_between says."""
    c = T.cluster(**params)
    ranks = np.arange(c.world_size)
    nvs = c.nvswitch_of(ranks)
    leaves = c.leaf_of(ranks)
    ends = c.link_endpoints(np.arange(c.num_links))
    fabric = (ends[0] >= c.fabric_base) & (ends[1] >= c.fabric_base)
    s = np.concatenate([ranks, nvs, ranks, leaves, ends[0][fabric]])
    d = np.concatenate([nvs, ranks, leaves, ranks, ends[1][fabric]])
    assert np.array_equal(c._adjacent_links(s, d), c.link_between(s, d))
    assert np.array_equal(c.adjacent_links(s, d), c.link_between(s, d))  # (the public form)
    # pairs that are all a rank and its leaf, both ways (read as they are, not gathered)
    s, d = np.concatenate([ranks, leaves[::-1]]), np.concatenate([leaves, ranks[::-1]])
    assert np.array_equal(c._adjacent_links(s, d), c.link_between(s, d))
    with pytest.raises(ValueError, match="nodes must be in"):
        c.adjacent_links([0], [c.num_nodes])
    other = np.flatnonzero(leaves != leaves[0])
    if other.size:  # rank 0 and a leaf that is not its own
        with pytest.raises(ValueError, match="no link joins"):
            c._adjacent_links(np.array([0]), leaves[other[:1]])
        with pytest.raises(ValueError, match="no link joins"):
            c._adjacent_links(leaves[other[:1]], np.array([0]))


@pytest.mark.parametrize("params", SMALL)
def test_rank_mapping_and_leaves_are_rail_aligned(params):
    c = T.cluster(**params)
    r = np.arange(c.world_size)
    loc = c.locate(r)
    assert np.array_equal(loc.domain, r // c.G) and np.array_equal(loc.local, r % c.G)
    assert np.array_equal(loc.rail, r % c.G % c.R)
    assert np.array_equal(loc.nvswitch, c.world_size + r // c.G)
    if c.levels >= 2:
        for leaf in np.unique(loc.leaf):
            assert np.unique(loc.rail[loc.leaf == leaf]).size == 1, "a leaf serves one rail"
    for leaf in np.unique(loc.leaf):
        assert np.array_equal(np.sort(c.children(int(leaf))), r[loc.leaf == leaf])
        assert c.node_kind(int(leaf)) == "leaf"
    groups = c.rail_groups()
    assert groups.shape == (c.R, c.world_size // c.R)
    assert np.array_equal(np.sort(groups.ravel()), r)
    for j in range(c.R):
        assert np.all(c.rank_rail(groups[j]) == j)
    assert np.array_equal(c.domain_groups()[1], np.arange(c.G, 2 * c.G)) if c.D > 1 else True


def test_tiny_cluster_three_domains_of_four():
    c = T.cluster(domains=3, gpus_per_domain=4)
    assert (c.world_size, c.num_domains, c.levels) == (12, 3, 1)
    assert c.switch_counts() == {"nvswitch": 3, "leaf": 1}
    assert c.num_nodes == 12 + 3 + 1
    assert c.node_label(13) == "nvswitch[domain 1]"
    p = c.path_links([0, 0, 5], [1, 4, 5])
    assert list(c.link_tier(p[0][p[0] >= 0])) == [T.TIER_CODE["nvlink"]] * 2
    assert list(c.link_tier(p[1][p[1] >= 0])) == [T.TIER_CODE["nic"]] * 2
    assert np.all(p[2] == -1)
    s = c.spec
    lat = c.path_latency([0, 0], [1, 4])
    assert lat[0] == pytest.approx(2 * s.nvlink_latency)
    assert lat[1] == pytest.approx(2 * s.nic_latency + s.switch_latency)
    assert c.path_bandwidth([0, 0], [1, 4]).tolist() == [s.nvlink_bandwidth, s.nic_bandwidth * s.nic_efficiency]


def test_adjacent_switch_links_and_errors():
    c = T.cluster(domains=8, gpus_per_domain=2, radix=4)
    leaf = int(c.leaf_of([3])[0])
    spine = c.parent(leaf, 1)
    core = c.parent(spine, 0)
    assert [c.node_kind(n) for n in (leaf, spine, core)] == ["leaf", "spine", "core"]
    src = np.array([3, c.nvswitch_of([3])[0], 3, leaf, leaf, spine, spine, core])
    dst = np.array([c.nvswitch_of([3])[0], 3, leaf, 3, spine, leaf, core, spine])
    links = c.link_between(src, dst)
    a, b = c.link_endpoints(links)
    assert np.array_equal(a, src) and np.array_equal(b, dst)
    assert np.array_equal(c.path_links(src, dst)[:, 0], links)
    assert leaf in c.children(spine) and spine in c.children(core)
    with pytest.raises(ValueError, match="no link joins"):
        c.link_between([3], [core])
    with pytest.raises(ValueError, match="nodes must be in"):
        c.path_links([0], [c.num_nodes])
    with pytest.raises(ValueError, match="top level"):
        c.parent(core)


def test_link_endpoints_cover_every_link_once():
    c = T.cluster(domains=20, gpus_per_domain=4, radix=8)
    links = np.arange(c.num_links)
    a, b = c.link_endpoints(links)
    used = (a >= 0) & (b >= 0)
    # each used link is the only one from a to b in its direction, except parallel top cables
    pairs = np.stack([a[used], b[used]], axis=1)
    uniq, counts = np.unique(pairs, axis=0, return_counts=True)
    assert counts.max() <= max(c.tree.p)
    # up and down links mirror each other
    assert np.array_equal(np.sort(a[used]), np.sort(b[used]))
    assert set(c.link_tier(links).tolist()) == {T.TIER_CODE[t] for t in ("nvlink", "nic", "leaf-spine", "spine-core")}


@pytest.mark.parametrize("params", SMALL[1:])
def test_sharp_trees(params):
    c = T.cluster(**params)
    for rail in range(c.R):
        tree = c.sharp_tree(rail)
        ranks = c.rail_groups()[rail]
        leaves = tree.levels[0]
        assert np.array_equal(np.sort(leaves.children[leaves.children >= 0]), np.sort(ranks))
        assert tree.levels[-1].switches.size == 1
        for lower, upper in zip(tree.levels[:-1], tree.levels[1:], strict=True):
            kids = upper.children[upper.children >= 0]
            assert np.array_equal(np.sort(kids), np.sort(lower.switches))
        parent = tree.parent_map()
        child = np.array(list(parent))
        c.link_between(child, np.array([parent[x] for x in child.tolist()]))  # every edge is a link
    if c.per_rail:
        with pytest.raises(ValueError, match="one rail"):
            c.sharp_tree()
    else:
        whole = c.sharp_tree()
        assert whole.levels[0].children[whole.levels[0].children >= 0].size == c.world_size


def test_full_size_gb300_builds_fast_and_counts_switches():
    t0 = time.perf_counter()
    c = T.preset("gb300-nvl72")
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0
    assert (c.world_size, c.num_domains, c.gpus_per_domain, c.levels) == (331_776, 4_608, 72, 3)
    # hardware.md: ~4,608 leaf + 4,608 spine + 2,304 core. The model wires each spine plane to 36 cores with
    # 2 cables per pod (integer parallel cables: 128 of 144 ports), hence 2,592 cores.
    assert c.switch_counts() == {"nvswitch": 4608, "leaf": 4608, "spine": 4608, "core": 2592}
    per_rail = T.preset("gb300-nvl72", rail_fabric="per-rail")
    assert per_rail.levels == 2  # hardware.md: 72 rails x 4,608 endpoints, 2 levels per rail
    assert per_rail.switch_counts() == {"nvswitch": 4608, "leaf": 72 * 64, "spine": 72 * 36}
    r = np.arange(c.world_size)
    t0 = time.perf_counter()
    loads = c.link_loads(r, (r + 1) % c.world_size, 1e6)
    assert time.perf_counter() - t0 < 5.0
    assert loads.max() == pytest.approx(1e6)  # a ring shares no link
    by_tier = np.bincount(c.link_tier(np.arange(c.num_links)), weights=loads, minlength=len(T.TIERS))
    domain_crossings = c.num_domains  # the ring leaves each domain once
    assert by_tier[T.TIER_CODE["nic"]] == pytest.approx(2 * domain_crossings * 1e6)
    assert by_tier[T.TIER_CODE["nvlink"]] == pytest.approx(2 * (c.world_size - domain_crossings) * 1e6)
    tree = c.sharp_tree(rail=5)
    assert [lv.switches.size for lv in tree.levels] == [64, 64, 1]
    assert c.node_label(int(tree.levels[0].switches[0])) == "leaf[rail 5, 0]"
    assert c.sharp_tree(rail=6).root != tree.root


def test_dgx_h100_scalable_unit_and_b300_superpod_counts():
    c = T.preset("dgx-h100")
    assert (c.world_size, c.levels) == (256, 2)
    assert c.switch_counts() == {"nvswitch": 32, "leaf": 8, "spine": 4}  # hardware.md: 8 leaf + 4 spine per SU
    b300 = T.cluster(domains=1296, gpus_per_domain=8, radix=144)
    assert b300.switch_counts() == {"nvswitch": 1296, "leaf": 144, "spine": 72}  # hardware.md: 144 + 72
    assert T.preset("dgx-h100", nodes=4).world_size == 32
    assert T.preset("gb200-nvl72", racks=2).world_size == 144


def test_overrides_and_errors():
    c = T.preset("gb300-nvl72", racks=2, nic_bandwidth=50e9, nic_planes=2)
    assert c.world_size == 144 and c.spec.nic_bandwidth == 50e9
    # a fabric link stands for its cable in both planes: aggregate bandwidth
    fabric_link = c.link_offset[c.levels] if c.levels >= 2 else c.link_offset[1]
    # (the fabric's links carry InfiniBand packets: nic_efficiency of the line rate is payload)
    assert c.link_bandwidth([fabric_link])[0] == pytest.approx(50e9 * c.spec.nic_efficiency)
    with pytest.raises(ValueError, match=r"unknown preset 'gb300-nvl72' parameter\(s\) 'nodes'.*valid: .*racks"):
        T.preset("gb300-nvl72", nodes=3)
    with pytest.raises(ValueError, match="unknown preset 'nope'; presets: gb300-nvl72"):
        T.preset("nope")
    with pytest.raises(ValueError, match="once"):
        T.preset("dgx-h100", nodes=2, domains=3)
    with pytest.raises(ValueError, match="rails"):
        T.cluster(domains=2, gpus_per_domain=6, rails=4)
    with pytest.raises(ValueError, match="radix"):
        T.cluster(domains=2, radix=7)
    with pytest.raises(ValueError, match="need 3 levels"):
        T.cluster(domains=20, gpus_per_domain=4, radix=8, levels=2)
    with pytest.raises(ValueError, match="sharp must be"):
        T.cluster(sharp="v9")
    with pytest.raises(ValueError, match="unknown cluster parameter"):
        T.cluster(domains=2, bandwidth=3)
    with pytest.raises(ValueError, match="no fabric"):
        T.preset("loopback", domains=2)
    assert set(T.presets()) == {"gb300-nvl72", "gb200-nvl72", "dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300",
                                "loopback"}


def test_capabilities():
    c = T.preset("dgx-h100", nodes=2)
    nv, sh = c.nvls, c.sharp
    assert nv.supports("sum", "bfloat16") and nv.supports("max", "float16") and nv.supports("avg", "float32")
    assert not nv.supports("min", "float32") and not nv.supports("sum", "int8") and not nv.supports("prod", "int32")
    assert nv.accumulator("bfloat16") == "float32" and nv.effective_bandwidth == pytest.approx(18 * 20.6e9 * 0.85)
    assert sh.supports("sum", np.float32) and sh.supports("sum", "bfloat16")
    assert "op 'prod'" in sh.refusal("prod", "float32") and "avg" in sh.refusal("avg", "float32")
    v2 = T.preset("dgx-h100", nodes=2, sharp="v2").sharp
    assert "SHARPv3 datatypes" in v2.refusal("sum", "bfloat16")
    assert (v2.llt_trees, v2.sat_scope, v2.max_sat_flows) == (63, "switch", 2)
    assert v2.protocol(100) == "llt" and v2.protocol(1 << 20) == "sat"
    assert T.preset("dgx-h100", nodes=2, sharp=None).sharp.refusal("sum", "float32") == "the fabric has no SHARP"
    assert T.preset("loopback").nvls.refusal("sum", "float32").startswith("the domain's switch cannot reduce")
    assert T.cluster(reduce_bandwidth={"float32": 2e9, "default": 1e9}).reduce_throughput("bfloat16") == 1e9


def test_fully_connected():
    fc = T.fully_connected(5, latency=2e-6, bandwidth=4e9, reduce_bandwidth=8e9)
    p = fc.path_links([0, 1, 2], [1, 1, 4])
    assert p.tolist() == [[1], [-1], [14]]
    assert fc.path_latency([0], [3])[0] == 2e-6 and fc.link_bandwidth([7])[0] == 4e9
    assert fc.reduce_throughput("float16") == 8e9
    a, b = fc.link_endpoints([14])
    assert (a[0], b[0]) == (2, 4)
    assert fc.nvls is None and fc.sharp is None


def test_save_load_round_trip(tmp_path, monkeypatch):
    c = T.preset("gb200-nvl72", racks=3, fabric_bandwidth=[40e9, 30e9], reduce_bandwidth={"default": 5e11})
    path = T.save(c, tmp_path / "t.json")
    back = T.load(path)
    assert back.to_dict() == c.to_dict() and back.num_links == c.num_links and back.describe() == c.describe()
    fc = T.fully_connected(4, latency=1e-6, bandwidth=2e9, reduce_bandwidth=3e9)
    assert T.load(T.save(fc, tmp_path / "fc.json")).to_dict() == fc.to_dict()
    # loopback reads the calibration file
    monkeypatch.setenv(T.ENV_CALIBRATION, str(tmp_path / "cal.json"))
    assert T.preset("loopback").spec.nvlink_bandwidth == 10e9  # no file: defaults
    T.save(T.preset("loopback", nvlink_bandwidth=3e9, ranks=6), T.calibration_path())
    lb = T.preset("loopback")
    assert (lb.world_size, lb.spec.nvlink_bandwidth) == (6, 3e9)
    assert T.preset("loopback", ranks=2).world_size == 2
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ValueError, match="unknown format"):
        T.load(tmp_path / "bad.json")


def test_cli(capsys, tmp_path):
    assert topo_cli.main(["gb300-nvl72"]) == 0
    out = capsys.readouterr().out
    for text in ("331,776", "4,608 domains", "core", "2,592", "SHARP", "OST 1024 B", "SAT threshold"):
        assert text in out
    assert topo_cli.main(["dgx-h100", "--nodes", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == 512
    assert topo_cli.main(["dgx-h100", "--racks", "2"]) == 2
    assert "valid:" in capsys.readouterr().err
    assert topo_cli.main(["--list"]) == 0
    assert "loopback" in capsys.readouterr().out
    assert topo_cli.main(["loopback", "--set", "nvlink_bandwidth=2e9", "--save", str(tmp_path / "x.json")]) == 0
    assert T.load(tmp_path / "x.json").spec.nvlink_bandwidth == 2e9


@pytest.mark.parametrize("name,size", [("gb300-nvl72", {"racks": 8}),
                                       ("gb200-nvl72", {"racks": 3, "gpus_per_domain": 4}),
                                       ("dgx-h100", {"nodes": 1024, "rail_fabric": "per-rail"}),
                                       ("dgx-h100", {"domain_sizes": [3, 2]})])
def test_node_labels_are_node_label_in_the_order_given(name, size):
    """Cluster.node_labels writes each kind of node's labels at once: node_label's, node by node, in the order
    given (every node, a shuffled third of them, the switches only), each a str."""
    topo = T.preset(name, **size)
    rng = np.random.default_rng(5)
    n = topo.num_nodes
    for nodes in (np.arange(n), rng.permutation(n)[: n // 3], np.arange(topo.world_size, n)):
        got = topo.node_labels(nodes)
        assert list(got.items()) == [(int(x), topo.node_label(int(x))) for x in nodes.tolist()]
        assert all(type(label) is str for label in got.values())
