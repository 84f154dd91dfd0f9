"""How far apart a host's cores are right now: the one-way time of a cache line between two ranks' cores.

On a physical machine this is fixed (tens of ns between cores of one L3, a few hundred across chiplets or
sockets). On a VM the hypervisor may move the vCPUs while a job runs: on the 2-vCPU EPYC VM this project is
developed on, the one-way time switched between ~25-60 ns and ~205-250 ns within seconds, and the shared-memory
executor's copy round at 4 MiB with it (~100 against ~310 us per piece; `bench/core_to_core.py` shows both over
time). A prediction carries the state its calibration measured, so `collectives calibrate` records this number
and `bench --predict` measures it again before each size and says which rows ran in another state.

The probe bounces a counter in an MPI-3 shared window between rank 0 and one other rank of its host, with the
C plan runner's own PUBLISH / WAIT instructions (one C call per run, no Python between transfers). The other
rank is the first whose CPU affinity is disjoint from rank 0's (with `-bind-to core`: a rank on another core),
else the host's second rank (unbound: the OS puts two spinning ranks on two cores). Every other rank sleeps
meanwhile (a rank polling a core would slice the spinner's time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

TRIPS = 400  # round trips per run: ~0.2 ms at 250 ns one-way, short enough to fit between time slices
RUNS = 7  # the median over runs leaves out a run a core-mate's wake-up interrupted
# a probe this many times the calibration's (either way) is another placement of the cores: on the VM above one
# placement's probes spread 2.5x (25-60 ns) and the two are 4-10x apart
FAR_RATIO = 3.0


def _sleeping_barrier(comm) -> None:
    """A barrier that sleeps while it waits (MPI's own spins, and would take the core from a probing rank)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


class CoreDistance:
    """The probe, set up once (collective over `mpi_comm`); `measure()` (collective too) returns the one-way
    seconds, the same on every rank, or None when rank 0's host has no second rank on another CPU or the C plan
    runner is missing. `close()` frees its window."""

    def __init__(self, mpi_comm) -> None:
        from mpi4py import MPI

        from ..transport import shm_program
        from ..transport.executor import own_cpus

        self.comm = mpi_comm
        # the split keeps the job's order: rank 0 is local rank 0 of its host
        self.node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.host_cpus = cpus = self.node.allgather(frozenset(own_cpus()))  # this host's ranks', in rank order
        self.on_rank0_host = bool(self.node.bcast(mpi_comm.Get_rank() == 0, root=0))
        partner = None
        if len(cpus) >= 2 and len(frozenset().union(*cpus)) >= 2:
            apart = [q for q in range(1, len(cpus)) if not (cpus[q] & cpus[0])]
            partner = apart[0] if apart else 1
        self.partner = partner
        self.kernel = shm_program.kernel_for(np.dtype(np.float32), "sum", 0)
        self.possible = bool(mpi_comm.bcast(partner is not None and self.kernel is not None, root=0))
        self.flags = MPI.Win.Allocate_shared(64, 8, comm=self.node)  # a counter per rank, each on its own line
        self.lines = None
        if self.possible and self.on_rank0_host and self.node.Get_rank() in (0, partner):
            me = 0 if self.node.Get_rank() == 0 else 1
            counters = [np.frombuffer(self.flags.Shared_query(q)[0], np.int64, 1) for q in (0, partner)]
            counters[me][0] = 0

            def program(trips: int):
                steps = []
                for k in range(1, trips + 1):  # rank 0 serves, the partner returns: 2 transfers per trip
                    steps += [("publish", k), ("wait", 1, k)] if me == 0 else [("wait", 0, k), ("publish", k)]
                return shm_program.StraightLine(steps, [np.zeros(1, np.float32)], 4, self.kernel, counters, me)

            self.lines = (program(1), program(TRIPS))  # a handshake to start together, then the timed trips
        self.node.Barrier()  # both counters are 0 before anyone publishes

    def measure(self) -> float | None:
        if not self.possible:
            return None
        _sleeping_barrier(self.comm)  # nobody else is still busy on the cores
        result = None
        if self.lines is not None:
            handshake, trips = self.lines
            runs = []
            for _ in range(RUNS):
                handshake(1 << 24, 0, timeout=10.0)
                t0 = time.perf_counter()
                trips(1 << 24, 0, timeout=10.0)
                runs.append(time.perf_counter() - t0)
            result = float(np.median(runs)) / (2 * TRIPS)
        _sleeping_barrier(self.comm)
        return self.comm.bcast(result, root=0)

    def close(self) -> None:
        self.flags.Free()
        self.node.Free()


def state_changed(calibrated_s: float | Sequence[float] | None, now_s: float | None) -> bool:
    """Whether the cores are placed otherwise than when the calibration ran: `now_s` over FAR_RATIO away (either
    way) from the calibration's probe (the geometric mean of its probes when it took several), or the calibration's
    own probes that far apart (it saw both placements, and describes neither)."""
    values = [calibrated_s] if isinstance(calibrated_s, (int, float)) or calibrated_s is None else list(calibrated_s)
    if not values or not all(values) or not now_s:
        return False
    if max(values) > FAR_RATIO * min(values):
        return True
    reference = math.exp(sum(math.log(v) for v in values) / len(values))
    ratio = now_s / reference
    return ratio > FAR_RATIO or ratio < 1.0 / FAR_RATIO


__all__ = ["FAR_RATIO", "CoreDistance", "state_changed"]
