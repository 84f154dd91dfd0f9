"""Errors of the MPI transport (defined in collectives/errors.py, re-exported here)."""

from ..errors import CallMismatchError, CollectiveTimeoutError, CommunicatorClosedError, PeerFailedError

__all__ = ["CallMismatchError", "CollectiveTimeoutError", "CommunicatorClosedError", "PeerFailedError"]
