"""The transport: `init()` and the `Communicator` that runs the library's schedules for real, on MPI (mpiexec) or
on another runtime (collectives.torch.runtime: torchrun and spawn).

Rooms: communicator.py (the public API), calls.py (signatures and the one validator), plans.py (a plan per
call signature), choose.py (what a call runs), executors.py (shared memory, messages, MPI's own, local),
agreement.py (the call agreement), progress.py (the queue, Work, bounded waits), context.py (what a
communicator's plans share), host.py (where the ranks run), shm/ (the arena, a rank's plan, its lowering and the
plan runner), messages.py (point-to-point execution), placement.py and daemon.py (switch nodes), domains.py
(scale-up domains), scratch.py (reusable work buffers), runtime.py (what the transport needs from the processes)
and mpi_runtime.py (MPI's). MPI is loaded and initialised by the first communicator over MPI, not by importing
this package, through mpi_library.py (a missing or mismatched MPI raises MPILibraryError saying what to install).
"""

from .communicator import Communicator, init
from .errors import CollectiveTimeoutError, CommunicatorClosedError, MPILibraryError
from .persistent import PersistentCall
from .progress import Work

__all__ = ["CollectiveTimeoutError", "Communicator", "CommunicatorClosedError", "MPILibraryError", "PersistentCall",
           "Work", "init"]
