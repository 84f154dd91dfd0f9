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


# -- checks, labels, fallbacks --------------------------------------------------------------------------------
def check_topology(name: str, topology, world_size: int) -> None:
    if topology is None:
        raise ValueError(f"algorithm {name!r} needs a topology (collectives.topology.cluster(...) or preset(...))")
    if world_size != topology.world_size:
        raise ValueError(f"algorithm {name!r}: world_size={world_size} but the topology {topology.name!r} has "
                         f"{topology.world_size} GPUs; build with world_size=topology.world_size")


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
    """Aggregation trees as per-(member, vertex slot) arrays; see the module docstring."""

    members: np.ndarray  # (M,) node ids, ranks first
    ranks: np.ndarray  # rank node ids (members[:len(ranks)])
    level: np.ndarray  # (M, V) level of the vertex, -1 where member m has no slot k
    tree: np.ndarray  # (M, V)
    top: np.ndarray  # (M, V) depth L of the vertex's tree
    parent: np.ndarray  # (M, V) member index of the parent, -1 at roots
    children: np.ndarray  # (M, V, C) member indices, -1 padded
    nchild: np.ndarray  # (M, V)
    child_pos: np.ndarray  # (M, V) this vertex's index among its parent's children
    depths: list[int]
    switches: np.ndarray  # switch node ids used

    @property
    def fanout(self) -> int:
        return int(max(self.children.shape[2], 1))

    def member_of(self, nodes) -> np.ndarray:
        return np.searchsorted(self.members, np.asarray(nodes, dtype=np.int64))


def build_forest(trees: list) -> Forest:
    ranks = np.sort(np.concatenate([t.ranks for t in trees]))
    if np.any(ranks[1:] == ranks[:-1]):
        raise ValueError("a rank can take part in one aggregation tree of a phase only")
    switches = np.unique(np.concatenate([t.switches for t in trees]))
    members = np.concatenate([ranks, switches])
    M = members.size
    member_of = lambda nodes: np.searchsorted(members, nodes)  # noqa: E731
    count = np.zeros(M, np.int64)
    for t in trees:
        count[member_of(t.switches)] += 1
    V = int(max(1, count.max(initial=0)))
    C = int(max([lv.children.shape[1] for t in trees for lv in t.levels] + [1]))
    level = np.full((M, V), -1, np.int64)
    tree_of = np.full((M, V), -1, np.int64)
    top = np.zeros((M, V), np.int64)
    parent = np.full((M, V), -1, np.int64)
    children = np.full((M, V, C), -1, np.int64)
    nchild = np.zeros((M, V), np.int64)
    child_pos = np.zeros((M, V), np.int64)
    used = np.zeros(M, np.int64)
    for ti, t in enumerate(trees):
        rm = member_of(t.ranks)
        level[rm, 0], tree_of[rm, 0], top[rm, 0] = 0, ti, t.depth
        slot_of = {}  # switch member -> its vertex slot in this tree
        for lv in t.levels:
            sm = member_of(lv.switches)
            sk = used[sm]
            used[sm] += 1
            slot_of.update(zip(sm.tolist(), sk.tolist(), strict=True))
            level[sm, sk], tree_of[sm, sk], top[sm, sk] = lv.level, ti, t.depth
            kids = lv.children
            valid = kids >= 0
            nchild[sm, sk] = valid.sum(axis=1)
            km = np.where(valid, member_of(np.where(valid, kids, 0)), -1)
            children[sm, sk, :kids.shape[1]] = km
            rows, cols = np.nonzero(valid)
            kmem = km[rows, cols]
            kslot = np.zeros(kmem.size, np.int64) if lv.level == 1 else \
                np.array([slot_of[int(x)] for x in kmem.tolist()], np.int64)
            if lv.level > 1:
                assert np.all(level[kmem, kslot] == lv.level - 1), "SHARP trees are balanced"
            parent[kmem, kslot] = sm[rows]
            child_pos[kmem, kslot] = cols
    return Forest(members, ranks, level, tree_of, top, parent, children, nchild, child_pos,
                  [t.depth for t in trees], switches)


def forest_phase(name: str, forest: Forest, table: ChunkTable, mode: str, chunks: int, *,
                 tree_chunk0=None, rank_chunk=None, multicast: bool = True, reproducible: bool = True,
                 root: int | None = None) -> Phase:
    """One phase running every tree of `forest` at once.

    mode "allreduce": tree t reduces chunks [tree_chunk0[t], + chunks) up and returns them down;
    "reduce" / "broadcast": as allreduce, but only toward / from rank node `root` (the path's switches
    relay); "gather": every rank's chunk rank_chunk[rank] goes up (switches store their subtree's range,
    which must be contiguous), and the root's range comes down (chunks must be 1).
    """
    f, c = forest, int(chunks)
    M, V = f.level.shape
    C = f.fanout
    U = C if not multicast else 1
    Lmax = max(f.depths)
    is_switch = np.arange(M) >= f.ranks.size
    lo = np.zeros((M, V), np.int64)
    hi = np.zeros((M, V), np.int64)
    if mode == "gather":
        assert c == 1
        lo[: f.ranks.size, 0] = rank_chunk
        hi[: f.ranks.size, 0] = np.asarray(rank_chunk) + 1
        for lvl in range(1, Lmax + 1):  # a subtree's range: its children's, which must be adjacent
            at = np.argwhere(f.level == lvl)
            for m, k in at.tolist():
                kids = f.children[m, k, : f.nchild[m, k]]
                klo = np.array([lo[x, _slot(f, x, f.tree[m, k])] for x in kids.tolist()])
                khi = np.array([hi[x, _slot(f, x, f.tree[m, k])] for x in kids.tolist()])
                if khi.sum() - klo.sum() != khi.max() - klo.min():
                    raise ValueError("the ranks under a switch do not hold adjacent blocks")
                lo[m, k], hi[m, k] = klo.min(), khi.max()
        base = np.zeros(len(f.depths), np.int64)
    else:
        base = np.asarray(tree_chunk0, dtype=np.int64)
    path = np.zeros((M, V), bool)  # vertices whose subtree holds `root`
    if root is not None:
        m, k = int(f.member_of([root])[0]), 0
        while m >= 0:
            path[m, k] = True
            p = int(f.parent[m, k])
            k = _slot(f, p, f.tree[m, k]) if p >= 0 else 0
            m = p
    # per (member, slot): the data range of chunk s is [first + s, first + s + n)
    whole_lo = np.zeros(len(f.depths), np.int64)
    whole_hi = np.zeros(len(f.depths), np.int64)
    if mode == "gather":
        for ti in range(len(f.depths)):
            sel = f.tree[: f.ranks.size, 0] == ti
            whole_lo[ti], whole_hi[ti] = lo[: f.ranks.size, 0][sel].min(), hi[: f.ranks.size, 0][sel].max()
    child_lo = np.zeros(f.children.shape, np.int64)
    child_n = np.zeros_like(child_lo)
    child_path = np.zeros(f.children.shape, bool)
    if mode == "gather" or root is not None:
        for m, k, i in np.argwhere(f.children >= 0).tolist():
            x = int(f.children[m, k, i])
            xk = _slot(f, x, f.tree[m, k])
            child_lo[m, k, i], child_n[m, k, i] = lo[x, xk], hi[x, xk] - lo[x, xk]
            child_path[m, k, i] = path[x, xk]

    nslots = (f.level >= 0).sum(axis=1)

    def slots(m, t):
        m, t = np.asarray(m), np.asarray(t)
        out = []
        scalar = np.ndim(m) == 0  # one member: only its own vertices' lanes, child lanes only on switches
        for k in range(int(nslots[m]) if scalar else V):
            lvl, L, tr = f.level[m, k], f.top[m, k], np.maximum(f.tree[m, k], 0)
            has = lvl >= 0
            par = f.parent[m, k]
            nch = np.maximum(f.nchild[m, k], 1)
            sw = is_switch[m] & has
            if mode == "gather":
                rng_up = (lo[m, k], hi[m, k] - lo[m, k])
                rng_down = (whole_lo[tr], whole_hi[tr] - whole_lo[tr])
            # up: children send chunk s in round s + lvl - 1, I send it in round s + lvl
            s_in = t - lvl + 1
            fan = 0 if scalar and not is_switch[m] else C
            for i in range(fan):
                rot = i if (reproducible or mode == "gather") else (i + s_in) % nch
                kid = f.children[m, k, np.minimum(rot, C - 1)]
                on = sw & (kid >= 0) & (i < f.nchild[m, k]) & (s_in >= 0) & (s_in < c)
                if mode == "gather":
                    out.append(recv(_on(on, kid), child_lo[m, k, i], child_n[m, k, i]))
                elif mode == "broadcast":
                    out.append(recv(_on(on & child_path[m, k, rot], kid), base[tr] + s_in))
                else:
                    kind = recv if i == 0 else recv_reduce
                    out.append(kind(_on(on, kid), base[tr] + s_in))
            s_up = t - lvl
            on = has & (par >= 0) & (s_up >= 0) & (s_up < c)
            if mode == "broadcast":
                on &= path[m, k]
            out.append(send(_on(on, par), *(rng_up if mode == "gather" else (base[tr] + s_up, 1))))
            # down
            if multicast:
                s_rx = t - 2 * L + lvl + 1
            else:
                q, r = np.divmod(t - L - (L - lvl - 1) * U - f.child_pos[m, k], U)
                s_rx = np.where(r == 0, q, -1)
            on = has & (par >= 0) & (s_rx >= 0) & (s_rx < c)
            if mode == "reduce":
                on &= path[m, k]
            elif mode == "broadcast":
                on &= ~path[m, k]
            out.append(recv(_on(on, par), *(rng_down if mode == "gather" else (base[tr] + s_rx, 1))))
            for i in range(fan):
                kid = f.children[m, k, i]
                if multicast:
                    s_tx = t - 2 * L + lvl
                else:
                    q, r = np.divmod(t - L - (L - lvl) * U - i, U)
                    s_tx = np.where(r == 0, q, -1)
                on = sw & (kid >= 0) & (s_tx >= 0) & (s_tx < c)
                if mode == "reduce":
                    on &= child_path[m, k, i]
                elif mode == "broadcast":
                    on &= ~child_path[m, k, i]
                out.append(send(_on(on, kid), *(rng_down if mode == "gather" else (base[tr] + s_tx, 1))))
        return out

    if multicast and len(set(f.depths)) == 1:
        return Phase(name, f.members[None, :], table, pipeline_rounds(slots, 2 * Lmax, c, name))
    rounds = c + 2 * Lmax - 1 if multicast else Lmax + (Lmax + c - 1) * U
    return Phase(name, f.members[None, :], table, [Round(slots, repeats=rounds, name=name)])


def _slot(f: Forest, m: int, tree: int) -> int:
    k = np.flatnonzero(f.tree[m] == tree)
    return int(k[0])


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


__all__ = ["Forest", "build_forest", "check_topology", "fall_back", "finish", "forest_phase", "itemsize",
           "nvls_allgather_phase", "nvls_allreduce_phase", "nvls_groups", "nvls_reduce_scatter_phase",
           "sharp_plan"]
