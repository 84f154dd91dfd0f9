"""`algorithm="auto"` on real runs: the one function that picks an algorithm and says why.

The rule is measured, not modelled (`bench/bench_mpi.py`, tables in docs/performance-mpi.md): below a size
threshold MPI's own collective wins (its C fast paths beat per-call Python work); above it the library's
schedule runs. When every rank of the communicator shares this host the schedule runs over shared memory
(transport/shm.py: peers' windows read directly, no messages), which beats MPICH's Allreduce from a few hundred
KiB on; across hosts it runs with point-to-point messages, which only win for large messages.

Allreduce on one host with the shared-memory plan runner (shm_program.py, the default): one_shot below
128 KiB [COLLECTIVES_ONE_SHOT_BELOW], the shared-memory table above it, MPI's own Allreduce at no size.
reduce_scatter, allgather, broadcast and reduce on one host with the runner: RUNNER_TABLE (the runner's
schedules up to a few MiB, MPI's own above for broadcast, allgather and reduce_scatter, where MPICH copies once
between the ranks' buffers and the shared windows copy twice; never for reduce, which MPICH runs 4-20x slower
from 512 KiB). Without the runner, other thresholds (bytes per rank, env overrides in brackets), measured on a 2-core AMD EPYC VM with MPICH 5:
* shared memory, ranks <= cores  [COLLECTIVES_NATIVE_BELOW_SHM]:                512 KiB
* shared memory, more ranks than cores  [COLLECTIVES_NATIVE_BELOW_SHM_OVERSUBSCRIBED]: 1 MiB
* messages, ranks <= cores  [COLLECTIVES_NATIVE_BELOW]:                         8 MiB
* messages, more ranks than cores  [COLLECTIVES_NATIVE_BELOW_OVERSUBSCRIBED]:  32 MiB
* reduce_scatter over shared memory, at most  [COLLECTIVES_NATIVE_BELOW_SHM_REDUCE_SCATTER]: 192 KiB
Replace `choose` (same signature) to plug in the tuner (collectives.tune) once it is calibrated on real hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import environment
from ..kernels._dtypes import BFLOAT16

NATIVE_BELOW_BYTES = environment.get("COLLECTIVES_NATIVE_BELOW")
# With more ranks than cores on a host, polling executors lose more to MPI's own (measured 4 ranks, 2 cores).
NATIVE_BELOW_OVERSUBSCRIBED = environment.get("COLLECTIVES_NATIVE_BELOW_OVERSUBSCRIBED")
# Over shared memory (all ranks on one host): see docs/performance-mpi.md for the crossover measurements.
NATIVE_BELOW_SHM = environment.get("COLLECTIVES_NATIVE_BELOW_SHM")
NATIVE_BELOW_SHM_OVERSUBSCRIBED = environment.get("COLLECTIVES_NATIVE_BELOW_SHM_OVERSUBSCRIBED")
# Allreduce over shared memory when the plan runner serves it (shm_program.py: the call's rounds run in C, no
# Python between rounds): one_shot (one synchronisation) below this, then the large-message table; MPI's own
# Allreduce is not used at any size (measured slower from 8 B up, docs/performance-mpi.md).
SHM_ONE_SHOT_BELOW = environment.get("COLLECTIVES_ONE_SHOT_BELOW")
# MPICH 5's own reduce_scatter on one host falls off a cliff between 128 and 192 KiB of input per rank (n=2: 28 ->
# 196 us, n=4: 121 -> 404 us, and 3-5x the library's ring up to 1 MiB), so over shared memory its schedules
# take over from 192 KiB, whatever the general threshold (docs/performance-mpi.md, "reduce_scatter").
NATIVE_BELOW_SHM_REDUCE_SCATTER = environment.get("COLLECTIVES_NATIVE_BELOW_SHM_REDUCE_SCATTER")


def shared_memory(world_size: int | None = None) -> bool:
    """Will schedules of a communicator of `world_size` ranks run over shared memory? (None: of any
    communicator of this process.) All ranks on this host and COLLECTIVES_SHM not disabled."""
    from . import executor, shm

    if not shm.enabled() or executor._host_ranks < 2:
        return False
    return world_size is None or world_size <= executor._host_ranks


def runner_allreduce(world_size: int) -> bool:
    """Do allreduces of a communicator of `world_size` ranks run in the shared-memory plan runner (all ranks on
    this host, shared memory and the runner enabled, C extension loaded)?"""
    from . import shm_program

    return shared_memory(world_size) and shm_program.enabled()


def native_below(oversubscribed: bool, shared: bool | None = None) -> int:
    """Messages smaller than this (bytes per rank) go to MPI's own collective. `shared`: whether the call's
    schedule would run over shared memory (None: whether any could on this host, the smaller threshold, so
    the communicator's small-message shortcut never takes a call `choose` would not give to MPI)."""
    if shared is None:
        shared = shared_memory()
    if shared:
        return NATIVE_BELOW_SHM_OVERSUBSCRIBED if oversubscribed else NATIVE_BELOW_SHM
    return NATIVE_BELOW_OVERSUBSCRIBED if oversubscribed else NATIVE_BELOW_BYTES


# Preference order for large messages, first registered one that implements the collective wins.
LARGE = {
    "allreduce": (("ring", {}),),
    "reduce_scatter": (("ring", {"chunks": 4}),),
    "allgather": (("ring", {"chunks": 4}),),
    "broadcast": (("binomial", {"chunks": 4}),),
    "reduce": (("binomial", {"chunks": 4}),),
}
# Over shared memory a round costs a synchronisation of the ranks (flags in shared memory) instead of a message.
# Ranks <= cores: a ring whose pieces stay in the cores' L2 (SHM_PIECE_BYTES per piece: the reduce, the mirror
# copy and the peer's read then hit the cache) measured fastest, ~2x unchunked at 2-4 MiB.
# More ranks than cores: every synchronisation costs context switches, so the fewest rounds win: direct (2
# rounds: every rank reduces its 1/p from all peers' windows at once, then all read all) measured ahead of
# rabenseifner (2 log2 p rounds) at every size from 1 MiB (4 ranks, 2 cores: 1.18-1.90x native vs 1.06-1.72x).
SHM_PIECE_BYTES = environment.get("COLLECTIVES_SHM_PIECE")
SHM_MAX_CHUNKS = 32
LARGE_SHM = {
    "allreduce": (("ring", "pieces"), ("rabenseifner", {})),
    "reduce_scatter": (("ring", "pieces"),),
    "allgather": (("ring", "pieces"),),
    "broadcast": (("binomial", {}),),
    "reduce": (("binomial", {}),),
}
LARGE_SHM_OVERSUBSCRIBED = {
    "allreduce": (("direct", {}), ("rabenseifner", {}), ("ring", {})),
    "reduce_scatter": (("ring", {}),),
    "allgather": (("ring", {}),),
    "broadcast": (("binomial", {}),),
    "reduce": (("binomial", {}),),
}


# reduce_scatter, allgather, broadcast and reduce over shared memory with the plan runner (with check="off" the
# communicator's runner shortcut: one C call per call), per (collective, more ranks than cores): rows
# (below this many bytes of each rank's input, algorithm, params), the first row above the call's size wins;
# "native" is MPI's own collective. Small calls stay on the runner (n=2, 512 B-8 KiB: 0.73-0.87x of a bare MPI
# call, against 0.62-0.73x for MPI's own posted from Python even through a persistent request); large broadcast, allgather and reduce_scatter go back to MPI, which copies once between the
# ranks' buffers where the windows copy twice (except reduce_scatter at n=2 from 48 MiB, where MPICH's falls off
# a cliff). Measured with `bench/bench_mpi.py --comm-check off --collective C` at n=2 (ranks <= cores) and n=4
# on 2 cores, 3-4 runs each; above 2 MiB the VM's memory state moves the ratios by up to 2x between runs, and the
# rows follow the majority (docs/performance-mpi.md, "The other collectives with the runner").
KIB, MIB = 1 << 10, 1 << 20
INF = float("inf")
RUNNER_TABLE: dict[tuple[str, bool], tuple[tuple[float, str, dict], ...]] = {
    ("broadcast", False): ((2 * MIB, "binomial", {}), (8 * MIB, "binomial", {"chunks": 4}), (INF, "native", {})),
    ("broadcast", True): ((1 * MIB, "binomial", {}), (8 * MIB, "binomial", {"chunks": 4}), (INF, "native", {})),
    ("reduce", False): ((INF, "binomial", {}),),
    ("reduce", True): ((128 * KIB, "binomial", {}), (INF, "direct", {})),
    ("allgather", False): ((2 * MIB, "ring", {}), (INF, "native", {})),
    ("allgather", True): ((4 * KIB, "recursive_doubling", {}), (4 * MIB, "ring", {}), (INF, "native", {})),
    ("reduce_scatter", False): ((4 * MIB, "ring", {}), (48 * MIB, "native", {}), (INF, "ring", {})),
    ("reduce_scatter", True): ((2 * MIB, "direct", {}), (16 * MIB, "ring", {}), (INF, "native", {})),
}


def shm_chunks(nbytes: int, world_size: int) -> int:
    """Ring chunks so that one piece (nbytes / (p * chunks)) is about SHM_PIECE_BYTES."""
    return max(1, min(SHM_MAX_CHUNKS, nbytes // max(1, world_size * SHM_PIECE_BYTES)))


@dataclass(frozen=True)
class Choice:
    algorithm: str  # a registered algorithm, "native" (MPI's own collective) or "copy" (world size 1)
    params: dict = field(default_factory=dict)
    reason: str = ""


def native_supports(dtype: np.dtype) -> bool:
    """MPI's own collectives take every kernel dtype but bfloat16 (MPICH has no bfloat16 reduction)."""
    return np.dtype(dtype) != BFLOAT16


def _kib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def choose(collective: str, nbytes: int, dtype: np.dtype, world_size: int, available: list[str], *,
           oversubscribed: bool = False) -> Choice:
    """Pick the algorithm for one call: nbytes is each rank's input size, available the registered names,
    oversubscribed whether this host runs more ranks than it has cores."""
    if world_size == 1:
        return Choice("copy", {}, "world size 1: the output is the input")
    shared = shared_memory(world_size)
    limit = native_below(oversubscribed, shared)
    knob = "COLLECTIVES_NATIVE_BELOW" + ("_SHM" if shared else "") + ("_OVERSUBSCRIBED" if oversubscribed else "")
    if collective == "reduce_scatter" and shared and NATIVE_BELOW_SHM_REDUCE_SCATTER < limit:
        limit, knob = NATIVE_BELOW_SHM_REDUCE_SCATTER, "COLLECTIVES_NATIVE_BELOW_SHM_REDUCE_SCATTER"
    small = nbytes < limit
    where = "shared memory" if shared else "point-to-point messages"
    host = (f"{'more ranks than cores, ' if oversubscribed else ''}"
            f"{'all ranks on one host' if shared else 'ranks on several hosts'}")
    if collective == "allreduce" and shared and runner_allreduce(world_size):
        if nbytes < SHM_ONE_SHOT_BELOW and "one_shot" in available:
            return Choice("one_shot", {}, f"one_shot over shared memory: one synchronisation, run in C, beats MPI's "
                                          f"own Allreduce below {_kib(SHM_ONE_SHOT_BELOW)} per rank ({host}; "
                                          "measured, docs/performance-mpi.md; COLLECTIVES_ONE_SHOT_BELOW); this "
                                          f"call: {nbytes} B")
        small = False  # the runner's schedules beat MPI's Allreduce at every size here
        why = f"{nbytes} B >= {_kib(SHM_ONE_SHOT_BELOW)} ({host}; the runner's schedules beat MPI's own at every size)"
    elif (collective, oversubscribed) in RUNNER_TABLE and shared and runner_allreduce(world_size):
        rows = RUNNER_TABLE[collective, oversubscribed]
        here = next(i for i, row in enumerate(rows) if nbytes < row[0])
        bound, name, params = rows[here]
        lower = max((b for b, _, _ in rows if b <= nbytes), default=0)
        span = f"{_kib(lower)}-{_kib(bound)}" if bound != float("inf") else f">= {_kib(lower)}"
        if name == "native" and native_supports(dtype):
            return Choice("native", {}, f"native: MPI's own {collective} is faster at {span} per rank over shared "
                                        f"memory with the plan runner ({host}; measured, docs/performance-mpi.md); "
                                        f"this call: {nbytes} B")
        if name == "native":  # bfloat16 (MPI cannot take it): the schedule of the nearest row that has one
            _, name, params = min((row for row in rows if row[1] != "native"),
                                  key=lambda row: abs(rows.index(row) - here))
        if name in available:
            return Choice(name, dict(params), f"{name} {params} over shared memory, run in C: fastest at {span} per "
                                              f"rank ({host}; measured, docs/performance-mpi.md); this call: "
                                              f"{nbytes} B")
        why = f"{nbytes} B ({host})"
    else:
        why = "bfloat16 is not reducible by MPI" if small else f"{nbytes} B >= {_kib(limit)} ({host})"
    if small and native_supports(dtype):
        return Choice("native", {}, f"native: MPI's own {collective} is faster below {_kib(limit)} per rank "
                                    f"({host}; measured, docs/performance-mpi.md; {knob}); this call: {nbytes} B")
    table = (LARGE_SHM_OVERSUBSCRIBED if oversubscribed else LARGE_SHM) if shared else LARGE
    for name, params in table[collective]:
        if params == "pieces":
            chunks = shm_chunks(nbytes, world_size)
            params = {"chunks": chunks} if chunks > 1 else {}
        if name in available:
            return Choice(name, dict(params), f"{why}: {name} {params} over {where} (measured fastest here, "
                                              "docs/performance-mpi.md)")
    fallback = sorted(available)[0]
    return Choice(fallback, {}, f"no preferred algorithm registered for {collective}; first registered: {fallback}")
