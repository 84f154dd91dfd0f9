"""The engine's entry points: time a built schedule or a registered algorithm on a topology, by events or analytically.

The engine never resolves "auto" (that is `collectives.choice`, called by `collectives.simulate`); it builds the
named algorithm with the parameters it is given and costs the schedule. On a cluster that runs NCCL's runtime
(`topology.runtime`) a call runs in one of NCCL's protocols: the one given, or, as NCCL's own tuning does for an
algorithm, the fastest of those its latency class runs in. Its time is the schedule's (event or analytic) plus
NCCL's per-call latency (latency.py), which both modes add the same way.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from ..schedule import Schedule
from ..schedule.collective import ROOTED, check_collective
from ..topology import TIERS
from ..topology.runtime import SIMPLE_ONLY
from . import analytic, event
from .flows import top_node
from .latency import latency_class, step_depth
from .model import CostRules, itemsize
from .pages import ordinary_pages
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


@functools.lru_cache(maxsize=512)
def builder_parameters(name: str) -> frozenset:
    """Names the builder of `name` takes ("*" if it takes any keyword)."""
    from .. import algorithms

    sig = inspect.signature(algorithms.info(name).builder).parameters
    if any(p.kind == p.VAR_KEYWORD for p in sig.values()):
        return frozenset(("*",))
    return frozenset(sig)


def takes(name: str, parameter: str) -> bool:
    params = builder_parameters(name)
    return parameter in params or "*" in params


def build_schedule(name: str, topology, collective: str, count: int, dtype: str = "float32", op: str = "sum",
                   root: int | None = None, protocol: str | None = None, **params) -> Schedule:
    """Build `name` through the registry, passing dtype, op and the protocol to builders that take them (a
    pipelined builder sizes its default chunks by the protocol's step, runtime.NcclRuntime.chunk_bytes)."""
    from .. import algorithms

    extra = {}
    for key, value in (("dtype", dtype), ("op", op), ("protocol", protocol)):
        if value is not None and takes(name, key) and key not in params:
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
        mode: str = "auto", op: str = "sum", root: int | None = None, reason: str = "", protocol: str | None = None,
        trace: bool = False, **params) -> SimulationResult:
    """Time `algorithm` (a registered name or a built Schedule) for `nbytes` on `topology`.

    `nbytes` is the full buffer as nccl-tests counts it: allreduce/broadcast/reduce count x itemsize,
    reduce_scatter the p*k-element input, allgather the p*k-element output (for a Schedule it defaults to the
    schedule's). mode: "event" (explicit per-node programs), "analytic" (round patterns, any scale) or "auto"
    (event up to EVENT_MAX_MESSAGES messages). `protocol` (LL, LL128, Simple) applies on clusters that run NCCL's
    runtime; None picks the fastest the algorithm runs in (a Schedule whose params name a "protocol", as an
    imported MSCCL program's do, runs in that one). `reason` is recorded in the result (why this
    algorithm was run). `trace` (event mode) keeps the timeline of every message and round in `result.trace`
    (collectives.simulator.trace writes it as a Chrome trace). Returns a SimulationResult in SI units.
    """
    if trace and mode != "event":
        raise ValueError(f"a trace is the event simulation's timeline: pass mode='event' with trace=True, not {mode!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(algorithm, str) and algorithm == "auto":
        raise ValueError("the simulator engine times a given algorithm; resolve 'auto' with collectives.choice "
                         "(collectives.simulate does)")
    check_call(nbytes, dtype, op, algorithm.collective if isinstance(algorithm, Schedule) else collective)
    topology = resolve_topology(topology)
    with ordinary_pages(huge(topology)):
        return _run(algorithm, topology, nbytes, collective, dtype, mode, op, root, reason, protocol, trace, params)


def huge(topology) -> bool:
    """Whether `topology` is above the analytic model's dataflow limit (its arrays run to millions of
    elements: pages.ordinary_pages applies)."""
    return int(getattr(topology, "num_nodes", 0)) > analytic.DATAFLOW_MAX_NODES


def _run(algorithm, topology, nbytes, collective: str, dtype, mode: str, op: str, root, reason: str, protocol,
         trace: bool, params: dict) -> SimulationResult:
    """`run` on a resolved topology, its arguments checked."""
    runtime = getattr(topology, "runtime", None)
    if protocol is not None and runtime is None:
        raise ValueError(f"protocol {protocol!r} needs a cluster that runs NCCL's runtime; {topology.name!r} has none "
                         "(its messages cost only their links)")
    isz = itemsize(dtype)
    if isinstance(algorithm, Schedule):
        collective = algorithm.collective
        if nbytes is None:
            nbytes = nbytes_for(collective, algorithm.count, algorithm.world_size, isz)
        if algorithm.world_size != topology.world_size:
            raise ValueError(f"the schedule has {algorithm.world_size} ranks but {topology.name} has "
                             f"{topology.world_size}")
        if protocol is None and runtime is not None:
            # a schedule written for one wire protocol (an MSCCL program's proto) runs in it
            protocol = algorithm.params.get("protocol")
    else:
        check_collective(collective)
        if nbytes is None or nbytes < 0:
            raise ValueError(f"nbytes must be >= 0 (the full buffer in bytes), got {nbytes!r}")
    best = None
    runtime = getattr(topology, "runtime", None)
    tried = [protocol] if runtime is None or protocol is not None else ["Simple", "LL128", "LL"]
    if not isinstance(algorithm, Schedule) and len(tried) > 1 and not takes(algorithm, "protocol") and \
            not _small_call_channels(algorithm, runtime, params):
        # the builder's schedule does not depend on the protocol: build it once
        count = count_for(collective, int(nbytes), topology.world_size, isz)
        algorithm = build_schedule(algorithm, topology, collective, count, str(dtype), op, root, **params)
    for proto in tried:
        res = _run_one(algorithm, topology, int(nbytes), collective, dtype, mode, op, root, proto, params,
                       strict=protocol is not None, trace=trace)
        if res is None:  # a protocol the algorithm's latency class does not run in
            break
        if best is None or res.time < best.time:
            best = res
        if runtime is not None and res.params.get("latency_class", "ring") in SIMPLE_ONLY and protocol is None:
            break  # its class runs Simple only (tried first)
    best.reason = reason
    return best


def _class_of(schedule: Schedule) -> str:
    cls = latency_class(schedule)
    switches = any(top_node(ph.groups) >= schedule.world_size for ph in schedule.phases)
    if switches and cls in ("ring", "tree"):
        return "nvls"  # switch operations run NCCL's Simple kernels (a schedule that did not say its class)
    return cls


def _run_one(algorithm, topology, nbytes: int, collective: str, dtype, mode: str, op: str, root, protocol,
             params: dict, strict: bool, trace: bool = False) -> SimulationResult | None:
    """One protocol's run; None when the schedule's latency class does not run in `protocol` (an error if
    `strict`: the caller asked for that protocol)."""
    isz = itemsize(dtype)
    runtime = getattr(topology, "runtime", None)
    if isinstance(algorithm, Schedule):
        schedule = algorithm
    else:
        count = count_for(collective, nbytes, topology.world_size, isz)
        schedule = None
        if protocol is not None and _small_call_channels(algorithm, runtime, params):
            # NCCL runs a small ring or tree call on fewer channels than it has (runtime.call_channels)
            key = (algorithm, collective, id(topology), analytic._freeze(params), str(dtype), op, root)
            known = _DEFAULTS.get(key)
            if known is None or known[0] is not topology:
                schedule = build_schedule(algorithm, topology, collective, count, str(dtype), op, root, protocol,
                                          **params)
                known = (topology, int(schedule.params.get("channels") or 1), _class_of(schedule))
                if len(_DEFAULTS) >= 256:
                    _DEFAULTS.pop(next(iter(_DEFAULTS)))
                _DEFAULTS[key] = known
            _, have, cls = known
            nc = runtime.call_channels(cls, protocol, nbytes, topology.world_size, have)
            if nc < have:
                try:
                    schedule = build_schedule(algorithm, topology, collective, count, str(dtype), op, root,
                                              protocol, **params, channels=nc)
                    params = {**params, "channels": nc}
                except ValueError:  # a layout that needs its channels (a double binary tree in one domain)
                    pass
        if schedule is None:
            schedule = build_schedule(algorithm, topology, collective, count, str(dtype), op, root, protocol,
                                      **params)
    if runtime is not None and protocol is not None and protocol not in runtime.protocols(_class_of(schedule)):
        if not strict:
            return None
        raise ValueError(f"{schedule.algorithm} (NCCL latency class {_class_of(schedule)}) runs in NCCL's "
                         f"{', '.join(runtime.protocols(_class_of(schedule)))} protocol only, not {protocol}")
    rules = CostRules(topology, dtype, nbytes_for(collective, schedule.count, schedule.world_size, isz), protocol)
    if mode == "auto":
        mode = "event" if event.estimate_messages(schedule) <= EVENT_MAX_MESSAGES else "analytic"
    timeline = None
    if mode == "event":
        res = _event(schedule, rules, trace)
        res, timeline = res[:5], res[5]
    else:
        res = _analytic(schedule, rules)
    time, phases, tiers, bottleneck, util = res
    notes = list(schedule.notes)
    if runtime is not None:
        extra = call_latency(algorithm, schedule, topology, collective, dtype, op, root, protocol, params, rules)
        if extra > 0:
            phases = phases + [PhaseTime("NCCL call latency (launch, switch sync, per-step)", extra)]
            if extra > time:
                bottleneck = "latency: NCCL's per-call and per-step latency dominate"
            time += extra
    return SimulationResult(
        algorithm=schedule.algorithm, collective=collective, topology=topology.name,
        world_size=schedule.world_size, nbytes=int(nbytes), count=schedule.count, dtype=rules.dtype, mode=mode,
        time=time, phases=phases, tier_bytes={t: float(b) for t, b in zip(TIERS, tiers, strict=True)},
        bottleneck=bottleneck, notes=notes, max_link_utilization=util, params=dict(schedule.params),
        protocol=protocol, channels=schedule.params.get("channels"), trace=timeline)


_DEFAULTS: dict[tuple, tuple] = {}  # (topology, default channels, latency class) of a named algorithm's calls


def _small_call_channels(algorithm, runtime, params: dict) -> bool:
    """Whether a call of `algorithm` takes NCCL's channel count for its size (runtime.call_channels): a named
    algorithm with a `channels` parameter left to its default, on a cluster that runs NCCL."""
    return runtime is not None and isinstance(algorithm, str) and "channels" not in params and \
        takes(algorithm, "channels")


_DEPTH: dict[tuple, float] = {}


def call_latency(algorithm, schedule: Schedule, topology, collective: str, dtype, op: str, root, protocol: str,
                 params: dict, rules: CostRules) -> float:
    """NCCL's per-call latency of `schedule` (latency.py): the class's call latency plus the step latency along
    the critical path of the unpipelined schedule (a named algorithm rebuilt with chunks=1; a Schedule as is).
    Cached per (algorithm, parameters but chunks, topology, protocol): it does not depend on the size."""
    runtime = topology.runtime
    cls = _class_of(schedule)
    base = runtime.call_latency(cls, protocol)
    lam_nv = runtime.step_latency(cls, protocol, "nvlink")
    lam_net = runtime.step_latency(cls, protocol, "net")
    if isinstance(algorithm, Schedule) or not takes(algorithm, "chunks") or schedule.params.get("chunks") == 1:
        flat = schedule  # already unpipelined (or not ours to rebuild)
        key = None
    else:
        flat_params = {k: v for k, v in params.items() if k != "chunks"}
        key = (algorithm, collective, id(topology), analytic._freeze(flat_params), str(dtype), op, root, protocol,
               rules.sharp_protocol, schedule.world_size)
        if key in _DEPTH and _DEPTH[key][0] is topology:
            return base + _DEPTH[key][1]
        flat = build_schedule(algorithm, topology, collective, schedule.count, str(dtype), op, root, protocol,
                              **{**flat_params, "chunks": 1})
    st = analytic.structure(flat, rules.at_full_rate())  # the depth needs the messages, not their rates
    depth = step_depth(st, lam_nv, lam_net, schedule.world_size)
    if key is not None:
        if len(_DEPTH) >= 256:
            _DEPTH.pop(next(iter(_DEPTH)))
        _DEPTH[key] = (topology, depth)
    return base + depth


def sweep(algorithm: str, topology, sizes, collective: str = "allreduce", dtype="float32", mode: str = "analytic",
          op: str = "sum", root: int | None = None, progress=None, **params) -> list[SimulationResult]:
    """`run` for each size in `sizes` (bytes, nccl-tests convention). Sizes share the work that does not depend
    on them: the analytic structure of schedules whose rounds do not change with the size, the paths and loads
    of pipelines whose pieces only repeat (analytic.py), and the builders' own caches. `progress(i, n)` is
    called after each size."""
    for n in sizes:
        check_call(n, dtype, op, collective)
    topology = resolve_topology(topology)
    out: list[SimulationResult] = []
    sizes = [int(s) for s in sizes]
    with ordinary_pages(huge(topology)):
        for i, n in enumerate(sizes):
            out.append(run(algorithm, topology, n, collective=collective, dtype=dtype, mode=mode, op=op, root=root,
                           **params))
            if progress is not None:
                progress(i + 1, len(sizes))
    return out


def _event(schedule: Schedule, rules: CostRules, trace: bool = False):
    run = event.run(schedule, rules, timeline=trace)
    if run.timeline is not None:  # readable names for the trace's processes and tracks
        topo = rules.topology
        nodes = np.unique(np.concatenate([run.timeline["src"], run.timeline["dst"], run.timeline["slot_node"]]))
        links = np.unique(np.concatenate([run.timeline["first_link"], run.timeline["last_link"]]))
        run.timeline["node_labels"] = {int(n): schedule.label(int(n)) if n < schedule.world_size or
                                       int(n) in schedule.node_labels else topo.node_label(int(n))
                                       for n in nodes.tolist()}
        run.timeline["link_labels"] = {int(k): topo.link_label(int(k)) for k in links.tolist() if k >= 0}
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
    return run.time, phases, run.tier_bytes, bottleneck, min(util, 1.0), run.timeline


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


__all__ = ["EVENT_MAX_MESSAGES", "MODES", "build_schedule", "check_call", "count_for",
           "describe_bottleneck", "nbytes_for", "resolve_topology", "run", "sweep"]
