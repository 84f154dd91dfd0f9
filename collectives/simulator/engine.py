"""The engine's entry points: time a built schedule or a registered algorithm on a topology, by events or analytically.

The engine never resolves "auto" (that is `collectives.choice`, called by `collectives.simulate`); it builds the
named algorithm with the parameters it is given and costs the schedule.
"""

from __future__ import annotations

import inspect

import numpy as np

from ..schedule import Schedule
from ..schedule.collective import ROOTED, check_collective
from ..topology import TIERS
from . import analytic, event
from .model import CostRules, itemsize
from .result import PhaseTime, SimulationResult

MODES = ("auto", "event", "analytic")
EVENT_MAX_MESSAGES = 300_000  # mode="auto": explicit events up to this many messages, analytic above


def resolve_topology(topology):
    """A Topology, a preset name, or a path to a saved topology (JSON)."""
    from .. import topology as topo_mod

    if isinstance(topology, str):
        if topology in topo_mod.presets():
            return topo_mod.preset(topology)
        return topo_mod.load(topology)
    return topology


def count_for(collective: str, nbytes: int, world_size: int, size: int) -> int:
    """Each rank's input elements for an nccl-tests size (full buffer in bytes; see SimulationResult)."""
    elems = int(nbytes) // size
    if collective == "allgather":
        return elems // world_size
    if collective == "reduce_scatter":
        return elems - elems % world_size
    return elems


def nbytes_for(collective: str, count: int, world_size: int, size: int) -> int:
    if collective == "allgather":
        return count * world_size * size
    return count * size


def build_schedule(name: str, topology, collective: str, count: int, dtype: str = "float32", op: str = "sum",
                   root: int | None = None, **params) -> Schedule:
    """Build `name` through the registry, passing dtype/op to builders that take them."""
    from .. import algorithms

    info = algorithms.info(name)
    sig = inspect.signature(info.builder).parameters
    extra = {}
    takes_any = any(p.kind == p.VAR_KEYWORD for p in sig.values())
    for key, value in (("dtype", dtype), ("op", op)):
        if (takes_any or key in sig) and key not in params:
            extra[key] = value
    if collective in ROOTED and root is None:
        root = 0
    return algorithms.build(name, collective=collective, world_size=topology.world_size, count=count, root=root,
                            topology=topology, **params, **extra)


def check_call(nbytes, dtype, op: str, collective: str) -> None:
    """Reject what a real run would reject: unknown dtypes and ops, sizes that are not whole bytes."""
    from ..kernels import SUPPORTED_DTYPES
    from ..kernels._dtypes import dtype_name as kernel_dtype_name
    from ..reduction import check_op
    from ..topology.capabilities import dtype_name

    supported = {kernel_dtype_name(d): d for d in SUPPORTED_DTYPES}
    name = dtype_name(dtype)
    if name not in supported:
        raise TypeError(f"unsupported dtype {dtype!r}; supported: {', '.join(supported)}")
    if collective in ("allreduce", "reduce_scatter", "reduce"):
        check_op(op, supported[name])
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer))):
        raise TypeError(f"nbytes must be a whole number of bytes (int), got {nbytes!r}; "
                        "parse '1M'-style sizes with collectives.units.parse_size")


def run(algorithm, topology, nbytes: int | None = None, collective: str = "allreduce", dtype="float32",
        mode: str = "auto", op: str = "sum", root: int | None = None, reason: str = "",
        **params) -> SimulationResult:
    """Time `algorithm` (a registered name or a built Schedule) for `nbytes` on `topology`.

    `nbytes` is the full buffer as nccl-tests counts it: allreduce/broadcast/reduce count x itemsize,
    reduce_scatter the p*k-element input, allgather the p*k-element output (for a Schedule it defaults to the
    schedule's). mode: "event" (explicit per-node programs), "analytic" (round patterns, any scale) or "auto"
    (event up to EVENT_MAX_MESSAGES messages). `reason` is recorded in the result (why this algorithm was run).
    Returns a SimulationResult in SI units.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(algorithm, str) and algorithm == "auto":
        raise ValueError("the simulator engine times a given algorithm; resolve 'auto' with collectives.choice "
                         "(collectives.simulate does)")
    check_call(nbytes, dtype, op, algorithm.collective if isinstance(algorithm, Schedule) else collective)
    topology = resolve_topology(topology)
    isz = itemsize(dtype)
    if isinstance(algorithm, Schedule):
        schedule = algorithm
        collective = schedule.collective
        if nbytes is None:
            nbytes = nbytes_for(collective, schedule.count, schedule.world_size, isz)
        if schedule.world_size != topology.world_size:
            raise ValueError(f"the schedule has {schedule.world_size} ranks but {topology.name} has "
                             f"{topology.world_size}")
    else:
        check_collective(collective)
        if nbytes is None or nbytes < 0:
            raise ValueError(f"nbytes must be >= 0 (the full buffer in bytes), got {nbytes!r}")
        count = count_for(collective, nbytes, topology.world_size, isz)
        schedule = build_schedule(algorithm, topology, collective, count, str(dtype), op, root, **params)
    rules = CostRules(topology, dtype, nbytes_for(collective, schedule.count, schedule.world_size, isz))
    if mode == "auto":
        mode = "event" if event.estimate_messages(schedule) <= EVENT_MAX_MESSAGES else "analytic"
    if mode == "event":
        res = _event(schedule, rules)
    else:
        res = _analytic(schedule, rules)
    time, phases, tiers, bottleneck, util = res
    return SimulationResult(
        algorithm=schedule.algorithm, collective=collective, topology=topology.name,
        world_size=schedule.world_size, nbytes=int(nbytes), count=schedule.count, dtype=rules.dtype, mode=mode,
        time=time, phases=phases, tier_bytes={t: float(b) for t, b in zip(TIERS, tiers, strict=True)},
        bottleneck=bottleneck, notes=list(schedule.notes), reason=reason, max_link_utilization=util,
        params=dict(schedule.params))


REBUILD_MAX_RANKS = 65_536  # sweep: rebuild the schedule per size up to this many ranks, reuse it above


def sweep(algorithm: str, topology, sizes, collective: str = "allreduce", dtype="float32", mode: str = "analytic",
          op: str = "sum", root: int | None = None, progress=None, **params) -> list[SimulationResult]:
    """`run` for each size in `sizes` (bytes, nccl-tests convention), sharing the work between sizes.

    Analytic sweeps above REBUILD_MAX_RANKS ranks build the schedule once (at the largest size) and scale its
    chunk sizes per size: every registered builder's round structure is independent of the count, so only the
    chunk bytes change. `progress(i, n)` is called after each size.
    """
    for n in sizes:
        check_call(n, dtype, op, collective)
    topology = resolve_topology(topology)
    sizes = [int(s) for s in sizes]
    out: list[SimulationResult] = []
    isz = itemsize(dtype)
    reuse = (mode == "analytic" and topology.world_size > REBUILD_MAX_RANKS and sizes)
    if not reuse:
        for i, n in enumerate(sizes):
            out.append(run(algorithm, topology, n, collective=collective, dtype=dtype, mode=mode, op=op,
                                root=root, **params))
            if progress is not None:
                progress(i + 1, len(sizes))
        return out
    check_collective(collective)
    ref_count = max(count_for(collective, max(sizes), topology.world_size, isz), 1)
    if collective == "reduce_scatter":
        ref_count = max(ref_count, topology.world_size)
    schedule = build_schedule(algorithm, topology, collective, ref_count, str(dtype), op, root, **params)
    ref_cb = analytic.chunk_bytes(schedule, isz)
    for i, n in enumerate(sizes):
        count = count_for(collective, n, topology.world_size, isz)
        rules = CostRules(topology, dtype, nbytes_for(collective, count, topology.world_size, isz))
        st = analytic.structure(schedule, rules)
        t = analytic.evaluate(st, ref_cb * (count / ref_count), dataflow=False)
        out.append(SimulationResult(
            algorithm=schedule.algorithm, collective=collective, topology=topology.name,
            world_size=topology.world_size, nbytes=n, count=count, dtype=rules.dtype, mode="analytic", time=t.time,
            phases=[PhaseTime(a, b) for a, b in zip(st.phase_names, t.phase_times, strict=True)],
            tier_bytes={k: float(b) for k, b in zip(TIERS, t.tier_bytes, strict=True)},
            bottleneck=describe_bottleneck(t.bottleneck, rules), notes=list(schedule.notes),
            max_link_utilization=t.utilization, params=dict(schedule.params)))
        if progress is not None:
            progress(i + 1, len(sizes))
    return out


def _event(schedule: Schedule, rules: CostRules):
    run = event.run(schedule, rules)
    prev, phases = 0.0, []
    for ph, end in zip(schedule.phases, run.phase_end, strict=True):
        end = max(float(end), prev)
        phases.append(PhaseTime(ph.name, end - prev))
        prev = end
    util = float(run.busy.max() / run.time) if run.time > 0 and run.busy.size else 0.0
    if util > 1 + 1e-9:
        raise AssertionError(f"a link was busy {util:.3f} x the elapsed time: the event model broke physics")
    weights: dict[tuple, float] = {}
    for key, seconds in run.critical:
        weights[key] = weights.get(key, 0.0) + seconds
    bottleneck = describe_bottleneck(max(weights, key=weights.get) if weights else ("latency",), rules)
    return run.time, phases, run.tier_bytes, bottleneck, min(util, 1.0)


def describe_bottleneck(key: tuple, rules: CostRules) -> str:
    kind = key[0]
    if kind == "reduce":
        return f"reduction at {rules.node_name(key[1])}"
    if kind == "link":
        link, factor, src, dst = key[1], key[2], key[3], key[4]
        if link < 0:
            return "latency: per-hop and per-message latency dominate"
        if factor < 1 and (src >= rules.world_size or dst >= rules.world_size):
            return f"{rules.aggregation_name(src, dst)} over {rules.link_name(link)}"
        return rules.link_name(link)
    return "latency: per-hop and per-message latency dominate"


def _analytic(schedule: Schedule, rules: CostRules):
    st = analytic.structure(schedule, rules)
    cb = analytic.chunk_bytes(schedule, rules.itemsize)
    dataflow = st.num_nodes <= analytic.DATAFLOW_MAX_NODES
    t = analytic.evaluate(st, cb, dataflow)
    phases = [PhaseTime(n, x) for n, x in zip(st.phase_names, t.phase_times, strict=True)]
    return t.time, phases, t.tier_bytes, describe_bottleneck(t.bottleneck, rules), t.utilization


__all__ = ["EVENT_MAX_MESSAGES", "MODES", "REBUILD_MAX_RANKS", "build_schedule", "check_call", "count_for",
           "describe_bottleneck", "nbytes_for", "resolve_topology", "run", "sweep"]
