"""Creating the backend's process groups: torch's backend creator (extended API) and the per-group `Options`."""

from __future__ import annotations

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
    ranks_per_domain: int | None = None  # scale-up domain size for hierarchical algorithms (default: per host)


_group_base = None  # a Dup of the default group's MPI communicator: sub-groups are cut from it
_default_options = Options()


def create_process_group(dist_opts, backend_options=None) -> CollectivesProcessGroup:
    """Backend creator (torch's extended API): the default group over the MPI world (minus switch daemons);
    a sub-group over the default group's ranks `global_ranks_in_group`, cut with MPI_Comm_create_group (only
    its members call this)."""
    global _group_base, _default_options
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
            comm = collectives.init(timeout=timeout, **asdict(options))
            if comm.rank != rank or comm.size != size:
                comm.close()
                raise ValueError(
                    f"backend 'collectives': init_process_group got rank {rank}, world_size {size}, but MPI has rank "
                    f"{comm.rank} of {comm.size}; start the job with mpiexec and pass the MPI rank and size (or "
                    "call collectives.torch.init_process_group(), which does)")
            if _group_base is not None:
                _group_base.Free()
            _group_base = comm.mpi_comm.Dup()
            _default_options = options
            return CollectivesProcessGroup(comm, rank, size, timeout)
        if _group_base is None:
            raise RuntimeError("backend 'collectives': a sub-group needs the default group to use backend "
                               "'collectives' too")
        group = _group_base.Get_group().Incl(ranks)
        try:
            sub = _group_base.Create_group(group)
        finally:
            group.Free()
        try:
            comm = collectives.init(sub, timeout=timeout, **asdict(backend_options or _default_options))
        finally:
            sub.Free()
    return CollectivesProcessGroup(comm, rank, size, timeout)


__all__ = ["Options", "create_process_group"]
