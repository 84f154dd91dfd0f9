"""Errors of the transport (the call errors are defined in collectives/errors.py and re-exported here)."""

from ..errors import (
    CallMismatchError,
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorClosedError,
    PeerFailedError,
)


class MPILibraryError(CollectivesError, ImportError):
    """No usable MPI library, or a launcher that does not belong to the MPI library mpi4py loaded
    (raised by mpi_library.py when a communicator over MPI first loads MPI)."""


__all__ = ["CallMismatchError", "CollectiveTimeoutError", "CommunicatorClosedError", "MPILibraryError",
           "PeerFailedError"]
