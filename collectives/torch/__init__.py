"""PyTorch backend: `import collectives.torch` registers the torch.distributed backend "collectives" (CPU).

Under mpiexec or torchrun::

    import collectives.torch, torch.distributed as dist
    collectives.torch.init_process_group()          # mpiexec: rank/world size from MPI; torchrun: env://
    dist.all_reduce(tensor)                         # runs the library's algorithms and kernels

or `dist.init_process_group("collectives", ...)` as with any backend (torchrun, torch.multiprocessing.spawn).

`init_process_group(backend="gloo")` gives the same bootstrap to torch's own backends. See docs/torch.md.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

try:
    import torch  # noqa: F401
    import torch.distributed as dist
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("collectives.torch needs PyTorch: pip install 'collectives[torch]' (torch>=2.4; CI uses the "
                      "CPU build of torch 2.13.0)") from exc

from .creation import Options, create_process_group, torch_launched
from .process_group import BACKEND_NAME, CollectivesProcessGroup
from .tensors import SUPPORTED_DTYPES, as_numpy
from .work import CollectivesWork, CompletedWork

__all__ = ["BACKEND_NAME", "SUPPORTED_DTYPES", "CollectivesProcessGroup", "CollectivesWork", "CompletedWork", "Options",
           "as_numpy", "create_process_group", "init_process_group", "is_registered", "monitored_barrier", "register"]


def is_registered() -> bool:
    """True once a backend named "collectives" is known to torch.distributed (by this or another import)."""
    return BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}) or \
        BACKEND_NAME in getattr(dist.Backend, "backend_list", [])


def register() -> None:
    """Register backend "collectives" for CPU tensors (idempotent: torch refuses a second registration)."""
    if not is_registered():
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu"])


register()


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """`torch.distributed.monitored_barrier` for groups of this backend (torch's own refuses every backend but gloo
    by name): rank 0 raises naming the ranks that did not arrive within `timeout` (default: the group's)."""
    from torch.distributed.distributed_c10d import _get_default_group

    pg = _get_default_group() if group is None else group
    if not isinstance(pg, CollectivesProcessGroup):
        return dist.monitored_barrier(group, timeout=timeout, wait_all_ranks=wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks)


def _master_host(comm) -> str:
    """Where rank 0's store listens: MASTER_ADDR if set; 127.0.0.1 when every rank shares rank 0's host;
    else rank 0's host name."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    from ..transport.mpi_library import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        one_host = local.Get_size() == comm.Get_size()
    finally:
        local.Free()
    return "127.0.0.1" if one_host else socket.gethostname()


def init_process_group(backend: str = BACKEND_NAME, *, timeout: timedelta | float | None = None,
                       **kwargs) -> tuple[int, int]:
    """`dist.init_process_group` with the rank and world size of whatever started the job; returns (rank, size).

    Under mpiexec: rank and world size from MPI; rank 0 starts a TCPStore on a free port (chosen by the OS) and
    broadcasts host and port over MPI, so no MASTER_ADDR/MASTER_PORT are needed. The ranks are those of
    MPI_COMM_WORLD minus switch daemons (collectives.switchd). Under torchrun (RANK and WORLD_SIZE set, and no MPI
    launcher started that many processes): torch's env:// rendezvous on torchrun's variables, and MPI is never
    initialised. Works for any backend (backend="gloo" included). `timeout`: a timedelta or seconds (torch's
    default if None).
    """
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if torch_launched():
        if timeout is not None:
            kwargs["timeout"] = timeout
        dist.init_process_group(backend, init_method="env://", **kwargs)
        return dist.get_rank(), dist.get_world_size()
    from ..transport import daemon

    comm = daemon.split_world(daemon.APP).local
    rank, size = comm.Get_rank(), comm.Get_size()
    store_timeout = timeout or timedelta(minutes=5)
    host = _master_host(comm)
    store = None
    port = None
    if rank == 0:
        try:
            store = dist.TCPStore(host, int(os.environ.get("MASTER_PORT", 0)), size, is_master=True,
                                  timeout=store_timeout, wait_for_workers=False)
            port = store.port
        except Exception as exc:  # noqa: BLE001 - tell the other ranks, then raise here
            comm.bcast((host, None, repr(exc)), root=0)
            raise
        comm.bcast((host, port, None), root=0)
    else:
        host, port, error = comm.bcast(None, root=0)
        if port is None:
            raise RuntimeError(f"rank 0 could not start the rendezvous store: {error}")
        store = dist.TCPStore(host, port, size, is_master=False, timeout=store_timeout)
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, **kwargs)
    return rank, size
