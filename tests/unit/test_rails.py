"""Rails as copies of rail 0 (Cluster.rail_link_steps, replicas.rail_rows): on the fabrics where the topology
says so, a message between domains on rail j takes rail 0's path moved by j steps per level, over links no other
rail uses; the analytic model then costs rail 0's messages between domains for every rail, with the same figures
as costing every message. Where the conditions fail the topology says None and every message is costed."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from collectives import topology as T
from collectives.simulate import simulate
from collectives.simulator import analytic, replicas
from collectives.topology import preset

# tests/unit/test_topology.py's small clusters: one leaf; 3 levels; partial pods; per-rail trees (PXN);
# oversubscribed leaves; 2 rails of 4 GPUs over 4 levels; 4 levels
SMALL = [dict(domains=3, gpus_per_domain=4), dict(domains=8, gpus_per_domain=2, radix=4),
         dict(domains=20, gpus_per_domain=4, radix=8), dict(domains=9, gpus_per_domain=4, radix=8, rail_fabric="per-rail"),
         dict(domains=12, gpus_per_domain=4, radix=8, oversubscription=3.0),
         dict(domains=6, gpus_per_domain=4, rails=2, radix=4), dict(domains=5, gpus_per_domain=3, radix=4, levels=4)]


def _rail0_pairs(c) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of rail-0 GPUs in different domains (rank r is on rail r % R)."""
    ranks = np.arange(0, c.world_size, c.R)
    s, d = (x.ravel() for x in np.meshgrid(ranks, ranks, indexing="ij"))
    apart = s // c.G != d // c.G
    return s[apart], d[apart]


def _level(c, links: np.ndarray) -> np.ndarray:
    """Fabric level of each link (0: NVLink)."""
    return np.searchsorted(np.asarray(c.link_offset[1:]), links, side="right")


CASES = [T.cluster(**p) for p in SMALL] + [preset("gb300-nvl72", racks=80, gpus_per_domain=8),
                                           preset("dgx-h100", nodes=300), preset("dgx-h100", nodes=40)]


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"{c.name}-{c.world_size}-{c.levels}")
def test_rails_take_rail_zeros_paths_moved_over_their_own_links(c):
    steps = c.rail_link_steps()
    if steps is None:
        pytest.skip("conditions not met (covered below)")
    s, d = _rail0_pairs(c)
    f0, h0 = c.hop_list(s, d)
    step = np.asarray((0,) + steps)[_level(c, h0)]
    assert (step[h0 >= 2 * c.world_size] > 0).all()
    used = []
    for j in range(c.R):
        fj, hj = c.hop_list(s + j, d + j)
        assert np.array_equal(fj, f0)
        assert np.array_equal(hj, h0 + j * step)
        assert np.array_equal(np.asarray(c.link_attributes(hj)), np.asarray(c.link_attributes(h0)))
        used.append(set(hj[hj >= 2 * c.world_size].tolist()))
    for a, b in itertools.combinations(range(c.R), 2):
        assert not used[a] & used[b], f"rails {a} and {b} share fabric links"


def test_the_conditions_cover_the_full_scale_preset():
    assert preset("gb300-nvl72").rail_link_steps() == (72, 72, 1)
    assert preset("dgx-h100", nodes=8, rail_fabric="per-rail").rail_link_steps() is not None


@pytest.mark.parametrize("make", [
    lambda: preset("gb200-nvl72", racks=20),  # 32-leaf pods split a block's 72 rails
    lambda: T.cluster(domains=6, gpus_per_domain=4, rails=2, radix=4),  # 4 levels
    lambda: preset("dgx-h100", nodes=4, placement=[[8 * d + (g + d) % 8 for g in range(8)] for d in range(4)]),
])
def test_rails_that_are_not_copies_say_none(make):
    assert make().rail_link_steps() is None


def test_a_split_pod_really_moves_rails_apart():
    """Where R does not divide a pod's leaves (72 rails, 32 leaves a pod), some rail's paths are not rail 0's
    moved by one step per level: the shift would be wrong, which is why rail_link_steps says None."""
    c = preset("gb200-nvl72", racks=40)
    assert c.levels == 3 and c.rail_link_steps() is None
    s, d = _rail0_pairs(c)
    f0, h0 = c.hop_list(s, d)
    level = _level(c, h0)

    def moved_by_one_step_per_level(j):
        fj, hj = c.hop_list(s + j, d + j)
        if not np.array_equal(fj, f0):
            return False
        return all(np.unique((hj - h0)[level == lv]).size <= 1 for lv in range(1, c.levels + 1))

    assert not all(moved_by_one_step_per_level(j) for j in range(c.R))


def _arrays(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(originals, copies, rail 0's) of RailRows: the rail-0 message each copy copies, the copies, rail 0's."""
    index = rows.index if rows.index is not None else rows.laid(np.arange(rows.hi, dtype=np.int64))
    return np.repeat(index[:, 0], rows.R - 1), index[:, 1:].ravel(), index[:, 0].copy()


def _rail_copies(topo, src, dst, fields, receiver_fields, between):
    """replicas.rail_rows as index arrays (_arrays), or None."""
    rows = replicas.rail_rows(topo, src, dst, fields, receiver_fields, between)
    return None if rows is None else _arrays(rows)


def _figures(r) -> tuple:
    return (r.time, [p.time for p in r.phases], r.tier_bytes, r.max_link_utilization, r.bottleneck, r.protocol)


@pytest.fixture
def bulk(monkeypatch):
    monkeypatch.setattr(analytic, "DATAFLOW_MAX_NODES", 0)
    monkeypatch.setattr(replicas, "MIN_DROPPED", 0.0)


def _with_and_without_rails(monkeypatch, make, name: str, nbytes: int, **params) -> tuple[tuple, tuple, int]:
    """simulate() with rail copies and with rail_rows switched off (alike domains kept either way), each on a
    fresh topology, and how many messages the rail copies dropped."""
    dropped = []
    real = replicas.rail_rows

    def spy(*args):
        out = real(*args)
        dropped.append(0 if out is None else out.rows * (out.R - 1))
        return out

    monkeypatch.setattr(replicas, "rail_rows", spy)
    fast = simulate(name, make(), nbytes, mode="analytic", **params)
    monkeypatch.setattr(replicas, "rail_rows", lambda *a: None)
    general = simulate(name, make(), nbytes, mode="analytic", **params)
    return _figures(fast), _figures(general), sum(dropped)


@pytest.mark.parametrize("make", [lambda: preset("gb200-nvl72", racks=4, gpus_per_domain=4),  # one leaf
                                  lambda: preset("dgx-h100", nodes=40),  # leaves and spines
                                  lambda: preset("gb300-nvl72", racks=80, gpus_per_domain=8),
                                  lambda: preset("dgx-h100", nodes=8, rail_fabric="per-rail")])
@pytest.mark.parametrize("nbytes", [4096, 64 << 20])
@pytest.mark.parametrize("name,params", [("nvls_tree", {}),  # rows of R messages, rail 0 to R - 1
                                         ("hierarchical", {"intra": "nvls", "inter": "ring"})])  # rail by rail
def test_rail_copies_cost_as_every_rail(bulk, monkeypatch, make, nbytes, name, params):
    fast, general, dropped = _with_and_without_rails(monkeypatch, make, name, nbytes, **params)
    assert dropped > 0
    assert fast == general
    monkeypatch.setattr(replicas, "domain_replicas", lambda *a: None)  # every message, no copies at all
    assert fast == _figures(simulate(name, make(), nbytes, mode="analytic", **params))


@pytest.mark.parametrize("name", ["ring", "hierarchical"])
def test_messages_between_rails_keep_every_message(bulk, monkeypatch, name):
    """A ring crosses from one rail to another between domains; SHARP's rail trees on a small fat-tree meet at
    spines that serve every rail (one switch in every rail's tree): no rail copies."""
    fast, general, dropped = _with_and_without_rails(monkeypatch, lambda: preset("dgx-h100", nodes=8), name,
                                                     64 << 20)
    assert dropped == 0
    assert fast == general


@pytest.mark.parametrize("nbytes", [4096, 64 << 20])
def test_a_double_binary_tree_costs_as_every_rail(bulk, monkeypatch, nbytes):
    """Rounds of NCCL's double binary tree whose messages mostly cross domains, rail by rail."""
    fast, general, _ = _with_and_without_rails(monkeypatch, lambda: preset("dgx-h100", nodes=8),
                                               "double_binary_tree", nbytes)
    assert fast == general
    monkeypatch.setattr(replicas, "domain_replicas", lambda *a: None)
    assert fast == _figures(simulate("double_binary_tree", preset("dgx-h100", nodes=8), nbytes, mode="analytic"))


def test_a_rail_that_differs_keeps_every_message():
    c = preset("dgx-h100", nodes=8)
    s0, d0 = _rail0_pairs(c)
    R = c.R
    src = (s0[:, None] + np.arange(R)).ravel()  # rows of R messages, rail 0 to rail R - 1
    dst = (d0[:, None] + np.arange(R)).ravel()
    units, lag = np.ones(src.size), np.zeros(src.size, np.int64)
    between = np.arange(src.size)
    originals, copies, rail0 = _rail_copies(c, src, dst, (units, lag), (), between)
    assert np.array_equal(copies, between[src % R > 0]) and np.array_equal(rail0, between[src % R == 0])
    assert np.array_equal(src[originals], src[copies] - copies % R)
    # the same messages with one inside a domain among them (the messages between domains no longer one range):
    # read one by one instead of as rows, the same answer
    inside = s0.size // 2 * R
    src2, dst2 = np.insert(src, inside, 1), np.insert(dst, inside, 2)
    between2 = np.r_[between[:inside], between[inside:] + 1]
    general = _rail_copies(c, src2, dst2, (np.ones(src2.size), np.zeros(src2.size, np.int64)), (), between2)
    moved = [np.where(x >= inside, x - 1, x) for x in general]
    assert all(np.array_equal(a, b) for a, b in zip(moved, (originals, copies, rail0), strict=True))
    more = units.copy()
    more[R + 3] = 2.0  # one copy carries more chunks than its original
    assert _rail_copies(c, src, dst, (more, lag), (), between) is None
    reduced = np.zeros(c.num_nodes)
    reduced[dst[5]] = 1.0  # one copy's receiver reduces what its original's does not
    assert _rail_copies(c, src, dst, (units, lag), (reduced,), between) is None
    assert _rail_copies(c, src[:-1], dst[:-1], (units[:-1], lag[:-1]), (), between[:-1]) is None
    cross = dst.copy()
    cross[R + 1] += 1  # a message between rails
    assert _rail_copies(c, src, cross, (units, lag), (), between) is None


@pytest.mark.parametrize("make", [lambda: T.cluster(domains=20, gpus_per_domain=4, radix=8),  # 3 levels
                                  lambda: T.cluster(domains=64, gpus_per_domain=4, radix=8),  # 4 (no rank copies)
                                  lambda: T.cluster(domains=16, gpus_per_domain=2, radix=4),
                                  lambda: preset("gb300-nvl72", racks=8)])  # one leaf per rail
@pytest.mark.parametrize("nbytes", [4096, 64 << 20])
@pytest.mark.parametrize("name,params", [("hierarchical", {}), ("collnet_direct", {}), ("collnet_chain", {})])
def test_sharp_rail_trees_cost_as_every_rail(bulk, monkeypatch, make, nbytes, name, params):
    """Messages between ranks and fabric switches of rail trees that share no switch: rail 0's tree stands for
    every rail's, with the figures of costing every message (4 levels: rail_link_steps says None, the links of
    such messages are compared instead)."""
    fast, general, dropped = _with_and_without_rails(monkeypatch, make, name, nbytes, **params)
    assert dropped > 0
    assert fast == general
    monkeypatch.setattr(replicas, "domain_replicas", lambda *a: None)
    assert fast == _figures(simulate(name, make(), nbytes, mode="analytic", **params))


def test_sharp_messages_that_differ_keep_every_message():
    """rail_copies of messages with a fabric switch at one end: the rails' climbs to their leaves as rows of R
    messages; a copy that differs from its original (its chunks, its receiver's reduction, its switch, a switch
    two rails share, two switches of rail 0 with one image) is no copy."""
    c = T.cluster(domains=20, gpus_per_domain=4, radix=8)  # 5 leaves per rail
    trees = [c.sharp_tree(ranks=g, port=j) for j, g in enumerate(c.domain_groups().T)]
    src = np.stack([t.ranks for t in trees], axis=1).ravel()  # rows of R: rank d·G + j on rail j
    leaf_of = {int(r): int(sw) for t in trees for sw, kids in zip(t.levels[0].switches, t.levels[0].children,
                                                                   strict=True) for r in kids if r >= 0}
    dst = np.array([leaf_of[int(r)] for r in src])
    units, lag, between = np.ones(src.size), np.zeros(src.size, np.int64), np.arange(src.size)
    R = c.R
    originals, copies, rail0 = _rail_copies(c, src, dst, (units, lag), (), between)
    assert np.array_equal(rail0, between[::R]) and np.array_equal(copies, between[src % R > 0])
    assert np.array_equal(src[originals], src[copies] - copies % R)
    # both ways: the descent's messages from the leaves to the ranks
    assert _rail_copies(c, dst, src, (units, lag), (), between) is not None
    more = units.copy()
    more[R + 3] = 2.0
    assert _rail_copies(c, src, dst, (more, lag), (), between) is None
    reduced = np.zeros(c.num_nodes)
    reduced[dst[5]] = 1.0
    assert _rail_copies(c, src, dst, (units, lag), (reduced,), between) is None
    shared = dst.copy()
    shared[1] = dst[0]  # rail 1's rank into rail 0's leaf
    assert _rail_copies(c, src, shared, (units, lag), (), between) is None
    rows = dst.reshape(-1, R)
    last = int(np.flatnonzero(rows[:, 0] != rows[0, 0])[0])  # the first row at another leaf
    merged = rows.copy()
    merged[last, 1:] = rows[0, 1:]  # two leaves of rail 0 with the same leaves on the other rails
    assert _rail_copies(c, src, merged.ravel(), (units, lag), (), between) is None


@pytest.mark.parametrize("rails_last", [True, False])
def test_rail_rows_of_a_range_read_it_in_place(rails_last):
    """RailRows over a range of messages (read through views) answers as the same rows given as indices."""
    R, rows, lo = 4, 6, 3
    index = np.arange(lo, lo + R * rows).reshape(-1, R) if rails_last else \
        np.arange(lo, lo + R * rows).reshape(R, -1).T
    in_place = replicas.RailRows(R, None, lo, lo + R * rows, rails_last)
    gathered = replicas.RailRows(R, index.copy())
    x = np.arange(40) * 10
    assert np.array_equal(in_place.laid(x), gathered.laid(x)) and in_place.rows == gathered.rows == rows
    assert np.array_equal(in_place.rail0, gathered.rail0)
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(in_place), _arrays(gathered), strict=True))
    for value in (None, -1):
        a, b = x.copy(), x.copy()
        in_place.set_copies(a, value)
        gathered.set_copies(b, value)
        assert np.array_equal(a, b) and not np.array_equal(a, x)


LEAF_CASES = CASES + [T.cluster(domains=9, gpus_per_domain=4, radix=8, rail_fabric="per-rail", levels=2),
                      preset("gb300-nvl72", racks=8)]


@pytest.mark.parametrize("c", LEAF_CASES, ids=lambda c: f"{c.name}-{c.world_size}-{c.levels}-{c.per_rail}")
def test_rail_leaf_step_moves_each_ranks_leaf_and_keeps_its_cables_attributes(c):
    """Where the topology gives a leaf step, rank r + j on rail j hangs off rail-0 rank r's leaf moved by j
    steps, over a cable (either way) with rank r's attributes; the rails' leaves differ."""
    step = c.rail_leaf_step()
    if step is None:
        assert c.levels == 1 or c.levels > 1 and not c.per_rail and c.tree.M[1] != c.H
        return
    r = np.arange(0, c.world_size, c.R)
    leaf0 = c.leaf_of(r)
    up0, down0 = (np.asarray(c.link_attributes(c.adjacent_links(a, b))) for a, b in ((r, leaf0), (leaf0, r)))
    seen = set()
    for j in range(c.R):
        leaf = c.leaf_of(r + j)
        assert np.array_equal(leaf, leaf0 + j * step)
        assert not seen & set(leaf.tolist())
        seen |= set(leaf.tolist())
        assert np.array_equal(np.asarray(c.link_attributes(c.adjacent_links(r + j, leaf))), up0)
        assert np.array_equal(np.asarray(c.link_attributes(c.adjacent_links(leaf, r + j))), down0)


def _leaf_step_holds(c, step: int) -> bool:
    ranks = c.rail_groups()
    return all(np.array_equal(c.leaf_of(ranks[j]), c.leaf_of(ranks[0]) + j * step) for j in range(c.R))


@pytest.mark.parametrize("make", [
    lambda: preset("dgx-h100", nodes=40, placement=[[8 * d + (g + d) % 8 for g in range(8)] for d in range(40)]),
    lambda: preset("gb300-nvl72", racks=80, gpus_per_domain=8, domain_sizes=[8] * 30 + [7] + [8] * 49),
])
def test_rail_leaf_step_is_none_where_ranks_move_off_their_rails(make):
    """A placement (or uneven domains, placed in their domains' first slots) moves ranks between rails: no rank
    r + j is rail j's beside rail-0 rank r throughout, and the leaf step says None."""
    c = make()
    assert c.rail_leaf_step() is None
    plain = type(c)(dataclasses.replace(c.spec, placement=None))
    step = plain.rail_leaf_step()
    assert step is not None and _leaf_step_holds(plain, step)
    r = np.arange(0, c.world_size, c.R)
    r = r[r + c.R - 1 < c.world_size]
    assert not all(np.array_equal(c.leaf_of(r + j), c.leaf_of(r) + j * step) for j in range(c.R))


def test_sharp_copies_on_another_leaf_raise_as_costing_them_would():
    """Rail trees whose copies keep a one-to-one map of the switches but send rails 2 and 3's ranks to each
    other's leaves: the leaf step does not hold, every link is looked up and the non-adjacent pair raises."""
    c = T.cluster(domains=20, gpus_per_domain=4, radix=8)  # 5 blocks of one leaf per rail
    assert c.rail_leaf_step() == 1
    src = np.arange(c.world_size)  # rows of R: rank d·G + j on rail j
    dst = c.leaf_of(src).reshape(-1, c.R)
    moved = dst[:, [0, 1, 3, 2]]
    units, lag, between = np.ones(src.size), np.zeros(src.size, np.int64), np.arange(src.size)
    assert _rail_copies(c, src, dst.ravel(), (units, lag), (), between) is not None
    with pytest.raises(ValueError, match="no link joins"):
        _rail_copies(c, src, moved.ravel(), (units, lag), (), between)
