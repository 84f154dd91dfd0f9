"""Round patterns of switch nodes (NVLS in a domain, SHARP aggregation trees in the fat-tree) and the refusal
and fallback logic the in-network builders share. The model and its sources: docs/in-network.md.

Vocabulary.

* An *NVLS group* is one domain's GPUs (members 0..N-1, by local index) followed by the domain's switch
  (member N). A *piece* is one pipeline step's share of the buffer: every GPU sends the whole piece to the
  switch, which reduce-receives all N copies in one round (one fused reduction) and, one round later, sends
  each GPU its *part* of the piece. With a block-major table (blocks = N slices, `sub` = pieces) piece it is
  chunk ids [it*N, (it+1)*N) and GPU j's part is the intersection with its slice j = [j*sub, (j+1)*sub): the
  parts are uneven per round when sub > 1, but every round's uplink carries the whole piece, so the slowest
  link still moves D/pieces per round. The fused allreduce uses a piece-major table (blocks = pieces, sub =
  N) instead, where every part is exactly 1/N of the piece, because there both directions carry a piece.
* A *forest* is one or more SHARP aggregation trees run side by side in one phase group. Its members are the
  trees' ranks, then every switch any tree uses (a switch may serve several trees: small fat-trees put every
  rail's tree on one switch). A *vertex* is a (tree, node) pair: member m holds up to V vertices, slot k.
  Trees are balanced (the leaves hold ranks, level l's children sit on level l-1), so with chunk s:
  a vertex of level l sends s up in round s + l, and its parent reduce-receives every child's copy in that
  same round (one fused reduction in fixed child order); the root of a tree of depth L holds s after round
  s + L - 1. Down by multicast, a vertex of level l sends s to all its children in round s + 2L - l. Down by
  unicast the aggregation node emits one copy per child, one child per round (U = most children of any
  vertex): it sends s to child i in round L + (L - l)*U + s*U + i.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from collectives.schedule import ChunkTable, Phase, Round, recv, recv_reduce, send

from .chain import pipeline_rounds

log = logging.getLogger("collectives")

SAT_MAX_BYTES = (1 << 30) - 32  # one SAT operation moves at most 1 GiB - 32 B (hardware.md)


# what the in-network builders need of a topology beyond the Topology interface (collectives.topology.Cluster)
CLUSTER_MODEL = ("num_domains", "gpus_per_domain", "domain_groups", "nvswitches", "num_nodes")


# -- checks, labels, fallbacks --------------------------------------------------------------------------------
def check_topology(name: str, topology, world_size: int) -> None:
    if topology is None:
        raise ValueError(f"algorithm {name!r} needs a topology (collectives.topology.cluster(...) or preset(...))")
    if world_size != topology.world_size:
        raise ValueError(f"algorithm {name!r}: world_size={world_size} but the topology {topology.name!r} has "
                         f"{topology.world_size} GPUs; build with world_size=topology.world_size")
    missing = [a for a in CLUSTER_MODEL if not hasattr(topology, a)]
    if missing:
        raise ValueError(f"algorithm {name!r} runs on scale-up domains and their switches, and the topology "
                         f"{topology.name!r} ({type(topology).__name__}) models none (no {', '.join(missing)}); "
                         "use collectives.topology.cluster(...) or preset(...), or a host algorithm")


def itemsize(dtype) -> int:
    if isinstance(dtype, str) and dtype.lower() == "bfloat16":
        return 2
    return int(np.dtype(dtype).itemsize)


def finish(schedule, topology, switches=()) -> None:
    """Give `schedule` the topology's node ids and labels (switch nodes used)."""
    schedule.num_nodes = max(schedule.num_nodes, topology.num_nodes)
    schedule.topology = topology
    sw = np.asarray(list(switches), dtype=np.int64).ravel()
    if sw.size:
        schedule.node_labels.update(topology.node_labels(np.unique(sw)))


def fall_back(what: str, reason: str, host: str, notes: list[str]) -> str:
    """Record and log that the in-network part `what` runs as host algorithm `host`; return the note."""
    note = f"{what} refused: {reason}; fell back to {host}"
    notes.append(note)
    log.warning("collectives: %s", note)
    return note


def host_schedule(name: str, collective: str, world_size: int, count: int, root, chunks: int | None):
    """Build host algorithm `name` (passing `chunks` only to builders that pipeline)."""
    import inspect

    from collectives.registry import build, info

    kwargs = {}
    if chunks is not None and "chunks" in inspect.signature(info(name).builder).parameters:
        kwargs["chunks"] = chunks
    return build(name, collective=collective, world_size=world_size, count=count, root=root, **kwargs)


def fallback_schedule(algorithm: str, what: str, reason: str, fallback: str, notes: list[str], *, collective: str,
                      world_size: int, count: int, root, chunks: int | None, dtype: str, op: str, topology):
    """The host algorithm `fallback` standing in for `algorithm` when the switches refuse (`what`: "NVLS" or
    "SHARP"): the schedule keeps the requested name, and its notes and params say why it fell back."""
    fall_back(what, reason, fallback, notes)
    sched = host_schedule(fallback, collective, world_size, count, root, chunks)
    sched.algorithm = algorithm
    sched.notes += notes
    sched.params.update(fallback=fallback, fallback_reason=reason, dtype=dtype, op=op)
    finish(sched, topology)
    return sched


def default_fallback(collective: str) -> str:
    return "binomial" if collective in ("broadcast", "reduce") else "ring"


# -- NVLS -----------------------------------------------------------------------------------------------------
def nvls_groups(topology) -> np.ndarray:
    """(domains, G + 1): each domain's ranks by local index, then its switch node."""
    return np.concatenate([topology.domain_groups(), topology.nvswitches()[:, None]], axis=1)


def _part(j, it, per_block: int, per_piece: int):
    """(first chunk, nchunks) of block j inside piece it, in chunk ids (nchunks 0 where they do not meet)."""
    lo = np.maximum(j * per_block, it * per_piece)
    hi = np.minimum((j + 1) * per_block, (it + 1) * per_piece)
    return lo, np.maximum(hi - lo, 0)


def _roles(m, n: int) -> tuple[bool, bool]:
    """(GPU lanes needed, switch lanes needed): one member's program needs only its own role's lanes (the
    lanes of the other role are idle for it), the vectorized evaluation over all members needs both."""
    if np.ndim(m) == 0:
        return int(m) < n, int(m) == n
    return True, True


def _on(cond, peer):
    return np.where(cond, peer, -1)


def nvls_reduce_scatter_phase(name: str, groups: np.ndarray, table: ChunkTable) -> Phase:
    """Slice j (table block j) reduced by the switch and delivered to GPU j; `table.sub` pieces pipeline it."""
    n, c = groups.shape[1] - 1, table.sub
    assert table.blocks == n

    def slots(m, t):
        m, t = np.asarray(m), np.asarray(t)
        gpu, sw = m < n, m == n
        g_on, s_on = _roles(m, n)
        up = (t < c)
        out = [send(_on(gpu & up, n), t * n, n)] if g_on else []
        if s_on:
            out += [(recv if i == 0 else recv_reduce)(_on(sw & up, i), t * n, n) for i in range(n)]
            for j in range(n):  # the switch hands out the previous piece's parts
                lo, k = _part(j, t - 1, c, n)
                out.append(send(_on(sw & (t >= 1) & (k > 0), j), lo, k))
        if g_on:
            lo, k = _part(np.minimum(m, n - 1), t - 1, c, n)
            out.append(recv(_on(gpu & (t >= 1) & (k > 0), n), lo, k))
        return out

    return Phase(name, groups, table, [Round(slots, repeats=c + 1, name=name)])


def nvls_allgather_phase(name: str, groups: np.ndarray, table: ChunkTable) -> Phase:
    """GPU j's slice (table block j) stored by the switch and multicast to every GPU, piece by piece."""
    n, c = groups.shape[1] - 1, table.sub
    assert table.blocks == n

    def slots(m, t):
        m, t = np.asarray(m), np.asarray(t)
        gpu, sw = m < n, m == n
        g_on, s_on = _roles(m, n)
        up, down = t < c, t >= 1  # down: multicast of the same range to every GPU, the sender's own included
        out = []
        if g_on:
            lo, k = _part(np.minimum(m, n - 1), t, c, n)
            out.append(send(_on(gpu & up & (k > 0), n), lo, k))
        if s_on:
            for i in range(n):
                lo, k = _part(i, t, c, n)
                out.append(recv(_on(sw & up & (k > 0), i), lo, k))
            out += [send(_on(sw & down, j), (t - 1) * n, n) for j in range(n)]
        if g_on:
            out.append(recv(_on(gpu & down, n), (t - 1) * n, n))
        return out

    return Phase(name, groups, table, [Round(slots, repeats=c + 1, name=name)])


def nvls_allreduce_phase(name: str, groups: np.ndarray, table: ChunkTable) -> Phase:
    """Two-shot NVLS allreduce, fused per piece (piece-major table: blocks = pieces, sub = N). Stage lags:
    0 GPUs send the piece, the switch reduces it; 1 the switch sends part j to GPU j; 2 GPU j sends its part
    back; 3 the switch multicasts the piece. Per GPU: D + D/N up, D/N + D down."""
    n, c = groups.shape[1] - 1, table.blocks
    assert table.sub == n

    def slots(m, t):
        m, t = np.asarray(m), np.asarray(t)
        gpu, sw = m < n, m == n
        j = np.minimum(m, n - 1)

        def live(lag):
            return (t - lag >= 0) & (t - lag < c)

        g_on, s_on = _roles(m, n)
        s0, s1, s2, s3 = ((t - lag) * n for lag in range(4))
        gpu_lanes = [send(_on(gpu & live(0), n), s0, n), recv(_on(gpu & live(1), n), s1 + j),
                     send(_on(gpu & live(2), n), s2 + j), recv(_on(gpu & live(3), n), s3, n)] if g_on else []
        if not s_on:
            return gpu_lanes
        switch_lanes = [(recv if i == 0 else recv_reduce)(_on(sw & live(0), i), s0, n) for i in range(n)]
        switch_lanes += [send(_on(sw & live(1), i), s1 + i) for i in range(n)]
        switch_lanes += [recv(_on(sw & live(2), i), s2 + i) for i in range(n)]
        switch_lanes += [send(_on(sw & live(3), i), s3, n) for i in range(n)]
        return gpu_lanes + switch_lanes

    return Phase(name, groups, table, pipeline_rounds(slots, 4, c, name))


# -- SHARP forests ----------------------------------------------------------------------------------------------
@dataclass
class Forest:
    """Aggregation trees as per-(member, vertex slot) arrays; see the module docstring.

    Only switch members have children, so the child tables are stored for them alone: row s of `kids`,
    `kid_slot` is switch member `len(ranks) + s` (a (M, V, C) table would hold ~25M entries, almost all -1, for
    the ranks of a full-scale cluster).
    """

    members: np.ndarray  # (M,) node ids, ranks first
    ranks: np.ndarray  # rank node ids (members[:len(ranks)])
    level: np.ndarray  # (M, V) level of the vertex, -1 where member m has no slot k
    tree: np.ndarray  # (M, V)
    top: np.ndarray  # (M, V) depth L of the vertex's tree
    parent: np.ndarray  # (M, V) member index of the parent, -1 at roots
    parent_slot: np.ndarray  # (M, V) the parent's vertex slot in the same tree (0 at roots)
    kids: np.ndarray  # (S, V, C) member indices of switch member R + s's children, -1 padded
    kid_slot: np.ndarray  # (S, V, C) each child's vertex slot in the same tree (0 where absent)
    nchild: np.ndarray  # (M, V)
    child_pos: np.ndarray  # (M, V) this vertex's index among its parent's children
    depths: list[int]
    switches: np.ndarray  # switch node ids used

    @property
    def fanout(self) -> int:
        return int(max(self.kids.shape[2], 1))

    def member_of(self, nodes) -> np.ndarray:
        return np.searchsorted(self.members, np.asarray(nodes, dtype=np.int64))


def build_forest(trees: list) -> Forest:
    """The trees' vertices as per-(member, slot) arrays, all trees at once (a switch's slots in tree order)."""
    ranks = np.sort(np.concatenate([t.ranks for t in trees]))
    if np.any(ranks[1:] == ranks[:-1]):
        raise ValueError("a rank can take part in one aggregation tree of a phase only")
    T = len(trees)
    # every switch vertex, tree by tree, level by level (the order in which a switch's slots are handed out)
    levels = [(ti, t.depth, lv) for ti, t in enumerate(trees) for lv in t.levels]
    C = int(max([lv.children.shape[1] for _, _, lv in levels] + [1]))
    v_node = np.concatenate([lv.switches for _, _, lv in levels]) if levels else np.zeros(0, np.int64)
    switches = np.unique(v_node)
    members = np.concatenate([ranks, switches])
    M, R = members.size, ranks.size
    index = np.full(int(members.max(initial=-1)) + 1, -1, np.int64)
    index[members] = np.arange(M, dtype=np.int64)
    n_per = [lv.switches.size for _, _, lv in levels]
    v_tree = np.repeat(np.array([ti for ti, _, _ in levels], np.int64), n_per)
    v_level = np.repeat(np.array([lv.level for _, _, lv in levels], np.int64), n_per)
    v_depth = np.repeat(np.array([d for _, d, _ in levels], np.int64), n_per)
    v_kids = np.full((v_node.size, C), -1, np.int64)
    row = 0
    for (_, _, lv), n in zip(levels, n_per, strict=True):
        v_kids[row:row + n, :lv.children.shape[1]] = lv.children
        row += n
    v_mem = index[v_node]
    # slot of each vertex: how many vertices on the same switch come before it
    order = np.argsort(v_mem, kind="stable")
    sorted_mem = v_mem[order]
    first = np.searchsorted(sorted_mem, sorted_mem)
    v_slot = np.empty(v_node.size, np.int64)
    v_slot[order] = np.arange(v_node.size) - first
    V = int(max(1, v_slot.max(initial=-1) + 1))
    level = np.full((M, V), -1, np.int64)
    tree_of = np.full((M, V), -1, np.int64)
    top = np.zeros((M, V), np.int64)
    parent = np.full((M, V), -1, np.int64)
    parent_slot = np.zeros((M, V), np.int64)
    kids = np.full((switches.size, V, C), -1, np.int64)
    kid_slot = np.zeros((switches.size, V, C), np.int64)
    nchild = np.zeros((M, V), np.int64)
    child_pos = np.zeros((M, V), np.int64)
    # (member, slot) tables are written through flat indices member * V + slot (1-D fancy indexing is many
    # times faster than 2-D at this scale)
    flat = lambda a: a.reshape(-1)  # noqa: E731
    r_at = index[np.concatenate([t.ranks for t in trees])] * V
    flat(level)[r_at] = 0
    flat(tree_of)[r_at] = np.repeat(np.arange(T, dtype=np.int64), [t.ranks.size for t in trees])
    flat(top)[r_at] = np.repeat(np.array([t.depth for t in trees], np.int64), [t.ranks.size for t in trees])
    v_at = v_mem * V + v_slot
    flat(level)[v_at], flat(tree_of)[v_at], flat(top)[v_at] = v_level, v_tree, v_depth
    valid = v_kids >= 0
    flat(nchild)[v_at] = valid.sum(axis=1)
    km = np.where(valid, index[np.where(valid, v_kids, 0)], -1)
    kids.reshape(-1, C)[(v_mem - R) * V + v_slot] = km
    rows, cols = np.nonzero(valid)
    kmem = km[rows, cols]
    # a child's slot: 0 for ranks, else its vertex in the same tree (looked up by (member, tree))
    key = v_mem * T + v_tree
    korder = np.argsort(key, kind="stable")
    up_lvl = v_level[rows] > 1
    kslot = np.zeros(kmem.size, np.int64)
    if up_lvl.any():
        want = kmem[up_lvl] * T + v_tree[rows[up_lvl]]
        pos = korder[np.searchsorted(key[korder], want)]
        kslot[up_lvl] = v_slot[pos]
        assert np.all(flat(level)[kmem[up_lvl] * V + kslot[up_lvl]] == v_level[rows[up_lvl]] - 1), \
            "SHARP trees are balanced"
    flat(kid_slot)[((v_mem[rows] - R) * V + v_slot[rows]) * C + cols] = kslot
    k_at = kmem * V + kslot
    flat(parent)[k_at] = v_mem[rows]
    flat(parent_slot)[k_at] = v_slot[rows]
    flat(child_pos)[k_at] = cols
    return Forest(members, ranks, level, tree_of, top, parent, parent_slot, kids, kid_slot, nchild, child_pos,
                  [t.depth for t in trees], switches)


def _idle(kind):
    """A lane idle for every member (vectorized evaluation: costs nothing to skip)."""
    return kind(-1, 0)


def forest_phase(name: str, forest: Forest, table: ChunkTable, mode: str, chunks: int, *,
                 tree_chunk0=None, rank_chunk=None, multicast: bool = True, reproducible: bool = True,
                 root: int | None = None) -> Phase:
    """One phase running every tree of `forest` at once.

    mode "allreduce": tree t reduces chunks [tree_chunk0[t], + chunks) up and returns them down;
    "reduce" / "broadcast": as allreduce, but only toward / from rank node `root` (the path's switches
    relay); "gather": every rank's chunk rank_chunk[rank] goes up (switches store their subtree's range,
    which must be contiguous), and the root's range comes down (chunks must be 1).

    The slot function returns, for one member, the lanes of its own vertices (child lanes on switches only);
    evaluated over an array of members it returns the same V x (2C + 2) lanes for any array, computing child
    lanes over the switch members among them only and marking lanes idle for all of them with a scalar peer
    -1, so that the analytic simulator may evaluate ranks and switches separately and skip idle lanes.
    """
    f, c = forest, int(chunks)
    M, V = f.level.shape
    R = f.ranks.size
    C = f.fanout
    U = C if not multicast else 1
    Lmax = max(f.depths)
    gather = mode == "gather"
    # per vertex slot k, contiguous columns over all members
    lvl_k = np.ascontiguousarray(f.level.T)
    top_k = np.ascontiguousarray(f.top.T)
    tree_k = np.ascontiguousarray(np.maximum(f.tree, 0).T)
    par_k = np.ascontiguousarray(f.parent.T)
    nchild_k = np.ascontiguousarray(f.nchild.T)
    pos_k = np.ascontiguousarray(f.child_pos.T)
    S = M - R
    lo = np.zeros((M, V), np.int64)
    hi = np.zeros((M, V), np.int64)
    if gather:
        assert c == 1
        lo[:R, 0] = rank_chunk
        hi[:R, 0] = np.asarray(rank_chunk) + 1
        for lvl in range(1, Lmax + 1):  # a subtree's range: its children's, which must be adjacent
            s_idx, k_idx = np.nonzero(f.level[R:] == lvl)
            if s_idx.size == 0:
                continue
            km, ks = f.kids[s_idx, k_idx], f.kid_slot[s_idx, k_idx]  # (n, C)
            valid = km >= 0
            x, xk = np.where(valid, km, 0), np.where(valid, ks, 0)
            klo, khi = lo[x, xk], hi[x, xk]
            big = np.iinfo(np.int64).max
            lo_min = np.where(valid, klo, big).min(axis=1)
            hi_max = np.where(valid, khi, -big).max(axis=1)
            span = np.where(valid, khi - klo, 0).sum(axis=1)
            if np.any(span != hi_max - lo_min):
                raise ValueError("the ranks under a switch do not hold adjacent blocks")
            lo[R + s_idx, k_idx], hi[R + s_idx, k_idx] = lo_min, hi_max
        base = np.zeros(len(f.depths), np.int64)
    else:
        base = np.asarray(tree_chunk0, dtype=np.int64)
    path = np.zeros((M, V), bool)  # vertices whose subtree holds `root`
    if root is not None:
        m, k = int(f.member_of([root])[0]), 0
        while m >= 0:
            path[m, k] = True
            m, k = int(f.parent[m, k]), int(f.parent_slot[m, k])
    path_k = np.ascontiguousarray(path.T)
    lo_k, hi_k = np.ascontiguousarray(lo.T), np.ascontiguousarray(hi.T)
    # per (member, slot): the data range of chunk s is [first + s, first + s + n)
    whole_lo = np.zeros(len(f.depths), np.int64)
    whole_hi = np.zeros(len(f.depths), np.int64)
    if gather:
        for ti in range(len(f.depths)):
            sel = f.tree[:R, 0] == ti
            whole_lo[ti], whole_hi[ti] = lo[:R, 0][sel].min(), hi[:R, 0][sel].max()
    child_lo = child_n = child_path = None
    if gather or root is not None:
        valid = f.kids >= 0
        x, xk = np.where(valid, f.kids, 0), f.kid_slot
        child_lo = np.where(valid, lo[x, xk], 0)
        child_n = np.where(valid, hi[x, xk] - lo[x, xk], 0)
        child_path = valid & path[x, xk]

    nslots = (f.level >= 0).sum(axis=1)
    nchild_max = nchild_k[:, R:].max(axis=1, initial=0) if S else np.zeros(V, np.int64)
    up_kind = [recv if (gather or mode == "broadcast" or i == 0) else recv_reduce for i in range(C)]

    def slots(m, t):
        m, t = np.asarray(m), np.asarray(t)
        out = []
        vector = np.ndim(m) != 0
        if not vector:  # one member: only its own vertices' lanes, child lanes only on switches
            mm, tt = m, t
            on_switch = bool(m >= R)
            sm, st, scatter = (m, t, None) if on_switch else (None, None, None)
            ks, fan, shape, nflat = int(nslots[m]), (C if on_switch else 0), None, 0
        else:  # many members: every lane, child lanes computed on the switch members among them
            if t.ndim:
                mb, tb = np.broadcast_arrays(m, t)
                mm, tt = mb.ravel(), tb.ravel()
                shape = mb.shape
            else:
                mm, tt, shape = m.ravel(), t, m.shape
            nflat = mm.size
            at = np.flatnonzero(mm >= R)
            if at.size == nflat:
                sm, st, scatter = mm, tt, None
            else:
                sm, st, scatter = mm[at], (tt[at] if np.ndim(tt) else tt), at
            ks, fan = V, C

        def shaped(x):
            return x if shape is None or np.ndim(x) == 0 else np.reshape(x, shape)

        def own(kind, on, peer, chunk, n=1):
            """A lane over mm (aligned arrays or scalars)."""
            if vector and not on.any():
                return _idle(kind)
            return kind(shaped(_on(on, peer)), shaped(chunk), shaped(n))

        def child(kind, on, peer, chunk, n=1):
            """A lane over the switch members sm, scattered back over mm in vector mode."""
            if not vector:
                return kind(_on(on, peer), chunk, n)
            if not on.any():
                return _idle(kind)
            if scatter is None:
                return kind(shaped(_on(on, peer)), shaped(chunk), shaped(n))
            where = scatter[on]
            pf = np.full(nflat, -1, np.int64)
            pf[where] = np.broadcast_to(peer, on.shape)[on]
            cf = np.zeros(nflat, np.int64)
            cf[where] = np.broadcast_to(chunk, on.shape)[on]
            if np.ndim(n):
                nf = np.zeros(nflat, np.int64)
                nf[where] = np.broadcast_to(n, on.shape)[on]
            else:
                nf = n
            return kind(shaped(pf), shaped(cf), shaped(nf))

        for k in range(ks):
            lvl = lvl_k[k][mm]
            has = lvl >= 0
            if vector and not has.any():
                out += [_idle(up_kind[i]) for i in range(fan)] + [_idle(send), _idle(recv)] + \
                    [_idle(send) for _ in range(fan)]
                continue
            L, tr, par = top_k[k][mm], tree_k[k][mm], par_k[k][mm]
            if gather:
                rng_up = (lo_k[k][mm], hi_k[k][mm] - lo_k[k][mm])
                rng_down = (whole_lo[tr], whole_hi[tr] - whole_lo[tr])
            # up: children send chunk s in round s + lvl - 1, I send it in round s + lvl
            if fan and sm is not None and (not vector or nchild_max[k] > 0):
                s_lvl = lvl_k[k][sm]
                s_has = s_lvl >= 0
                s_nchild = nchild_k[k][sm]
                s_tr, s_L = tree_k[k][sm], top_k[k][sm]
                krows = f.kids[sm - R, k]
                s_in = st - s_lvl + 1
                in_win = s_has & (s_in >= 0) & (s_in < c)
                nch = np.maximum(s_nchild, 1)
                top_i = int(s_nchild.max(initial=0)) if vector else fan
                rows = np.arange(krows.shape[0]) if krows.ndim == 2 else None

                def pick(table, col, rows=rows):
                    col = np.minimum(col, C - 1)
                    return table[..., col] if np.ndim(col) == 0 else \
                        (table[col] if rows is None else table[rows, col])

                for i in range(fan):
                    if i >= top_i:
                        out.append(_idle(up_kind[i]))
                        continue
                    rot = i if (reproducible or gather) else (i + s_in) % nch
                    kid = pick(krows, rot)
                    on = in_win & (kid >= 0) & (i < s_nchild)
                    if gather:
                        out.append(child(recv, on, kid, child_lo[sm - R, k, i], child_n[sm - R, k, i]))
                    elif mode == "broadcast":
                        out.append(child(recv, on & pick(child_path[sm - R, k], rot), kid, base[s_tr] + s_in))
                    else:
                        out.append(child(up_kind[i], on, kid, base[s_tr] + s_in))
            else:
                out += [_idle(up_kind[i]) for i in range(fan)]
            s_up = tt - lvl
            on = has & (par >= 0) & (s_up >= 0) & (s_up < c)
            if mode == "broadcast":
                on &= path_k[k][mm]
            out.append(own(send, on, par, *(rng_up if gather else (base[tr] + s_up, 1))))
            # down
            if multicast:
                s_rx = tt - 2 * L + lvl + 1
            else:
                q, r = np.divmod(tt - L - (L - lvl - 1) * U - pos_k[k][mm], U)
                s_rx = np.where(r == 0, q, -1)
            on = has & (par >= 0) & (s_rx >= 0) & (s_rx < c)
            if mode == "reduce":
                on &= path_k[k][mm]
            elif mode == "broadcast":
                on &= ~path_k[k][mm]
            out.append(own(recv, on, par, *(rng_down if gather else (base[tr] + s_rx, 1))))
            if fan and sm is not None and (not vector or nchild_max[k] > 0):
                if gather:
                    s_rng = (whole_lo[s_tr], whole_hi[s_tr] - whole_lo[s_tr])
                for i in range(fan):
                    if i >= top_i:
                        out.append(_idle(send))
                        continue
                    kid = krows[..., i]
                    if multicast:
                        s_tx = st - 2 * s_L + s_lvl
                    else:
                        q, r = np.divmod(st - s_L - (s_L - s_lvl) * U - i, U)
                        s_tx = np.where(r == 0, q, -1)
                    on = s_has & (kid >= 0) & (s_tx >= 0) & (s_tx < c)
                    if mode == "reduce":
                        on &= child_path[sm - R, k, i]
                    elif mode == "broadcast":
                        on &= ~child_path[sm - R, k, i]
                    out.append(child(send, on, kid, *(s_rng if gather else (base[s_tr] + s_tx, 1))))
            else:
                out += [_idle(send) for _ in range(fan)]
        return out

    if multicast and len(set(f.depths)) == 1:
        return Phase(name, f.members[None, :], table, pipeline_rounds(slots, 2 * Lmax, c, name))
    rounds = c + 2 * Lmax - 1 if multicast else Lmax + (Lmax + c - 1) * U
    return Phase(name, f.members[None, :], table, [Round(slots, repeats=rounds, name=name)])


# -- SHARP refusals ---------------------------------------------------------------------------------------------
SAT_LOCKS = ("granted", "busy", "denied")


def sharp_plan(topology, trees_for, *, nbytes: int, op: str, dtype, domains: int, trees_in_use: int,
               sat_lock: str, chunks: int | None, notes: list[str]) -> tuple[dict, str | None]:
    """Decide whether SHARP serves a call whose trees carry `nbytes` each, and how (protocol, chunks).

    Returns (params, refusal reason or None). `trees_for()` builds the trees (it may raise: no tree).
    """
    sh = topology.sharp
    if sat_lock not in SAT_LOCKS:
        raise ValueError(f"sat_lock must be one of {', '.join(SAT_LOCKS)}, got {sat_lock!r}")
    if not isinstance(trees_in_use, (int, np.integer)) or trees_in_use < 0:
        raise ValueError(f"trees_in_use must be an integer >= 0, got {trees_in_use!r}")
    plan: dict = {}
    if not sh.enabled or getattr(topology, "levels", 0) == 0:
        return plan, "no tree: " + (sh.refusal(op, dtype) or "the cluster has no fabric")
    reason = sh.refusal(op, dtype)
    if reason:
        return plan, reason
    if domains < sh.min_nodes:
        return plan, (f"group below the size threshold: {domains} node(s) (domains) < sharp_min_nodes="
                      f"{sh.min_nodes}")
    try:
        trees = trees_for()
    except ValueError as e:
        return plan, f"no tree: {e}"
    protocol = sh.protocol(nbytes)
    if protocol == "sat":
        limit_reason = _sat_limit(topology, trees)
        if sat_lock == "denied":
            return plan, "SAT lock denied: the aggregation tree is locked by another job"
        if sat_lock == "busy":
            notes.append("SAT lock failed (tree busy): streaming aggregation not available, running LLT")
            protocol = "llt"
        elif limit_reason:
            notes.append(f"SAT limit: {limit_reason}; running LLT")
            protocol = "llt"
    limit = sh.sat_trees if protocol == "sat" else sh.llt_trees
    if trees_in_use + len(trees) > limit:
        return plan, (f"quota: {len(trees)} {protocol.upper()} tree(s) needed, {trees_in_use} of the subnet's "
                      f"{limit} already in use")
    if protocol == "llt":
        osts = max(1, -(-nbytes // sh.ost_size))
        stages = 2 * max(t.depth for t in trees)
        per_round = max(1, sh.ost_quota // stages)  # at most ost_quota OSTs in flight along the pipeline
        auto = -(-osts // per_round)
        plan.update(protocol="llt", ost_size=sh.ost_size, ost_quota=sh.ost_quota, osts=osts,
                    osts_per_chunk=per_round)
    else:
        ops_ = max(1, -(-nbytes // SAT_MAX_BYTES))
        auto = max(ops_, 4 * 2 * max(t.depth for t in trees))  # streaming: deep pipeline
        plan.update(protocol="sat", sat_operations=ops_, sat_lock=sat_lock)
    plan["chunks"] = int(chunks) if chunks is not None else int(auto)
    if plan["chunks"] < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    plan["trees"] = trees
    return plan, None


def _sat_limit(topology, trees) -> str | None:
    sh = topology.sharp
    if sh.max_sat_flows is not None and len(trees) > sh.max_sat_flows:
        return f"{len(trees)} SAT flows needed, {sh.generation} runs at most {sh.max_sat_flows} in parallel"
    if sh.sat_scope == "switch" and len(trees) > 1:
        sw = np.concatenate([t.switches for t in trees])
        if np.unique(sw).size < sw.size:
            return f"one active SAT tree per switch ({sh.generation}), and the trees share switches"
    return None


__all__ = ["Forest", "build_forest", "check_topology", "fall_back", "fallback_schedule", "finish", "forest_phase", "itemsize",
           "nvls_allgather_phase", "nvls_allreduce_phase", "nvls_groups", "nvls_reduce_scatter_phase",
           "sharp_plan"]
