"""Creating the backend's process groups: torch's backend creator (extended API) and the per-group `Options`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from .process_group import CollectivesProcessGroup
from .work import LOCK, seconds


@dataclass
class Options:
    """Library options for a group: `dist.init_process_group("collectives", pg_options=Options(...))` or
    `dist.new_group(ranks, pg_options=Options(...))` (a sub-group without options inherits the default group's).
    None means the library's default (and its environment variables, e.g. COLLECTIVES_ACCUMULATE)."""

    accumulate: str | None = None  # "float32": 16-bit float sums carried in float32, rounded once
    deterministic: bool | None = None  # True: fixed rank-order reductions (algorithm 'direct')
    check: str | None = None  # call agreement: "metadata" (default), "full", "off"
    # scale-up domains for hierarchical algorithms (default: per host): a size k, a list of domain sizes ([3, 2])
    # or a list of rank lists ([[0, 2, 4], [1, 3]]), as collectives.init takes
    ranks_per_domain: int | list | None = None
    # what the default group runs on: "mpi" (the MPI world of mpiexec), "store" (torch's store and gloo: torchrun,
    # spawn); None: "mpi" when an MPI launcher started at least this job's ranks, else "store". Sub-groups run on
    # the default group's runtime.
    runtime: str | None = None


_group_base = None  # a Dup of the default group's MPI communicator: sub-groups are cut from it
_default_options = Options()
_default_runtime = "mpi"  # what the default group runs on: sub-groups run on the same


def _library_options(options: Options) -> dict:
    return {k: v for k, v in asdict(options).items() if k != "runtime"}


# the world size an MPI launcher gives its processes (MPICH/Intel MPI's hydra and Slurm's PMI, Open MPI, MVAPICH)
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_size() -> int:
    """How many processes an MPI launcher started, from its environment (0: no MPI launcher's environment)."""
    return max([int(os.environ[v]) for v in _LAUNCHER_SIZE if os.environ.get(v, "").isdigit()] or [0])


def torch_launched() -> bool:
    """torchrun (or another launcher of torch's env:// kind) started this process: RANK and WORLD_SIZE are set and
    no MPI launcher started that many processes (under `srun torchrun` each worker inherits a PMI size of one per
    node)."""
    rank, size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return rank.isdigit() and size.isdigit() and launcher_size() < int(size)


def _runtime_for(options: Options, size: int) -> str:
    """The default group's runtime: as asked; else MPI when an MPI launcher started at least this job's ranks
    (switch daemons are extra processes), else torch's store. Read from the launcher's environment, so that
    torchrun's and spawn's processes never initialise MPI, one-process jobs included."""
    if options.runtime not in (None, "mpi", "store"):
        raise ValueError(f"backend 'collectives': Options(runtime={options.runtime!r}); use 'mpi', 'store' or None")
    if options.runtime is not None:
        return options.runtime
    return "mpi" if launcher_size() >= size else "store"


def _store_group(dist_opts, options: Options, rank: int, size: int, timeout):
    """A group over torch's store (every member calls this; torch's store is already prefixed per group)."""
    import collectives

    from .runtime import StoreRuntime

    runtime = StoreRuntime(dist_opts.store, rank, size, timeout=timeout, name="collectives")
    return collectives.init(runtime, timeout=timeout, **_library_options(options))


def create_process_group(dist_opts, backend_options=None) -> CollectivesProcessGroup:
    """Backend creator (torch's extended API). Under mpiexec: the default group over the MPI world (minus switch
    daemons), a sub-group over the default group's ranks `global_ranks_in_group` cut with MPI_Comm_create_group.
    Under torchrun or spawn: every group over torch's store (gloo between hosts, shared memory on a host). Only a
    group's members call this."""
    global _group_base, _default_options, _default_runtime
    import collectives

    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = seconds(dist_opts.timeout, None)
    ranks = list(dist_opts.global_ranks_in_group)
    if backend_options is not None and not isinstance(backend_options, Options):
        raise TypeError(f"backend 'collectives' takes pg_options=collectives.torch.Options(...), got "
                        f"{type(backend_options).__name__}")
    with LOCK:
        if not ranks:  # the default group
            options = backend_options or Options()
            _default_runtime = _runtime_for(options, size)
            _default_options = options
            if _default_runtime == "store":
                return CollectivesProcessGroup(_store_group(dist_opts, options, rank, size, timeout), rank, size,
                                               timeout)
            comm = collectives.init(timeout=timeout, **_library_options(options))
            if comm.rank != rank or comm.size != size:
                comm.close()
                if comm.size == 1 and options.runtime == "mpi":
                    raise ValueError(
                        f"backend 'collectives': Options(runtime='mpi') runs on the MPI world, but no MPI launcher "
                        f"started this job (MPI has 1 rank, torch's world_size is {size}): start it with `mpiexec "
                        f"-n {size}`, or leave runtime unset (or 'store') to run on torch's store as under "
                        "torchrun and torch.multiprocessing.spawn")
                raise ValueError(
                    f"backend 'collectives': init_process_group got rank {rank}, world_size {size}, but MPI has rank "
                    f"{comm.rank} of {comm.size}; start the job with mpiexec and pass the MPI rank and size (or "
                    "call collectives.torch.init_process_group(), which does), or start it with torchrun and "
                    "pass pg_options=collectives.torch.Options(runtime='store')")
            if _group_base is not None:
                _group_base.Free()
            _group_base = comm.mpi_comm.Dup()
            return CollectivesProcessGroup(comm, rank, size, timeout)
        if backend_options is not None and backend_options.runtime not in (None, _default_runtime):
            raise ValueError(
                f"backend 'collectives': new_group(pg_options=Options(runtime={backend_options.runtime!r})), but "
                f"the default group runs on {_default_runtime!r} and its sub-groups run on the same; leave "
                "runtime unset for a sub-group (set it in init_process_group's pg_options)")
        if _default_runtime == "store":
            return CollectivesProcessGroup(_store_group(dist_opts, backend_options or _default_options, rank, size,
                                                        timeout), rank, size, timeout)
        if _group_base is None:
            raise RuntimeError("backend 'collectives': a sub-group needs the default group to use backend "
                               "'collectives' too")
        group = _group_base.Get_group().Incl(ranks)
        try:
            sub = _group_base.Create_group(group)
        finally:
            group.Free()
        try:
            comm = collectives.init(sub, timeout=timeout, **_library_options(backend_options or _default_options))
        finally:
            sub.Free()
    return CollectivesProcessGroup(comm, rank, size, timeout)


__all__ = ["Options", "create_process_group", "launcher_size", "torch_launched"]
