"""What a call runs: the algorithm named, the fixed-order one for deterministic=True, or auto's pick.

auto asks the one chooser (`collectives.choice.select_measured`), handing it what was measured on this host as
data (`collectives.decisions`: which of the library's schedules or MPI's own collective ran fastest, by
collective, size, rank count and transport); where nothing measured covers a call the chooser prices the
schedules on the host's model. The choice and its reason are fixed per call signature (plans.py) and every rank
decides the same, from facts all ranks agreed on (host.py) and models that do not depend on the host's files.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .. import choice, decisions, environment, registry
from ..kernels._dtypes import BFLOAT16, dtype_name
from ..schedule.collective import REDUCING
from ..topology import preset

DETERMINISTIC_REASON = ("deterministic=True: 'direct' folds every element once, in rank order 0..p-1, so the "
                        "result is bitwise identical across algorithms, chunk counts and layouts")


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


@functools.lru_cache(maxsize=64)
def host_model(ranks: int):
    """The host's model for pricing what no measurement covers: the loopback preset at its defaults (not this
    host's calibration file, which another host of the job may not share: every rank must choose alike)."""
    return preset("loopback", ranks=ranks, defaults_only=True)


def auto(collective: str, nbytes: int, dtype: np.dtype, p: int, host, shared_memory: bool,
         runtime=None) -> Choice:
    """auto's pick for each rank's `nbytes` of input, by the one chooser (`collectives.choice.select_measured`):
    the measured decision for this host where one covers the call, else the model's pick among the schedules that
    run without a topology. A runtime whose own collectives are not the MPI ones the decisions measured
    (`runtime.native_measured` False), or that refuses the dtype, never gets them from a decision."""
    native_measured = runtime is None or runtime.native_measured
    refusal = native_refusal(collective, dtype, runtime)
    if p == 1:
        return Choice("copy", {}, "world size 1: the output is the input")
    if collective == "alltoallv":  # no schedule takes per-rank counts: the runtime's own, else the exchange
        if refusal:
            return Choice("pairwise", {}, f"pairwise: {refusal}, and no other algorithm takes alltoallv")
        return Choice("native", {}, "the runtime's own alltoallv: no schedule of the library takes per-rank counts")
    transport = "shm" if shared_memory else "net"
    where = (f"{p} ranks{', more ranks than cores' if host.oversubscribed else ''}, "
             f"{'one host, shared memory' if shared_memory else 'point-to-point messages'}")
    path = environment.get("COLLECTIVES_DECISIONS") or None
    found = decisions.lookup(collective, nbytes, transport=transport, ranks=p, oversubscribed=host.oversubscribed,
                             path=path)
    measured, note = None, ""
    if found is not None:
        if found.algorithm == "native" and not native_measured:
            note = "MPI's own collective, measured fastest here, is not this runtime's; "
        elif found.algorithm == "native" and refusal:
            note = f"MPI's own collective, measured fastest here, refuses the dtype ({refusal}); "
        elif found.algorithm == "native" or found.algorithm in registry.names(collective):
            measured = (found.algorithm, dict(found.params), f"{found.span} per rank ({where}; {found.source})")
    candidates = tuple(n for n in registry.names(collective) if not registry.info(n).needs_topology)
    name, params, reason = choice.select_measured(collective, nbytes, host_model(p), measured, candidates,
                                                  dtype_name(dtype), "sum")
    return Choice(name, params, note + reason)


__all__ = ["Choice", "DETERMINISTIC_REASON", "auto", "deterministic", "native_supports", "requested"]
