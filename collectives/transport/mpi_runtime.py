"""The transport's runtime over an MPI communicator (mpi4py): `MpiRuntime`, its shared-memory windows and MPI's own
collectives (see runtime.py for what a runtime provides)."""

from __future__ import annotations

import platform

import numpy as np

from .mpi_library import MPI
from .runtime import Runtime, Segments

_WEAK_ORDER = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86")


class _MpiSegments(Segments):
    def __init__(self, local: MPI.Comm, nbytes: int, itemsize: int, info: dict | None) -> None:
        mpi_info = MPI.Info.Create()
        for k, v in (info or {}).items():
            mpi_info.Set(k, v)
        try:
            self.win = MPI.Win.Allocate_shared(nbytes, itemsize, mpi_info, comm=local)
        finally:
            mpi_info.Free()
        if _WEAK_ORDER:
            self.win.Lock_all()  # Win_sync needs a passive-target epoch
        self.views = [np.frombuffer(self.win.Shared_query(q)[0], dtype=np.uint8, count=nbytes)
                      for q in range(local.Get_size())]

    def sync(self) -> None:
        if _WEAK_ORDER:
            self.win.Sync()

    def free(self) -> None:
        self.views = []
        if _WEAK_ORDER:
            self.win.Unlock_all()
        self.win.Free()


def _bytes(a: np.ndarray) -> list:
    """An mpi4py buffer spec of `a`'s bytes (contiguous)."""
    return [a.reshape(-1).view(np.uint8), MPI.BYTE]


class _MpiNative:
    """MPI's own collectives, nonblocking (mpi4py's buffer interface)."""

    OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "band": MPI.BAND, "bor": MPI.BOR,
           "bxor": MPI.BXOR}
    IN_PLACE = MPI.IN_PLACE

    def __init__(self, comm: MPI.Comm) -> None:
        self.c = comm

    def allreduce(self, send, recv, op: str):
        return self.c.Iallreduce(send, recv, self.OPS[op])

    def reduce(self, send, recv, op: str, root: int):
        return self.c.Ireduce(send, recv, self.OPS[op], root)

    # Data movement travels as bytes: every dtype moves (bfloat16 too, which MPI has no type for).
    def broadcast(self, buf, root: int):
        return self.c.Ibcast(_bytes(buf), root)

    def reduce_scatter(self, send, recv, op: str):
        return self.c.Ireduce_scatter_block(send, recv, self.OPS[op]) if recv.size else self.c.Ibarrier()

    def allgather(self, send, recv):
        return self.c.Iallgather(_bytes(send), _bytes(recv)) if send.size else self.c.Ibarrier()

    def alltoall(self, send, recv):
        return self.c.Ialltoall(_bytes(send), _bytes(recv)) if send.size else self.c.Ibarrier()

    def alltoallv(self, send, send_counts, recv, recv_counts):
        k = send.dtype.itemsize
        sc, rc = np.asarray(send_counts, np.int64) * k, np.asarray(recv_counts, np.int64) * k
        sdispl = np.concatenate(([0], np.cumsum(sc)[:-1]))
        rdispl = np.concatenate(([0], np.cumsum(rc)[:-1]))
        return self.c.Ialltoallv([send.reshape(-1).view(np.uint8), (sc, sdispl), MPI.BYTE],
                                 [recv.reshape(-1).view(np.uint8), (rc, rdispl), MPI.BYTE])

    def gather(self, send, recv, root: int):
        return self.c.Igather(_bytes(send), None if recv is None else _bytes(recv), root)

    def scatter(self, send, recv, root: int):
        return self.c.Iscatter(None if send is None else _bytes(send), _bytes(recv), root)

    def barrier(self):
        return self.c.Ibarrier()

    def persistent(self, collective: str, send: np.ndarray, recv, op: str, root: int | None):
        """MPI-4's persistent collective (MPI_Allreduce_init, ...) on these buffers, inactive until Start(); for
        allreduce, reduce_scatter, allgather, alltoall, broadcast and reduce with data to move (`recv is send`:
        in place). An allgather's runs in place: the caller copies its block into its place in `recv` before
        each Start and again once it completes (Intel MPI 2021.18's MPI_Allgather_init leaves the previous
        start's block of this rank there on later starts, at 2 ranks even in place). Collective: every rank initialises its own at the same call
        (executors.NativeExecutor). None: this MPI has none (the same answer on every rank)."""
        try:
            return self._persistent(collective, send, recv, op, root)
        except NotImplementedError:  # an MPI without MPI-4's persistent collectives (mpi4py's stubs)
            return None

    def _persistent(self, collective: str, send: np.ndarray, recv, op: str, root: int | None):
        c, place = self.c, MPI.IN_PLACE if recv is send else send
        if collective == "allreduce":
            return c.Allreduce_init(place, recv, self.OPS[op])
        if collective == "reduce":
            return c.Reduce_init(place if recv is not None else send, recv, self.OPS[op], root)
        if collective == "broadcast":
            return c.Bcast_init(_bytes(send), root)
        if collective == "reduce_scatter":
            return c.Reduce_scatter_block_init(send, recv, self.OPS[op])
        if collective == "allgather":  # in place: the caller copies its block into recv before each Start
            return c.Allgather_init(MPI.IN_PLACE, _bytes(recv))
        if collective == "alltoall":
            return c.Alltoall_init(_bytes(send), _bytes(recv))
        raise ValueError(f"no persistent {collective}")


class _MpiRecv:
    """An MPI receive and the status that says who sent it."""

    __slots__ = ("req", "status")

    def __init__(self, req: MPI.Request) -> None:
        self.req, self.status = req, MPI.Status()

    def Test(self) -> bool:  # noqa: N802 - the request protocol is MPI's
        return self.req.Test(self.status)

    def Cancel(self) -> None:  # noqa: N802
        self.req.Cancel()

    def source(self) -> int:
        return self.status.Get_source()

    def tag(self) -> int:
        return self.status.Get_tag()


class MpiRuntime(Runtime):
    """The transport over an MPI communicator (its own duplicate: the library's messages never meet the
    caller's), errors returned as exceptions (a dead peer surfaces as MPI.Exception, not an abort)."""

    failure = MPI.Exception

    def __init__(self, comm: MPI.Comm, duplicate: bool = True) -> None:
        self.comm = comm.Dup() if duplicate else comm
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.name = MPI.Get_library_version().splitlines()[0].strip()
        self.native = _MpiNative(self.comm)
        self._local: MPI.Comm | None = None
        # the largest tag: read from MPI_COMM_WORLD, where every MPI sets it (Open MPI leaves the attribute unset
        # on duplicated communicators); 32767 is the least the standard guarantees
        value = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self.tag_upper_bound = int(value) if value else 32767

    def native_refusal(self, collective: str, dtype: np.dtype) -> str | None:
        if dtype.name == "bfloat16" and collective in ("allreduce", "reduce", "reduce_scatter"):
            return "MPI has no bfloat16 type"
        return None

    def ibarrier(self):
        return self.comm.Ibarrier()

    def iallgather(self, send: np.ndarray, recv: np.ndarray):
        return self.comm.Iallgather(send, recv)

    def iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str):
        return self.comm.Iallreduce(send, recv, {"min": MPI.MIN, "max": MPI.MAX, "sum": MPI.SUM}[op])

    def isend(self, buf: np.ndarray, peer: int, tag: int):
        return self.comm.Isend([buf, MPI.BYTE], peer, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: int):
        return self.comm.Irecv([buf, MPI.BYTE], peer, tag)

    def irecv_any(self, buf: np.ndarray, peer: int | None, tag: int | None):
        return _MpiRecv(self.comm.Irecv([buf, MPI.BYTE], MPI.ANY_SOURCE if peer is None else peer,
                                        MPI.ANY_TAG if tag is None else tag))

    def testsome(self, reqs: list) -> list[int]:
        return MPI.Request.Testsome(reqs) or []  # completed requests become inactive: reported once

    def truncated(self, exc: BaseException) -> bool:
        return isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE

    def duplicate(self, framed: bool = False) -> MpiRuntime:
        return MpiRuntime(self.comm)

    def _host(self) -> MPI.Comm:
        if self._local is None:
            self._local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        return self._local

    def host_ranks(self) -> list[int]:
        return sorted(self._host().allgather(self.rank))

    def shared_segments(self, nbytes: int, itemsize: int = 1, noncontiguous: bool = True) -> Segments:
        info = {"alloc_shared_noncontig": "true"} if noncontiguous else None
        return _MpiSegments(self._host(), nbytes, itemsize, info)

    def free(self) -> None:
        if self._local is not None:
            self._local.Free()
            self._local = None
        self.comm.Free()


__all__ = ["MpiRuntime"]
