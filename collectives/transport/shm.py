"""Shared-memory execution of schedules: ranks on one host read their peers' buffers directly.

The same schedule the message-passing executor runs (executor.py) runs here without MPI messages. Every rank
keeps its node state in the caller's work buffer (receives land there, so there is no copy-out) and exposes,
in an MPI-3 shared window (`MPI.Win.Allocate_shared` on the communicator's `Split_type(COMM_TYPE_SHARED)`;
`Shared_query` maps every peer's window), a *mirror* of the ranges its peers read: a SEND op of the schedule only
says which peer reads which range of this rank's window in which round. A receive of [a, b) from node q is a
direct read of q's window range, landed through `collectives.execution.land_receives` (the function the
emulator and the MPI executor use): a store is one copy, a run of reduce-receives into one range is ONE fused
`reduce_into` over the local value and every sender's range, read in place. Results are bitwise the emulator's.

What the window holds (planned once per schedule and rank, `ShmPlan` in shm_plan.py):
* input ranges a peer reads before this rank writes them are copied in just before the counters announce the
  round of their first read (lazily: a chunked call streams through the caches piece by piece);
* a range written in round k and read by a peer in a later round is copied work -> window after landing.

Synchronisation replaces messages: each rank publishes two counters in a small shared control window,
`done` (its mirror holds the state at the start of round k once done >= base + 1 + k) and `read` (it has
finished reading peers' windows for rounds <= k once read >= base + 2 + k).
* data: before reading node q's range in round k, wait for done[q] >= base + 1 + k;
* write-after-read: before writing a mirror range that node q reads in round j <= k (same round included,
  e.g. recursive doubling, where the landing into the private work buffer goes first), wait for
  read[q] >= base + 2 + j. Landing never waits for readers: the work buffer is private.
A call takes 1 + num_rounds counter steps on every rank, so all counters meet at the same base between calls;
the first window write of a call waits for read[q] >= base on every peer (nobody still reads the last call).
Round semantics (ops.py: sends read the round-start state, writes land at round end) hold exactly.

Waits never block: `advance()` does what is ready and returns, so the communicator's waiter (`wait_until`,
spin then yield) and its timeouts work unchanged, and a missing peer surfaces as CollectiveTimeoutError naming
the rank awaited. The arena (control + data windows) is created once per communicator at its first
shared-memory call and the data windows grow (doubling) when a call needs more; both are collective, so they
are preceded by a polled Ibarrier (a missing peer times out instead of hanging); every rank takes the same
decision because it depends only on the call (same schedule and size on every rank).

The plan runner (shm_program.py, csrc/plan.c) executes the same plan compiled to instructions, in C, with the
same counters and the same kernel calls: `advance()` then runs the whole call in one C call, returning only at
a wait that does not pass within NATIVE_POLLS polls. The Python rounds below serve what the runner cannot
(no C extension, a dtype or thread split the C kernels do not serve, COLLECTIVES_SHM_C=0).

Used when every rank of the communicator shares one host, every node of the schedule is a rank (no switch
nodes: daemons and leader-emulated switches take the message path) and COLLECTIVES_SHM is not "0". On other
architectures than x86 (weaker memory ordering) `Win.Sync` fences every counter access.
"""

from __future__ import annotations

import platform
import weakref

import numpy as np
from mpi4py import MPI

from .. import environment
from ..execution import land_receives
from . import executor as _executor
from . import shm_program
from .shm_plan import ShmPlan

# the plan runner polls an unsatisfied wait this often before returning to the caller's waiter (which checks the
# deadline): ~1024 yields, or ~25 us of pauses when every rank has a core
NATIVE_POLLS = 1024
_CTRL_INTS = 16  # per rank: done at [0], read at [8] (separate 64-byte lines)
_FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86")


def enabled() -> bool:
    return environment.get("COLLECTIVES_SHM")


# -- the arena: windows of one communicator -------------------------------------------------------------
class Arena:
    """Control and data windows over the host's ranks of one communicator (all of them, or unusable)."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm_ref = weakref.ref(comm)
        self.usable = False
        self.capacity = 0
        self.data: MPI.Win | None = None
        self.views: list[np.ndarray] = []
        self._typed: dict = {}
        self._c_counters = None  # the plan runner's views (shm_program.py), built on first use
        self._c_windows = None
        self.local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        if self.local.Get_size() != comm.Get_size():
            self.local.Free()
            self.local = None
            return
        self.rank = self.local.Get_rank()
        self.size = self.local.Get_size()
        itemsize = np.dtype(np.int64).itemsize
        self.ctrl = MPI.Win.Allocate_shared(_CTRL_INTS * itemsize, itemsize, comm=self.local)
        if _FENCE:
            self.ctrl.Lock_all()
        self.done, self.read = [], []
        for q in range(self.size):
            buf, _ = self.ctrl.Shared_query(q)
            arr = np.frombuffer(buf, dtype=np.int64, count=_CTRL_INTS)
            self.done.append(arr[0:1])
            self.read.append(arr[8:9])
        self.done[self.rank][0] = 0
        self.read[self.rank][0] = 0
        self.local.Barrier()
        self.usable = True

    def grow(self, nbytes: int) -> None:
        """Collective over the host: (re)allocate every rank's data window to at least nbytes."""
        cap = max(4096, self.capacity)
        while cap < nbytes:
            cap *= 2
        if self.data is not None:
            self.views = []
            self._typed = {}
            self.data.Free()
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        try:
            self.data = MPI.Win.Allocate_shared(cap, 1, info, comm=self.local)
        finally:
            info.Free()
        self.views = [np.frombuffer(self.data.Shared_query(q)[0], dtype=np.uint8, count=cap)
                      for q in range(self.size)]
        self._typed = {}
        self._c_windows = None
        self.capacity = cap

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

    def c_counters(self):
        """(done, read) as `int64_t *[]` over the ranks, for the plan runner (built once per arena)."""
        if self._c_counters is None:
            from .shm_program import ffi
            keep = [ffi.from_buffer(c) for c in self.done + self.read]  # keeps the window memory referenced
            ptrs = [ffi.cast("int64_t *", k) for k in keep]
            self._c_counters = (ffi.new("int64_t *[]", ptrs[:self.size]), ffi.new("int64_t *[]", ptrs[self.size:]),
                                keep)
        return self._c_counters[:2]

    def c_buffers(self):
        """A new `char *[]` for the plan runner: work and source (set per call), then every rank's window."""
        from .shm_program import ffi
        if self._c_windows is None:
            keep = [ffi.from_buffer(v) for v in self.views]  # keeps the window memory referenced
            self._c_windows = ([ffi.cast("char *", k) for k in keep], keep)
        return ffi.new("char *[]", [ffi.NULL, ffi.NULL, *self._c_windows[0]])

    def fence(self) -> None:
        if _FENCE:
            self.ctrl.Sync()


_arenas: dict[int, Arena | None] = {}


def _arena_for(comm: MPI.Comm) -> Arena | None | bool:
    """The comm's arena, None if shared memory cannot serve it, False if not created yet."""
    entry = _arenas.get(id(comm))
    if entry is None and id(comm) in _arenas:
        return None
    if entry is not None and entry.comm_ref() is not comm:
        del _arenas[id(comm)]
        return False
    return entry if entry is not None else False


def shm_plan_for(plan) -> ShmPlan:
    """The process plan's ShmPlan (built once, kept on the plan)."""
    splan = getattr(plan, "_shm_plan", None)
    if splan is None:
        splan = plan._shm_plan = ShmPlan.build(plan.schedule, plan.proc)
    return splan


def program_for(plan, itemsize: int, lazy: bool) -> shm_program.Program:
    """The plan runner's program for the process plan (compiled once per element size and input mode, kept on
    the plan): shared by ShmExecution and the communicator's runner shortcut."""
    programs = plan.__dict__.setdefault("_shm_programs", {})
    program = programs.get((itemsize, lazy))
    if program is None:
        program = programs[itemsize, lazy] = shm_program.compile_plan(shm_plan_for(plan), itemsize, lazy)
    return program


def eligible(plan, comm: MPI.Comm) -> bool:
    """Can this process plan run over shared memory (before knowing whether the ranks share a host)?"""
    s = plan.schedule
    return (enabled() and s.num_nodes == s.world_size and plan.nodes == [plan.proc] and s.world_size > 1
            and plan.placement.proc(plan.proc) == plan.proc and comm.Get_size() == s.world_size
            and comm.Get_rank() == plan.proc)


# -- one call ---------------------------------------------------------------------------------------------
class ShmExecution:
    """One collective over shared memory; same interface as executor.Execution (advance, stuck, cancel,
    events, done, last_completed). `fallback()` builds the message-passing execution used when the
    communicator's ranks do not share one host.

    The caller's work buffer stays the node's state (receives land there, so no copy-out); the window holds a
    mirror of the ranges peers read (copied in at the start, or after the write that precedes the read)."""

    def __init__(self, plan, comm: MPI.Comm, works: list[np.ndarray], kernel_op: str, fallback,
                 source: np.ndarray | None = None) -> None:
        self.plan = plan
        self.comm = comm
        self.work = works[0]
        # lazy input: the node's initial value is `source` (the caller's x), not yet copied into work; ranges are
        # read from it until the schedule writes them (saves a full read + write of the buffer per call)
        self.source = source
        self.kernel_op = kernel_op
        self._fallback_factory = fallback
        self.inner = None  # the message-passing Execution when shared memory cannot serve
        self.events = 0
        self.last_completed = -1
        self._state = "arena"
        self._ibarrier: MPI.Request | None = None
        self._waiting: tuple[int, ...] = ()
        self._i = 0  # next round of the ShmPlan
        self._landed = False  # the current round's receives have landed (its mirror copy may wait)
        self.arena: Arena | None = None
        self.runner: shm_program.Runner | None = None  # the whole call in C (shm_program.py), when it applies
        self._events_before_runner = 0

    @property
    def done(self) -> bool:
        return self._state == "done" if self.inner is None else self.inner.done

    def _barrier(self, comm: MPI.Comm) -> bool:
        """Polled barrier before collective window operations: a missing peer times out instead of hanging."""
        if self._ibarrier is None:
            self._ibarrier = comm.Ibarrier()
        if self._ibarrier.Test():
            self._ibarrier = None
            self.events += 1
            return True
        self._waiting = tuple(q for q in range(comm.Get_size()) if q != comm.Get_rank())
        return False

    def advance(self) -> bool:
        st = self._state
        if st == "native":
            return self._step_native()
        if st == "rounds":
            if not self._run_rounds():
                return False
            self._state = "done"
            return True
        if self.inner is not None:
            done = self.inner.advance()
            self.events = self.inner.events
            self.last_completed = self.inner.last_completed
            return done
        if st == "done":
            return True
        if st == "arena":
            arena = _arena_for(self.comm)
            if arena is False:
                if not self._barrier(self.comm):
                    return False
                arena = Arena(self.comm)
                _arenas[id(self.comm)] = arena if arena.usable else None
                arena = arena if arena.usable else None
            if arena is None:
                self._materialize()
                self.inner = self._fallback_factory()
                return self.advance()
            self.arena = arena
            st = self._state = "grow"
        a = self.arena
        if st == "grow":
            need = self.plan.schedule.work_size * self.work.dtype.itemsize
            if need > a.capacity or a.data is None:
                if not self._barrier(a.local):
                    return False
                a.grow(need)
            self._setup_call()
            st = self._state = "start"
        if self.runner is not None:
            self._state = "native"
            self._events_before_runner = self.events
            return self._step_native()
        # start: nobody reads this rank's window for the previous call any more; copy the input in
        if self.splan.writes_window:
            me = a.rank
            late = tuple(q for q, c in enumerate(a.read) if q != me and c[0] < self.base)
            if late:
                self._waiting = late
                return False
            a.fence()
            mine, origin = self.mine, self.work if self.source is None else self.source
            for lo, hi in self.splan.copy_in:  # nothing is written yet: the input is the origin
                mine[lo:hi] = origin[lo:hi]
        self._publish(self.splan.start_offset)
        self._state = "rounds"
        return self.advance()

    def _setup_call(self) -> None:
        a, plan = self.arena, self.plan
        self.splan = splan = shm_plan_for(plan)
        self.views = a.typed(self.work.dtype, splan.work_size)
        self.mine = self.views[a.rank]
        self.base = int(a.done[a.rank][0])
        work, source = self.work, self.source
        kernel = shm_program.kernel_for(work.dtype, self.kernel_op, work.nbytes)
        if kernel is not None and work.flags.c_contiguous and (source is None or source.flags.c_contiguous):
            program = program_for(plan, work.dtype.itemsize, source is not None)
            self.runner = shm_program.Runner(program, a, kernel)
            self._started = False

    def _step_native(self) -> bool:
        """Run the call's program in C until it finishes or a wait does not pass within a bounded poll."""
        r = self.runner
        if self._started:
            finished = r.step(NATIVE_POLLS, int(_executor._oversubscribed))
        else:
            self._started = True
            finished = r.run(self.work, self.source, NATIVE_POLLS, int(_executor._oversubscribed))
        self.events = self._events_before_runner + r.events
        self.last_completed = r.program.last_completed(r.ip)
        if finished:
            self._state = "done"
            self._waiting = ()
            return True
        self._waiting = (r.waiting,)
        return False

    def _publish(self, offset: int) -> None:
        a = self.arena
        a.fence()
        v = self.base + offset
        a.read[a.rank][0] = v
        a.done[a.rank][0] = v
        self.events += 1

    def _run_rounds(self) -> bool:
        a, base, rounds = self.arena, self.base, self.splan.rounds
        done, read, me = a.done, a.read, a.rank
        work, views, op, node = self.work, self.views, self.kernel_op, self.plan.proc
        while self._i < len(rounds):
            r = rounds[self._i]
            if not self._landed:
                for q, off in r.data_waits:
                    if done[q][0] < base + off:
                        self._waiting = (q,)
                        return False
                a.fence()
                src = self.source
                for g, fresh in zip(r.groups, r.fresh, strict=True):
                    local = None
                    if src is not None and fresh:
                        if len(fresh) == 1 and fresh[0] == (g[0].start, g[0].stop):
                            local = src  # the node's value of the whole target is still the input
                        else:
                            for lo, hi in fresh:
                                work[lo:hi] = src[lo:hi]
                    land_receives(work, [(o, views[o.peer][o.start:o.stop]) for o in g], op, node, local)
                self._landed = True
                if r.mirror:
                    a.fence()
                    read[me][0] = base + 1 + r.k + 1  # this round's reads are over
            if r.mirror:
                for q, off in r.mirror_waits:
                    if read[q][0] < base + off:
                        self._waiting = (q,)
                        return False
                mine = self.mine
                for lo, hi in r.mirror:
                    mine[lo:hi] = work[lo:hi]
            if r.copy_next:
                mine = self.mine
                if self.source is None:
                    for lo, hi in r.copy_next:
                        mine[lo:hi] = work[lo:hi]
                else:  # parts not written yet hold the input's value
                    src = self.source
                    for lo, hi, unwritten in r.copy_next_parts:
                        mine[lo:hi] = (src if unwritten else work)[lo:hi]
            self._landed = False
            self._publish(r.advance_to)
            self.last_completed = r.k
            self._i += 1
        self._waiting = ()
        if self.source is not None:
            for lo, hi in self.splan.never_written:
                work[lo:hi] = self.source[lo:hi]
        return True

    def _materialize(self) -> None:
        """Copy the lazy input into the work buffer (before handing the call to the message executor)."""
        if self.source is not None:
            self.work[...] = self.source
            self.source = None

    def stuck(self) -> tuple[int | None, int | None, tuple[int, ...]]:
        if self.inner is not None:
            return self.inner.stuck()
        if self.done:
            return None, None, ()
        rnd = None
        if self._state == "native":
            rnd = self.runner.program.round_at(self.runner.ip)
        elif self._state == "rounds" and self._i < len(self.splan.rounds):
            rnd = self.splan.rounds[self._i].k
        return rnd, None, self._waiting

    def cancel(self) -> None:
        if self.inner is not None:
            self.inner.cancel()


class RunnerExecution:
    """A call already running in the plan runner (the communicator's one-shot shortcut started it) that did not
    finish within its first poll: the same interface as ShmExecution, for the communicator's bounded waiter."""

    def __init__(self, runner: shm_program.Runner) -> None:
        self.runner = runner
        self.events = runner.events
        self.last_completed = runner.program.last_completed(runner.ip)
        self.done = False

    def advance(self) -> bool:
        r = self.runner
        self.done = r.step(NATIVE_POLLS, int(_executor._oversubscribed))
        self.events = r.events
        self.last_completed = r.program.last_completed(r.ip)
        return self.done

    def stuck(self) -> tuple[int | None, int | None, tuple[int, ...]]:
        if self.done:
            return None, None, ()
        r = self.runner
        return r.program.round_at(r.ip), None, (r.waiting,)

    def cancel(self) -> None:
        pass


__all__ = ["Arena", "RunnerExecution", "ShmExecution", "ShmPlan", "eligible", "enabled", "program_for",
           "shm_plan_for"]
