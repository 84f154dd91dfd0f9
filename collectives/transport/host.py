"""Facts about where a communicator's ranks run, gathered once at `collectives.init` and passed explicitly.

The executors and the chooser read them from the communicator's `Host`, never from module globals: two
communicators of one process may differ (a world one and a split one), and every rank must decide the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import environment, kernels


def own_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity; every CPU where affinity is not available)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Host:
    """Agreed by every rank of a communicator (the same values on all of them).

    `ranks_per_host`: the most ranks of the communicator on one host; `cores`: the fewest CPUs the ranks of one
    host may use between them (the union of their affinities: ranks that `mpiexec -bind-to core` pins to a core
    each still do not share one); `one_host`: every rank on the same host; `hosts`: how many hosts."""

    ranks_per_host: int
    cores: int
    one_host: bool
    hosts: int

    @property
    def oversubscribed(self) -> bool:
        """More ranks than cores on some host: waiters yield the CPU on every poll (a peer may need the core)."""
        return self.ranks_per_host > self.cores

    @property
    def kernel_threads(self) -> int:
        """Threads one rank's reductions may use: its share of the host's cores."""
        return max(1, self.cores // self.ranks_per_host)


_CPU_MASK = 4096  # CPUs whose affinity a rank reports (bits of one row of the exchange)


def discover(runtime) -> tuple[Host, list[list[int]]]:
    """The host facts of the runtime's ranks and their hosts as lists of ranks, in order of their lowest rank
    (collective: one exchange of (host leader, CPU affinity) rows)."""
    here = runtime.host_ranks()
    mask = np.zeros(_CPU_MASK // 8, np.uint8)
    for cpu in own_cpus():
        if cpu < _CPU_MASK:
            mask[cpu // 8] |= 1 << (cpu % 8)
    row = np.concatenate((np.array([min(here)], np.int64).view(np.uint8), mask))
    rows = np.empty((runtime.size, row.size), np.uint8)
    wait(runtime.iallgather(row, rows))
    leaders = rows[:, :8].copy().view(np.int64).ravel()
    hosts: dict[int, list[int]] = {}
    for r, lead in enumerate(leaders.tolist()):
        hosts.setdefault(lead, []).append(r)
    cores = []
    for members in hosts.values():
        union = np.bitwise_or.reduce(rows[members, 8:], axis=0)
        cores.append(int(np.unpackbits(union).sum()))
    most = max(len(m) for m in hosts.values())
    host = Host(most, max(1, min(cores)), len(hosts) == 1, len(hosts))
    return host, [hosts[k] for k in sorted(hosts)]


def wait(req, timeout: float | None = None) -> None:
    """Wait for a setup request (bounded by COLLECTIVES_TIMEOUT: a missing peer raises, never hangs)."""
    import time

    limit = environment.get("COLLECTIVES_TIMEOUT") if timeout is None else timeout
    deadline = None if limit is None else time.monotonic() + limit
    nap = 0.0
    while not req.Test():
        if deadline is not None and time.monotonic() > deadline:
            from ..errors import CollectiveTimeoutError
            raise CollectiveTimeoutError(f"the ranks' setup exchange did not complete within {limit} s (a rank may "
                                         "be dead, stuck or late)", collective="init", timeout=limit)
        nap = min(1e-3, nap * 2 or 1e-6)
        time.sleep(nap)


# what MPI launchers put in every process's environment: MPICH's and Intel MPI's hydra (PMI_*), Open MPI
# (OMPI_*), PMIx-based launchers (PMIX_RANK), Slurm's srun (SLURM_PROCID with a PMI plugin)
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_PROCID",
                      "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD")
_warned = False


def warn_if_alone(size: int, environ=None) -> bool:
    """Say once on stderr that this process runs as one rank because no launcher started it (`python app.py`
    instead of `mpiexec -n N python app.py`): everything works, on one rank, which is rarely what was meant.
    COLLECTIVES_ONE_RANK=1 says it is. Returns whether it warned."""
    global _warned
    env = os.environ if environ is None else environ
    if _warned or size != 1 or environment.get("COLLECTIVES_ONE_RANK") or any(v in env for v in LAUNCHER_VARIABLES):
        return False
    _warned = True
    import sys
    print("collectives: running as 1 rank: not started by mpiexec (`mpiexec -n N python ...` runs N ranks; "
          "COLLECTIVES_ONE_RANK=1 says one rank is intended and hides this)", file=sys.stderr, flush=True)
    return True


def share_kernel_threads(host: Host) -> None:
    """Ranks share their host's cores: each rank splits its large reductions over its share only (unless the
    user chose a thread count with COLLECTIVES_KERNEL_THREADS or kernels.set_threads), so kernels of different
    ranks never oversubscribe the cores."""
    if environment.get("COLLECTIVES_KERNEL_THREADS") is None:
        kernels.set_threads(max(1, min(kernels.get_threads(), host.kernel_threads)))


__all__ = ["Host", "LAUNCHER_VARIABLES", "discover", "own_cpus", "share_kernel_threads", "wait", "warn_if_alone"]
