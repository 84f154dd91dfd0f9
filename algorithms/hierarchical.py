"""Hierarchical: reduce inside each scale-up domain, across domains shard by shard, then back inside the domain.

Vocabulary. D domains of G GPUs; GPU j of domain d is rank d*G + j. The buffer is cut into G *shards*, shard j
owned by the GPUs with local index j (one per domain: the *inter group* j, which sits on rail j of a
rail-aligned fabric). Three phases, each a parameter:

* allreduce: intra reduce-scatter (GPU j of every domain gets shard j reduced over its domain) -> inter
  allreduce of shard j over inter group j (every group at once, each on its own shard) -> intra allgather.
  Default: NVLS reduce-scatter -> SHARP allreduce of each shard over its rail's aggregation tree -> NVLS
  allgather (NCCL's multi-node NVLS, src/graph/connect.cc). Only 1/G of the buffer crosses the fabric.
* reduce_scatter (rank r's output is block r of p blocks of k): shard j is blocks [j*D, (j+1)*D). Intra
  reduce-scatter -> inter reduce-scatter of shard j (member d of group j gets block j*D + d) -> *transpose*:
  the GPU holding block b sends it to rank b (one message of k elements, none where holder == owner).
  Intra first keeps the fabric traffic at 1/G of an inter-first split; the transpose costs k per GPU.
  Inter algorithms without a reduce-scatter (sharp, double_binary_tree) allreduce the shard instead.
* allgather: the mirror image: transpose (rank b's block to the GPU that owns it in shard b // D) -> inter
  allgather of shard j (sharp: gathered up the rail's tree, multicast down) -> intra allgather.

intra in {nvls, ring}; inter in {sharp, ring, double_binary_tree, rabenseifner} (rabenseifner's allgather
half is recursive doubling). Refusals of NVLS (op/dtype) or SHARP (see sharp.py) turn that phase into the
host `fallback`, with the reason in schedule.notes and params["fallback_reason"].
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, send, split_points
from collectives.topology.capabilities import dtype_name

from ._innetwork import (
    build_forest,
    check_topology,
    fall_back,
    finish,
    forest_phase,
    itemsize,
    nvls_allgather_phase,
    nvls_groups,
    nvls_reduce_scatter_phase,
    sharp_plan,
)
from .double_binary_tree import dbt_rounds, double_binary_tree
from .rabenseifner import halving_round
from .recursive_doubling import doubling_allgather_round, fold_layout, pair_phase, super_block_start
from .ring import ring_allgather_phase, ring_reduce_scatter_phase
from .sharp import sharp_options

INTRA = ("nvls", "ring")
INTER = ("sharp", "ring", "double_binary_tree", "rabenseifner")
HOST_INTER = ("ring", "double_binary_tree", "rabenseifner")


def transpose_phase(p: int, D: int, G: int, work: int, to_owner: bool) -> Phase:
    """Rank m = d*G + j holds block held(m) = j*D + d after the inter phase; holder(b) inverts it."""

    def slots(m, t):
        held = (m % G) * D + m // G
        holder = (m % D) * G + m // D
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
    odd_blocks = ChunkTable(off_e + np.tile(pairs[:, 1], G) * k, np.full(G * e, k, np.int64), 1)
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


@register("hierarchical", ("allreduce", "reduce_scatter", "allgather"), needs_topology=True,
          summary="intra-domain reduce-scatter (nvls|ring) -> inter-domain phase per shard over its rail "
                  "(sharp|ring|double_binary_tree|rabenseifner) -> intra-domain allgather")
def build_hierarchical(collective: str, world_size: int, count: int, *, root=None, topology=None,
                       dtype="float32", op: str = "sum", intra: str = "nvls", inter: str = "sharp",
                       chunks: int = 1, inter_chunks: int | None = None, fallback: str = "ring",
                       result: str | None = None, reproducible: bool = True, accumulator: str | None = None,
                       trees_in_use: int = 0, sat_lock: str = "granted") -> Schedule:
    check_topology("hierarchical", topology, world_size)
    if intra not in INTRA:
        raise ValueError(f"intra must be one of {', '.join(INTRA)}, got {intra!r}")
    if inter not in INTER:
        raise ValueError(f"inter must be one of {', '.join(INTER)}, got {inter!r}")
    if fallback not in HOST_INTER:
        raise ValueError(f"fallback must be one of {', '.join(HOST_INTER)}, got {fallback!r}")
    c = check_chunks("hierarchical", chunks)
    D, G, p = topology.num_domains, topology.gpus_per_domain, world_size
    reducing = collective != "allgather"
    work = count * p if collective == "allgather" else count
    k = count // p if collective == "reduce_scatter" else count  # block size of the contract
    notes: list[str] = []
    params: dict = {"intra": intra, "inter": inter, "chunks": c, "dtype": dtype_name(dtype), "op": op}
    reasons: list[str] = []

    # -- intra: NVLS or ring, in every domain at once ----------------------------------------------------------
    intra_used = intra
    if intra == "nvls":
        reason = topology.nvls.refusal(op, dtype) if reducing else topology.nvls.refusal("sum", "float32")
        if reason:
            fall_back("NVLS (intra)", reason, "ring", notes)
            reasons.append(reason)
            intra_used = "ring"
    dom = topology.domain_groups()
    intra_table = ChunkTable.whole(work, G, c, groups=D)
    switches: list[np.ndarray] = []

    def intra_phase(kind: str) -> list[Phase]:
        if G == 1:
            return []
        if intra_used == "nvls":
            switches.append(topology.nvswitches())
            make = nvls_reduce_scatter_phase if kind == "reduce-scatter" else nvls_allgather_phase
            return [make(f"NVLS {kind}", nvls_groups(topology), intra_table)]
        if kind == "reduce-scatter":
            return [ring_reduce_scatter_phase("ring reduce-scatter (intra)", dom, intra_table, c, -1)]
        return [ring_allgather_phase("ring allgather (intra)", dom, intra_table, c, 0)]

    # -- inter: shard j over inter group j (the GPUs of local index j), all groups at once --------------------
    groups = dom.T.copy()  # (G, D)
    j = np.arange(G, dtype=np.int64)
    off = split_points(work, G, j)
    length = split_points(work, G, j + 1) - off
    kind = {"allreduce": "allreduce", "reduce_scatter": "reduce_scatter", "allgather": "allgather"}[collective]
    inter_used = inter if D > 1 else "none (one domain)"
    inter_phases: list[Phase] = []
    if D > 1 and inter == "sharp":
        shard_bytes = int(length.max(initial=0)) * itemsize(dtype)
        options = sharp_options(topology, dtype, result, accumulator, reproducible)

        def trees():
            return [topology.sharp_tree(ranks=groups[i], port=int(topology.rank_rail(int(groups[i, 0]))))
                    for i in range(G)]

        plan, reason = sharp_plan(topology, trees, nbytes=shard_bytes, op=op if reducing else "sum",
                                  dtype=dtype if reducing else "float32", domains=D, trees_in_use=trees_in_use,
                                  sat_lock=sat_lock, chunks=inter_chunks if kind != "allgather" else 1,
                                  notes=notes)
        if reason:
            fall_back("SHARP (inter)", reason, fallback, notes)
            reasons.append(reason)
            inter_used = fallback
        else:
            forest = build_forest(plan.pop("trees"))
            switches.append(forest.switches)
            multicast = options["result"] == "multicast"
            if kind == "allgather":
                plan["chunks"] = 1
                rank_chunk = (forest.ranks % G) * D + forest.ranks // G
                inter_phases = [forest_phase("SHARP allgather", forest, ChunkTable.whole(work, p), "gather", 1,
                                             rank_chunk=rank_chunk, multicast=multicast)]
            else:
                ci = plan["chunks"] if inter_chunks is not None else min(plan["chunks"],
                                                                          max(int(length.min(initial=0)), 1))
                plan["chunks"] = ci
                if kind == "reduce_scatter":
                    notes.append("SHARP has no reduce-scatter: each shard is allreduced over its tree and every "
                                 "GPU keeps its block")
                inter_phases = [forest_phase("SHARP allreduce", forest, ChunkTable.whole(work, G, ci),
                                             "allreduce", ci, tree_chunk0=j * ci, multicast=multicast,
                                             reproducible=options["reproducible"])]
            params.update({f"sharp_{key}": v for key, v in plan.items()})
            params.update(options)
    if D > 1 and inter_used in HOST_INTER:
        ci = c if inter_chunks is None else int(inter_chunks)
        if inter_used == "double_binary_tree" and kind != "allreduce":
            if kind == "allgather":
                notes.append("double_binary_tree has no allgather: shards are allgathered with ring")
            else:
                notes.append("double_binary_tree has no reduce-scatter: each shard is allreduced and every GPU "
                             "keeps its block")
        inter_kind = "allreduce" if (kind == "reduce_scatter" and inter_used == "double_binary_tree") else kind
        inter_phases = _host_inter(inter_used, inter_kind, groups, off, length, k, ci)

    phases: list[Phase] = []
    transpose = [transpose_phase(p, D, G, work, collective == "reduce_scatter")] if D > 1 and G > 1 else []
    if collective == "allreduce":
        phases = intra_phase("reduce-scatter") + inter_phases + intra_phase("allgather")
    elif collective == "reduce_scatter":
        phases = intra_phase("reduce-scatter") + inter_phases + transpose
    else:
        phases = transpose + inter_phases \
            + intra_phase("allgather")
    params.update(intra_used=intra_used, inter_used=inter_used)
    if reasons:
        params["fallback_reason"] = "; ".join(reasons)
    sched = Schedule("hierarchical", collective, p, count, phases, params=params, notes=notes)
    finish(sched, topology, np.concatenate(switches) if switches else ())
    return sched
