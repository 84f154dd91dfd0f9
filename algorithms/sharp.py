"""SHARP (flat): every rank through one aggregation tree of the fat-tree's switches.

Vocabulary (shared with _innetwork.py). The *tree* is `topology.sharp_tree()` over all ranks: leaves are the
leaf switches holding the ranks' NICs, each higher level one switch per group of children, up to one *root*
switch. The buffer is cut into `chunks` *segments* that stream through the tree one level per round.

* allreduce: every rank sends its buffer (D) to its leaf; each switch reduce-receives all its children's
  copies of a segment in one round (one fused reduction, children in a fixed order) and sends one result up;
  the root's result comes back down by multicast (each switch sends the same segment to all its children in
  one round) or by unicast (the aggregation node emits one copy per child, one child per round). Each rank
  sends D and receives D, against 2(p-1)/p·D each way for a ring.
* reduce: the same up pass; the result goes down only along the path to the root rank.
* broadcast: the root's data climbs its path to the tree's root and comes down to every other rank.

The protocol follows the size (topology.sharp.protocol): LLT below the SAT threshold, with segments of at
most ost_quota / (pipeline stages) outstanding transactions of ost_size bytes, so no more than the OST quota
is in flight; SAT (streaming, exclusive tree lock) above it, with a deep pipeline. When SHARP cannot serve
the call (no tree, op/dtype not offloaded, too few nodes, tree quota, SAT lock denied) the schedule is the
host `fallback` algorithm and schedule.notes and params["fallback_reason"] say why; it is logged too.
"""

from __future__ import annotations

from collectives.registry import register
from collectives.schedule import ChunkTable, Schedule
from collectives.topology.capabilities import dtype_name

from ._innetwork import (
    build_forest,
    check_topology,
    default_fallback,
    fallback_schedule,
    finish,
    forest_phase,
    itemsize,
    sharp_plan,
)

RESULTS = ("multicast", "unicast")


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
    plan, reason = sharp_plan(topology, lambda: [topology.sharp_tree()], nbytes=count * itemsize(dtype),
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
    forest = build_forest(trees)
    phase = forest_phase(f"SHARP {collective}", forest, ChunkTable.whole(count, 1, c), collective, c,
                         tree_chunk0=[0], multicast=options["result"] == "multicast",
                         reproducible=options["reproducible"], root=root)
    sched = Schedule("sharp", collective, world_size, count, [phase], root=root,
                     params={**plan, **options, "dtype": dtype_name(dtype), "op": op, "tree_root": trees[0].root,
                             "tree_depth": trees[0].depth},
                     notes=notes)
    finish(sched, topology, forest.switches)
    return sched
