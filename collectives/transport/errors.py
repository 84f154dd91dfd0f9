"""Errors of the MPI transport (defined in collectives/errors.py, re-exported here)."""

from ..errors import CollectiveTimeoutError, CommunicatorClosedError

__all__ = ["CollectiveTimeoutError", "CommunicatorClosedError"]
