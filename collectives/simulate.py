"""`collectives.simulate(...)`: predict a collective's time on a modelled cluster, with "auto" resolved.

The public face of the simulator. `simulate(algorithm, topology, nbytes)` times a registered algorithm, a built
Schedule, or "auto" (the algorithm, protocol and channel count `collectives.choice` picks, with its reason in
the result); `sweep(...)` does it for many sizes, sharing work between them. The timing itself is the engine's
(`collectives.simulator`), which never resolves "auto". The module is callable: `collectives.simulate(...)` is
`simulate(...)`.
"""

from __future__ import annotations

import sys
import types

from .simulator import engine
from .simulator.engine import EVENT_MAX_MESSAGES, MODES, resolve_topology
from .simulator.result import PhaseTime, SimulationResult, bus_factor


def simulate(algorithm, topology, nbytes: int | None = None, collective: str = "allreduce", dtype="float32",
             mode: str = "auto", op: str = "sum", root: int | None = None, **params) -> SimulationResult:
    """Time `algorithm` (a registered name, "auto", or a built Schedule) for `nbytes` on `topology`.

    `nbytes` is the full buffer as nccl-tests counts it: allreduce/broadcast/reduce count x itemsize,
    reduce_scatter the p*k-element input, allgather the p*k-element output (for a Schedule it defaults to the
    schedule's). mode: "event" (explicit per-node programs), "analytic" (round patterns, any scale) or "auto"
    (event up to EVENT_MAX_MESSAGES messages). `params` are the builder's parameters. Returns a
    SimulationResult in SI units; for "auto", `reason` says why the algorithm was picked.
    """
    if isinstance(algorithm, str) and algorithm == "auto":
        from .choice import select

        engine.check_call(nbytes, dtype, op, collective)
        if nbytes is None or nbytes < 0:
            raise ValueError(f"nbytes must be >= 0 (the full buffer in bytes), got {nbytes!r}")
        topology = resolve_topology(topology)
        name, chosen, reason = select(collective, int(nbytes), topology, dtype=str(dtype), op=op)
        return engine.run(name, topology, nbytes, collective=collective, dtype=dtype, mode=mode, op=op, root=root,
                          reason=reason, **{**chosen, **params})
    return engine.run(algorithm, topology, nbytes, collective=collective, dtype=dtype, mode=mode, op=op, root=root,
                      **params)


def sweep(algorithm: str, topology, sizes, collective: str = "allreduce", dtype="float32", mode: str = "analytic",
          op: str = "sum", root: int | None = None, progress=None, **params) -> list[SimulationResult]:
    """`simulate` for each size in `sizes` (bytes, nccl-tests convention); "auto" chooses per size.

    Sizes share the work that does not depend on them (collectives.simulator.engine.sweep). `progress(i, n)`
    is called after each size.
    """
    if algorithm != "auto":
        return engine.sweep(algorithm, topology, sizes, collective=collective, dtype=dtype, mode=mode, op=op,
                            root=root, progress=progress, **params)
    topology = resolve_topology(topology)
    out = []
    sizes = [int(s) for s in sizes]
    for i, n in enumerate(sizes):
        out.append(simulate("auto", topology, n, collective=collective, dtype=dtype, mode=mode, op=op, root=root,
                            **params))
        if progress is not None:
            progress(i + 1, len(sizes))
    return out


__all__ = ["EVENT_MAX_MESSAGES", "MODES", "PhaseTime", "SimulationResult", "bus_factor", "simulate", "sweep"]


class _CallableModule(types.ModuleType):
    """`collectives.simulate` is this module and, called, `simulate(...)`."""

    def __call__(self, *args, **kwargs) -> SimulationResult:
        return simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
