"""The arena: a communicator's MPI-3 shared windows when all its ranks share one host.

Two windows over the host communicator (`Split_type(COMM_TYPE_SHARED)`; `Shared_query` maps every peer's part):

* the control window: per rank one control block of `CTRL_WORDS` int64 (csrc/plan.h, `coll_ctrl_word`): its
  `done` counter, two signature slots (call number, signature hash) and a poison word in one cache line, its
  `read` counter in the next. The counters carry the plan runner's progress; the signature slots carry the
  call agreement (every rank writes what it is calling, every rank compares with every peer before its call
  returns), so on one host the agreement costs no extra synchronisation;
* the data windows: per rank a *mirror* of the ranges its peers read (see plan.py), grown collectively
  (doubling) when a call needs more.

Created once per communicator, at `collectives.init`, when every rank of the communicator is on this host and
COLLECTIVES_SHM is on (collective over the communicator). On weakly ordered CPUs without the C extension, the
Python side fences counter accesses with `MPI_Win_sync`.
"""

from __future__ import annotations

import platform

import numpy as np
from mpi4py import MPI

from ... import environment

try:
    from collectives._ckernels import ffi, lib
except ImportError:  # no C extension: numpy stores and loads (fenced where the CPU needs it)
    ffi = lib = None

# csrc/plan.h: enum coll_ctrl_word
DONE, SIG_SEQ, SIG_HASH, POISON, READ, CTRL_WORDS = 0, 1, 2, 5, 8, 16
_FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86")
MATCH, NOT_STARTED, MISMATCH, POISONED = 1, 0, -1, -2


def enabled() -> bool:
    """Shared memory may serve calls (COLLECTIVES_SHM)."""
    return environment.get("COLLECTIVES_SHM")


class Arena:
    """Control and data windows of one communicator whose ranks all share this host."""

    def __init__(self, local: MPI.Comm) -> None:
        """`local`: the communicator's ranks on this host, all of them (the caller checked), in rank order."""
        self.local = local
        self.rank = local.Get_rank()
        self.size = local.Get_size()
        itemsize = np.dtype(np.int64).itemsize
        self.ctrl_win = MPI.Win.Allocate_shared(CTRL_WORDS * itemsize, itemsize, comm=local)
        if _FENCE:
            self.ctrl_win.Lock_all()
        self.ctrl = [np.frombuffer(self.ctrl_win.Shared_query(q)[0], dtype=np.int64, count=CTRL_WORDS)
                     for q in range(self.size)]
        self.ctrl[self.rank][:] = 0
        self.ctrl[self.rank][SIG_SEQ] = self.ctrl[self.rank][SIG_SEQ + 2] = -1  # no call signed yet
        self.data: MPI.Win | None = None
        self.capacity = 0
        self.generation = 0  # bumped whenever the data windows are replaced (runners rebind their pointers)
        self.views: list[np.ndarray] = []
        self._typed: dict = {}
        self._c_ctrl = None
        self._c_windows = None
        local.Barrier()

    # -- data windows -------------------------------------------------------------------------------------
    def grow(self, nbytes: int) -> None:
        """Collective over the host: (re)allocate every rank's data window to at least nbytes (doubling)."""
        cap = max(4096, self.capacity)
        while cap < nbytes:
            cap *= 2
        self.views, self._typed, self._c_windows = [], {}, None
        if self.data is not None:
            self.data.Free()
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        try:
            self.data = MPI.Win.Allocate_shared(cap, 1, info, comm=self.local)
        finally:
            info.Free()
        self.views = [np.frombuffer(self.data.Shared_query(q)[0], dtype=np.uint8, count=cap)
                      for q in range(self.size)]
        self.capacity = cap
        self.generation += 1

    def typed(self, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """Every rank's window as `count` elements of `dtype` (cached per dtype and count)."""
        key = (dtype, count)
        views = self._typed.get(key)
        if views is None:
            if len(self._typed) > 64:
                self._typed.clear()
            n = count * dtype.itemsize
            views = self._typed[key] = [v[:n].view(dtype) for v in self.views]
        return views

    # -- what the C plan runner points at ---------------------------------------------------------------
    def c_ctrl(self):
        """Every rank's control block as `int64_t *[]` (built once; keeps the window memory referenced)."""
        if self._c_ctrl is None:
            keep = [ffi.from_buffer(c) for c in self.ctrl]
            pointers = [ffi.cast("int64_t *", k) for k in keep]
            self._c_ctrl = (ffi.new("int64_t *[]", pointers), pointers, keep)
        return self._c_ctrl[0]

    def c_buffers(self):
        """A new `char *[]` for a runner: work and source (set per call), then every rank's data window."""
        if self._c_windows is None:
            keep = [ffi.from_buffer(v) for v in self.views]
            self._c_windows = ([ffi.cast("char *", k) for k in keep], keep)
        return ffi.new("char *[]", [ffi.NULL, ffi.NULL, *self._c_windows[0]])

    # -- counters and the call agreement, from Python ------------------------------------------------------
    def fence(self) -> None:
        if _FENCE:
            self.ctrl_win.Sync()

    def counter(self, q: int, which: int) -> int:
        self.fence()
        return int(self.ctrl[q][which])

    def publish(self, value: int, read_only: bool = False) -> None:
        """read[me] (and done[me] unless read_only) = value, after every store before it (release)."""
        self.fence()
        mine = self.ctrl[self.rank]
        mine[READ] = value
        if not read_only:
            mine[DONE] = value

    def sign(self, seq: int, signature: int) -> None:
        """Write this rank's signature slot for call `seq`."""
        if lib is not None:
            lib.coll_ctrl_sign(self._c_ctrl_ptr(self.rank), seq, signature)
            return
        mine, slot = self.ctrl[self.rank], (seq & 1) * 2
        mine[SIG_HASH + slot] = signature
        self.fence()
        mine[SIG_SEQ + slot] = seq

    def poison(self, seq: int) -> None:
        """Tell peers this rank found a mismatch of call `seq`."""
        if lib is not None:
            lib.coll_ctrl_poison(self._c_ctrl_ptr(self.rank), seq)
            return
        self.fence()
        self.ctrl[self.rank][POISON] = seq

    def compare(self, q: int, seq: int, signature: int) -> int:
        """MATCH, NOT_STARTED, MISMATCH or POISONED: rank q's view of call `seq` (coll_ctrl_compare)."""
        if lib is not None:
            return int(lib.coll_ctrl_compare(self._c_ctrl_ptr(q), seq, signature))
        self.fence()
        c, slot = self.ctrl[q], (seq & 1) * 2
        if c[POISON] == seq:
            return POISONED
        if c[SIG_SEQ + slot] != seq:
            return NOT_STARTED
        return MATCH if c[SIG_HASH + slot] == signature else MISMATCH

    def _c_ctrl_ptr(self, q: int):
        if self._c_ctrl is None:
            self.c_ctrl()
        return self._c_ctrl[1][q]

    def resynchronise(self, value: int) -> None:
        """After a mismatch (every rank stopped its call wherever it was): every rank's counters restart at the
        same `value` (the caller agreed it over MPI, at least every rank's done counter)."""
        self.publish(value)

    def free(self) -> None:
        if self.data is not None:
            self.data.Free()
            self.data = None
        if _FENCE:
            self.ctrl_win.Unlock_all()
        self.ctrl_win.Free()
        self.local.Free()


def create(comm: MPI.Comm) -> Arena | None:
    """The arena of `comm` (collective over comm), or None when shared memory cannot serve it: not every rank
    on this host, or COLLECTIVES_SHM=0 (the answer is the same on every rank)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    everyone_here = local.Get_size() == comm.Get_size()
    usable = comm.allreduce(int(everyone_here and enabled()), op=MPI.MIN)
    if not usable:
        local.Free()
        return None
    return Arena(local)


__all__ = ["Arena", "CTRL_WORDS", "DONE", "MATCH", "MISMATCH", "NOT_STARTED", "POISONED", "READ", "create",
           "enabled"]
