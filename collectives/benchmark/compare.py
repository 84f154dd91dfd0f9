"""Candidates measured against each other in the same run: MPI's own collective and the library's algorithms.

For every size the candidates are timed in *interleaved* trials (native, candidate 1, candidate 2, ..., then
again, the order rotated by one each time), each trial a timed loop of the same number of calls on every rank; a trial's time is the slowest rank's
mean per call. A ratio is the median over trials of t_native / t_candidate, paired within the trial, so slow
drifts of a shared machine cancel. Used by `bench/bench_mpi.py` (the tables behind the README's claims) and by
`collectives calibrate --decisions` (which algorithm auto runs at which size on this host).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..transport.mpi_library import MPI

NATIVE_CALLS = {
    "allreduce": lambda mpi, x, out, root: mpi.Allreduce(MPI.IN_PLACE if out is x else x, out, MPI.SUM),
    "reduce_scatter": lambda mpi, x, out, root: mpi.Reduce_scatter_block(x, out, MPI.SUM),
    "allgather": lambda mpi, x, out, root: mpi.Allgather(x, out),
    "broadcast": lambda mpi, x, out, root: mpi.Bcast(x, root=root),
    "reduce": lambda mpi, x, out, root: mpi.Reduce(x, out, MPI.SUM, root=root),
    "alltoall": lambda mpi, x, out, root: mpi.Alltoall(x, out),
}
COLLECTIVES = tuple(NATIVE_CALLS)


def label(name: str, params: dict) -> str:
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


def parse_spec(spec: str) -> tuple[str, dict]:
    """'ring:chunks=4' -> ("ring", {"chunks": 4})."""
    name, _, rest = spec.partition(":")
    return name, {k: int(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}


def buffers(collective: str, n: int, p: int, dtype, inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x, out) for a call moving n elements (nccl-tests sizes: reduce_scatter's input, allgather's output and
    alltoall's input are n; n is a multiple of p for those three). `inplace` applies to allreduce (out is x)."""
    k = max(1, n // p)
    x = np.ones(k if collective == "allgather" else n, dtype)
    out = x if inplace and collective == "allreduce" else np.empty(k if collective == "reduce_scatter" else n, dtype)
    return x, out


def calls(comm, collective: str, x: np.ndarray, out: np.ndarray, specs, root: int = 0
          ) -> list[tuple[str, Callable[[], object]]]:
    """(label, call) for MPI's own collective, then each (name, params) spec through the library."""
    mpi = comm.mpi_comm
    native = NATIVE_CALLS[collective]

    def ours(name: str, prm: dict):
        if collective == "broadcast":
            return comm.broadcast(x, root=root, algorithm=name, **prm)
        if collective == "reduce":
            return comm.reduce(x, out=out, root=root, algorithm=name, **prm)
        return getattr(comm, collective)(x, out=out, algorithm=name, **prm)

    # MPI's own collective through the library (spec "native") is labelled apart from the raw call
    return [("native", lambda: native(mpi, x, out, root)),
            *((label(name, prm) if name != "native" else "native (library)", lambda name=name, prm=prm: ours(name, prm))
              for name, prm in specs)]


def iterations(mpi, fn, budget: float) -> int:
    """Calls per trial, the same on every rank: about `budget` seconds on the slowest rank."""
    fn()  # warm-up: builds the plan, grows buffers
    mpi.Barrier()
    t = time.perf_counter()
    fn()
    fn()
    one = mpi.allreduce((time.perf_counter() - t) / 2, op=MPI.MAX)
    return max(2, min(2000, int(budget / max(one, 1e-7))))


def trial(mpi, fn, iters: int) -> float:
    mpi.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return mpi.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)


@dataclass
class Comparison:
    """One size: every candidate's trial times (seconds per call), native first."""

    labels: list[str]
    times: list[list[float]]

    def median(self, i: int) -> float:
        return statistics.median(self.times[i])

    def ratio(self, i: int) -> float:
        """Median over trials of native's time / candidate i's (paired within a trial): > 1 is faster."""
        return statistics.median(tn / tc for tn, tc in zip(self.times[0], self.times[i], strict=True))

    def fastest(self) -> int:
        """The candidate with the best ratio to native (native itself at 1.0)."""
        return max(range(len(self.labels)), key=lambda i: 1.0 if i == 0 else self.ratio(i))


def compare(mpi, candidates: list[tuple[str, Callable]], trials: int, seconds: float) -> Comparison:
    iters = [iterations(mpi, fn, seconds) for _, fn in candidates]
    times: list[list[float]] = [[] for _ in candidates]
    n = len(candidates)
    for t in range(trials):
        # the order rotates from trial to trial: each candidate follows each other one as often (the one run
        # right after MPI's own collective measured up to 20% slower than the same algorithm elsewhere)
        for i in [(t + j) % n for j in range(n)]:
            times[i].append(trial(mpi, candidates[i][1], iters[i]))
    return Comparison([c[0] for c in candidates], times)


def bus_factor(collective: str, p: int) -> float:
    """NCCL's bus bandwidth factor (nccl-tests' PERFORMANCE.md)."""
    if p == 1:
        return 1.0
    return {"allreduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p, "allgather": (p - 1) / p,
            "alltoall": (p - 1) / p}.get(collective, 1.0)


__all__ = ["COLLECTIVES", "Comparison", "bus_factor", "buffers", "calls", "compare", "iterations", "label",
           "parse_spec", "trial"]
