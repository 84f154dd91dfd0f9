"""The MPI transport: `init()` and the `Communicator` that runs the library's schedules under mpiexec.

Rooms: communicator.py (the public API), calls.py (signatures and the one validator), plans.py (a plan per
call signature), choose.py (what a call runs), executors.py (shared memory, messages, MPI's own, local),
agreement.py (the call agreement), progress.py (the queue, Work, bounded waits), context.py (what a
communicator's plans share), host.py (where the ranks run), shm/ (the arena, a rank's plan, its lowering and the
plan runner), messages.py (point-to-point execution), placement.py and daemon.py (switch nodes), domains.py
(scale-up domains), scratch.py (reusable work buffers). Importing this package loads MPI through
mpi_library.py (mpi4py, initialised; a missing or mismatched MPI raises MPILibraryError saying what to install).
"""

# isort: off
from .mpi_library import MPILibraryError  # first: every way into the transport meets its checks
from .communicator import Communicator, init
from .errors import CollectiveTimeoutError, CommunicatorClosedError
from .progress import Work
# isort: on

__all__ = ["CollectiveTimeoutError", "Communicator", "CommunicatorClosedError", "MPILibraryError", "Work", "init"]
