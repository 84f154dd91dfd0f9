"""The MPI transport: `init()` and the `Communicator` that runs the library's schedules under mpiexec.

Layers: communicator.py (public API, call queue, validation), choice.py (algorithm="auto"), executor.py (one
process's programs over MPI), placement.py (which process runs each node), daemon.py (switch daemons),
domains.py (scale-up domains). Importing this package imports mpi4py, which initialises MPI.
"""

from .communicator import Communicator, Work, init
from .errors import CollectiveTimeoutError, CommunicatorClosedError

__all__ = ["CollectiveTimeoutError", "Communicator", "CommunicatorClosedError", "Work", "init"]
