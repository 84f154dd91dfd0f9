"""SHARP: the fat-tree's switches aggregate: every rank's data climbs an aggregation tree, the result comes down.

Vocabulary. A *tree* is `topology.sharp_tree()`: leaves are the leaf switches holding the ranks' NICs, each
higher level one switch per group of children, up to one *root*; its *depth* L is its number of switch levels.
A *vertex* is a (tree, node) pair: a rank is a vertex of level 0, a switch of its level (a switch that serves
several trees, as a small fat-tree's spines do for every rail, holds one vertex per tree, in tree order). A
*forest* is the trees one phase runs side by side (flat sharp: one tree of all ranks; hierarchical and
collnet: one per rail). The buffer is cut into *pieces* that stream through each tree one level per round.

* climb (up): a vertex of level l sends piece k to its parent in round k + l; the parent reduce-receives all its
  children's copies in that same round (one fused reduction, children in a fixed order: the first child's
  copy is stored, the others reduced into it), so the root holds piece k reduced after round k + L - 1;
* descent by multicast (down): a vertex of level l sends piece k to all its children in round k + 2L - l;
* descent by unicast: the aggregation node emits one copy per child, one child per round (its own output rate
  bounds it): child i of a level-l vertex gets piece k in round L + (L - l)·U + k·U + i, U the widest fan-out.

allreduce = climb + descent. reduce = climb, then the descent only along the root rank's path. broadcast = the
root rank's data climbs its path (stored, not reduced), then comes down to every other vertex. gather (the
hierarchical allgather) = every rank's block climbs and each switch stores its children's adjacent ranges; the
root's whole range comes down. Each rank sends D and receives D, against 2(p-1)/p·D each way for a ring.

The protocol follows the size (topology.sharp.protocol): LLT below the SAT threshold, with pieces of at most
ost_quota / (pipeline stages) outstanding transactions of ost_size bytes, so no more than the OST quota is in
flight; SAT (streaming, exclusive tree lock) above it, with a deep pipeline. When SHARP cannot serve the call
(no tree, op/dtype not offloaded, too few nodes, tree quota, SAT lock denied) the schedule is the host
`fallback` algorithm, and schedule.notes and params["fallback_reason"] say why; it is logged too
(_innetwork.py holds the refusal logic the in-network builders share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Schedule, recv, recv_reduce, send
from collectives.topology.capabilities import dtype_name

from ._innetwork import check_topology, default_fallback, fallback_schedule, finish, itemsize, sharp_plan
from ._pipeline import Lane, _member_order, _stable_order, lane, memo, pipelined_phase

RESULTS = ("multicast", "unicast")


@dataclass(frozen=True)
class Forest:
    """Aggregation trees as flat vertex arrays. Members are the trees' ranks (increasing), then every switch
    they use (increasing); a vertex is one member's place in one tree."""

    members: np.ndarray  # node ids
    member: np.ndarray  # per vertex: its member index
    tree: np.ndarray  # per vertex: its tree
    level: np.ndarray  # per vertex: 0 for ranks, the switch level otherwise
    parent: np.ndarray  # per vertex: the parent vertex (-1 at roots)
    position: np.ndarray  # per vertex: its index among its parent's children
    slot: np.ndarray  # per vertex: its index among its member's vertices (tree order)
    depth: np.ndarray  # per tree: switch levels
    by_member: np.ndarray  # the vertices in member order (a member's in tree order): np.argsort(member, stable)

    @property
    def fanout(self) -> int:
        return int(self.position.max(initial=0)) + 1

    @property
    def switches(self) -> np.ndarray:
        return self.members[self.member[self.level > 0]]

    def top(self) -> np.ndarray:
        """Per vertex: its tree's depth."""
        return self.depth[self.tree]


def _index_of(members: np.ndarray, node: np.ndarray) -> np.ndarray:
    """np.searchsorted(members, node) for increasing members: by a table of each member's index where the
    members are distinct node ids below a few times their count and every node is one of them (the same
    answer), else by the search."""
    top = int(members[-1]) if members.size else -1
    if node.size and members.size and int(members[0]) >= 0 and top < 4 * members.size + 1024 and \
            int(node.min()) >= 0 and int(node.max()) <= top and bool((members[1:] > members[:-1]).all()):
        table = np.full(top + 1, -1, np.int64)
        table[members] = np.arange(members.size, dtype=np.int64)
        out = table[node]
        if bool((out >= 0).all()):
            return out
    return np.searchsorted(members, node)


def _tree_vertices(trees: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(node, tree, level, parent node) of every vertex, tree by tree (its ranks, then its levels' switches, bottom
    up), read tree by tree: a node's parent in a tree is the switch listing it, the last listed where a node is
    listed twice (as a dict built level by level, switch by switch would keep)."""
    node, tree, level, parent_node = [], [], [], []
    for ti, t in enumerate(trees):
        child = [np.asarray(lv.children, np.int64) for lv in t.levels]
        owner = [np.broadcast_to(np.asarray(lv.switches, np.int64)[:, None], c.shape) for lv, c in
                 zip(t.levels, child, strict=True)]
        child = np.concatenate([c.ravel() for c in child]) if child else np.zeros(0, np.int64)
        owner = np.concatenate([o.ravel() for o in owner]) if owner else np.zeros(0, np.int64)
        listed = child >= 0
        child, owner = child[listed], owner[listed]
        by_child = np.argsort(child, kind="stable")
        child, owner = child[by_child], owner[by_child]
        node.append(t.ranks)
        level.append(np.zeros(t.ranks.size, np.int64))
        for lv in t.levels:
            node.append(lv.switches)
            level.append(np.full(lv.switches.size, lv.level, np.int64))
        n = np.concatenate(node[-1 - len(t.levels):])
        tree.append(np.full(n.size, ti, np.int64))
        at = np.searchsorted(child, n, side="right") - 1  # the last entry of n's node, if listed
        found = (at >= 0) & (child[np.maximum(at, 0)] == n) if child.size else np.zeros(n.size, bool)
        parent_node.append(np.where(found, owner[np.maximum(at, 0)] if child.size else -1, -1).astype(np.int64))
    node, tree, level, parent_node = (np.concatenate(x) for x in (node, tree, level, parent_node))
    return node, tree, level, parent_node


class _Disjoint(NamedTuple):
    """The vertices of trees that share no node, read all at once (_disjoint_tree_vertices)."""

    node: np.ndarray  # per vertex: its node (tree by tree, as _tree_vertices lists them)
    tree: np.ndarray
    level: np.ndarray
    parent: np.ndarray  # per vertex: the parent vertex (-1 at roots)
    vertex_at: np.ndarray  # per node id: its vertex (-1 for nodes in no tree)
    position: np.ndarray | None  # per vertex: its column among its switch's children (None: not in vertex order)


def _disjoint_tree_vertices(trees: list) -> _Disjoint | None:
    """_tree_vertices of trees that share no node and list no node twice (one tree per rail: every node in
    one tree, once a child), all trees at once: each node's vertex and each child's parent by tables over the
    node ids. A child's position among its switch's children is its column among the switch's listed children
    where every switch lists them in vertex order (the ranks in rank order, the switches as their level lists
    them). None where a node is in two trees or listed twice (the tables would have to tell them apart), a
    switch lists a child of another tree, or the ids are sparse."""
    node = np.concatenate([x for t in trees for x in [t.ranks] + [lv.switches for lv in t.levels]]).astype(
        np.int64, copy=False)
    if not node.size or int(node.min()) < 0 or int(node.max()) >= 4 * node.size + 1024:
        return None
    top = int(node.max()) + 1
    every = np.arange(node.size, dtype=np.int64)
    vertex_at = np.full(top, -1, np.int64)
    vertex_at[node] = every
    if not np.array_equal(vertex_at[node], every):  # a node in two trees (a spine serving several rails)
        return None
    sizes = [t.ranks.size + sum(lv.switches.size for lv in t.levels) for t in trees]
    tree = np.repeat(np.arange(len(trees), dtype=np.int64), sizes)
    # each tree's ranks (level 0), then its levels' switches: one run of vertices per (tree, level)
    level = np.repeat(np.array([x for t in trees for x in [0] + [lv.level for lv in t.levels]], np.int64),
                      [x for t in trees for x in [t.ranks.size] + [lv.switches.size for lv in t.levels]])
    levels = [lv for t in trees for lv in t.levels]
    none = np.zeros(0, np.int64)
    if levels:
        # every switch's list of children (one row of its level's table), rows one after another
        child = np.concatenate([np.asarray(lv.children, np.int64).ravel() for lv in levels])
        width = np.repeat([np.shape(lv.children)[1] for lv in levels], [np.size(lv.switches) for lv in levels])
        # each child's switch's vertex (a level's switches are tree nodes: each has one), row by row
        up = np.repeat(vertex_at[np.concatenate([np.asarray(lv.switches, np.int64) for lv in levels])], width)
        listed = child >= 0
        row_start = np.cumsum(width) - width
        if bool(listed.all()):  # no padding (gb300-nvl72's rail trees): a child's column is its place in its row
            column = np.arange(child.size, dtype=np.int64) - np.repeat(row_start, width)
        else:
            # each child's column among its switch's listed children: the listed ones counted along the rows
            count = np.cumsum(listed)
            before = np.where(row_start > 0, count[np.maximum(row_start - 1, 0)], 0)
            column = count - 1 - np.repeat(before, width)
            child, up, column = child[listed], up[listed], column[listed]
    else:
        child = up = column = none
    parent = np.full(node.size, -1, np.int64)
    position = np.zeros(node.size, np.int64)
    if child.size:
        if int(child.max()) >= top:
            return None  # a child that is no vertex
        at = vertex_at[child]
        if not bool((at >= 0).all()) or not np.array_equal(tree[at], tree[up]):
            return None  # a child that is no vertex of its switch's tree (which that tree would not read)
        parent[at] = up
        if not np.array_equal(parent[at], up):
            return None  # a child listed by two switches
        # in vertex order along each switch's list (strictly: a child listed twice is not)
        same = up[1:] == up[:-1]
        position[at] = column
        if not bool((at[1:][same] > at[:-1][same]).all()) or not np.array_equal(position[at], column):
            position = None
    return _Disjoint(node, tree, level, parent, vertex_at, position)


def build_forest(trees: list, nodes=None) -> Forest:
    """The vertices of `trees` (topology.SharpTree, each balanced: level l's children on level l - 1). `nodes`
    (increasing node ids holding every tree node) are the members when the forest is part of a larger phase;
    by default the members are the trees' ranks, then their switches."""
    disjoint = _disjoint_tree_vertices(trees)
    if disjoint is None or nodes is None:  # (disjoint trees share no rank: no need to look)
        ranks = np.sort(np.concatenate([t.ranks for t in trees]))
        if np.any(ranks[1:] == ranks[:-1]):
            raise ValueError("a rank can take part in one aggregation tree of a phase only")
    if nodes is None:
        switches = np.unique(np.concatenate([lv.switches for t in trees for lv in t.levels]))
        members = np.concatenate([ranks, switches])
    else:
        members = np.asarray(nodes, np.int64)
    if disjoint is not None:
        # every member has one vertex (no node in two trees): members are in node order, so the vertices by
        # member are the vertices by node; every slot is 0
        node, tree, level, parent, vertex_at, position = disjoint
        member = _index_of(members, node)
        has = parent >= 0
        slot = np.zeros(node.size, np.int64)
        by_member = vertex_at[vertex_at >= 0]
    else:
        node, tree, level, parent_node = _tree_vertices(trees)
        member = _index_of(members, node)
        has = parent_node >= 0
        parent = np.full(node.size, -1, np.int64)
        parent[has], slot, by_member = _parents_and_slots(members, member, tree, len(trees),
                                                          _index_of(members, parent_node[has]), tree[has])
        position = None
    assert np.all(level[parent[has]] == level[has] + 1), "SHARP trees are balanced"
    if position is None:  # position among the parent's children (children in vertex order)
        position = np.zeros(node.size, np.int64)
        kids = np.flatnonzero(has)
        if kids.size:
            by_parent = kids[_stable_order(parent[kids])]  # (radix-sorted: the stable argsort's order)
            starts = np.r_[0, np.flatnonzero(np.diff(parent[by_parent])) + 1]
            position[by_parent] = np.arange(by_parent.size) - np.repeat(starts,
                                                                         np.diff(np.r_[starts, by_parent.size]))
    return Forest(members, member, tree, level, parent, position, slot, np.array([t.depth for t in trees]),
                  by_member)


def _parents_and_slots(members: np.ndarray, member: np.ndarray, tree: np.ndarray, trees: int,
                       parent_member: np.ndarray, parent_tree: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parent vertices (the vertex of each parent member in its child's tree), every vertex's slot (its
    index among its member's vertices, in tree order) and the vertices in member order, where a member may have
    a vertex in several trees."""
    # the vertices by (member, tree) are the vertices by member (stable): they are listed tree by tree, so a
    # member's come in increasing tree order
    key = member * trees + tree
    order = _member_order(member)
    # each member's first vertex (in (member, tree) order) is the parent where it is in the parent's tree (every
    # parent of a one-tree switch): the first key >= want, np.searchsorted's answer; the others are searched
    sorted_member = member[order]
    runs = np.flatnonzero(np.r_[sorted_member.size > 0, sorted_member[1:] != sorted_member[:-1]])
    first_of = np.zeros(members.size, np.int64)
    first_of[sorted_member[runs]] = runs
    at = first_of[parent_member]
    other = np.flatnonzero((sorted_member[at] != parent_member) | (tree[order[at]] != parent_tree))
    if other.size:
        at[other] = np.searchsorted(key[order], parent_member[other] * trees + parent_tree[other])
    parent = order[at]
    first = np.repeat(runs, np.diff(np.r_[runs, sorted_member.size]))
    slot = np.empty(member.size, np.int64)
    slot[order] = np.arange(member.size) - first
    return parent, slot, order


def _lanes_by(forest: Forest, vertices: np.ndarray, key: np.ndarray, make, within: np.ndarray | None = None
              ) -> list[Lane]:
    """One lane per distinct key (in increasing order) over `vertices`, made by make(vertices of the key, key):
    each key's vertices in their order, or by `within` (per vertex: the member it gives its lane; stable), so
    that a lane whose members are those finds them in order (lane() would sort each lane's members alike)."""
    # vertices[key == k] for each k in one stable sort: each key's vertices, in their order, are one run; by
    # (key, within) in two (least significant first)
    if not key.size:
        return []
    if within is None:
        order = _stable_order(key)
    else:
        by_within = _stable_order(within)
        order = by_within[_stable_order(key[by_within])]
    ordered, keys = vertices[order], key[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], keys.size]
    return [make(ordered[a:b], k) for a, b, k in zip(starts.tolist(), ends.tolist(), keys[starts].tolist(),
                                                          strict=True)]


def _lanes_by_position(forest: Forest, children: np.ndarray, make) -> list[Lane]:
    """_lanes_by(forest, children, position, make, within=member of the parent) for `children` whose parents
    are distinct members (one slot's): a (parent, position) table of the children, its rows the parents in
    member order, read column by column, instead of sorting the children (each parent has one child at a
    position: the column's children are the key's, in their parents' member order). By the sort where the
    table would be sparse."""
    f = forest
    if not children.size:
        return []
    parents = f.parent[children]
    position = f.position[children]
    fanout = int(position.max()) + 1
    is_parent = np.zeros(f.member.size, bool)
    is_parent[parents] = True
    rows = np.flatnonzero(is_parent)
    if rows.size * fanout > 4 * children.size + 1024:
        return _lanes_by(f, children, position, make, within=f.member[parents])
    rows = rows[_member_order(f.member[rows])]
    row_of = np.empty(f.member.size, np.int64)
    row_of[rows] = np.arange(rows.size, dtype=np.int64)
    table = np.full((fanout, rows.size), -1, np.int64)  # position-major: each position's children contiguous
    table[position, row_of[parents]] = children
    lanes = []
    for i in range(fanout):
        at = table[i]
        at = at[at >= 0]
        if at.size:
            lanes.append(make(at, i))
    return lanes


def _slots_in_use(parent_slot: np.ndarray, own_slot: np.ndarray) -> list[int]:
    """np.union1d(parent_slot, own_slot) as a list: slots are small non-negative indices, counted, not sorted."""
    if not parent_slot.size:
        return []
    n = int(max(parent_slot.max(), own_slot.max())) + 1
    return np.flatnonzero(np.bincount(parent_slot, minlength=n) + np.bincount(own_slot, minlength=n)).tolist()


def _by_slot(forest: Forest, on: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per slot in use by the vertices `on` (a mask of vertices with a parent) or their parents, in increasing
    slot: (the vertices whose parent has the slot, in vertex order; the vertices of the slot, in member order).
    Where every slot is 0 (no member in two trees) the masks are the whole sets, not compared slot by slot."""
    f = forest
    at = np.flatnonzero(on)
    in_order = f.by_member[on[f.by_member]]
    if not f.slot.any():
        return [(at, in_order)] if at.size else []
    parent_slot = f.slot[f.parent[at]]
    own = f.slot[in_order]
    return [(at[parent_slot == k], in_order[own == k]) for k in _slots_in_use(parent_slot, f.slot[at])]


class _Edges(NamedTuple):
    """One slot's edges (child vertex to parent vertex), the arrays the climb's and the descent's lanes share."""

    by_position: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]  # per child position i, increasing:
    # (i, the children at i, their parents' members, their own members), the parents in member order
    children: np.ndarray  # the slot's vertices with a parent, in member order
    members: np.ndarray  # their members (increasing)
    parents: np.ndarray  # their parents' members


def _edges(forest: Forest, on: np.ndarray) -> list[_Edges]:
    """Per slot in use by the vertices `on` (a mask of vertices with a parent) or their parents (_by_slot): the
    edges by the parent's child position and by the child, with both ends' members."""
    f = forest
    out = []
    for mine, child in _by_slot(f, on):
        by_position = _lanes_by_position(f, mine, lambda v, i: (i, v, f.member[f.parent[v]], f.member[v]))
        out.append(_Edges(by_position, child, f.member[child], f.member[f.parent[child]]))
    return out


def _vertex_chunks(data, vertices: np.ndarray):
    """A lane's chunk range over `vertices` (its members' vertices, in its order): data(piece, vertex)."""
    return lambda k_, at: data(k_, vertices[at])


def _climb(forest: Forest, edges: list[_Edges], data, lag: int, reduce: bool, count: int | None = None
           ) -> list[Lane]:
    lags = lag + forest.level
    lanes = []
    for e in edges:
        # parent side: one lane per (parent slot, child position), the parents in member order
        for i, v, parent_members, child_members in e.by_position:
            lanes.append(lane(recv_reduce if reduce and i > 0 else recv, parent_members, child_members, lags[v],
                              _vertex_chunks(data, v), count=count))
        # child side: the vertices of the slot send (in member order: the lane's members as given)
        if e.children.size:
            lanes.append(lane(send, e.members, e.parents, lags[e.children], _vertex_chunks(data, e.children),
                              count=count))
    return lanes


def _descent(forest: Forest, edges: list[_Edges], data, lag: int, multicast: bool, count: int | None = None
             ) -> list[Lane]:
    f = forest
    L = f.top()
    if multicast:
        lags, period = lag + 2 * L - f.level - 1, 1
    else:
        U = f.fanout
        lags, period = lag + L + (L - f.level - 1) * U + f.position, U
    lanes = []
    for e in edges:
        for _, v, parent_members, child_members in e.by_position:
            lanes.append(lane(send, parent_members, child_members, lags[v], _vertex_chunks(data, v), period, count))
        if e.children.size:  # (in member order: the lane's members as given)
            lanes.append(lane(recv, e.members, e.parents, lags[e.children], _vertex_chunks(data, e.children),
                              period, count))
    return lanes


def climb_lanes(forest: Forest, data, lag: int = 0, reduce: bool = True, path=None) -> list[Lane]:
    """Every vertex sends `data(piece, vertex)` to its parent at lag `lag` + its level; the parent stores its
    first child's copy and reduce-receives the others in that round (`reduce=False`: stores each child's range,
    as a gather does). `path` (a vertex mask) keeps only the vertices on it."""
    f = forest
    return _climb(f, _edges(f, (f.parent >= 0) if path is None else (f.parent >= 0) & path), data, lag, reduce)


def descent_lanes(forest: Forest, data, lag: int = 0, multicast: bool = True, skip=None) -> list[Lane]:
    """Every vertex with a parent receives `data(piece, vertex)` from it: by multicast at lag + 2L - level - 1
    (its parent's level l sends to all children at lag + 2L - l), or by unicast one child per round (period U).
    `skip` (a vertex mask) leaves out the vertices that already hold the data."""
    f = forest
    return _descent(f, _edges(f, (f.parent >= 0) if skip is None else (f.parent >= 0) & ~skip), data, lag,
                    multicast)


def allreduce_lanes(forest: Forest, data, lag: int = 0, multicast: bool = True, count: int | None = None
                    ) -> list[Lane]:
    """climb_lanes(forest, data, lag) + descent_lanes(forest, data, lag, multicast): the same lanes, the edges
    found once and their member arrays shared by the lanes up and down an edge (lanes are only read). `count`:
    the chunk count `data` gives every vertex for every piece, where the caller knows it is one number."""
    edges = _edges(forest, forest.parent >= 0)
    return _climb(forest, edges, data, lag, True, count) + _descent(forest, edges, data, lag, multicast, count)


def path_to(forest: Forest, rank: int) -> np.ndarray:
    """Vertex mask: `rank`'s vertex and its ancestors."""
    f = forest
    on = np.zeros(f.member.size, bool)
    v = int(np.flatnonzero((f.members[f.member] == rank) & (f.level == 0))[0])
    while v >= 0:
        on[v] = True
        v = int(f.parent[v])
    return on


def sharp_options(topology, dtype, result, accumulator, reproducible) -> dict:
    """The precision and result-delivery parameters every SHARP schedule records."""
    result = ("multicast" if topology.sharp.multicast else "unicast") if result is None else result
    if result not in RESULTS:
        raise ValueError(f"result must be one of {', '.join(RESULTS)}, got {result!r}")
    accumulator = topology.sharp.accumulator if accumulator is None else accumulator
    if accumulator not in ("float32", "input"):
        raise ValueError(f"accumulator must be 'float32' or 'input', got {accumulator!r}")
    name = dtype_name(dtype)
    acc = "float32" if accumulator == "float32" and name in ("float16", "bfloat16") else name
    return {"result": result, "accumulator": accumulator, "accumulator_dtype": acc,
            "reproducible": bool(reproducible)}


@register("sharp", ("allreduce", "reduce", "broadcast"), needs_topology=True,
          summary="SHARP in-network aggregation: every rank up one switch tree (fused reduction per switch), "
                  "result down by multicast or unicast; LLT/SAT by size; host fallback on refusal")
def build_sharp(collective: str, world_size: int, count: int, *, root=None, topology=None, dtype="float32",
                op: str = "sum", chunks: int | None = None, result: str | None = None,
                reproducible: bool = True, accumulator: str | None = None, trees_in_use: int = 0,
                sat_lock: str = "granted", fallback: str | None = None) -> Schedule:
    check_topology("sharp", topology, world_size)
    fallback = fallback or default_fallback(collective)
    options = sharp_options(topology, dtype, result, accumulator, reproducible)
    notes: list[str] = []
    reducing = collective != "broadcast"
    plan, reason = sharp_plan(topology, lambda: memo(topology, ("sharp_tree",), lambda: [topology.sharp_tree()]),
                              nbytes=count * itemsize(dtype),
                              op=op if reducing else "sum", dtype=dtype if reducing else "float32",
                              domains=topology.num_domains, trees_in_use=trees_in_use, sat_lock=sat_lock,
                              chunks=chunks, notes=notes)
    if reason is not None:
        return fallback_schedule("sharp", "SHARP", reason, fallback, notes, collective=collective,
                                 world_size=world_size, count=count, root=root, chunks=chunks,
                                 dtype=dtype_name(dtype), op=op, topology=topology)
    trees = plan.pop("trees")
    c = plan["chunks"] if chunks is not None else min(plan["chunks"], max(count, 1))
    plan["chunks"] = c
    multicast = options["result"] == "multicast"

    def stages():  # independent of the size: kept across a sweep's sizes
        forest = build_forest(trees)
        piece = lambda k, v: (k, 1)  # noqa: E731  (one tree: piece k is chunk k)
        if collective == "allreduce":
            return forest, allreduce_lanes(forest, piece, multicast=multicast)
        path = path_to(forest, int(root))
        if collective == "reduce":  # the result comes down only toward the root rank
            return forest, climb_lanes(forest, piece) + descent_lanes(forest, piece, multicast=multicast, skip=~path)
        # broadcast: the root's data climbs its path, then comes down to every vertex off it
        return forest, climb_lanes(forest, piece, reduce=False, path=path) + \
            descent_lanes(forest, piece, multicast=multicast, skip=path)

    forest, lanes = memo(topology, ("sharp", collective, root, multicast), stages)
    phase = pipelined_phase(f"SHARP {collective}", forest.members, ChunkTable.whole(count, c), lanes, c,
                            piece_invariant=True)
    sched = Schedule("sharp", collective, world_size, count, [phase], root=root,
                     params={**plan, **options, "dtype": dtype_name(dtype), "op": op, "tree_root": trees[0].root,
                             "tree_depth": trees[0].depth, "latency_class": "collnet_direct"},
                     notes=notes)
    finish(sched, topology, forest.switches)
    return sched


__all__ = ["Forest", "allreduce_lanes", "build_forest", "climb_lanes", "descent_lanes", "path_to",
           "sharp_options"]
