"""`algorithm="auto"` on real runs: the one function that picks an algorithm and says why.

Until the tuner (collectives.tune, driven by the simulator) lands, the rule is a measured threshold:
`bench/bench_mpi.py` on one 2-core host (MPICH shared memory, -n 2) shows MPI's own collective wins below
NATIVE_BELOW_BYTES, where per-round Python overhead dominates; above it a pipelined ring moves the data.
Replace `choose` (same signature) to plug in the tuner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..kernels._dtypes import BFLOAT16

NATIVE_BELOW_BYTES = int(os.environ.get("COLLECTIVES_NATIVE_BELOW", 8 << 20))
# With more ranks than cores on a host, polling executors lose more to MPI's own (measured 4 ranks, 2 cores).
NATIVE_BELOW_OVERSUBSCRIBED = int(os.environ.get("COLLECTIVES_NATIVE_BELOW_OVERSUBSCRIBED", 32 << 20))


def native_below(oversubscribed: bool) -> int:
    """Messages smaller than this (bytes per rank) go to MPI's own collective."""
    return NATIVE_BELOW_OVERSUBSCRIBED if oversubscribed else NATIVE_BELOW_BYTES
# Preference order for large messages, first registered one that implements the collective wins.
LARGE = {
    "allreduce": (("ring", {}),),
    "reduce_scatter": (("ring", {"chunks": 4}),),
    "allgather": (("ring", {"chunks": 4}),),
    "broadcast": (("binomial", {"chunks": 4}),),
    "reduce": (("binomial", {"chunks": 4}),),
}


@dataclass(frozen=True)
class Choice:
    algorithm: str  # a registered algorithm, "native" (MPI's own collective) or "copy" (world size 1)
    params: dict = field(default_factory=dict)
    reason: str = ""


def native_supports(dtype: np.dtype) -> bool:
    """MPI's own collectives take every kernel dtype but bfloat16 (MPICH has no bfloat16 reduction)."""
    return np.dtype(dtype) != BFLOAT16


def choose(collective: str, nbytes: int, dtype: np.dtype, world_size: int, available: list[str], *,
           oversubscribed: bool = False) -> Choice:
    """Pick the algorithm for one call: nbytes is each rank's input size, available the registered names,
    oversubscribed whether this host runs more ranks than it has cores."""
    if world_size == 1:
        return Choice("copy", {}, "world size 1: the output is the input")
    limit = native_below(oversubscribed)
    small = nbytes < limit
    if small and native_supports(dtype):
        knob = "COLLECTIVES_NATIVE_BELOW" + ("_OVERSUBSCRIBED (more ranks than cores)" if oversubscribed else "")
        return Choice("native", {}, f"{nbytes} B < {limit} B ({knob}): MPI's own collective has less "
                                    "per-round overhead at this size")
    for name, params in LARGE[collective]:
        if name in available:
            why = "bfloat16 is not reducible by MPI" if small else f"{nbytes} B >= {limit} B"
            return Choice(name, dict(params), f"{why}: {name} {params} (pipelined, measured fastest on one host)")
    fallback = sorted(available)[0]
    return Choice(fallback, {}, f"no preferred algorithm registered for {collective}; first registered: {fallback}")
