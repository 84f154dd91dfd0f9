"""What a call runs: the algorithm named, the fixed-order one for deterministic=True, or auto's pick.

auto reads measured decisions for this host (`collectives.decisions`: which of the library's schedules or MPI's
own collective ran fastest, by collective, size, rank count and transport), the data the one chooser
(`collectives.choice`) reads for real hosts; the choice and its reason are fixed per call signature (plans.py)
and every rank decides the same, from facts all ranks agreed on (host.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import decisions, environment, registry
from ..kernels._dtypes import BFLOAT16
from ..schedule.collective import REDUCING

DETERMINISTIC_REASON = ("deterministic=True: 'direct' folds every element once, in rank order 0..p-1, so the "
                        "result is bitwise identical across algorithms, chunk counts and layouts")
# what auto runs when no measured decision covers a collective (no table for it)
FALLBACK = {"allreduce": "ring", "reduce_scatter": "ring", "allgather": "ring", "broadcast": "binomial",
            "reduce": "binomial", "alltoall": "pairwise", "alltoallv": "native"}
_NOT_NATIVE = {**FALLBACK, "alltoallv": "native"}  # alltoallv: only the runtime's own, at any size


@dataclass(frozen=True)
class Choice:
    algorithm: str  # a registered algorithm, "native" (MPI's own collective) or "copy" (world size 1)
    params: dict = field(default_factory=dict)
    reason: str = ""


def native_supports(dtype: np.dtype, collective: str = "allreduce") -> bool:
    """MPI's own collectives move every dtype (as bytes) and reduce every kernel dtype but bfloat16."""
    return np.dtype(dtype) != BFLOAT16 or collective not in REDUCING


def native_refusal(collective: str, dtype: np.dtype, runtime=None) -> str | None:
    """Why the runtime's own collective cannot take `dtype` (None: it can). No runtime: MPI's rule."""
    if runtime is not None:
        return runtime.native_refusal(collective, np.dtype(dtype))
    return None if native_supports(dtype, collective) else "MPI has no bfloat16 type"


def requested(collective: str, algorithm: str, dtype: np.dtype, params: dict, runtime=None) -> Choice:
    """An algorithm named by the caller: "native" or a registered one implementing the collective."""
    if algorithm == "native":
        refusal = native_refusal(collective, dtype, runtime)
        if refusal:
            raise TypeError(f"algorithm 'native' (the runtime's own {collective}) cannot take {np.dtype(dtype)}: "
                            f"{refusal}; use algorithm='auto' or one of: {', '.join(registry.names(collective))}")
        if params:
            raise ValueError(f"algorithm 'native' takes no parameters, got {sorted(params)}")
        return Choice("native", {}, "requested")
    info = registry.info(algorithm)  # unknown name: ValueError listing the valid ones
    if collective not in info.collectives:
        raise ValueError(f"algorithm {algorithm!r} does not implement {collective}; algorithms for "
                         f"{collective}: {', '.join(registry.names(collective) + ['native', 'auto'])}")
    return Choice(algorithm, dict(params), "requested")


def deterministic(collective: str, algorithm: str, params: dict, explicit: bool) -> Choice:
    """deterministic=True: algorithm 'direct' (the fixed rank-order reduction), or a clear error."""
    where = "deterministic=True" if explicit else ("the communicator's deterministic=True (init(deterministic=) or "
                                                    "COLLECTIVES_DETERMINISTIC=1)")
    if algorithm not in ("auto", "direct"):
        raise ValueError(f"{where} fixes the reduction order with algorithm 'direct', but algorithm={algorithm!r} "
                         "was requested; pass algorithm='auto' or 'direct', or deterministic=False")
    if algorithm == "auto" and params:
        raise ValueError(f"parameters {sorted(params)} need an explicit algorithm, not 'auto'")
    registry.info("direct")
    return Choice("direct", dict(params), DETERMINISTIC_REASON + f" ({where})")


def auto(collective: str, nbytes: int, dtype: np.dtype, p: int, host, shared_memory: bool,
         runtime=None) -> Choice:
    """auto's pick for each rank's `nbytes` of input (see the module docstring). A runtime whose own collectives
    are not the MPI ones the decisions measured (`runtime.native_measured` False) never gets them from a decision."""
    native_measured = runtime is None or runtime.native_measured
    refusal = native_refusal(collective, dtype, runtime)
    if p == 1:
        return Choice("copy", {}, "world size 1: the output is the input")
    transport = "shm" if shared_memory else "net"
    where = (f"{p} ranks{', more ranks than cores' if host.oversubscribed else ''}, "
             f"{'one host, shared memory' if shared_memory else 'point-to-point messages'}")
    path = environment.get("COLLECTIVES_DECISIONS") or None
    found = decisions.lookup(collective, nbytes, transport=transport, ranks=p, oversubscribed=host.oversubscribed,
                             path=path)
    if found is not None:
        name, params = found.algorithm, found.params
        if name == "native" and not native_measured:
            name, params = _NOT_NATIVE[collective], {}
            why = f"{name} instead of MPI's own collective, which is not this runtime's (measured fastest at "
        elif name == "native" and refusal:
            name, params = FALLBACK[collective], {}
            why = f"{refusal}, so {name} instead of MPI's own collective (measured fastest at "
        else:
            why = "measured fastest at "
        if name == "native" or (name in registry.names(collective)):
            shown = "MPI's own collective" if name == "native" else f"{name} {params}" if params else name
            return Choice(name, dict(params), f"{shown}: {why}{found.span} per rank ({where}; {found.source}); "
                                              f"this call: {nbytes} B")
    name = FALLBACK[collective]
    if name == "native" and refusal:
        name = "pairwise"
    shown = "MPI's own collective" if name == "native" else name
    return Choice(name, {}, f"{shown}: no measured decision covers {collective} ({where}); this call: {nbytes} B")


__all__ = ["Choice", "DETERMINISTIC_REASON", "auto", "deterministic", "native_supports", "requested"]
