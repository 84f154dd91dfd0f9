"""The arena: a communicator's shared memory when all its ranks share one host.

Two kinds of segment over the host's ranks (the runtime's `shared_segments`: MPI-3 shared windows under MPI,
POSIX shared memory without an MPI launcher), each mapped by every rank:

* the control blocks: per rank `CTRL_WORDS` int64 (csrc/plan.h, `coll_ctrl_word`): its `done` counter, two
  signature slots (call number, signature hash) and a poison word in one cache line, its `read` counter in the
  next. The counters carry the plan runner's progress; the signature slots carry the call agreement (every rank
  writes what it is calling, every rank compares with every peer before its call returns), so on one host the
  agreement costs no extra synchronisation;
* the data windows: per rank a *mirror* of the ranges its peers read (see plan.py), grown collectively
  (doubling) when a call needs more. A call that fits in half a window uses half (call number & 1), so a rank
  can write its next call while its peers still read this one (csrc/plan.h); the private `reuse` words of its
  control block say when the peers are done with each half (`reserve`).

Created once per communicator, at `collectives.init`, when every rank of the communicator is on this host and
COLLECTIVES_SHM is on (collective over the communicator).
"""

from __future__ import annotations

import os

import numpy as np

from ... import environment

try:
    from collectives._ckernels import ffi, lib
except ImportError:  # no C extension: numpy stores and loads (fenced where the CPU needs it)
    ffi = lib = None

# csrc/plan.h: enum coll_ctrl_word
DONE, SIG_SEQ, SIG_HASH, POISON, FLAG, READ, REUSE, PID, ORIGIN, SELF, CTRL_WORDS = 0, 1, 2, 5, 6, 8, 9, 11, 12, 13, 16
MATCH, NOT_STARTED, MISMATCH, POISONED = 1, 0, -1, -2


def enabled() -> bool:
    """Shared memory may serve calls (COLLECTIVES_SHM)."""
    return environment.get("COLLECTIVES_SHM")


class Arena:
    """Control and data windows of one communicator whose ranks all share this host."""

    def __init__(self, runtime) -> None:
        """`runtime`: the communicator's runtime, every rank of which is on this host (the caller checked)."""
        self.runtime = runtime
        self.rank = runtime.rank
        self.size = runtime.size
        self.ctrl_segments = runtime.shared_segments(CTRL_WORDS * 8)
        self.ctrl = [v.view(np.int64) for v in self.ctrl_segments.views]
        self.ctrl[self.rank][:] = 0
        self.ctrl[self.rank][SIG_SEQ] = self.ctrl[self.rank][SIG_SEQ + 2] = -1  # no call signed yet
        # where peers find this rank for single-copy reads (csrc/plan.h, PEER_READ): its process, and its
        # control block's address in its own memory (what agree_single_copy reads)
        self.ctrl[self.rank][PID] = os.getpid()
        self.ctrl[self.rank][SELF] = self.ctrl[self.rank].ctypes.data
        self.single_copy_min = 0  # messages from this size are read from the sender's memory (agree_single_copy)
        self.data = None  # the data segments, once a call needs them
        self.capacity = 0
        self.generation = 0  # bumped whenever the data windows are replaced (runners rebind their pointers)
        self.views: list[np.ndarray] = []
        self._typed: dict = {}
        self._c_ctrl = None
        self._c_windows = None
        self._agree_out = None  # coll_ctrl_agree's answer (one int64, reused: a rank tests one agreement at a time)
        self.sync()

    def agree_single_copy(self, min_bytes: int) -> int:
        """Collective over the host: the message size from which the plan runner reads a peer's memory directly
        (PEER_READ), or 0 (never). Nonzero when every rank asks for the same `min_bytes` > 0
        (COLLECTIVES_SHM_SINGLE_COPY) and can read every peer's memory (Linux cross-memory attach): each rank
        first allows it where a security module restricts it to ancestors (coll_allow_peer_reads, as MPI
        libraries do), then reads each peer's process id from the peer's own memory. ValueError on every rank
        when the ranks ask for different sizes (their programs would differ)."""
        import time

        ok = min_bytes > 0 and lib is not None and lib.coll_allow_peer_reads() == 0
        self.sync()  # every rank has allowed it (and written PID and SELF at creation) before anyone reads
        if ok:
            got = np.zeros(1, np.int64)
            for q in range(self.size):
                c = self.ctrl[q]
                if q != self.rank and (lib.coll_peer_read(int(c[PID]), ffi.from_buffer(got), int(c[SELF]) + 8 * PID,
                                                          8) != 0 or got[0] != c[PID]):
                    ok = False
                    break
        want, agreed = np.array([int(ok), min_bytes, -min_bytes], np.int64), np.zeros(3, np.int64)
        req = self.runtime.iallreduce(want, agreed, "min")
        while not req.Test():
            time.sleep(1e-6)
        if agreed[1] != -agreed[2]:
            name = "COLLECTIVES_SHM_SINGLE_COPY"
            raise ValueError(f"the ranks of this host set {name} differently ({agreed[1]} to {-agreed[2]} bytes; "
                             f"this rank: {min_bytes}): set it alike on every rank")
        self.single_copy_min = min_bytes if agreed[0] else 0
        return self.single_copy_min

    # -- data windows -------------------------------------------------------------------------------------
    def grow(self, nbytes: int) -> None:
        """Collective over the host: (re)allocate every rank's data window to at least nbytes (doubling)."""
        cap = max(4096, self.capacity)
        while cap < nbytes:
            cap *= 2
        self.views, self._typed, self._c_windows = [], {}, None
        if self.data is not None:
            self.data.free()
        self.data = self.runtime.shared_segments(cap)
        self.views = self.data.views
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
        """A new `char *[]` for a runner: work, source and output (set per call), then every rank's data
        window (program.py numbers them)."""
        if self._c_windows is None:
            keep = [ffi.from_buffer(v) for v in self.views]
            self._c_windows = ([ffi.cast("char *", k) for k in keep], keep)
        return ffi.new("char *[]", [ffi.NULL, ffi.NULL, ffi.NULL, *self._c_windows[0]])

    # -- counters and the call agreement, from Python ------------------------------------------------------
    def fence(self) -> None:
        self.ctrl_segments.sync()

    def sync(self) -> None:
        """A barrier of the host's ranks, bounded (setup only: a call never waits on one)."""
        import time

        req, deadline = self.runtime.ibarrier(), time.monotonic() + (environment.get("COLLECTIVES_TIMEOUT") or 1e9)
        while not req.Test():
            if time.monotonic() > deadline:
                raise TimeoutError("the host's ranks did not all create the shared-memory arena in time")
            time.sleep(1e-5)

    def reserve(self, seq: int, half: int, end: int) -> tuple[int, int]:
        """The window part of call `seq` ending with counters at `end`, as csrc/plan.c's restart: (byte offset
        of the call's half, or 0 for the whole window when `half` is 0; the peers' `read` at which the calls that
        wrote it before are read)."""
        mine = self.ctrl[self.rank]
        if half > 0:
            h = seq & 1
            reuse = int(mine[REUSE + h])
            mine[REUSE + h] = end
            return h * half, reuse
        reuse = int(max(mine[REUSE], mine[REUSE + 1]))
        mine[REUSE] = mine[REUSE + 1] = end
        return 0, reuse

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

    def sign(self, seq: int, signature: int, flag: int | None = None) -> None:
        """Write this rank's signature slot for call `seq`, and first its flag word of the slot's parity (a bit
        every rank reads once the agreement is complete, HostAgreement's `flag`) when given."""
        if flag is not None:
            if lib is not None:
                lib.coll_ctrl_sign_flag(self._c_ctrl_ptr(self.rank), seq, signature, flag)
                return
            self.ctrl[self.rank][FLAG + (seq & 1)] = 2 * seq + flag  # published by the slot's release store
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

    def agree(self, seq: int, signature: int) -> tuple[int, int]:
        """Every peer's view of call `seq` at once (coll_ctrl_agree): (1, AND of the peers' flag bits) when all
        started it with this signature, (0, a peer not started yet), (-1, a peer that differs or poisoned it)."""
        if lib is not None:
            out = self._agree_out
            if out is None:
                out = self._agree_out = ffi.new("int64_t *")
            rc = lib.coll_ctrl_agree(self.c_ctrl(), self.size, self.rank, seq, signature, out)
            return rc, int(out[0])
        flags = 1
        for q in range(self.size):
            if q == self.rank:
                continue
            state = self.compare(q, seq, signature)
            if state != MATCH:
                return (0 if state == NOT_STARTED else -1), q
            flags &= self.flag(q, seq)
        return 1, flags

    def flag(self, q: int, seq: int) -> int:
        """Rank q's flag bit for call `seq` (0 when its flag word holds another call's: it set none)."""
        word = int(self.ctrl[q][FLAG + (seq & 1)])
        return word & 1 if word >> 1 == seq else 0

    def compare(self, q: int, seq: int, signature: int) -> int:
        """MATCH, NOT_STARTED, MISMATCH or POISONED: rank q's view of call `seq` (coll_ctrl_compare)."""
        if lib is not None:
            return int(lib.coll_ctrl_compare(self._c_ctrl_ptr(q), seq, signature))
        self.fence()
        c, slot = self.ctrl[q], (seq & 1) * 2
        if c[POISON] == seq:
            return POISONED
        if c[SIG_SEQ + slot] != seq:  # a later number: the peer finished this call (csrc/plan.c)
            return MATCH if c[SIG_SEQ + slot] > seq else NOT_STARTED
        return MATCH if c[SIG_HASH + slot] == signature else MISMATCH

    def _c_ctrl_ptr(self, q: int):
        if self._c_ctrl is None:
            self.c_ctrl()
        return self._c_ctrl[1][q]

    def resynchronise(self, value: int) -> None:
        """After a mismatch (every rank stopped its call wherever it was): every rank's counters restart at the
        same `value` (the caller agreed it over MPI, at least every rank's done counter), and with them the
        `reuse` words: nobody reads a window any more (a stopped call may have reserved a later value)."""
        mine = self.ctrl[self.rank]
        mine[REUSE] = mine[REUSE + 1] = value
        self.publish(value)

    def free(self) -> None:
        if self.data is not None:
            self.data.free()
            self.data = None
        self.ctrl_segments.free()


def create(runtime, one_host: bool) -> Arena | None:
    """The arena of the runtime's ranks (collective), or None when shared memory cannot serve them: not every
    rank on this host (`one_host`, agreed by every rank), or COLLECTIVES_SHM=0 on any rank."""
    import time

    want = np.array([int(one_host and enabled())], np.int64)
    agreed = np.zeros(1, np.int64)
    req = runtime.iallreduce(want, agreed, "min")
    while not req.Test():
        time.sleep(1e-6)
    if not agreed[0]:
        return None
    arena = Arena(runtime)
    arena.agree_single_copy(environment.get("COLLECTIVES_SHM_SINGLE_COPY"))
    return arena


__all__ = ["Arena", "CTRL_WORDS", "DONE", "MATCH", "MISMATCH", "NOT_STARTED", "ORIGIN", "PID", "POISONED", "READ",
           "create", "enabled"]
