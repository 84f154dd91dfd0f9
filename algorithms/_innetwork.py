"""What the in-network builders share: topology checks, fallbacks to host algorithms (never silent), SHARP's
refusal logic, and default pipelining. The algorithms themselves are in nvls.py, sharp.py, hierarchical.py,
nvls_tree.py, collnet_direct.py and collnet_chain.py; the model and its sources: docs/in-network.md.
"""

from __future__ import annotations

import logging

import numpy as np

from collectives.schedule import check_chunks
from collectives.topology.capabilities import dtype_name

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
    sw = np.asarray(list(switches) if not isinstance(switches, np.ndarray) else switches, dtype=np.int64).ravel()
    if not sw.size:
        return
    from ._pipeline import memo  # the labels of a large fabric's switches, kept across a sweep's sizes

    if not bool((sw[1:] > sw[:-1]).all()):  # already strictly increasing (most callers): np.unique's result as is
        # the switches a builder names for each size of a sweep: sorted once (keyed by their exact bytes)
        sw = memo(topology, ("unique switches", sw.tobytes()), lambda: np.unique(sw))
    schedule.node_labels.update(memo(topology, ("labels", sw.size, hash(sw.tobytes())),
                                     lambda: topology.node_labels(sw)))


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


# -- pipelining as NCCL does it ---------------------------------------------------------------------------------
def nbytes_of(elements: int, dtype) -> int:
    return int(elements) * itemsize(dtype)


def runtime_pieces(topology, latency_class: str, nbytes: int, protocol: str = "Simple",
                   channels: int | None = None) -> int:
    """Default pipeline pieces: NCCL's (runtime.NcclRuntime.pieces: the call over channels x chunk) on a cluster
    that runs NCCL's runtime, else 1 (one piece, as the builders did before pipelining followed NCCL)."""
    rt = getattr(topology, "runtime", None)
    if rt is None:
        return 1
    return rt.pieces(latency_class, protocol, nbytes, channels)


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


def collnet_setup(name: str, collective: str, world_size: int, count: int, topology, trees_for, *, dtype, op: str,
                  chunks: int | None, protocol: str, trees_in_use: int, sat_lock: str, fallback: str):
    """What both CollNet builders do before their stages: SHARP's plan for one slice per GPU of a domain over the
    rail trees `trees_for()`, or the host `fallback` schedule when SHARP refuses. Returns (fallback schedule,
    None) or (None, (pieces, trees, plan, fabric switches, notes)); `plan` keeps the SHARP parameters to report."""
    check_topology(name, topology, world_size)
    if collective != "allreduce":
        raise ValueError(f"{name} implements allreduce only, not {collective}")
    D, G = topology.num_domains, topology.gpus_per_domain
    notes: list[str] = []
    plan, reason = sharp_plan(topology, trees_for, nbytes=-(-count // max(G, 1)) * itemsize(dtype), op=op,
                              dtype=dtype, domains=D, trees_in_use=trees_in_use, sat_lock=sat_lock, chunks=None,
                              notes=notes)
    if reason is not None:
        return fallback_schedule(name, "SHARP", reason, fallback, notes, collective=collective,
                                 world_size=world_size, count=count, root=None, chunks=chunks,
                                 dtype=dtype_name(dtype), op=op, topology=topology), None
    c = runtime_pieces(topology, name, count * itemsize(dtype), protocol) if chunks is None else \
        check_chunks(name, chunks)
    if chunks is None and plan["protocol"] == "llt":
        c = max(c, int(plan["chunks"]))  # at most the OST quota in flight per piece
    trees = plan.pop("trees")
    plan.pop("chunks")
    fabric = np.concatenate([lv.switches for t in trees for lv in t.levels])
    return None, (c, trees, plan, fabric, notes)


def _sat_limit(topology, trees) -> str | None:
    sh = topology.sharp
    if sh.max_sat_flows is not None and len(trees) > sh.max_sat_flows:
        return f"{len(trees)} SAT flows needed, {sh.generation} runs at most {sh.max_sat_flows} in parallel"
    if sh.sat_scope == "switch" and len(trees) > 1 and _share_switches(topology, trees):
        return f"one active SAT tree per switch ({sh.generation}), and the trees share switches"
    return None


def _share_switches(topology, trees) -> bool:
    """Whether two of `trees` share a switch; kept per trees list (a builder's memo keeps one list per cluster,
    which every size of a sweep asks about)."""
    from ._pipeline import memo

    def share() -> bool:
        sw = np.concatenate([t.switches for t in trees])
        return bool(np.unique(sw).size < sw.size)

    kept, answer = memo(topology, ("trees share switches", id(trees)), lambda: (trees, share()))
    return answer if kept is trees else share()  # (an id reused by another list: asked afresh)


__all__ = ["check_topology", "default_fallback", "fall_back", "fallback_schedule", "finish", "itemsize",
           "nbytes_of", "runtime_pieces", "sharp_plan"]
