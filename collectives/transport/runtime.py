"""What the transport needs from the processes it runs on, and its MPI implementation.

A `Runtime` is a group of processes (ranks 0..size-1) with:

* small nonblocking collectives (barrier, allgather of fixed-size rows, an int64 allreduce): setup, the call
  agreement across hosts, mismatch reports, alltoallv's counts;
* point-to-point messages of bytes with tags (the message executor and `send`/`recv`), in a tag space of its own
  (`duplicate()` gives another);
* the ranks of this host and memory they share (`shared_segments`: the arena's windows and control blocks);
* optionally the runtime's own collectives (`native`: MPI's own), which auto may pick where they are faster.

Requests are anything with `Test() -> bool` (raising `failure` when a peer failed) and `Cancel()`.

`MpiRuntime` (mpi_runtime.py) runs on an MPI communicator (mpi4py). A runtime that needs no MPI launcher (torch's
Store for setup, shared memory on a host, gloo between hosts) lives with the torch backend (collectives/torch/),
which brings torch. This module imports neither: a process on torch's runtime never initialises MPI.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Segments(ABC):
    """One shared-memory segment per rank of a host (collective to create and to free): `views[q]` is rank q's
    (the host-local index) as bytes, mapped in this process."""

    views: list[np.ndarray]

    def sync(self) -> None:
        """A full memory fence for the segments (only the Python side needs it, on weakly ordered CPUs: the C plan
        runner orders its loads and stores itself). Segments whose mapping needs no fence keep this default."""
        return None

    @abstractmethod
    def free(self) -> None: ...


class Runtime(ABC):
    rank: int
    size: int
    name: str
    failure: type[BaseException]  # what a request raises when a peer failed
    tag_upper_bound: int
    native = None  # the runtime's own collectives (NativeCollectives), or None
    native_measured = True  # auto's measured decisions (MPI's own collectives) describe `native`

    def native_refusal(self, collective: str, dtype: np.dtype) -> str | None:
        """Why `native.<collective>` cannot take `dtype` (None: it can)."""
        return None

    # -- small collectives ------------------------------------------------------------------------------
    @abstractmethod
    def ibarrier(self): ...

    @abstractmethod
    def iallgather(self, send: np.ndarray, recv: np.ndarray):
        """recv[q] = rank q's `send` (1-D, the same dtype and length on every rank; recv is (size, len))."""

    @abstractmethod
    def iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str):
        """int64 element-wise over the ranks, op "min", "max" or "sum"."""

    # -- point to point --------------------------------------------------------------------------------
    @abstractmethod
    def isend(self, buf: np.ndarray, peer: int, tag: int): ...

    @abstractmethod
    def irecv(self, buf: np.ndarray, peer: int, tag: int): ...

    @abstractmethod
    def irecv_any(self, buf: np.ndarray, peer: int | None, tag: int | None):
        """peer/tag None: any. The request's `source()` and `tag()` tell what arrived, once complete."""

    def testsome(self, reqs: list) -> list[int]:
        """Indices of the requests in `reqs` that completed since the last call (each is reported once)."""
        out = []
        for i, r in enumerate(reqs):
            if r is not None and r.Test():
                out.append(i)
                reqs[i] = None
        return out

    def truncated(self, exc: BaseException) -> bool:
        """Whether `exc` (raised by a receive) says the message was larger than the buffer."""
        return False

    @abstractmethod
    def duplicate(self, framed: bool = False) -> Runtime:
        """The same ranks with a tag space of their own (collective). `framed`: its messages may be received into
        larger buffers and a smaller one must fail cleanly (`truncated`), as point-to-point's do; a runtime that
        knows every message's size (MPI) needs nothing more for that."""

    # -- this host ----------------------------------------------------------------------------------------
    @abstractmethod
    def host_ranks(self) -> list[int]:
        """The ranks on this host, in rank order (collective)."""

    @abstractmethod
    def shared_segments(self, nbytes: int) -> Segments:
        """A segment of nbytes per rank of this host, every one mapped by every rank of the host (collective over
        the host; the caller knows the host's ranks all take part)."""

    @abstractmethod
    def free(self) -> None: ...


__all__ = ["Runtime", "Segments"]
