"""The builders' shortcuts for huge clusters give what their general forms give, on small inputs.

A tree's depths and heights come level by level from the root (double_binary_tree.Tree.from_parents), a SHARP
forest's parents by each member's first vertex or a sorted lookup (sharp.build_forest) and its slots in use by
counting them, a lane's members are put in order by scattering them to their slots (_pipeline._member_order),
and NCCL's tree of a channel and its lanes are built once per cluster
and shared by the builds of several channel counts (double_binary_tree.nccl_trees, build_double_binary_tree), the
channel tree written down from its shape (double_binary_tree.chain_tree). Each test compares the shortcut with its
general form element by element.
"""

from __future__ import annotations

import numpy as np
import pytest
from collectives.algorithms import _pipeline
from collectives.algorithms.double_binary_tree import (
    Tree,
    btree_parents,
    chain_tree,
    double_binary_tree,
    nccl_trees,
)
from collectives.algorithms.sharp import build_forest

from collectives.topology import preset


def _random_tree(n: int, max_children: int, rng) -> np.ndarray:
    """Parents of a random tree over n nodes (labels shuffled), at most max_children children per node."""
    parent = np.full(n, -1, np.int64)
    kids = np.zeros(n, np.int64)
    for i in range(1, n):
        open_ = np.flatnonzero(kids[:i] < max_children)
        p = int(rng.choice(open_[-8:])) if rng.random() < 0.7 else int(rng.choice(open_))  # deep and bushy
        parent[i], kids[p] = p, kids[p] + 1
    label = rng.permutation(n)
    out = np.full(n, -1, np.int64)
    out[label] = np.where(parent >= 0, label[np.maximum(parent, 0)], -1)
    return out


def _walked(parent: np.ndarray, max_children: int):
    """Children (increasing, -1 padded), depth and height of every node by walking the tree node by node."""
    n = parent.size
    children = np.full((n, max_children), -1, np.int64)
    for v, p in enumerate(parent.tolist()):
        if p >= 0:
            row = children[p]
            row[np.flatnonzero(row < 0)[0]] = v  # nodes in increasing order: each row ends up sorted
    depth = np.zeros(n, np.int64)
    for v in range(n):
        u = v
        while parent[u] >= 0:
            u, depth[v] = int(parent[u]), depth[v] + 1
    height = np.zeros(n, np.int64)
    for v in np.argsort(-depth, kind="stable").tolist():  # deepest first: children before parents
        if parent[v] >= 0:
            height[parent[v]] = max(height[parent[v]], height[v] + 1)
    return children, depth, height


@pytest.mark.parametrize("n,max_children,seed", [(1, 2, 0), (2, 2, 1), (57, 2, 2), (300, 3, 3), (1000, 3, 4)])
def test_tree_levels_are_the_walk(n, max_children, seed):
    parent = _random_tree(n, max_children, np.random.default_rng(seed))
    tree = Tree.from_parents(parent, max_children=max_children)
    children, depth, height = _walked(parent, max_children)
    assert np.array_equal(tree.children, children)
    assert np.array_equal(tree.depth, depth) and np.array_equal(tree.height, height)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100])
def test_nccl_binary_trees_are_the_walk(n):
    assert np.array_equal(Tree.from_parents(btree_parents(n)).height, _walked(btree_parents(n), 2)[2])
    for tree in double_binary_tree(n):
        children, depth, height = _walked(tree.parent, 2)
        assert np.array_equal(tree.depth, depth) and np.array_equal(tree.height, height)


def test_a_cycle_is_not_a_tree():
    with pytest.raises(AssertionError, match="hangs from the root"):
        Tree.from_parents(np.array([-1, 2, 1], np.int64))


def test_channel_trees_are_shared_and_built_alike():
    topo = preset("gb200-nvl72", racks=6, gpus_per_domain=4)
    four = nccl_trees(topo, 4)
    assert nccl_trees(topo, 1)[0] is four[0], "the builds of several channel counts share a channel's tree"
    G, D = topo.gpus_per_domain, topo.num_domains
    d, j = np.repeat(np.arange(D), G), np.tile(np.arange(G), D)
    for c, tree in enumerate(four):
        tr, h = double_binary_tree(D)[c % 2], (c // 2) % G
        parent = np.where((j - h) % G > 0, d * G + (j - 1) % G,
                          np.where(tr.parent[d] >= 0, tr.parent[d] * G + h, -1))
        assert np.array_equal(tree.parent, parent)
        children, depth, height = _walked(parent, 3)
        assert np.array_equal(tree.children, children) and np.array_equal(tree.height, height)


@pytest.mark.parametrize("D,G", [(1, 1), (1, 5), (2, 1), (3, 2), (7, 3), (12, 4)])
def test_chain_tree_is_the_tree_of_its_parents(D, G):
    """chain_tree writes NCCL's channel tree down from its shape: the arrays Tree.from_parents finds."""
    d, j = np.repeat(np.arange(D), G), np.tile(np.arange(G), D)
    for tr in double_binary_tree(D):
        for h in range(G):
            tree = chain_tree(tr, G, h)
            parent = np.where((j - h) % G > 0, d * G + (j - 1) % G,
                              np.where(tr.parent[d] >= 0, tr.parent[d] * G + h, -1))
            ref = Tree.from_parents(parent, max_children=3)
            for field in ("parent", "children", "height", "depth"):
                got, want = getattr(tree, field), getattr(ref, field)
                assert got.dtype == want.dtype and np.array_equal(got, want), (D, G, h, field)


@pytest.mark.parametrize("name,size", [("gb200-nvl72", {"racks": 16, "gpus_per_domain": 4}),
                                       ("dgx-h100", {"nodes": 8})])  # one tree per switch; spines in 8 trees
def test_forest_parents_are_each_trees_parent_map(name, size):
    topo = preset(name, **size)
    trees = [topo.sharp_tree(rail=j) for j in range(topo.gpus_per_domain)]
    forest = build_forest(trees)
    node = forest.members[forest.member]
    has = forest.parent >= 0
    got = np.where(has, forest.members[forest.member[np.maximum(forest.parent, 0)]], -1)
    for t, tree in enumerate(trees):
        parent_of = tree.parent_map()
        on = forest.tree == t
        want = np.array([parent_of.get(x, -1) for x in node[on].tolist()], np.int64)
        assert np.array_equal(got[on], want)
        assert (want >= 0).sum() == on.sum() - 1, "every vertex but the root has a parent"


@pytest.mark.parametrize("name,size", [("gb200-nvl72", {"racks": 16, "gpus_per_domain": 4}),
                                       ("gb300-nvl72", {"racks": 8}), ("dgx-h100", {"nodes": 8}),
                                       ("gb200-nvl72", {"racks": 4})])
def test_forest_of_disjoint_trees_is_the_general_one(monkeypatch, name, size):
    """Rail trees that share no switch (a fat-tree per rail, rail-aligned leaves to the top) are read all at once
    (sharp._disjoint_tree_vertices): the forest the tree-by-tree reading gives, with the members of a phase or
    its own; and one tree over every rank (gb200-nvl72's 4 racks pad a level's lists of children)."""
    from collectives.algorithms import sharp

    topo = preset(name, **size)
    rails = [topo.sharp_tree(ranks=g, port=int(topo.rank_rail(int(g[0])))) for g in topo.domain_groups().T]
    for trees in (rails, [topo.sharp_tree()]):
        switches = np.unique(np.concatenate([t.switches for t in trees]))
        disjoint = sharp._disjoint_tree_vertices(trees) is not None
        assert disjoint == (switches.size == sum(t.switches.size for t in trees))
        for nodes in (None, np.concatenate([np.arange(topo.world_size), topo.nvswitches(), switches])):
            fast = build_forest(trees, nodes)
            with monkeypatch.context() as m:
                m.setattr(sharp, "_disjoint_tree_vertices", lambda trees: None)
                general = build_forest(trees, nodes)
            for field in fast.__dataclass_fields__:
                a, b = getattr(fast, field), getattr(general, field)
                assert a.dtype == b.dtype and np.array_equal(a, b), field


def test_disjoint_reading_refuses_what_it_cannot_tell_apart(monkeypatch):
    """Trees read all at once give the forest of the tree-by-tree reading; a child in another tree's list is
    left to that reading; a child listed twice by its switch, or a switch listing its children out of vertex
    order, leaves the positions to the sort."""
    from collectives.algorithms import sharp

    from collectives.topology.sharp_tree import SharpLevel, SharpTree

    def tree(ranks, leaf_kids):
        return SharpTree(None, np.array(ranks), [SharpLevel(1, np.array([100 + ranks[0]]), np.array([leaf_kids]))])

    cases = {"apart": [tree([0, 1], [0, 1]), tree([2, 3], [2, 3])],
             "another tree's child": [tree([0, 1], [0, 1]), tree([2, 3], [2, 1])],
             "twice": [tree([0, 1], [0, 1, 1])], "out of order": [tree([0, 1, 2], [2, 0, 1])],
             "padded": [tree([0, 1, 2], [0, -1, 1, 2])]}
    read = {name: sharp._disjoint_tree_vertices(trees) for name, trees in cases.items()}
    assert read["another tree's child"] is None
    assert read["apart"].position is not None and read["padded"].position is not None
    assert read["twice"].position is None and read["out of order"].position is None
    for name, trees in cases.items():
        if name == "another tree's child":
            continue
        fast = build_forest(trees)
        with monkeypatch.context() as m:
            m.setattr(sharp, "_disjoint_tree_vertices", lambda trees: None)
            general = build_forest(trees)
        for field in fast.__dataclass_fields__:
            assert np.array_equal(getattr(fast, field), getattr(general, field)), (name, field)


@pytest.mark.parametrize("n,keys", [(0, 1), (1, 1), (50, 3), (2000, 70)])
def test_lanes_by_key_within_members_are_each_keys_vertices_by_member(n, keys):
    """sharp._lanes_by with `within`: per key, vertices[key == k] in the stable order of their members, which is
    the order lane() would put them in."""
    from collectives.algorithms import sharp

    rng = np.random.default_rng(n * keys + 5)
    vertices, key = rng.permutation(2 * n)[:n], rng.integers(0, keys, n)
    within = rng.integers(0, 100_000, n)
    got = sharp._lanes_by(None, vertices, key, lambda v, k: (k, v.copy()), within=within)
    want = []
    for k in np.unique(key).tolist():
        on = np.flatnonzero(key == k)
        want.append((k, vertices[on[np.argsort(within[on], kind="stable")]]))
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))


@pytest.mark.parametrize("case", ["distinct", "repeated", "sparse", "small"])
def test_member_order_is_a_stable_argsort(case):
    rng = np.random.default_rng(7)
    members = {"distinct": rng.permutation(5000), "repeated": rng.integers(0, 300, 5000),
               "sparse": rng.choice(10 ** 9, 50, replace=False),
               "small": np.array([3, 1, 2])}[case].astype(np.int64)
    assert np.array_equal(_pipeline._member_order(members), np.argsort(members, kind="stable"))


def _same_lanes(a, b) -> bool:
    """Lanes alike: kind, members, peers, lags, and every member's chunk range for a few pieces."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.kind is not y.kind or x.period != y.period or not all(
                np.array_equal(u, v) for u, v in ((x.members, y.members), (x.peers, y.peers), (x.lags, y.lags))):
            return False
        at = np.arange(x.size)
        for piece in (0, 3):
            got = [np.broadcast_to(v, at.shape) for v in x.chunks(np.full(at.size, piece), at)]
            want = [np.broadcast_to(v, at.shape) for v in y.chunks(np.full(at.size, piece), at)]
            if not all(np.array_equal(u, v) for u, v in zip(got, want, strict=True)):
                return False
    return True


def test_a_lane_in_order_is_the_sorted_lane():
    """lane() keeps members given in order with every peer as they are; listed in another order with the same
    peers, it sorts them into the same lane."""
    rng = np.random.default_rng(3)
    members = np.sort(rng.choice(1000, 200, replace=False))
    peers, lags = rng.integers(0, 1000, 200), rng.integers(0, 5, 200)
    chunks = _pipeline.strided(np.arange(200) * 2, 1 + np.arange(200) % 3, 600)
    fast = _pipeline.lane(_pipeline.Lane, members, peers, lags, chunks)
    shuffle = rng.permutation(200)
    general = _pipeline.lane(_pipeline.Lane, members[shuffle], peers[shuffle], lags[shuffle],
                             lambda k, at: chunks(k, shuffle[at]))
    assert _same_lanes([fast], [general])
    one_lag = _pipeline._Indexed(_pipeline.lane(_pipeline.Lane, members, peers, 4, chunks))
    assert np.array_equal(one_lag.by_lag, np.argsort(one_lag.lane.lags, kind="stable"))


def test_replicated_tree_lanes_node_by_node_are_those_replica_by_replica(monkeypatch):
    """A tree replicated on every GPU of a domain lists its lane positions node by node (its members then come
    in order); replica by replica, the lanes come out the same."""
    from collectives.algorithms import double_binary_tree as dbt

    tree = double_binary_tree(6)[0]
    # GPU j of domain d: rank 4 d + j + 3 (replica j; in order node by node, but not numbered from 0, which
    # _numbered_replicas lays out without positions)
    members = np.arange(6 * 4, dtype=np.int64).reshape(6, 4).T + 3
    data = lambda k, r: (k * 8 + r, 1)  # noqa: E731
    fast = dbt.tree_lanes(tree, members, data, 0)

    def replica_major(tree, members):
        members = np.atleast_2d(np.asarray(members, np.int64))
        R, n = members.shape
        return members, np.repeat(np.arange(R), n), np.tile(np.arange(n), R), members.ravel()

    monkeypatch.setattr(dbt, "_replicas", replica_major)
    assert _same_lanes(fast, dbt.tree_lanes(tree, members, data, 0))


def _every_position_tree_lanes(tree, members, data, lag, start):
    """tree_up_lanes + tree_down_lanes in their general form: a lane over every position, lane() leaving out
    those without a peer."""
    from collectives.algorithms import double_binary_tree as dbt

    from collectives.schedule import recv, recv_reduce, send

    members, rep, node, me = dbt._replicas(tree, members)
    of = lambda x: np.where(x >= 0, members[rep, np.maximum(x, 0)], -1)  # noqa: E731
    chunks = lambda k, at: data(k, rep[at])  # noqa: E731
    lane = _pipeline.lane
    up = [lane(recv_reduce, me, of(tree.children[node, j]),
               lag + tree.height[np.maximum(tree.children[node, j], 0)], chunks)
          for j in range(tree.children.shape[1])]
    up.append(lane(send, me, of(tree.parent[node]), lag + tree.height[node], chunks))
    down = [lane(recv, me, of(tree.parent[node]), start + tree.depth[node] - 1, chunks)]
    down += [lane(send, me, of(tree.children[node, j]), start + tree.depth[node], chunks)
             for j in range(tree.children.shape[1])]
    return up + down


@pytest.mark.parametrize("replicas", [1, 4])
def test_tree_lanes_over_positions_with_a_peer_are_every_positions(replicas):
    """tree_up_lanes and tree_down_lanes take out the positions without a peer before mapping them to members,
    or write the lanes down from the tree's nodes where the members number the positions node by node from 0:
    the lanes of every position (members, peers, lags, chunk ranges), for NCCL's channel tree over all ranks
    (one replica) and a tree over domains on each GPU of a domain (replicas, in order or not); tree_lanes, whose
    lanes up and down a link share its nodes, the same."""
    from collectives.algorithms import double_binary_tree as dbt

    data = lambda k, r: (k * 8 + r, 1 + r % 2)  # noqa: E731
    if replicas == 1:
        tree = chain_tree(double_binary_tree(5)[1], 3, 1)
        ranks = np.arange(15, dtype=np.int64)[None, :]
        layouts = [ranks, ranks + 4, ranks[:, ::-1].copy()]  # numbered from 0, in order from 4, not in order
        numbered = [True, False, False]
    else:
        tree = double_binary_tree(6)[0]
        by_gpu = np.arange(6 * replicas, dtype=np.int64).reshape(6, replicas).T  # in order node by node
        layouts = [by_gpu, by_gpu + 1, by_gpu[:, ::-1].copy()]  # and from 1, and a layout not in order
        numbered = [True, False, False]
    for members, from_nodes in zip(layouts, numbered, strict=True):
        assert (dbt._numbered_replicas(members) is not None) == from_nodes
        fast = dbt.tree_up_lanes(tree, members, data, 2) + dbt.tree_down_lanes(tree, members, data, 9)
        want = _every_position_tree_lanes(tree, members, data, 2, 9)
        assert _same_lanes(fast, want)
        assert _same_lanes(dbt.tree_lanes(tree, members, data, 2, height=7), want)  # down from 2 + 7


def test_channel_lanes_are_shared_and_take_each_counts_chunks(monkeypatch):
    """NCCL's tree lanes of a channel are laid out once per cluster and shared by the builds of several channel
    counts, each with its own chunk ids (piece * channels + channel): every count's lanes are those a fresh
    build lays out (a key that mixed heads or counts would give another channel's tree or chunks)."""
    from collectives.algorithms import double_binary_tree as dbt

    from collectives.simulator.engine import build_schedule

    topo = preset("gb200-nvl72", racks=6, gpus_per_domain=4)

    def lanes(channels):
        schedule = build_schedule("double_binary_tree", topo, "allreduce", 1 << 12, channels=channels)
        return schedule.phases[0].rounds[0].slots.pipeline["lanes"]

    shared = {c: lanes(c) for c in (8, 1, 3, 6)}  # the counts after the first reuse its channels' lanes
    for c, got in shared.items():
        monkeypatch.setattr(_pipeline, "_MEMO", {})  # a fresh build: nothing laid out yet
        monkeypatch.setattr(dbt, "_CHANNEL_TREES", {})
        want = [ln for t, tree in enumerate(nccl_trees(topo, c))
                for ln in dbt.tree_lanes(tree, np.arange(topo.world_size)[None, :],
                                         lambda k, r, t=t, c=c: (k * c + t, 1))]
        assert _same_lanes(got, want), c
        assert _same_lanes(got, lanes(c)), c


@pytest.mark.parametrize("n,keys", [(0, 1), (1, 1), (50, 3), (2000, 70)])
def test_lanes_by_key_are_each_keys_vertices_in_order(n, keys):
    """sharp._lanes_by groups the vertices by one stable sort: per key (increasing), vertices[key == k]."""
    from collectives.algorithms import sharp

    rng = np.random.default_rng(n + keys)
    vertices, key = rng.permutation(2 * n)[:n], rng.integers(0, keys, n)
    got = sharp._lanes_by(None, vertices, key, lambda v, k: (k, v.copy()))
    want = [(k, vertices[key == k]) for k in np.unique(key).tolist()]
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))


def test_slots_in_use_are_the_union():
    """sharp._slots_in_use counts the slots: np.union1d's answer."""
    from collectives.algorithms.sharp import _slots_in_use

    rng = np.random.default_rng(11)
    for a, b in ((rng.integers(0, 9, 300), rng.integers(3, 40, 300)), (np.zeros(5, np.int64), np.zeros(5, np.int64)),
                 (np.zeros(0, np.int64), np.zeros(0, np.int64))):
        assert _slots_in_use(a, b) == np.union1d(a, b).tolist()


@pytest.mark.parametrize("top", [1, 255, 256, 30_000, 40_000, 1 << 20, 1 << 30, 1 << 40])
def test_stable_order_is_a_stable_argsort(top):
    """_pipeline._stable_order sorts small keys as one or two bytes, keys below 2**30 as two 15-bit digits: the
    permutation of a stable argsort."""
    keys = np.random.default_rng(top).integers(0, top, 5000)
    keys[:3] = top - 1
    assert np.array_equal(_pipeline._stable_order(keys), np.argsort(keys, kind="stable"))


def test_lanes_are_sorted_by_lag_when_a_round_reads_them(monkeypatch):
    """A pipeline's lanes are sorted by lag on the first round that reads its busy members: the analytic bulk
    model (a huge cluster, here a small one above a lowered limit) reads the stages only and sorts none."""
    from collectives.simulate import simulate
    from collectives.simulator import analytic

    monkeypatch.setattr(analytic, "DATAFLOW_MAX_NODES", 0)
    topo = preset("gb200-nvl72", racks=6, gpus_per_domain=4)
    _pipeline._INDEX.clear()
    simulate("double_binary_tree", topo, 1 << 20, mode="analytic")
    indexed = [ix for _, (indexed, _, _) in _pipeline._INDEX.values() for ix in indexed]
    assert indexed and all(ix._order is None for ix in indexed)
    many = next(ix for ix in indexed if np.unique(ix.lane.lags).size > 1)
    assert np.array_equal(many.by_lag, np.argsort(many.lane.lags, kind="stable")) and many._order is not None


def test_index_of_is_searchsorted():
    """sharp._index_of looks members up in a table: np.searchsorted's answer, also where a node is no member or
    the members repeat (the search then answers)."""
    from collectives.algorithms.sharp import _index_of

    rng = np.random.default_rng(5)
    members = np.unique(rng.integers(0, 5000, 3000))
    node = rng.choice(members, 4000)
    for m, x in ((members, node), (members, np.r_[node, members[-1] + 1]), (members, np.r_[node, 1 + members[0]]),
                 (np.sort(np.r_[members, members[:9]]), node)):
        assert np.array_equal(_index_of(m, x), np.searchsorted(m, x))


@pytest.mark.parametrize("name,size", [("gb200-nvl72", {"racks": 16, "gpus_per_domain": 4}),
                                       ("gb300-nvl72", {"racks": 8}), ("dgx-h100", {"nodes": 8})])
def test_lanes_by_position_are_the_sorted_ones(name, size):
    """sharp._lanes_by_position reads each position's children from a table whose rows are the parents in
    member order: the children _lanes_by sorts by (position, parent's member); the forest's vertices in member
    order are the stable argsort of their members."""
    from collectives.algorithms import sharp

    topo = preset(name, **size)
    forest = build_forest([topo.sharp_tree(ranks=g, port=int(topo.rank_rail(int(g[0]))))
                           for g in topo.domain_groups().T])
    assert np.array_equal(forest.by_member, np.argsort(forest.member, kind="stable"))
    up = np.flatnonzero(forest.parent >= 0)
    for k in np.unique(forest.slot[forest.parent[up]]).tolist():
        mine = up[forest.slot[forest.parent[up]] == k]
        got = sharp._lanes_by_position(forest, mine, lambda v, i: (i, v))
        want = sharp._lanes_by(forest, mine, forest.position[mine], lambda v, i: (i, v),
                               within=forest.member[forest.parent[mine]])
        assert [i for i, _ in got] == [i for i, _ in want]
        assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))


@pytest.mark.parametrize("name,size", [("gb200-nvl72", {"racks": 16, "gpus_per_domain": 4}),
                                       ("gb300-nvl72", {"racks": 8}), ("dgx-h100", {"nodes": 8})])
def test_allreduce_lanes_are_the_climb_and_descent(name, size):
    """sharp.allreduce_lanes finds the edges once for the climb and the descent: the lanes climb_lanes and
    descent_lanes give apart, on rail forests (members in several trees on dgx-h100 and the 4-GPU gb200) and
    on one tree over every rank, by multicast and by unicast."""
    from collectives.algorithms.sharp import allreduce_lanes, climb_lanes, descent_lanes

    topo = preset(name, **size)
    rails = [topo.sharp_tree(ranks=g, port=int(topo.rank_rail(int(g[0])))) for g in topo.domain_groups().T]
    for trees in (rails, [topo.sharp_tree()]):
        forest = build_forest(trees)
        data = lambda k, v, f=forest: (f.tree[v] * 7 + k + f.level[v], 1 + v % 3)  # noqa: E731
        for lag, multicast in ((0, True), (2, False)):
            assert _same_lanes(allreduce_lanes(forest, data, lag, multicast=multicast),
                               climb_lanes(forest, data, lag) + descent_lanes(forest, data, lag, multicast=multicast))


@pytest.mark.parametrize("name,size", [("gb200-nvl72", {"racks": 3, "gpus_per_domain": 4}),
                                       ("dgx-h100", {"nodes": 8}), ("dgx-h100", {"domain_sizes": [3, 2]})])
def test_nvls_lanes_over_shared_rows_are_the_lanes_over_columns(name, size):
    """The NVLS stages' lanes over shared member arrays (nvls.domain_rows: one transposed copy of the GPUs, one
    lags array per stage) are the lanes of each GPU column and a scalar lag, as lane() writes them out."""
    from collectives.algorithms import nvls
    from collectives.algorithms._pipeline import lane

    from collectives.schedule import recv, recv_reduce, send

    topo = preset(name, **size)
    gpus = topo.domain_groups()
    D, N = gpus.shape
    switches = topo.world_size + np.arange(D, dtype=np.int64)
    flat, switch_of, local = gpus.ravel(), np.repeat(switches, N), np.tile(np.arange(N), D)
    piece = lambda k: (k * N, N)  # noqa: E731
    part = lambda k, j: (k * N + j, 1)  # noqa: E731
    whole = lambda k, at: piece(k)  # noqa: E731
    to_switch = [lane(recv if i == 0 else recv_reduce, switches, gpus[:, i], 2, whole) for i in range(N)]
    want = {
        "reduce_lanes": [lane(send, flat, switch_of, 2, whole)] + to_switch,
        "scatter_lanes": [lane(send, switches, gpus[:, i], 2, lambda k, at, i=i: part(k, i)) for i in range(N)] +
        [lane(recv, flat, switch_of, 2, lambda k, at: part(k, local[at]))],
        "gather_lanes": [lane(send, flat, switch_of, 2, lambda k, at: part(k, local[at]))] +
        [lane(recv, switches, gpus[:, i], 2, lambda k, at, i=i: part(k, i)) for i in range(N)],
        "multicast_lanes": [lane(send, switches, gpus[:, i], 2, whole) for i in range(N)] +
        [lane(recv, flat, switch_of, 2, whole)],
    }
    rows = nvls.domain_rows(gpus, switches)
    for builder, lanes in want.items():
        arg = piece if builder in ("reduce_lanes", "multicast_lanes") else part
        assert _same_lanes(getattr(nvls, builder)(gpus, switches, 2, arg, rows), lanes)
        assert _same_lanes(getattr(nvls, builder)(gpus, switches, 2, arg), lanes)


@pytest.mark.parametrize("algorithm,params", [("hierarchical", {}), ("hierarchical", {"inter": "double_binary_tree"}),
                                              ("nvls_tree", {}), ("nvls", {}), ("collnet_direct", {})])
def test_a_lanes_declared_count_is_its_chunk_count(algorithm, params):
    """A lane built with one chunk count (Lane.count, which _pipeline's stages() reads instead of the chunk
    ranges) gives that count to every member for every piece, and stages() lists what the chunk ranges say."""
    from collectives.registry import build

    topo = preset("dgx-h100", nodes=1) if algorithm == "nvls" else preset("gb200-nvl72", racks=4, gpus_per_domain=4)
    sched = build(algorithm, collective="allreduce", world_size=topo.world_size, count=1 << 16, topology=topo,
                  chunks=5, **params)
    declared = 0
    for phase in sched.phases:
        info = getattr(phase.rounds[0].slots, "pipeline", None)
        if info is None:
            continue
        for ln in info["lanes"]:
            at = np.arange(ln.size)
            for piece in range(5):
                _, count = ln.chunks(np.full(ln.size, piece), at)
                if ln.count is not None:
                    declared += 1
                    assert np.all(np.broadcast_to(count, at.shape) == ln.count)
        for stage, ln in zip(info["stages"](), [x for x in info["lanes"] if x.size], strict=True):
            _, want = ln.chunks(np.zeros(ln.size, np.int64), np.arange(ln.size))
            assert stage[1] is ln.members and np.array_equal(stage[4], np.broadcast_to(want, ln.members.shape))
    assert declared or algorithm == "collnet_direct"


@pytest.mark.parametrize("name,size", [("gb300-nvl72", {"racks": 8}), ("dgx-h100", {"nodes": 64})])
def test_a_sharp_tree_over_ranks_in_order_is_the_sorted_one(name, size):
    """sharp_tree keeps ranks given in increasing order, and leaves' keys in order, without sorting them: the
    tree of the same ranks given shuffled and with repeats (sorted and grouped by argsort)."""
    topo = preset(name, **size)
    rng = np.random.default_rng(7)
    for g in topo.domain_groups().T[:3]:
        port = int(topo.rank_rail(int(g[0])))
        fast = topo.sharp_tree(ranks=g, port=port)
        general = topo.sharp_tree(ranks=np.r_[rng.permutation(g), g[:5]], port=port)
        assert np.array_equal(fast.ranks, general.ranks) and fast.ranks.base is None
        for a, b in zip(fast.levels, general.levels, strict=True):
            assert a.level == b.level and np.array_equal(a.switches, b.switches)
            assert np.array_equal(a.children, b.children)
