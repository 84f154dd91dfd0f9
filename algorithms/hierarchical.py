"""Hierarchical: reduce inside each scale-up domain, across domains shard by shard, then back inside the domain.

Vocabulary. D domains of G GPUs; GPU j of domain d is rank d*G + j. The buffer is cut into G *shards*, shard j
owned by the GPUs with local index j (one per domain: the *inter group* j, which sits on rail j of a
rail-aligned fabric). Three stages, each a parameter:

* allreduce: intra reduce-scatter (GPU j gets shard j reduced over its domain) -> inter allreduce of shard j
  over inter group j (every group at once, each on its own shard) -> intra allgather. Default: NVLS
  reduce-scatter -> SHARP allreduce of each shard over its rail's aggregation tree -> NVLS allgather (NCCL's
  multi-node NVLS, src/graph/connect.cc). Only 1/G of the buffer crosses the fabric. With inter sharp (results
  by multicast) or double_binary_tree the three stages are *pipelined*: the buffer is cut into pieces that
  stream through all three one round apart (_hierarchy.py), so the fabric's time hides behind NVLink's, as
  NCCL's NVLS and NVLSTree kernels do; with inter ring or rabenseifner they run one after another (and
  pipeline each stage only with an explicit `chunks`).
* reduce_scatter (rank r's output is block r of p blocks of k): shard j is blocks [j*D, (j+1)*D). Intra
  reduce-scatter -> inter reduce-scatter of shard j (member d of group j gets block j*D + d) -> *transpose*:
  the GPU holding block b sends it to rank b (one message of k elements, none where holder == owner).
  Intra first keeps the fabric traffic at 1/G of an inter-first split; the transpose costs k per GPU.
  Inter algorithms without a reduce-scatter (sharp, double_binary_tree) allreduce the shard instead.
* allgather: the mirror image: transpose (rank b's block to the GPU that owns it in shard b // D) -> inter
  allgather of shard j (sharp: gathered up the rail's tree, multicast down) -> intra allgather.

intra in {nvls, ring}; inter in {sharp, ring, double_binary_tree, rabenseifner} (rabenseifner's allgather
half is recursive doubling). Refusals of NVLS (op/dtype) or SHARP (see sharp.py) turn that stage into the
host `fallback`, with the reason in schedule.notes and params["fallback_reason"]. `chunks` (pieces) of the
pipelined allreduce defaults to NCCL's chunking on clusters that run its runtime, else 1.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, send, split_points
from collectives.topology.capabilities import dtype_name

from ._hierarchy import (
    Shards,
    inter_allreduce,
    intra_allgather,
    intra_reduce_scatter,
    members,
    nvls_rows,
    rail_trees,
)
from ._innetwork import check_topology, fall_back, finish, itemsize, runtime_pieces, sharp_plan
from ._pipeline import memo, pipelined_phase
from ._uneven import holders_phase, serves_uneven
from .double_binary_tree import dbt_rounds, double_binary_tree
from .nvls import nvls_phase
from .rabenseifner import halving_round
from .recursive_doubling import doubling_allgather_round, fold_layout, pair_phase, super_block_start
from .ring import ring_allgather_phase, ring_reduce_scatter_phase
from .sharp import allreduce_lanes, build_forest, climb_lanes, descent_lanes, sharp_options

INTRA = ("nvls", "ring")
INTER = ("sharp", "ring", "double_binary_tree", "rabenseifner")
HOST_INTER = ("ring", "double_binary_tree", "rabenseifner")
STAGE_NAMES = {"nvls": "NVLS", "sharp": "SHARP", "double_binary_tree": "double binary tree",
               "none (one domain)": "no inter-domain"}
# the latency class (NCCL's tables, topology/runtime.py) of each (intra, inter) pair
CLASS = {("nvls", "sharp"): "nvls", ("nvls", "double_binary_tree"): "nvls_tree", ("ring", "sharp"): "collnet_chain",
         ("ring", "double_binary_tree"): "tree"}


def held_blocks(dom: np.ndarray, p: int | None = None) -> np.ndarray:
    """Per rank (of p, default D*G): the block it holds after the inter phase, j*D + d for the GPU of local index
    j in domain d (`dom`: the (D, G) domain table, every slot filled; ranks outside it hold -1)."""
    D, G = dom.shape
    held = np.full(D * G if p is None else p, -1, np.int64)
    held[dom.ravel()] = (np.arange(G, dtype=np.int64)[None, :] * D + np.arange(D, dtype=np.int64)[:, None]).ravel()
    return held


def transpose_phase(p: int, dom: np.ndarray, work: int, to_owner: bool) -> Phase:
    """Rank m holds block held(m) after the inter phase (held_blocks); holder(b) inverts it. Without a
    placement rank m = d*G + j and held(m) = j*D + d."""
    held_of = held_blocks(dom)
    holder_of = np.empty_like(held_of)
    holder_of[held_of] = np.arange(p, dtype=np.int64)

    def slots(m, t):
        held = held_of[m]
        holder = holder_of[m]
        if to_owner:
            return [send(np.where(held != m, held, -1), held), recv(np.where(holder != m, holder, -1), m)]
        return [send(np.where(holder != m, holder, -1), m), recv(np.where(held != m, held, -1), held)]

    name = "transpose (blocks to owners)" if to_owner else "transpose (blocks to shard holders)"
    return Phase(name, np.arange(p, dtype=np.int64)[None, :], ChunkTable.whole(work, p),
                 [Round(slots, repeats=1, uniform=True, name=name)])


def _host_inter(algo: str, kind: str, groups: np.ndarray, off: np.ndarray, length: np.ndarray, k: int,
                c: int) -> list[Phase]:
    """Host algorithm `algo` doing `kind` (allreduce / reduce_scatter / allgather) of shard j in group j.

    For reduce_scatter and allgather the shard is D blocks of k elements, member d's block being block d."""
    G, D = groups.shape
    if algo == "ring" or (algo == "double_binary_tree" and kind == "allgather"):
        table = ChunkTable(off, length, D, c)
        if kind == "allreduce":
            return [ring_reduce_scatter_phase("ring reduce-scatter (inter)", groups, table, c, 0),
                    ring_allgather_phase("ring allgather (inter)", groups, table, c, 1)]
        if kind == "reduce_scatter":
            return [ring_reduce_scatter_phase("ring reduce-scatter (inter)", groups, table, c, -1)]
        return [ring_allgather_phase("ring allgather (inter)", groups, table, c, 0)]
    if algo == "double_binary_tree":
        return [Phase("double binary tree (inter)", groups, ChunkTable(off, length, 2, c),
                      dbt_rounds(double_binary_tree(D), c))]
    core_size, e, pairs, core = fold_layout(D)
    steps = core_size.bit_length() - 1
    pair_nodes = groups[:, pairs].reshape(G * e, 2)
    off_e, len_e = np.repeat(off, e), np.repeat(length, e)
    odd = np.tile(pairs[:, 1], G)  # the odd member's part of the shard (block k·odd when the shard is D blocks)
    odd_start = split_points(len_e, D, odd)
    odd_blocks = ChunkTable(off_e + odd_start, split_points(len_e, D, odd + 1) - odd_start, 1)
    whole = ChunkTable(off_e, len_e, 1)
    phases = []
    if kind == "allgather":
        if e:
            phases.append(pair_phase("recursive doubling fold (inter)", pair_nodes, odd_blocks, 1, False))
        phases.append(Phase("recursive doubling (inter)", groups[:, core], ChunkTable(off, length, D),
                            [doubling_allgather_round(steps, super_block_start(e))]))
        if e:
            phases.append(pair_phase("recursive doubling unfold (inter)", pair_nodes, whole, 0, False))
        return phases
    if e:
        phases.append(pair_phase("rabenseifner fold (inter)", pair_nodes, whole, 1, True))
    if kind == "allreduce":
        phases.append(Phase("rabenseifner halving-doubling (inter)", groups[:, core],
                            ChunkTable(off, length, core_size),
                            [halving_round(core_size, steps, lambda c_: c_),
                             doubling_allgather_round(steps, lambda c_: c_)]))
        if e:
            phases.append(pair_phase("rabenseifner unfold (inter)", pair_nodes, whole, 0, False))
    else:
        phases.append(Phase("rabenseifner recursive halving (inter)", groups[:, core], ChunkTable(off, length, D),
                            [halving_round(core_size, steps, super_block_start(e))]))
        if e:
            phases.append(pair_phase("rabenseifner unfold (inter)", pair_nodes, odd_blocks, 0, False))
    return phases


def sharp_phase(topology, kind: str, trees: list, work: int, chunks: int, multicast: bool) -> tuple[Phase, object]:
    """The SHARP stage alone: allreduce of shard j over rail j's tree (chunk j·chunks + piece), or the
    allgather's gather (each switch stores its children's adjacent blocks; the root's shard comes down). The
    gather's chunk j·D + d is part d of shard j (the block j·D + d when p = D·G; on uneven domains' core, p >
    D·G and a part spans several blocks)."""
    D, G, p = topology.num_domains, topology.gpus_per_domain, topology.world_size
    forest = build_forest(trees)
    if kind == "gather":
        # after the transpose rank d·G + j holds block j·D + d; a switch's range: its children's, adjacent
        lo, hi = _gather_ranges(forest, held_blocks(topology.domain_groups(), p))
        up = lambda k, v: (lo[v], hi[v] - lo[v])  # noqa: E731
        down = lambda k, v: (forest.tree[v] * D, D)  # noqa: E731
        lanes = climb_lanes(forest, up, reduce=False) + descent_lanes(forest, down, multicast=multicast)
        return pipelined_phase("SHARP allgather", forest.members, ChunkTable.whole(work, G, D), lanes, 1), forest
    data = lambda k, v: (forest.tree[v] * chunks + k, 1)  # noqa: E731
    lanes = allreduce_lanes(forest, data, multicast=multicast)
    return pipelined_phase("SHARP allreduce", forest.members, ChunkTable.whole(work, G, chunks), lanes,
                           chunks), forest


def _gather_ranges(forest, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per vertex: the block range [lo, hi) it holds in the gather (ranks: their block; switches: the union of
    their children's, which must be adjacent)."""
    f = forest
    lo = np.zeros(f.member.size, np.int64)
    hi = np.zeros(f.member.size, np.int64)
    ranks = f.level == 0
    node = f.members[f.member[ranks]]
    lo[ranks] = held[node]
    hi[ranks] = lo[ranks] + 1
    for level in range(1, int(f.level.max(initial=0)) + 1):
        kids = np.flatnonzero(f.level == level - 1)
        kids = kids[f.parent[kids] >= 0]
        top = np.flatnonzero(f.level == level)
        lo[top], hi[top] = np.iinfo(np.int64).max, -1
        np.minimum.at(lo, f.parent[kids], lo[kids])
        np.maximum.at(hi, f.parent[kids], hi[kids])
        span = np.zeros(f.member.size, np.int64)
        np.add.at(span, f.parent[kids], hi[kids] - lo[kids])
        if np.any(span[top] != hi[top] - lo[top]):
            raise ValueError("the ranks under a switch do not hold adjacent blocks")
    return lo, hi


@register("hierarchical", ("allreduce", "reduce_scatter", "allgather"), needs_topology=True,
          summary="intra-domain reduce-scatter (nvls|ring) -> inter-domain stage per shard over its rail "
                  "(sharp|ring|double_binary_tree|rabenseifner) -> intra-domain allgather; pipelined")
@serves_uneven("hierarchical", allgather=True)
def build_hierarchical(collective: str, world_size: int, count: int, *, root=None, topology=None,
                       dtype="float32", op: str = "sum", intra: str = "nvls", inter: str = "sharp",
                       chunks: int | None = None, inter_chunks: int | None = None, fallback: str = "ring",
                       result: str | None = None, reproducible: bool = True, accumulator: str | None = None,
                       trees_in_use: int = 0, sat_lock: str = "granted", protocol: str = "Simple") -> Schedule:
    check_topology("hierarchical", topology, world_size)
    if intra not in INTRA:
        raise ValueError(f"intra must be one of {', '.join(INTRA)}, got {intra!r}")
    if inter not in INTER:
        raise ValueError(f"inter must be one of {', '.join(INTER)}, got {inter!r}")
    if fallback not in HOST_INTER:
        raise ValueError(f"fallback must be one of {', '.join(HOST_INTER)}, got {fallback!r}")
    D, G, p = topology.num_domains, topology.gpus_per_domain, world_size
    reducing = collective != "allgather"
    work = count * p if collective == "allgather" else count
    k = count // p if collective == "reduce_scatter" else count  # block size of the contract
    notes: list[str] = []
    params: dict = {"intra": intra, "inter": inter, "dtype": dtype_name(dtype), "op": op}
    reasons: list[str] = []

    # -- which stages run as asked: NVLS and SHARP refuse what their switches cannot reduce -------------------
    intra_used = intra
    if intra == "nvls":
        reason = topology.nvls.refusal(op, dtype) if reducing else topology.nvls.refusal("sum", "float32")
        if reason:
            fall_back("NVLS (intra)", reason, "ring", notes)
            reasons.append(reason)
            intra_used = "ring"
    # (G, D): inter group j; read only, kept across a sweep's sizes
    groups = memo(topology, ("inter groups",), lambda: topology.domain_groups().T.copy())
    j = np.arange(G, dtype=np.int64)
    off = split_points(work, G, j)
    length = split_points(work, G, j + 1) - off
    inter_used = inter if D > 1 else "none (one domain)"
    plan: dict = {}
    options = sharp_options(topology, dtype, result, accumulator, reproducible)
    if D > 1 and inter == "sharp":
        shard_bytes = int(length.max(initial=0)) * itemsize(dtype)
        plan, reason = sharp_plan(topology, lambda: rail_trees(topology), nbytes=shard_bytes,
                                  op=op if reducing else "sum", dtype=dtype if reducing else "float32", domains=D,
                                  trees_in_use=trees_in_use, sat_lock=sat_lock,
                                  chunks=inter_chunks if collective != "allgather" else 1, notes=notes)
        if reason:
            fall_back("SHARP (inter)", reason, fallback, notes)
            reasons.append(reason)
            inter_used = fallback
        else:
            params.update(options)
    cls = CLASS.get((intra_used, inter_used), "nvls" if intra_used == "nvls" else "ring")
    params["latency_class"] = cls
    pipelined = collective == "allreduce" and (inter_used in ("sharp", "double_binary_tree") or D == 1) and \
        not (inter_used == "sharp" and options["result"] == "unicast")
    if chunks is None:
        c = runtime_pieces(topology, cls if cls != "tree" else "ring", work * itemsize(dtype), protocol)
        if inter_used == "sharp" and plan.get("protocol") == "llt":  # at most the OST quota in flight per piece
            c = max(c, int(plan["chunks"]))
    else:
        c = check_chunks("hierarchical", chunks)
    params["chunks"] = c
    switches: list[np.ndarray] = []
    if intra_used == "nvls" and G > 1:
        switches.append(topology.nvswitches())

    if pipelined:
        trees = plan.pop("trees", None)
        fabric = np.concatenate([lv.switches for t in trees for lv in t.levels]) if trees else ()
        layout = Shards(c, G, 2 if inter_used == "double_binary_tree" else 1)

        def stages():  # the lanes do not depend on the size: kept across a sweep's sizes
            nodes = members(topology, intra_used == "nvls" and G > 1, fabric)
            rows = nvls_rows(topology) if intra_used == "nvls" and G > 1 else None  # both NVLS stages read them
            lanes, lag = intra_reduce_scatter(topology, intra_used, layout, 0, rows)
            more, lag = inter_allreduce(topology, inter_used, layout, lag, nodes, trees)
            lanes += more
            more, lag = intra_allgather(topology, intra_used, layout, lag, rows)
            return nodes, lanes + more

        nodes, lanes = memo(topology, ("hierarchical", intra_used, inter_used, layout.sub), stages)
        a, b = STAGE_NAMES.get(intra_used, intra_used), STAGE_NAMES.get(inter_used, inter_used)
        name = f"{a} reduce-scatter + {b} allreduce + {a} allgather, pipelined"
        phases = [pipelined_phase(name, nodes, layout.table(work), lanes, c, piece_invariant=True)]
        if trees:
            switches.append(np.asarray(fabric, np.int64))
            params.update({f"sharp_{key}": v for key, v in plan.items() if key != "chunks"})
    else:
        # stages one after another pipeline only when asked (NCCL runs no such composition to copy): one piece
        c = 1 if chunks is None else c
        params["chunks"] = c
        phases = _sequential(topology, collective, intra_used, inter_used, plan, options, work, k, c, c,
                             inter_chunks, groups, off, length, notes, switches, params)
    params.update(intra_used=intra_used, inter_used=inter_used, pipelined=pipelined)
    if reasons:
        params["fallback_reason"] = "; ".join(reasons)
    sched = Schedule("hierarchical", collective, p, count, phases, params=params, notes=notes)
    finish(sched, topology, np.concatenate(switches) if switches else ())
    return sched


def _sequential(topology, collective, intra_used, inter_used, plan, options, work, k, c, host_c, inter_chunks,
                groups, off, length, notes, switches, params) -> list[Phase]:
    """The stages one after another (reduce_scatter, allgather, and allreduce over ring or rabenseifner): NVLS
    stages in `c` pieces, host ring stages in `host_c` segments."""
    D, G, p = topology.num_domains, topology.gpus_per_domain, topology.world_size
    dom = topology.domain_groups()

    def intra_phase(kind: str) -> list[Phase]:
        if G == 1:
            return []
        if intra_used == "nvls":
            return [nvls_phase(kind, topology, work, c)]
        table = ChunkTable.whole(work, G, host_c, groups=D)
        if kind == "reduce_scatter":
            return [ring_reduce_scatter_phase("ring reduce-scatter (intra)", dom, table, host_c, -1)]
        return [ring_allgather_phase("ring allgather (intra)", dom, table, host_c, 0)]

    kind = collective
    inter_phases: list[Phase] = []
    if D > 1 and inter_used == "sharp":
        trees = plan.pop("trees")
        multicast = options["result"] == "multicast"
        if kind == "allgather":
            plan["chunks"] = 1
            phase, forest = sharp_phase(topology, "gather", trees, work, 1, multicast)
        else:
            ci = plan["chunks"] if inter_chunks is not None else min(plan["chunks"],
                                                                      max(int(length.min(initial=0)), 1))
            plan["chunks"] = ci
            if kind == "reduce_scatter":
                notes.append("SHARP has no reduce-scatter: each shard is allreduced over its tree and every GPU "
                             "keeps its block")
            phase, forest = sharp_phase(topology, "allreduce", trees, work, ci, multicast)
        inter_phases = [phase]
        switches.append(forest.switches)
        params.update({f"sharp_{key}": v for key, v in plan.items()})
    if D > 1 and inter_used in HOST_INTER:
        ci = host_c if inter_chunks is None else int(inter_chunks)
        if inter_used == "double_binary_tree" and kind != "allreduce":
            if kind == "allgather":
                notes.append("double_binary_tree has no allgather: shards are allgathered with ring")
            else:
                notes.append("double_binary_tree has no reduce-scatter: each shard is allreduced and every GPU "
                             "keeps its block")
        inter_kind = "allreduce" if (kind == "reduce_scatter" and inter_used == "double_binary_tree") else kind
        if inter_used == "rabenseifner":
            inter_phases = _host_inter(inter_used, inter_kind, groups, off, length, k, ci)
        else:  # their rounds count chunks, not elements: kept across a sweep's sizes, with this size's tables
            made = memo(topology, ("host inter", inter_used, inter_kind, ci),
                        lambda: _host_inter(inter_used, inter_kind, groups, off, length, k, ci))
            inter_phases = [Phase(ph.name, ph.groups, ChunkTable(off, length, ph.chunks.blocks, ph.chunks.sub),
                                  ph.rounds) for ph in made]
    if collective == "allgather" and p != D * G:  # the core of uneven domains: extras' blocks go to holders too
        transpose = [holders_phase(p, dom, k)]
    elif collective != "allreduce" and np.any(held_blocks(dom) != np.arange(p)):  # D, G > 1 or a placement
        transpose = [transpose_phase(p, dom, work, collective == "reduce_scatter")]
    else:
        transpose = []
    if collective == "allreduce":
        return intra_phase("reduce_scatter") + inter_phases + intra_phase("allgather")
    if collective == "reduce_scatter":
        return intra_phase("reduce_scatter") + inter_phases + transpose
    return transpose + inter_phases + intra_phase("allgather")
