"""The transport's runtime without an MPI launcher (torchrun, torch.multiprocessing.spawn): `StoreRuntime`.

* setup goes through torch's Store, the one `init_process_group` rendezvoused on;
* the small collectives (setup, the call agreement across hosts), the messages between hosts and the runtime's own
  collectives go through a gloo process group built on the same store (torch ships gloo on every platform);
* the ranks of one host share memory through files in /dev/shm (the temporary directory where there is none), their
  names exchanged through the store, so the same shared-memory plans and C plan runner run as under mpiexec.

gloo's point-to-point Works report completion only to `wait()` (`is_completed()` stays False until then), so every
outstanding send or receive is waited on by a thread of its own (threads are reused; a receive that never completes
holds one daemon thread, never the process's exit). gloo's collectives complete on gloo's own threads and are polled.
"""

from __future__ import annotations

import collections
import hashlib
import mmap
import os
import queue
import socket
import tempfile
import threading
import time
import uuid
import warnings
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ..transport.runtime import Runtime, Segments
from .framed import FramedMessages


class GlooFailure(RuntimeError):
    """A gloo operation failed: a peer died, a connection broke, or gloo's own timeout passed."""


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing `a`'s memory (a read-only array is only ever sent, never written)."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the array is not writable
        return torch.from_numpy(a)


# -- requests -----------------------------------------------------------------------------------------------
class _Polled:
    """A gloo collective's Work (completed by gloo's threads), then `after()` once it completed."""

    __slots__ = ("after", "work")

    def __init__(self, work, after=None) -> None:
        self.work, self.after = work, after

    def Test(self) -> bool:  # noqa: N802 - the request protocol of transport/runtime.py
        if self.work is None:
            return True
        if not self.work.is_completed():
            return False
        try:
            self.work.wait()
        except RuntimeError as exc:
            raise GlooFailure(str(exc)) from exc
        self.work = None
        if self.after is not None:
            self.after()
        return True

    def Cancel(self) -> None:  # noqa: N802 - gloo cannot cancel a collective; the group fails as a whole
        pass


class _Waited:
    """A request completed by a waiter thread running `job()` (gloo's point-to-point)."""

    __slots__ = ("error", "finished", "origin", "tag_of")

    def __init__(self, tag: int | None = None) -> None:
        self.finished = False
        self.error: BaseException | None = None
        self.origin = -1
        self.tag_of = tag

    def Test(self) -> bool:  # noqa: N802
        if not self.finished:
            return False
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, (GlooFailure, TruncatedMessage)):
                raise error
            raise GlooFailure(str(error)) from error
        return True

    def Cancel(self) -> None:  # noqa: N802 - gloo's Works cannot be cancelled from Python: the thread stays
        pass

    def source(self) -> int:
        return self.origin

    def tag(self) -> int:
        return int(self.tag_of)


class TruncatedMessage(GlooFailure):
    """A framed message was larger than the receive buffer (the message was drained; the stream stays usable)."""


class _Waiters:
    """Daemon threads that run blocking jobs, one job per thread at a time, reused when idle."""

    def __init__(self) -> None:
        self._idle: queue.SimpleQueue = queue.SimpleQueue()

    def run(self, job, request: _Waited) -> _Waited:
        try:
            inbox = self._idle.get_nowait()
        except queue.Empty:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="collectives-gloo-wait", daemon=True).start()
        inbox.put((job, request))
        return request

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            job, request = inbox.get()
            try:
                job(request)
            except BaseException as exc:  # noqa: BLE001 - handed to the request, raised by Test()
                request.error = exc
            request.finished = True
            self._idle.put(inbox)


_WAITERS = _Waiters()


# -- shared memory on one host --------------------------------------------------------------------------------
def _shm_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class _FileSegments(Segments):
    """Every host rank's segment: a file each rank creates, maps, and unlinks once every rank of the host mapped
    it (the memory lives while mapped; nothing is left behind if a process dies)."""

    def __init__(self, runtime: StoreRuntime, nbytes: int) -> None:
        store, rank, ranks = runtime.store, runtime.rank, runtime.host_ranks()
        runtime.segment_round += 1
        key = f"segments/{runtime.segment_round}"
        path = os.path.join(_shm_directory(), f"collectives-{uuid.uuid4().hex}")
        size = max(nbytes, 1)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            own = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        store.set(f"{key}/{rank}", path)
        self._maps = []
        try:
            for q in ranks:
                if q == rank:
                    self._maps.append(own)
                    continue
                other = store.get(f"{key}/{q}").decode()  # blocks until rank q set it (the store's timeout)
                fd = os.open(other, os.O_RDWR)
                try:
                    self._maps.append(mmap.mmap(fd, size))
                finally:
                    os.close(fd)
            # every rank of the host mapped every segment: the names can go
            if store.add(f"{key}/mapped", 1) == len(ranks):
                store.set(f"{key}/all", "1")
            store.wait([f"{key}/all"])
        finally:
            os.unlink(path)
        self.views = [np.frombuffer(m, dtype=np.uint8, count=nbytes) for m in self._maps]

    def free(self) -> None:
        self.views = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a view still exported elsewhere: the mapping goes with it
                pass
        self._maps = []


# -- gloo's own collectives ---------------------------------------------------------------------------------
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
               "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
               "bxor": dist.ReduceOp.BXOR}
_GLOO_REDUCES = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64)}


class _GlooNative:
    """gloo's collectives on numpy buffers (pure data movement travels as bytes, so every dtype moves)."""

    IN_PLACE = object()

    def __init__(self, pg) -> None:
        self.pg = pg

    @staticmethod
    def _reducible(a: np.ndarray, op: str) -> torch.Tensor:
        if a.dtype not in _GLOO_REDUCES:
            raise TypeError(f"gloo's own reductions cannot take {a.dtype}; use algorithm='auto' or one of the "
                            "library's algorithms")
        return _tensor(a.reshape(-1))

    @staticmethod
    def _bytes(a: np.ndarray) -> torch.Tensor:
        return _tensor(a.reshape(-1).view(np.uint8))

    def allreduce(self, send, recv, op: str):
        if send is not self.IN_PLACE:
            np.copyto(recv, send)
        opts = dist.AllreduceOptions()
        opts.reduceOp = _REDUCE_OPS[op]
        return _Polled(self.pg.allreduce([self._reducible(recv, op)], opts))

    def reduce(self, send, recv, op: str, root: int):
        if send is self.IN_PLACE:
            work = recv
        elif recv is not None:
            np.copyto(recv, send)
            work = recv
        else:
            work = send.copy()  # gloo reduces in place; the caller's input stays as it was
        opts = dist.ReduceOptions()
        opts.reduceOp, opts.rootRank = _REDUCE_OPS[op], root
        return _Polled(self.pg.reduce([self._reducible(work, op)], opts))

    def broadcast(self, buf, root: int):
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return _Polled(self.pg.broadcast([self._bytes(buf)], opts))

    def reduce_scatter(self, send, recv, op: str):
        # gloo's reduce_scatter: an allreduce of the whole input, then this rank's block copied out
        whole = send.reshape(-1).copy()
        n, r = recv.size, self.pg.rank()
        opts = dist.AllreduceOptions()
        opts.reduceOp = _REDUCE_OPS[op]
        work = self.pg.allreduce([self._reducible(whole, op)], opts)
        return _Polled(work, lambda: np.copyto(recv.reshape(-1), whole[r * n:(r + 1) * n]))

    def allgather(self, send, recv):
        p = self.pg.size()
        rows = recv.reshape(-1).view(np.uint8).reshape(p, -1)
        return _Polled(self.pg.allgather([[_tensor(rows[q]) for q in range(p)]], [self._bytes(send)]))

    def alltoall(self, send, recv):
        return _Polled(self.pg.alltoall_base(self._bytes(recv), self._bytes(send), [], []))

    def alltoallv(self, send, send_counts, recv, recv_counts):
        k = send.dtype.itemsize
        return _Polled(self.pg.alltoall_base(self._bytes(recv), self._bytes(send),
                                             [int(c) * k for c in recv_counts], [int(c) * k for c in send_counts]))

    def gather(self, send, recv, root: int):
        p = self.pg.size()
        opts = dist.GatherOptions()
        opts.rootRank = root
        outs = [[_tensor(r) for r in recv.reshape(-1).view(np.uint8).reshape(p, -1)]] if recv is not None and \
            self.pg.rank() == root else []
        return _Polled(self.pg.gather(outs, [self._bytes(send)], opts))

    def scatter(self, send, recv, root: int):
        p = self.pg.size()
        opts = dist.ScatterOptions()
        opts.rootRank = root
        ins = [[_tensor(r) for r in send.reshape(-1).view(np.uint8).reshape(p, -1)]] if send is not None else []
        return _Polled(self.pg.scatter([self._bytes(recv)], ins, opts))

    def barrier(self):
        return _Polled(self.pg.barrier())


# -- the runtime ----------------------------------------------------------------------------------------------
class StoreRuntime(Runtime):
    """Ranks 0..size-1 of a torch Store rendezvous (collective to create: every rank, the same `name`)."""

    failure = GlooFailure
    native_measured = False  # auto's measured decisions are MPI's own collectives, not gloo's
    tag_upper_bound = 2**31 - 1

    def __init__(self, store, rank: int, size: int, timeout: float | None = None, name: str = "collectives",
                 framed: bool = False) -> None:
        self._base, self._name = store, name
        self.store = dist.PrefixStore(f"{name}/", store)
        self.rank, self.size = rank, size
        self.timeout = timeout
        seconds = 1800.0 if timeout is None else max(float(timeout), 1.0)
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", self.store), rank, size, timedelta(seconds=seconds))
        self.native = _GlooNative(self.pg)
        self.name = f"torch's store and gloo (torch {torch.__version__})"
        self.framed = framed  # messages carry their length (point-to-point: receives larger than what is sent)
        self._framed = FramedMessages(self.pg, _WAITERS, _Waited, TruncatedMessage)
        self._mailbox: dict[int, collections.deque] = {}  # messages to oneself not yet received, per tag
        self._self_receives: dict[int, collections.deque] = {}  # receives from oneself not yet matched, per tag
        self.segment_round = 0
        self._duplicates = 0
        self._host: list[int] | None = None

    def native_refusal(self, collective: str, dtype: np.dtype) -> str | None:
        if collective in ("allreduce", "reduce", "reduce_scatter") and dtype not in _GLOO_REDUCES:
            return f"gloo reduces only {', '.join(sorted(str(t) for t in _GLOO_REDUCES))}"
        return None

    # -- small collectives ----------------------------------------------------------------------------------
    def ibarrier(self):
        return _Polled(self.pg.barrier())

    def iallgather(self, send: np.ndarray, recv: np.ndarray):
        return _Polled(self.pg.allgather([[_tensor(recv[q]) for q in range(self.size)]], [_tensor(send)]))

    def iallreduce(self, send: np.ndarray, recv: np.ndarray, op: str):
        np.copyto(recv, send)
        opts = dist.AllreduceOptions()
        opts.reduceOp = _REDUCE_OPS[op]
        return _Polled(self.pg.allreduce([_tensor(recv)], opts))

    # -- point to point -------------------------------------------------------------------------------------
    # Every send and receive is posted on the caller's thread (gloo keeps messages of one sender and tag in posting
    # order, as MPI does); only the wait runs on a waiter thread.
    def isend(self, buf: np.ndarray, peer: int, tag: int):
        if peer == self.rank:
            return self._send_to_self(buf, tag)
        if not self.framed:
            work = self.pg.send([_tensor(buf)], peer, tag)
            return _WAITERS.run(lambda _: work.wait(), _Waited(tag))
        return self._framed.send(_tensor(buf.reshape(-1).view(np.uint8)), buf.nbytes, peer, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: int):
        return self.irecv_any(buf, peer, tag)

    def irecv_any(self, buf: np.ndarray, peer: int | None, tag: int | None):
        if tag is None:
            raise ValueError("a receive from any tag needs MPI (gloo matches messages by tag); pass the tag")
        if peer == self.rank or (peer is None and self._mailbox.get(tag)):
            return self._receive_from_self(buf, tag)
        pg = self.pg
        if not self.framed:
            work = pg.recv_anysource([_tensor(buf)], tag) if peer is None else pg.recv([_tensor(buf)], peer, tag)

            def wait(request):
                work.wait()
                request.origin = work._source_rank() if peer is None else peer
            return _WAITERS.run(wait, _Waited(tag))
        return self._framed.receive(buf, peer, tag)

    # gloo has no connection to oneself: messages to oneself are copied here, matched by tag in posting order (a
    # receive from any source posted before the message to oneself is gloo's, and only sees other ranks')
    def _send_to_self(self, buf: np.ndarray, tag: int) -> _Waited:
        waiting = self._self_receives.get(tag)
        if waiting:
            self._deliver(buf, *waiting.popleft())
        else:
            self._mailbox.setdefault(tag, collections.deque()).append(buf.reshape(-1).view(np.uint8).copy())
        done = _Waited(tag)
        done.finished = True
        return done

    def _receive_from_self(self, buf: np.ndarray, tag: int) -> _Waited:
        request = _Waited(tag)
        queued = self._mailbox.get(tag)
        if queued:
            self._deliver(queued.popleft(), buf, request)
        else:
            self._self_receives.setdefault(tag, collections.deque()).append((buf, request))
        return request

    def _deliver(self, data: np.ndarray, buf: np.ndarray, request: _Waited) -> None:
        data, into = data.reshape(-1).view(np.uint8), buf.reshape(-1).view(np.uint8)
        request.origin = self.rank
        if data.nbytes > into.nbytes:
            request.error = TruncatedMessage(f"message of {data.nbytes} bytes from rank {self.rank} (itself), buffer "
                                             f"of {into.nbytes} bytes")
        else:
            into[:data.nbytes] = data
        request.finished = True

    def truncated(self, exc: BaseException) -> bool:
        return isinstance(exc, TruncatedMessage)

    def duplicate(self, framed: bool = False) -> StoreRuntime:
        self._duplicates += 1
        return StoreRuntime(self._base, self.rank, self.size, self.timeout, f"{self._name}/{self._duplicates}",
                            framed=framed)

    # -- this host ----------------------------------------------------------------------------------------
    def host_ranks(self) -> list[int]:
        if self._host is None:
            mine = np.frombuffer(hashlib.sha256(_host_identity().encode()).digest(), np.uint8)
            rows = np.empty((self.size, mine.size), np.uint8)
            _wait(self.iallgather(mine.copy(), rows), self.timeout, "the exchange of host names")
            self._host = [q for q in range(self.size) if np.array_equal(rows[q], mine)]
        return list(self._host)

    def shared_segments(self, nbytes: int) -> Segments:
        return _FileSegments(self, nbytes)

    def free(self) -> None:
        pg, self.pg, self.native = self.pg, None, None
        if pg is not None and hasattr(pg, "shutdown"):
            pg.shutdown()


def _wait(request, timeout: float | None, what: str) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    nap = 0.0
    while not request.Test():
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not complete within {timeout} s: not every rank took part")
        nap = min(1e-3, nap * 2 or 1e-5)
        time.sleep(nap)


def _host_identity() -> str:
    """Processes that can share memory: the same host name and the same boot (one kernel)."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return f"{socket.gethostname()}/{boot}"


__all__ = ["GlooFailure", "StoreRuntime", "TruncatedMessage"]
