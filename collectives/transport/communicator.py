"""The Communicator: collectives on numpy arrays under mpiexec, executing the library's schedules over MPI.

Calls on one communicator complete in the order they were issued. Each call becomes a *task* in the
communicator's queue; only the head task has requests posted (one collective at a time owns the receive
scratch), and progress is made whenever the caller enters the communicator: a blocking call, `Work.wait()`,
`Work.test()`, or issuing another call. No progress thread: MPI is only ever called from the user's thread.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .. import algorithms as _builtins  # noqa: F401  (registers the built-in algorithms)
from .. import environment, registry
from ..emulator import check_accumulate, widens
from ..errors import CallMismatchError, CollectivesError, PeerFailedError
from ..kernels import SUPPORTED_DTYPES, round_into
from ..kernels._dtypes import dtype_name
from ..reduction import check_op, finalize
from ..schedule.collective import REDUCING, ROOTED
from . import daemon as _daemon
from . import executor as _executor
from . import shm as _shm
from . import shm_program
from .agreement import Agreement, CallMeta, ResultCheck, check_mode
from .choice import Choice, choose, native_below, native_supports, runner_allreduce
from .domains import find_domains, topology_for
from .errors import CollectiveTimeoutError, CommunicatorClosedError
from .executor import Execution, ProcPlan, wait_until
from .placement import daemon_placement, leader_placement
from .scratch import ScratchPool

_NATIVE_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
_NATIVE_DTYPES = frozenset(d for d in SUPPORTED_DTYPES if native_supports(d))
# Tiny allreduces at or below this many bytes run through cached persistent requests (measured at n=2,
# 2-core VM: 8 B-4 KiB 1.1-2.0 us against MPI_Allreduce's 1.8-3.2 us; 32 KiB 10 vs 11.5 us; 128 KiB slower).
PERSISTENT_BELOW = 32 << 10
PERSISTENT_REQUESTS = 16  # cached per communicator (each holds a buffer of at most PERSISTENT_BELOW bytes)
_NOT_SERVED = object()  # a shortcut declined the call (reduce returns None off the root): take the general path
_UNKNOWN = object()
_SMALL_NATIVE = Choice("native", {}, "message below the native threshold (see collectives.transport.choice): "
                                     "MPI's own Allreduce has less per-call overhead at this size")
_CACHE_SIZE = 64


def check_timeout(value, where: str = "timeout") -> float | None:
    """A timeout in seconds: None (or inf) waits forever, else a positive number; ValueError otherwise
    (a negative or NaN timeout would make every wait expire at once, or never)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a number of seconds > 0 or None (wait forever), got {value!r}") from None
    if not seconds > 0:  # negative, zero or NaN (inf is allowed: a deadline that never comes)
        raise ValueError(f"{where} must be a number of seconds > 0 or None (wait forever), got {value!r}")
    return seconds


def _default_timeout() -> float | None:
    return environment.get("COLLECTIVES_TIMEOUT")


def _env_flag(name: str) -> bool:
    return bool(environment.get(name))


_DETERMINISTIC_REASON = ("deterministic=True: 'direct' folds every element once, in rank order 0..p-1, so the "
                         "result is bitwise identical across algorithms, chunk counts and layouts")


def _output_shape(collective: str, x: np.ndarray, p: int) -> tuple[int, ...]:
    """The shape of a new output array for `collective` over input x on p ranks: reduce_scatter's block (a
    leading axis of p·k rows gives k rows), allgather's p blocks (stacked on the leading axis), else x's."""
    if collective == "reduce_scatter":
        return (x.shape[0] // p, *x.shape[1:]) if x.ndim >= 1 and x.shape[0] % p == 0 else (x.size // p,)
    if collective == "allgather":
        return (p * x.shape[0], *x.shape[1:]) if x.ndim else (p,)
    return x.shape


def _timeout(timeout: float | None) -> float | None:
    return None if timeout is None else check_timeout(timeout)


def _spin(test: Callable[[], bool], polls: int = 1024) -> bool:
    """Poll `test` flat out (yielding the CPU when oversubscribed) up to `polls` times; True once it passed."""
    for _ in range(polls):
        if test():
            return True
        if _executor._oversubscribed:
            os.sched_yield()
    return False


def _ranks_text(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _bounded(req: MPI.Request, deadline: float | None) -> bool:
    """Poll `req` until it completes (True) or the monotonic `deadline` passes (False)."""
    nap = 0.0
    while not req.Test():
        if deadline is not None and time.monotonic() > deadline:
            return False
        nap = min(1e-3, nap * 2 or 1e-5)
        time.sleep(nap)
    return True


def host_layout(comm: MPI.Comm) -> tuple[int, int]:
    """(ranks of `comm` on this host, CPUs they may run on between them: the union of their affinities).
    Collective over `comm`."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cpus = set().union(*local.allgather(sorted(_executor.own_cpus())))
        return local.Get_size(), len(cpus)
    finally:
        local.Free()


class Work:
    """Handle of an `async_op=True` call: `wait()` returns the output, `test()` polls (and makes progress)."""

    def __init__(self, comm: Communicator, task: _Task) -> None:
        self._comm = comm
        self._task = task

    def wait(self, timeout: float | None = None):
        """Block until done (at most `timeout` s, default the communicator's) and return the output."""
        if timeout is not None:
            timeout = check_timeout(timeout, "wait(timeout=)")
        self._comm._wait_for(self._task, timeout)
        return self._task.result

    def test(self) -> bool:
        """True once complete; advances this and earlier calls without blocking."""
        if not self._task.done:
            self._comm._progress()
        return self._task.done

    is_completed = test

    @property
    def seq(self) -> int:
        return self._task.seq

    @property
    def algorithm(self) -> str:
        return self._task.choice.algorithm

    @property
    def reason(self) -> str:
        return self._task.choice.reason

    def __repr__(self) -> str:
        state = "done" if self._task.done else "pending"
        return f"<Work #{self.seq} {self._task.collective} {self.algorithm} {state}>"


class _Task:
    """One issued call: `start` posts it, `advance` progresses it without blocking, `complete` writes outputs."""

    events = 0

    def __init__(self, seq: int, collective: str, choice: Choice, finish: Callable[[], object]) -> None:
        self.seq = seq
        self.collective = collective
        self.choice = choice
        self.finish = finish
        self.started = False
        self.done = False
        self.result = None
        self.error: BaseException | None = None
        self.agreement: Agreement | None = None  # runs before start() (metadata check)
        self.post = None  # ResultCheck after finish() (full check)
        self.check_result = False

    def start(self) -> None:
        self.started = True

    def advance(self) -> bool:
        return True

    def stuck(self) -> tuple[int | None, int | None, tuple[int, ...], int | None]:
        return None, None, (), None


class _NativeTask(_Task):
    """MPI's own nonblocking collective (posted in issue order on every rank, as MPI requires)."""

    def __init__(self, seq, collective, choice, finish, post: Callable[[], MPI.Request]) -> None:
        super().__init__(seq, collective, choice, finish)
        self._post = post
        self._req: MPI.Request | None = None

    def start(self) -> None:
        self._req = self._post()
        self.started = True

    def advance(self) -> bool:
        if self._req.Test():
            self.events = 1
            return True
        return False


class _ScheduleTask(_Task):
    """A schedule's programs for the nodes this process hosts."""

    def __init__(self, seq, collective, choice, finish, make_run: Callable[[], Execution],
                 before_start: Callable[[], None] | None) -> None:
        super().__init__(seq, collective, choice, finish)
        self._make_run = make_run
        self._before_start = before_start
        self.run: Execution | None = None

    def start(self) -> None:
        if self._before_start is not None:
            self._before_start()
        self.run = self._make_run()
        self.started = True

    def advance(self) -> bool:
        done = self.run.advance()
        self.events = self.run.events
        return done

    def stuck(self):
        rnd, index, peers = self.run.stuck() if self.run else (None, None, ())
        return rnd, index, peers, self.run.last_completed if self.run else None


class _RunnerEntry:
    """The runner shortcut's state for one call signature (collective, count, dtype, op, lazy, algorithm, root):
    the runner, the arena it points into, what auto chose, the bytes one call sends/receives (stats are counted
    per entry: calls x bytes), and the work buffer of calls whose partial results the caller never sees
    (reduce_scatter, reduce off the root; None for the others, whose work buffer is the caller's output)."""

    __slots__ = ("runner", "arena", "choice", "sent", "received", "calls", "scratch")

    def __init__(self, runner: shm_program.Runner, arena: _shm.Arena, choice: Choice, sent: int,
                 received: int, scratch: np.ndarray | None = None) -> None:
        self.runner, self.arena, self.choice, self.sent, self.received = runner, arena, choice, sent, received
        self.calls = 0
        self.scratch = scratch


class Communicator:
    """Collectives over an MPI communicator (duplicated: the library's messages never meet the user's).

    Create with `collectives.init(...)`. `stats` counts the bytes this rank's node sent and received through
    the library's schedules (switch nodes it hosts under leader emulation are counted apart), so
    `ring` (~2(p-1)/p·D per rank) and in-network reduction (~D) can be compared; native calls are counted
    in `stats["native_calls"]` only.
    """

    def __init__(self, mpi_comm: MPI.Comm, *, ranks_per_domain: int | None = None, topology=None,
                 timeout: float | None = None, world: _daemon.World | None = None, check: str | None = None,
                 deterministic: bool | None = None, accumulate: str | None = None) -> None:
        self.timeout = _default_timeout() if timeout is None else check_timeout(timeout, "init(timeout=)")
        self._check = check_mode(check)
        self.deterministic = _env_flag("COLLECTIVES_DETERMINISTIC") if deterministic is None else bool(deterministic)
        self.accumulate = check_accumulate(environment.get("COLLECTIVES_ACCUMULATE")
                                           if accumulate is None else accumulate)
        # Bound the setup: Dup, Split_type and the domain exchange below are blocking collectives; an entry
        # barrier with a deadline first makes sure every rank has entered init (else CollectiveTimeoutError).
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        if not _bounded(mpi_comm.Ibarrier(), deadline):
            raise CollectiveTimeoutError(
                f"rank {mpi_comm.Get_rank()}: collectives.init did not complete within {self.timeout} s: not every "
                "rank of the communicator called collectives.init (a peer may be dead, stuck or late); set "
                "COLLECTIVES_TIMEOUT or timeout= to wait longer", collective="init", algorithm="native", seq=0,
                timeout=self.timeout)
        self._comm = mpi_comm.Dup()
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)  # MPI errors (a dead peer) come back as exceptions
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.domains = find_domains(self._comm, ranks_per_domain)
        _executor.note_host_ranks(*host_layout(self._comm))
        self._topology = topology
        self._world = world  # set when this communicator owns the switch daemons
        self._queue: deque[_Task] = deque()
        self._seq = 0
        self._completed = 0
        self._schedules: OrderedDict = OrderedDict()
        self._plans: OrderedDict = OrderedDict()
        self._scratch = ScratchPool()
        self._tag_ub = self._comm.Get_attr(MPI.TAG_UB)
        self._closed = False
        self._failure: BaseException | None = None
        self.last_choice: Choice | None = None
        self._auto_choices: dict[tuple, Choice] = {}  # choose()'s answers, see _choose
        self._stats = self._zero_stats()
        self._fast_calls = 0  # calls of the small-message shortcut (counted apart: it is the hot path)
        self._fast_below, self._runner_fast = self._agree_fast_below()
        # the runner shortcut's entries per (count, dtype, op, lazy, algorithm); False: never for that call
        self._runners: dict[tuple, _RunnerEntry | bool] = {}
        # the shortcut's decision per (collective, count, dtype, algorithm): auto's native Choice, or None
        self._native_choices: dict[tuple, Choice | None] = {}
        self._fast_ready = self._check == "off"  # the inline shortcut: no agreement; False once closed/failed
        # the shortcuts with the metadata agreement run inline first (check="metadata"); False once closed/failed
        self._agreed_ready = self._check == "metadata"
        # agreement vectors and call records per call signature (the call number apart)
        self._meta_vectors: dict[tuple, tuple[np.ndarray, CallMeta]] = {}
        # persistent requests of tiny allreduces, oldest first (MPI-4; COLLECTIVES_PERSISTENT=0 turns them off)
        self._persistent: dict[tuple, tuple[np.ndarray, MPI.Prequest]] = {}
        self._persistent_below = PERSISTENT_BELOW if MPI.Get_version() >= (4, 0) and \
            environment.get("COLLECTIVES_PERSISTENT") else -1
        self._pending_orders: list[MPI.Request] = []  # orders to switch daemons still being sent
        self._waiting: _Task | None = None
        _live.add(self)

    # -- properties -----------------------------------------------------------------------------------
    @property
    def mpi_comm(self) -> MPI.Comm:
        """The library's duplicate of the communicator (ranks in the same order as the one passed in)."""
        return self._comm

    @property
    def daemons(self) -> int:
        """Number of switch daemons serving this communicator (0: switch nodes run on the ranks)."""
        w = self._world
        return len(w.daemon_procs) if w is not None and w.serving else 0

    @property
    def topology(self):
        """The topology hierarchical algorithms get: the one passed to init, else built from the domains."""
        if self._topology is None:
            self._topology = topology_for(self.domains)
        return self._topology

    @staticmethod
    def _zero_stats() -> dict[str, int]:
        return {"calls": 0, "native_calls": 0, "bytes_sent": 0, "bytes_received": 0,
                "switch_bytes_sent": 0, "switch_bytes_received": 0}

    @property
    def check(self) -> str:
        """The call agreement: "metadata", "full" or "off" (settable; every rank must set the same)."""
        return self._check

    @check.setter
    def check(self, mode: str) -> None:
        self._check = check_mode(mode)
        self._fast_ready = self._check == "off" and not self._closed and self._failure is None
        self._agreed_ready = self._check == "metadata" and not self._closed and self._failure is None

    @property
    def stats(self) -> dict[str, int]:
        """Calls made (of them, by MPI's own collective) and bytes this rank sent/received, its switch nodes'
        apart; a snapshot (reset with `reset_stats`)."""
        stats = dict(self._stats)
        stats["calls"] += self._fast_calls
        stats["native_calls"] += self._fast_calls
        for entry in filter(None, self._runners.values()):  # the runner shortcut counts per entry (hot path)
            stats["calls"] += entry.calls
            stats["bytes_sent"] += entry.calls * entry.sent
            stats["bytes_received"] += entry.calls * entry.received
        return stats

    def reset_stats(self) -> None:
        self._stats = self._zero_stats()
        self._fast_calls = 0
        for entry in filter(None, self._runners.values()):
            entry.calls = 0

    def _agree_fast_below(self) -> tuple[int, bool]:
        """auto allreduce's shortcuts, the same on every rank: (bytes below which MPI's own collective is
        called directly: the smallest of the ranks' native thresholds, as hosts may differ in ranks per core;
        whether every call goes straight to the shared-memory plan runner, which makes MPI's own collective
        unnecessary at any size). Both off when the communicator's settings (deterministic, float32
        accumulation) or a world of one rule the shortcuts out."""
        runner = runner_allreduce(self.size)
        native = 0 if runner else native_below(_executor._oversubscribed)
        if self.size == 1 or self.deterministic or self.accumulate not in (None, "input"):
            native, runner = 0, False
        agreed = np.empty(2, np.int64)
        self._comm.Allreduce(np.array([native, int(runner)], np.int64), agreed, op=MPI.MIN)
        return int(agreed[0]), bool(agreed[1])

    # -- the collectives ------------------------------------------------------------------------------
    def allreduce(self, x, out=None, op: str = "sum", algorithm: str = "auto", *, async_op: bool = False,
                  timeout: float | None = None, deterministic: bool | None = None, accumulate: str | None = None,
                  **params):
        """Reduce `x` over all ranks into `out` (new array of x's shape if None; `out=x` in place).

        `deterministic=True` (default: the communicator's) uses the fixed rank-order reduction of algorithm
        'direct'; `accumulate="float32"` carries float16/bfloat16 partial sums in float32 and rounds once.
        """
        if timeout is not None:
            timeout = check_timeout(timeout)
        # All ranks on this host: the schedule (auto's pick or the one named) runs in C (shm_program.py), the
        # same call the general path makes, without the queue and the per-call Python around it.
        if self._runner_fast and type(x) is np.ndarray and (self._fast_ready or self._agreed_ready) \
                and not async_op and not self._queue and deterministic is None and accumulate is None and not params \
                and not self.deterministic and self.accumulate in (None, "input"):
            fast = self._runner_allreduce(x, out, op, algorithm, timeout)
            if fast is not None:
                return fast
        # The small-message shortcut (`_fast_below` is 0 when the communicator's settings rule it out); the
        # conditions are ordered cheapest first: this line is most of a tiny call's Python cost.
        if type(x) is np.ndarray and x.nbytes < self._fast_below and algorithm == "auto" and not async_op \
                and not self._queue and deterministic is None and accumulate is None and not params:
            # Hottest case inline: tiny 1-D arrays, no agreement, a cached persistent request (1-D arrays are
            # contiguous; out must match x exactly, else the checks below raise the library's precise error).
            mpi_op = _NATIVE_OPS.get(op)
            if self._fast_ready and x.nbytes <= self._persistent_below and x.ndim == 1 and mpi_op is not None \
                    and x.dtype in _NATIVE_DTYPES and (out is None or (
                        type(out) is np.ndarray and out.ndim == 1 and out.base is None and x.base is None
                        and out.dtype == x.dtype and out.size == x.size and out.flags.writeable)):
                return self._persistent_allreduce(x, out, op, mpi_op, timeout)
            fast = self._small_native_allreduce(x, out, op, timeout)
            if fast is not None:
                return fast
        return self._call("allreduce", x, out, op, None, algorithm, async_op, timeout, params, deterministic,
                          accumulate)

    def _runner_allreduce(self, x: np.ndarray, out, op: str, algorithm: str, timeout: float | None):
        """An allreduce over shared memory with nothing but the plan runner in the way: a cached runner per
        (count, dtype, op, in place or not, algorithm) for the schedule the general path would run (auto's
        pick, or the algorithm named), pointed at x and out, run to the end in C. Returns None (take the
        general path) unless every condition holds: contiguous arrays of a dtype the C kernels reduce
        single-threaded, out a fresh array, x itself or an exact match of x, a schedule without switch nodes,
        and the shared-memory arena already created and large enough (its creation and growth are collective:
        the general path does them, and every rank sees the same arena state, so every rank takes the same
        path). The other collectives take `_runner_call`; allreduce keeps this narrower copy, its hottest path
        (a tiny call is ~2 us: each check here is measurable)."""
        if out is None:
            lazy = True
        elif out is x:
            lazy = False
        elif type(out) is not np.ndarray or out.dtype != x.dtype or out.shape != x.shape \
                or not out.flags.writeable or not out.flags.c_contiguous \
                or ((out.base is not None or x.base is not None) and np.may_share_memory(x, out)):
            return None  # the general path raises the precise errors (overlapping views included)
        else:
            lazy = True
        if not x.flags.c_contiguous or (out is x and not x.flags.writeable):
            return None
        key = ("allreduce", x.size, x.dtype, op, lazy, algorithm, None)
        entry = self._runners.get(key)
        if entry is False:  # this call can never take the shortcut (e.g. a schedule with switch nodes)
            return None
        if entry is None or entry.runner.windows is not entry.arena.views:
            entry = self._runner_entry(key)
            if entry is None:
                return None
        self._seq += 1
        if self._agreed_ready:  # before anything is written: a mismatch leaves every buffer as it was
            self._agree_inline("allreduce", x, op, None, algorithm, entry.choice, timeout)
        if out is None:
            out = np.empty_like(x)
        entry.calls += 1
        self.last_choice = entry.choice
        runner = entry.runner
        if not runner.run(out, x if lazy else None, _shm.NATIVE_POLLS, _executor._oversubscribed):
            # a late peer: the bounded wait with the full timeout report
            execution = _shm.RunnerExecution(runner)
            task = _ScheduleTask(self._seq, "allreduce", entry.choice, lambda: out, lambda: execution, None)
            task.start()
            self._queue.append(task)
            self._wait_for(task, timeout)
        return out

    def _shortcut(self, collective: str, x: np.ndarray, out, op: str, root, algorithm: str,
                  timeout: float | None):
        """reduce_scatter, allgather, broadcast and reduce with nothing queued, check off and no parameters: MPI's
        own collective posted directly where auto picks it (or it is named: `_small_native_call`), else the plan
        runner (`_runner_call`). _NOT_SERVED: take the general path."""
        key = (collective, x.size, x.dtype, algorithm)
        native = self._native_choices.get(key, _UNKNOWN)
        if native is _UNKNOWN:  # decided once per signature: choosing is most of a tiny call's Python cost
            native = None
            if algorithm in ("auto", "native") and x.dtype in _NATIVE_DTYPES:
                choice = self._choose(collective, algorithm, x.dtype, x.size, {})
                native = choice if choice.algorithm == "native" else None
            if len(self._native_choices) >= 4096:
                self._native_choices.clear()
            self._native_choices[key] = native
        if native is not None:
            if op not in _NATIVE_OPS:
                return _NOT_SERVED
            return self._small_native_call(collective, x, out, op, root, algorithm, timeout, native)
        if self._runner_fast:
            return self._runner_call(collective, x, out, op, root, algorithm, timeout)
        return _NOT_SERVED

    def _small_native_call(self, collective: str, x: np.ndarray, out, op: str, root, algorithm: str,
                           timeout: float | None, choice: Choice):
        """MPI's own reduce_scatter (Reduce_scatter_block), allgather, broadcast or reduce, posted nonblocking
        on the call's buffers and polled with the general path's deadline, without its queue and Python (a tiny
        call through the general path costs ~5x MPI's own, measured); with check="metadata" after the same
        agreement as the general path's. _NOT_SERVED unless the buffers are what
        the general path would accept without copies: contiguous, out absent, x itself where that means in
        place (reduce on the root), or a separate writeable array of the right dtype and size."""
        p, r, n = self.size, self.rank, x.size
        if not x.flags.c_contiguous or (collective in ("reduce", "broadcast")
                                        and not (type(root) is int and 0 <= root < p)):
            return _NOT_SERVED
        if collective == "broadcast":
            if not x.flags.writeable:
                return _NOT_SERVED
            out = x
        elif out is x:
            if collective != "reduce" or r != root or not x.flags.writeable:
                return _NOT_SERVED
        elif out is not None:
            want = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
            if type(out) is not np.ndarray or out.dtype != x.dtype or out.size != want or not out.flags.writeable \
                    or not out.flags.c_contiguous \
                    or ((out.base is not None or x.base is not None) and np.may_share_memory(x, out)):
                return _NOT_SERVED
        if collective == "reduce_scatter" and n % p:
            return _NOT_SERVED
        self._seq += 1
        if self._agreed_ready:  # before anything is posted or written
            self._agree_inline(collective, x, op, root, algorithm, choice, timeout)
        if out is None and (collective != "reduce" or r == root):
            out = np.empty(_output_shape(collective, x, p), dtype=x.dtype)
        # nonblocking, as the general path posts it (`_native_post`): a rank whose call takes that path (an async
        # handle still pending) posts the same operation, and MPICH matches nonblocking collectives by order.
        # (Persistent requests would be faster for tiny calls, but MPICH does not match a persistent request
        # with a nonblocking call of another rank once the communicator has run other collectives: measured.)
        c, mpi_op = self._comm, _NATIVE_OPS[op]
        if collective == "reduce_scatter":
            req = c.Ireduce_scatter_block(x, out, mpi_op)
        elif collective == "allgather":
            req = c.Iallgather(x, out)
        elif collective == "broadcast":
            req = c.Ibcast(x, root)
        elif r != root:
            req, out = c.Ireduce(x, None, mpi_op, root), None
        else:
            req = c.Ireduce(MPI.IN_PLACE if out is x else x, out, mpi_op, root)
        self._fast_calls += 1
        self.last_choice = choice
        return self._finish_small(req, out, timeout, collective, choice)

    def _agree_inline(self, collective: str, x: np.ndarray, op: str, root, algorithm: str, choice: Choice,
                      timeout: float | None) -> None:
        """check="metadata" on a shortcut: the general path's agreement for call #self._seq (the same vector and
        the same nonblocking MPI operation, so ranks whose calls take different paths still agree), polled here; not agreed within the spin, the
        general path's bounded wait takes over (timeout report included). Raises CallMismatchError on every
        rank, before the call moves or writes anything."""
        key = (collective, x.size, x.dtype, op, root, algorithm, choice.algorithm, tuple(choice.params.items()))
        cached = self._meta_vectors.get(key)
        if cached is None:  # the record's strings and their codes are most of an agreement's Python cost
            if len(self._meta_vectors) >= 4096:
                self._meta_vectors.clear()
            meta = CallMeta(0, collective, x.size, dtype_name(x.dtype), op if collective in REDUCING else "-", root,
                            algorithm, f"{choice.algorithm} {sorted(choice.params.items())!r}", "input", False)
            cached = self._meta_vectors[key] = (meta.vector(), meta)
        vector, meta = cached
        vector = vector.copy()
        vector[0] = self._seq
        agreement = Agreement(self._comm, meta, self.rank, vector)
        try:
            if _spin(agreement.test):
                return
        except CallMismatchError as exc:
            self._note_mismatch(exc)
            raise
        task = _Task(self._seq, collective, choice, lambda: None)
        task.agreement = agreement
        self._queue.append(task)
        self._wait_for(task, timeout)

    def _runner_call(self, collective: str, x: np.ndarray, out, op: str, root, algorithm: str,
                     timeout: float | None):
        """A call over shared memory with nothing but the plan runner in the way: a cached runner per call
        signature for the schedule the general path would run (auto's pick, or the algorithm named), pointed at
        the call's buffers, run to the end in C. The buffers are the general path's (`_buffers`): the caller's
        output as the work buffer (allreduce, broadcast, allgather, reduce on the root), or the entry's own
        (reduce_scatter: the caller gets its block; reduce off the root: partial sums nobody sees), with an
        out-of-place input read where it lies. Returns _NOT_SERVED (take the general path) unless every condition
        holds: contiguous arrays of a dtype the C kernels reduce single-threaded, out absent, x itself where
        that means in place, or a separate array of the right dtype and size, a valid root, a schedule without
        switch nodes, and the shared-memory arena already created and large enough (its creation and growth are
        collective: the general path does them, and every rank sees the same arena state, so every rank takes
        the same path). The general path raises the precise errors for whatever is refused here."""
        p, r, n = self.size, self.rank, x.size
        if not x.flags.c_contiguous:
            return _NOT_SERVED
        if collective in ("reduce", "broadcast") and not (type(root) is int and 0 <= root < p):
            return _NOT_SERVED
        producing = collective in ("allreduce", "allgather") or (collective == "reduce" and r == root)
        if collective == "broadcast":
            if not x.flags.writeable:
                return _NOT_SERVED
            lazy = False
        elif out is None:
            lazy = collective != "allgather"
        elif out is x:
            if not producing or collective == "allgather" or not x.flags.writeable:
                return _NOT_SERVED
            lazy = False
        else:
            want = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
            if type(out) is not np.ndarray or out.dtype != x.dtype or out.size != want or not out.flags.writeable \
                    or not out.flags.c_contiguous \
                    or ((out.base is not None or x.base is not None) and np.may_share_memory(x, out)):
                return _NOT_SERVED  # the general path raises the precise errors (overlapping views included)
            lazy = collective != "allgather"
        if collective == "reduce_scatter" and n % p:
            return _NOT_SERVED
        key = (collective, n, x.dtype, op, lazy, algorithm, root)
        entry = self._runners.get(key)
        if entry is False:  # this call can never take the shortcut (e.g. a schedule with switch nodes)
            return _NOT_SERVED
        if entry is None or entry.runner.windows is not entry.arena.views:
            entry = self._runner_entry(key)
            if entry is None:
                return _NOT_SERVED
        self._seq += 1
        if self._agreed_ready:  # before anything is written: a mismatch leaves every buffer as it was
            self._agree_inline(collective, x, op, root, algorithm, entry.choice, timeout)
        # the work buffer and the input the runner reads in place (None: already in the work buffer)
        source = x.reshape(-1) if lazy else None
        if collective == "broadcast":
            work = result = x
        elif entry.scratch is not None:  # reduce_scatter; reduce off the root
            work, result = entry.scratch, None
            if collective == "reduce_scatter" and out is None:
                out = np.empty(_output_shape(collective, x, p), dtype=x.dtype)
        else:
            if out is None:
                out = np.empty(_output_shape(collective, x, p), dtype=x.dtype)
            work = result = out
            if collective == "allgather":
                out.reshape(-1)[r * n:(r + 1) * n] = x.reshape(-1)
        entry.calls += 1
        self.last_choice = entry.choice
        runner = entry.runner
        if not runner.run(work.reshape(-1), source, _shm.NATIVE_POLLS, _executor._oversubscribed):
            # a late peer: the bounded wait with the full timeout report
            execution = _shm.RunnerExecution(runner)
            task = _ScheduleTask(self._seq, collective, entry.choice, lambda: result, lambda: execution, None)
            task.start()
            self._queue.append(task)
            self._wait_for(task, timeout)
        if collective == "reduce_scatter":
            k = n // p
            out.reshape(-1)[...] = work[r * k:(r + 1) * k]
            return out
        return result

    def _runner_entry(self, key: tuple) -> _RunnerEntry | None:
        """The runner shortcut's cache entry for (collective, count, dtype, op, lazy, algorithm, root), or None
        when it cannot serve this call (remembered as False when it never will: the general path takes such
        calls at once)."""
        collective, count, dtype, op, lazy, algorithm, root = key
        kernel_op = op if collective in REDUCING else "sum"
        kernel = shm_program.kernel_for(dtype, kernel_op, count * dtype.itemsize)
        arena = _shm._arena_for(self._comm)
        if arena is None or kernel is None or count == 0 or (algorithm != "auto" and (
                algorithm == "native" or algorithm not in registry.names(collective))):
            return self._no_runner(key)  # bad names and dtypes: the general path raises the precise error
        if not arena or arena.data is None:
            return None  # not created yet: the general path creates it (collective), later calls may come here
        choice = self._choose(collective, algorithm, dtype, count, {})
        if choice.algorithm in ("copy", "native"):
            return self._no_runner(key)
        schedule_key, schedule, _ = self._schedule(collective, choice, count, root, dtype, kernel_op)
        plan, _ = self._proc_plan(schedule_key, schedule)
        if not _shm.eligible(plan, self._comm) or schedule.notes:
            return self._no_runner(key)
        if arena.capacity < schedule.work_size * dtype.itemsize:
            return None  # the general path grows the arena (collective)
        runner = shm_program.Runner(_shm.program_for(plan, dtype.itemsize, lazy), arena, kernel)
        isz = dtype.itemsize
        # partial results the caller never sees: the entry's own work buffer (the general path's scratch)
        private = collective == "reduce_scatter" or (collective == "reduce" and self.rank != root)
        entry = _RunnerEntry(runner, arena, choice, plan.sent_elements[self.rank] * isz,
                             plan.received_elements[self.rank] * isz,
                             np.empty(schedule.work_size, dtype) if private else None)
        old = self._runners.pop(key, None)
        if old:
            self._fold_runner_stats(old)
        elif len(self._runners) >= PERSISTENT_REQUESTS:
            self._evict_runner()
        self._runners[key] = entry
        return entry

    def _no_runner(self, key: tuple) -> None:
        if len(self._runners) >= PERSISTENT_REQUESTS:
            self._evict_runner()
        self._runners[key] = False
        return None

    def _evict_runner(self) -> None:
        old = self._runners.pop(next(iter(self._runners)))
        if old:
            self._fold_runner_stats(old)

    def _fold_runner_stats(self, entry: _RunnerEntry) -> None:
        """Move an entry's call count into the stats (before it is dropped or its count reset)."""
        self._stats["calls"] += entry.calls
        self._stats["bytes_sent"] += entry.calls * entry.sent
        self._stats["bytes_received"] += entry.calls * entry.received
        entry.calls = 0

    def _small_native_allreduce(self, x, out, op, timeout):
        """auto's small-message path without the queue: the same checks, one Iallreduce, polled with a
        deadline. Returns None (take the general path) unless every condition of the shortcut holds."""
        mpi_op = _NATIVE_OPS.get(op)
        if mpi_op is None or x.dtype not in _NATIVE_DTYPES or not x.flags.c_contiguous:
            return None
        if out is None:
            out = np.empty_like(x)
            send = x
        elif out is x:
            if not x.flags.writeable:
                return None
            send = MPI.IN_PLACE
        elif type(out) is not np.ndarray or out.dtype != x.dtype or out.size != x.size \
                or out.base is not None or x.base is not None or not out.flags.writeable \
                or not out.flags.c_contiguous:
            return None  # the general path checks views for overlap and raises the precise errors
        else:
            send = x
        if self._failure is not None or self._closed:
            self._check_open()
        self._seq += 1
        self._fast_calls += 1
        self.last_choice = _SMALL_NATIVE
        if self.check != "off":
            meta = CallMeta(self._seq, "allreduce", x.size, dtype_name(x.dtype), op, None, "auto", "native",
                            "input", False)
            agreement = Agreement(self._comm, meta, self.rank)
            try:
                agreed = _spin(agreement.test)
            except CallMismatchError as exc:
                self._note_mismatch(exc)
                raise
            if not agreed:  # a late peer: the bounded wait with the full timeout report
                task = _NativeTask(self._seq, "allreduce", _SMALL_NATIVE, lambda: out,
                                   lambda: self._comm.Iallreduce(send, out, mpi_op))
                task.agreement = agreement
                self._queue.append(task)
                self._wait_for(task, timeout)
                return out
        return self._finish_small(self._comm.Iallreduce(send, out, mpi_op), out, timeout)

    def _persistent_allreduce(self, x: np.ndarray, out: np.ndarray | None, op: str, mpi_op: MPI.Op,
                              timeout: float | None) -> np.ndarray:
        """A tiny allreduce through a persistent MPI request (MPI-4 `MPI_Allreduce_init`) on a buffer the
        communicator owns, one per (count, dtype, op): copy in, `Start`, poll, copy out. Starting a prepared
        request skips mpi4py's and MPI's per-call argument processing, which is most of a tiny call's cost
        (n=2: 8 B in ~1.1 us against ~1.8 us for MPI_Allreduce; docs/performance-mpi.md). Every rank creates and
        evicts the same requests in the same call order, because the key depends only on what every rank of a
        matching call agrees on; so the persistent initialisations (collective operations) match."""
        key = (x.size, x.dtype, op)
        entry = self._persistent.get(key)
        if entry is None:
            if len(self._persistent) >= PERSISTENT_REQUESTS:  # evict the oldest (same one on every rank)
                self._persistent.pop(next(iter(self._persistent)))[1].Free()
            buf = np.empty(x.size, x.dtype)
            entry = self._persistent[key] = (buf, self._comm.Allreduce_init(MPI.IN_PLACE, buf, mpi_op))
        buf, req = entry
        buf[...] = x
        req.Start()
        self._seq += 1
        self._fast_calls += 1
        self.last_choice = _SMALL_NATIVE
        # _spin's loop inlined: two Python calls are ~0.2 us, ~10% of an 8-byte call at n=2 (measured)
        for _ in range(1024):
            if req.Test():
                break
            if _executor._oversubscribed:
                os.sched_yield()
        else:
            self._finish_small(req, None, timeout)  # bounded wait with the full timeout report
        if out is None:
            return buf.copy()
        out[...] = buf
        return out

    def _finish_small(self, req: MPI.Request, out: np.ndarray | None, timeout: float | None,
                      collective: str = "allreduce", choice: Choice = _SMALL_NATIVE) -> np.ndarray | None:
        # MPICH completes a small shared-memory collective within a few polls; poll flat out before the general
        # bounded wait (which sleeps between polls and builds the timeout report).
        if _spin(req.Test):
            return out
        self._queue.append(_NativeTask(self._seq, collective, choice, lambda: out, lambda: req))
        self._wait_for(self._queue[-1], timeout)  # bounded wait with the full timeout report
        return out

    def reduce_scatter(self, x, out=None, op: str = "sum", algorithm: str = "auto", *, async_op: bool = False,
                       timeout: float | None = None, deterministic: bool | None = None,
                       accumulate: str | None = None, **params):
        """Reduce `x` (p·k elements) over all ranks; rank r gets elements [r·k, (r+1)·k) of the result."""
        if (self._fast_ready or self._agreed_ready) and type(x) is np.ndarray and not async_op and not self._queue \
                and deterministic is None and accumulate is None and not params and not self.deterministic \
                and self.accumulate in (None, "input"):
            fast = self._shortcut("reduce_scatter", x, out, op, None, algorithm, _timeout(timeout))
            if fast is not _NOT_SERVED:
                return fast
        return self._call("reduce_scatter", x, out, op, None, algorithm, async_op, timeout, params, deterministic,
                          accumulate)

    def allgather(self, x, out=None, algorithm: str = "auto", *, async_op: bool = False,
                  timeout: float | None = None, **params):
        """Concatenate every rank's `x` (k elements) in rank order: p·k elements on every rank."""
        if (self._fast_ready or self._agreed_ready) and type(x) is np.ndarray and not async_op and not self._queue \
                and not params:
            fast = self._shortcut("allgather", x, out, "sum", None, algorithm, _timeout(timeout))
            if fast is not _NOT_SERVED:
                return fast
        return self._call("allgather", x, out, "sum", None, algorithm, async_op, timeout, params)

    def broadcast(self, x, root: int = 0, algorithm: str = "auto", *, async_op: bool = False,
                  timeout: float | None = None, **params):
        """Copy root's `x` into every rank's `x` (in place) and return it."""
        if (self._fast_ready or self._agreed_ready) and type(x) is np.ndarray and not async_op and not self._queue \
                and not params:
            fast = self._shortcut("broadcast", x, x, "sum", root, algorithm, _timeout(timeout))
            if fast is not _NOT_SERVED:
                return fast
        return self._call("broadcast", x, x, "sum", root, algorithm, async_op, timeout, params)

    def reduce(self, x, out=None, root: int = 0, op: str = "sum", algorithm: str = "auto", *,
               async_op: bool = False, timeout: float | None = None, deterministic: bool | None = None,
               accumulate: str | None = None, **params):
        """Reduce `x` over all ranks onto `root` (returns the result there, None elsewhere)."""
        if (self._fast_ready or self._agreed_ready) and type(x) is np.ndarray and not async_op and not self._queue \
                and deterministic is None and accumulate is None and not params and not self.deterministic \
                and self.accumulate in (None, "input"):
            fast = self._shortcut("reduce", x, out, op, root, algorithm, _timeout(timeout))
            if fast is not _NOT_SERVED:
                return fast
        return self._call("reduce", x, out, op, root, algorithm, async_op, timeout, params, deterministic,
                          accumulate)

    def barrier(self, *, async_op: bool = False, timeout: float | None = None):
        """Wait until every rank has entered the barrier (after this rank's earlier calls completed)."""
        self._check_open()
        if timeout is not None:
            timeout = check_timeout(timeout)
        task = _NativeTask(self._next_seq(), "barrier", Choice("native", {}, "barrier is MPI's own"),
                           lambda: None, self._comm.Ibarrier)
        if self.check != "off":
            task.agreement = Agreement(self._comm, CallMeta(task.seq, "barrier", 0, "-", "-", None, "native",
                                                            "native", "-", False), self.rank)
        return self._submit(task, async_op, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Finish pending calls, stop the switch daemons this communicator owns, free the MPI communicator."""
        if self._closed:
            return
        try:
            if self._queue and self._failure is None:
                self._wait_for(self._queue[-1], timeout)
        finally:
            self._closed = True
            self._fast_ready = self._agreed_ready = False
            if self._failure is None:
                for _, req in self._persistent.values():
                    req.Free()
            self._persistent.clear()
            for entry in filter(None, self._runners.values()):
                self._fold_runner_stats(entry)
            self._runners.clear()
            self._scratch.clear()
            if self._world is not None and self.rank == 0 and self._failure is None:
                _daemon.stop_daemons(self._world, timeout=self.timeout)
            elif self._world is not None:
                self._world.serving = False
            _live.discard(self)
            if self._failure is None:
                self._comm.Free()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<collectives.Communicator rank {self.rank}/{self.size}, {len(self.domains)} domain(s), "
                f"{self.daemons} switch daemon(s)>")

    # -- one call: validate (before any communication), choose, build, queue ---------------------------
    def _call(self, collective, x, out, op, root, algorithm, async_op, timeout, params, deterministic=None,
              accumulate=None):
        self._check_open()
        if timeout is not None:
            timeout = check_timeout(timeout)
        p = self.size
        x = self._check_input(collective, x)
        dtype = x.dtype
        accumulate = self.accumulate if accumulate is None else check_accumulate(accumulate)
        explicit = deterministic is not None
        deterministic = self.deterministic if deterministic is None else bool(deterministic)
        kernel_op = check_op(op, dtype) if collective in REDUCING else "sum"
        if collective in ROOTED and (not isinstance(root, (int, np.integer)) or not 0 <= root < p):
            raise ValueError(f"{collective} root must be an integer in [0, {p}), got {root!r}")
        root = int(root) if collective in ROOTED else None
        count = x.size
        if collective == "reduce_scatter" and count % p:
            raise ValueError(f"reduce_scatter input must have a multiple of the world size {p} elements "
                             f"(p·k, rank r gets block r), got {count}")
        out = self._check_output(collective, x, out, root)
        wide = widens(accumulate, dtype, collective)
        wdtype = np.dtype(np.float32) if wide else dtype  # accumulate="float32": float32 work, messages, sums
        if deterministic and collective in REDUCING:
            choice = self._deterministic_choice(collective, algorithm, params, explicit)
        else:
            choice = self._choose(collective, algorithm, wdtype, count, params)
        if choice.algorithm not in ("copy", "native") and p > 1:
            # builder errors raise before any buffer is written; a fallback inside the schedule (SHARP or NVLS
            # refused) is part of the reason the user reads in last_choice
            _, schedule, _ = self._schedule(collective, choice, count, root, wdtype, kernel_op)
            if schedule.notes:
                choice = Choice(choice.algorithm, choice.params, "; ".join([choice.reason, *schedule.notes]))
        self.last_choice = choice
        source = None
        if wide:
            work, finish = self._widened_buffers(collective, x, out, op, root)
        else:
            # native reduce_scatter sends x itself (_native_post): its work buffer only receives the block
            lazy = p > 1 and ((choice.algorithm not in ("copy", "native") and not self.daemons)
                              or (choice.algorithm == "native" and collective == "reduce_scatter"))
            work, finish, source = self._buffers(collective, x, out, op, root, lazy=lazy)
        seq = self._next_seq()
        self._stats["calls"] += 1
        if choice.algorithm == "copy" or p == 1:
            task = _Task(seq, collective, choice, finish)
        elif choice.algorithm == "native":
            self._stats["native_calls"] += 1
            task = _NativeTask(seq, collective, choice, finish,
                               self._native_post(collective, x, work, out, op, root))
        else:
            task = self._schedule_task(seq, collective, choice, finish, work, count, wdtype, kernel_op, root,
                                       source)
        if self.check != "off" and p > 1:
            chosen = f"{choice.algorithm} {sorted(choice.params.items())!r}"
            meta = CallMeta(seq, collective, count, dtype_name(dtype), op if collective in REDUCING else "-", root,
                            algorithm, chosen, accumulate or "input", deterministic and collective in REDUCING)
            task.agreement = Agreement(self._comm, meta, self.rank)
            task.check_result = self.check == "full" and collective in ("allreduce", "allgather", "broadcast")
        return self._submit(task, async_op, timeout)

    def _deterministic_choice(self, collective, algorithm, params, explicit) -> Choice:
        """deterministic=True: algorithm 'direct' (the fixed rank-order reduction), or a clear error."""
        where = "deterministic=True" if explicit else ("the communicator's deterministic=True (init(deterministic=)"
                                                        " or COLLECTIVES_DETERMINISTIC=1)")
        if algorithm not in ("auto", "direct"):
            raise ValueError(f"{where} fixes the reduction order with algorithm 'direct', but algorithm="
                             f"{algorithm!r} was requested; pass algorithm='auto' or 'direct', or "
                             "deterministic=False")
        if algorithm == "auto" and params:
            raise ValueError(f"parameters {sorted(params)} need an explicit algorithm, not 'auto'")
        registry.info("direct")
        return Choice("direct", dict(params), _DETERMINISTIC_REASON + f" ({where})")

    def _widened_buffers(self, collective, x, out, op, root):
        """accumulate="float32": run the call on a float32 copy of x (converted once), then round the float32
        result once into the caller's output (a new array, `out`, or x itself when out=x)."""
        x32 = x.astype(np.float32)
        work, finish32, _ = self._buffers(collective, x32, None, op, root)

        def finish():
            result = finish32()
            if result is None:
                return None
            target = out if out is not None else np.empty(result.shape, dtype=x.dtype)
            round_into(target.reshape(-1), np.ascontiguousarray(result).reshape(-1))
            return target
        return work, finish

    def _check_open(self) -> None:
        if self._failure is not None:
            raise CommunicatorClosedError(f"this communicator failed earlier ({self._failure}); create a new one "
                                          "with collectives.init()") from self._failure
        if self._closed:
            raise CommunicatorClosedError("this communicator was closed; create a new one with collectives.init()")

    def _check_input(self, collective: str, x) -> np.ndarray:
        if collective == "broadcast":
            if not isinstance(x, np.ndarray):
                raise TypeError(f"broadcast works in place: x must be a numpy.ndarray, got {type(x).__name__}")
            self._check_writable(x, "x (broadcast writes it in place)")
        else:
            x = np.asarray(x)
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"unsupported dtype {x.dtype}; supported: "
                            f"{', '.join(dtype_name(d) for d in SUPPORTED_DTYPES)}")
        return x

    @staticmethod
    def _check_writable(a: np.ndarray, name: str) -> None:
        if not a.flags.writeable:
            raise ValueError(f"{name} is read-only; pass a writeable array (np.array(a) makes a copy)")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous; pass np.ascontiguousarray(a) or a fresh array")

    def _check_output(self, collective, x, out, root):
        if collective == "broadcast":
            return x
        p, n = self.size, x.size
        if out is None:
            return None
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
        if out.dtype != x.dtype:
            raise TypeError(f"out has dtype {dtype_name(out.dtype)} but x has {dtype_name(x.dtype)}; they must match")
        want = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
        if out.size != want:
            raise ValueError(f"{collective} out must have {want} elements for an input of {n} on {p} ranks, "
                             f"got {out.size}")
        self._check_writable(out, "out")
        if out is not x and np.may_share_memory(out, x) and out.size:
            raise ValueError("out overlaps x without being x itself; pass out=x (in place) or separate arrays")
        return out

    def _choose(self, collective, algorithm, dtype, count, params) -> Choice:
        if algorithm == "auto":
            if params:
                raise ValueError(f"parameters {sorted(params)} need an explicit algorithm, not 'auto'")
            # choose() is a pure function of these (its thresholds are read at import; whether shared memory
            # serves depends on the host's ranks and the COLLECTIVES_SHM/_SHM_C switches): ~3.5 us saved per call
            key = (collective, count * dtype.itemsize, dtype, _executor._oversubscribed, _executor._host_ranks,
                   registry.generation(), environment.get("COLLECTIVES_SHM"), environment.get("COLLECTIVES_SHM_C"))
            found = self._auto_choices.get(key)
            if found is None:
                if len(self._auto_choices) >= 4096:  # many distinct sizes: start over rather than grow
                    self._auto_choices.clear()
                found = self._auto_choices[key] = choose(
                    collective, count * dtype.itemsize, dtype, self.size, registry.names(collective),
                    oversubscribed=_executor._oversubscribed)
            return found
        if algorithm == "native":
            if not native_supports(dtype):
                raise TypeError(f"algorithm 'native' (MPI's own {collective}) cannot take bfloat16: MPI has no "
                                f"bfloat16 type; use algorithm='auto' or one of: "
                                f"{', '.join(registry.names(collective))}")
            if params:
                raise ValueError(f"algorithm 'native' takes no parameters, got {sorted(params)}")
            return Choice("native", {}, "requested")
        info = registry.info(algorithm)  # unknown name: ValueError listing the valid ones
        if collective not in info.collectives:
            raise ValueError(f"algorithm {algorithm!r} does not implement {collective}; algorithms for "
                             f"{collective}: {', '.join(registry.names(collective) + ['native', 'auto'])}")
        return Choice(algorithm, dict(params), "requested")

    def _buffers(self, collective, x, out, op, root, lazy: bool = False):
        """The rank's work buffer (input placed per the collective's contract), the `finish` that produces
        the call's result from it, and the input still to place (None: placed). `lazy` (allreduce and the root's
        reduce run by a schedule): leave an out-of-place input where it is and return it, for the executor to
        read in place on shared memory or to copy in when the call starts."""
        p, r, n = self.size, self.rank, x.size
        flat = x.reshape(-1)
        if collective == "allreduce" or (collective == "reduce" and r == root):
            if out is None:
                out = np.empty(x.shape, dtype=x.dtype)
            work = out.reshape(-1)
            source = flat if out is not x and lazy else None
            if out is not x and not lazy:
                work[...] = flat
            return work, lambda: self._finalize(out, op), source
        if collective == "broadcast":
            return flat, lambda: x, None
        # reduce on a non-root, reduce_scatter: the work buffer is the library's (partial sums never touch the
        # caller's buffers), from the pool (a fresh one per call re-faults every page: scratch.py)
        work = self._scratch.take(n, x.dtype)
        source = flat if lazy else None
        if not lazy:
            work[...] = flat
        if collective == "reduce":
            return work, lambda: self._scratch.give(work), source
        if collective == "reduce_scatter":
            k = n // p
            if out is None:
                out = np.empty(_output_shape(collective, x, p), dtype=x.dtype)

            def finish():
                out.reshape(-1)[...] = work[r * k:(r + 1) * k]
                self._scratch.give(work)
                return self._finalize(out, op)
            return work, finish, source
        # allgather
        if out is None:
            out = np.empty(_output_shape(collective, x, p), dtype=x.dtype)
        work = out.reshape(-1)
        work[r * n:(r + 1) * n] = flat
        return work, lambda: out, None

    def _finalize(self, out: np.ndarray, op: str) -> np.ndarray:
        finalize(out.reshape(-1), op, self.size)
        return out

    def _native_post(self, collective, x, work, out, op, root) -> Callable[[], MPI.Request]:
        c, mop, r = self._comm, _NATIVE_OPS.get(check_op(op), MPI.SUM), self.rank
        if collective == "allreduce":
            return lambda: c.Iallreduce(MPI.IN_PLACE, work, mop)
        if collective == "reduce":
            if r == root:
                return lambda: c.Ireduce(MPI.IN_PLACE, work, mop, root)
            return lambda: c.Ireduce(work, None, mop, root)
        if collective == "broadcast":
            return lambda: c.Ibcast(work, root)
        if collective == "reduce_scatter":
            k = work.size // self.size
            if k == 0:
                return c.Ibarrier
            # MPI only reads it (a strided input is copied: MPI takes contiguous buffers); the result block lands
            # where finish() reads it
            send = np.ascontiguousarray(x).reshape(-1)
            return lambda: c.Ireduce_scatter_block(send, work[r * k:(r + 1) * k], mop)
        n = x.size  # allgather: own block already in place
        return lambda: c.Iallgather(MPI.IN_PLACE, work) if n else c.Ibarrier()

    @staticmethod
    def _build_params(choice: Choice, dtype, kernel_op: str) -> dict:
        """The choice's parameters, plus dtype and op for builders that take them: in-network builders decide
        from these what the switches can offload (the switch daemons build with the same parameters)."""
        takes = registry.parameters(choice.algorithm)
        extra = {k: v for k, v in (("dtype", dtype_name(np.dtype(dtype))), ("op", kernel_op))
                 if k in takes and k not in choice.params}
        return {**choice.params, **extra}

    def _schedule(self, collective, choice: Choice, count: int, root, dtype, kernel_op: str):
        algo = choice.algorithm
        needs_topology = registry.info(algo).needs_topology
        topology = self.topology if needs_topology else None
        params = self._build_params(choice, dtype, kernel_op)
        key = (collective, algo, self.size, count, root, repr(sorted(params.items())), needs_topology)
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = registry.build(algo, collective=collective, world_size=self.size, count=count, root=root,
                                      topology=topology, **params)
            self._schedules[key] = schedule
            if len(self._schedules) > _CACHE_SIZE:
                self._schedules.popitem(last=False)
        self._schedules.move_to_end(key)
        return key, schedule, topology

    def _proc_plan(self, key, schedule) -> tuple[ProcPlan, bool]:
        """(this process's plan of the schedule, whether switch daemons run its switch nodes), cached by the
        schedule's key."""
        daemons = self.daemons and schedule.num_nodes > schedule.world_size
        plan_key = (key, daemons)
        plan = self._plans.get(plan_key)
        if plan is None:
            if daemons:
                w = self._world
                placement = daemon_placement(self.size, schedule.num_nodes, w.app_procs, w.daemon_procs)
                proc = w.fabric.Get_rank()
            else:
                placement, proc = leader_placement(self.size, schedule.num_nodes), self.rank
            plan = self._plans[plan_key] = ProcPlan.build(schedule, placement, proc)
            if len(self._plans) > _CACHE_SIZE:
                self._plans.popitem(last=False)
        self._plans.move_to_end(plan_key)
        return plan, daemons

    def _schedule_task(self, seq, collective, choice, finish, work, count, dtype, kernel_op, root, source=None):
        key, schedule, topology = self._schedule(collective, choice, count, root, dtype, kernel_op)
        plan, daemons = self._proc_plan(key, schedule)
        carrier = self._world.fabric if daemons else self._comm
        L = plan.placement.slots
        tag_base = (seq % ((self._tag_ub + 1) // (L * L))) * L * L
        me = self.rank

        def make_run() -> Execution:
            works = [work if node == me else np.zeros(schedule.work_size, dtype=dtype) for node in plan.nodes]
            isz = dtype.itemsize
            for node in plan.nodes:
                if node < self.size:
                    self._stats["bytes_sent"] += plan.sent_elements[node] * isz
                    self._stats["bytes_received"] += plan.received_elements[node] * isz
                else:
                    self._stats["switch_bytes_sent"] += plan.sent_elements[node] * isz
                    self._stats["switch_bytes_received"] += plan.received_elements[node] * isz
            # shared memory when the ranks share a host (transport/shm.py), else messages
            return _executor.start_execution(plan, carrier, works, kernel_op, seq, tag_base,
                                             source if not daemons else None)

        before = None
        if daemons and self.rank == 0:
            order = ("run", seq, collective, choice.algorithm, count, dtype_name(dtype), root, kernel_op,
                     self._build_params(choice, dtype, kernel_op), topology, self.size)
            before = lambda: self._pending_orders.extend(_daemon.send_orders(self._world, order))  # noqa: E731
        return _ScheduleTask(seq, collective, choice, finish, make_run, before)

    # -- queue and progress ---------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _submit(self, task: _Task, async_op: bool, timeout: float | None):
        self._queue.append(task)
        if async_op:
            self._progress()
            return Work(self, task)
        self._wait_for(task, timeout)
        return task.result

    def _progress(self) -> None:
        """Advance queued calls in issue order as far as possible without blocking.

        Each call: the metadata agreement (unless check="off"), then the call itself, then (check="full") the
        result check. A mismatch fails that call on every rank (its handle re-raises) and the queue moves on;
        an MPI error (a dead peer) fails the communicator with PeerFailedError naming the peers.
        """
        while self._queue:
            head = self._queue[0]
            try:
                if head.agreement is not None:
                    if not head.agreement.test():
                        return
                    head.agreement = None
                if head.post is None:
                    if not head.started:
                        head.start()
                    if not head.advance():
                        return
                    head.result = head.finish()
                    if head.check_result and isinstance(head.result, np.ndarray):
                        head.post = ResultCheck(self._comm, head.result, head.seq, head.collective, self.rank)
                if head.post is not None and not head.post.test():
                    return
            except CallMismatchError as exc:
                self._note_mismatch(exc)
                head.error = exc
            except MPI.Exception as exc:
                raise self._peer_failed(head, exc) from exc
            except CollectivesError as exc:  # the full check found different results
                head.error = exc
            head.done = True
            self._completed += 1
            self._queue.popleft()
        if self._pending_orders:
            self._pending_orders = [r for r in self._pending_orders if not r.Test()]

    def _note_mismatch(self, exc: CallMismatchError) -> None:
        """A mismatch leaves the communicator usable unless the ranks' call sequences went out of step."""
        if "call" in exc.fields:
            self._fail(exc)

    def _peer_failed(self, head: _Task, exc: MPI.Exception) -> PeerFailedError:
        peers = head.stuck()[2] if head.started else ()
        labels = self._peer_labels(peers) if peers else "a peer (the MPI error names no rank; the call was " \
            "in its metadata agreement or a native collective)"
        err = PeerFailedError(
            f"rank {self.rank}: {head.collective} #{head.seq} (algorithm {head.choice.algorithm}) failed: MPI "
            f"reported an error while communicating with {labels}: {exc.Get_error_string()}. The peer has "
            "probably died; this communicator is unusable", collective=head.collective, seq=head.seq, peers=peers)
        self._fail(err)
        return err

    def _peer_labels(self, peers) -> str:
        out = []
        w = self._world
        for n in peers:
            if n < self.size:
                out.append(f"rank {n}")
            elif w is not None and w.serving and w.daemon_procs:
                d = w.daemon_procs[(n - self.size) % len(w.daemon_procs)]
                out.append(f"switch node {n} (switch daemon, world rank {d})")
            else:
                out.append(f"switch node {n} (leader emulation on rank {(n - self.size) % self.size})")
        return ", ".join(out)

    def _fail(self, exc: BaseException) -> None:
        """The communicator is broken: cancel what is in flight, release the switch daemons, and make sure
        this process can exit (MPICH's MPI_Finalize blocks forever on a dead peer)."""
        if self._failure is not None:
            return
        self._failure = exc
        self._fast_ready = self._agreed_ready = False
        for t in self._queue:
            if isinstance(t, _ScheduleTask) and t.run is not None:
                t.run.cancel()
        if self._world is not None and self._world.serving:
            _daemon.abort_daemons(self._world, f"app rank {self.rank}: {exc}")
        global _failed
        _failed = True

    @property
    def events(self) -> int:
        return self._completed * 1_000_003 + (self._queue[0].events if self._queue else 0)

    def advance(self) -> bool:  # the waiter's view of the queue (see _wait_for)
        self._progress()
        return self._waiting.done

    def _wait_for(self, task: _Task, timeout: float | None) -> None:
        if task.done:
            if task.error is not None:
                raise task.error
            return
        if self._failure is not None:
            self._check_open()
        limit = self.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        self._waiting = task
        try:
            wait_until(self, deadline, lambda: self._timeout_error(task, limit))
        except CollectiveTimeoutError as exc:
            self._fail(exc)
            raise
        if task.error is not None:
            raise task.error

    def _timeout_error(self, waited: _Task, limit: float) -> CollectiveTimeoutError:
        head = self._queue[0]
        if head.agreement is not None or head.post is not None:
            stage = (head.agreement or head.post).stage
            rnd, index, last = None, None, None
            peers = tuple(r for r in range(self.size) if r != self.rank)
            labels = self._peer_labels(peers) if len(peers) == 1 else \
                f"any of {_ranks_text(peers)} (the check is collective: it cannot tell which)"
            where = (f" in its {stage} (before any data moved: a peer has not issued call #{head.seq} — it may be "
                     "dead, stuck, have raised a local error, or have skipped a call)")
        else:
            rnd, index, peers, last = head.stuck()
            labels = self._peer_labels(peers) or "none known"
            where = "" if rnd is None else f" in round {rnd}, first unfinished op {index} (last completed op {last})"
        extra = "" if head is waited else f"; the awaited call #{waited.seq} ({waited.collective}) queues behind it"
        return CollectiveTimeoutError(
            f"rank {self.rank}: {head.collective} #{head.seq} (algorithm {head.choice.algorithm}) did not complete "
            f"within {limit} s{where}; awaiting {labels}{extra}. A peer may be dead, stuck, or have called a "
            "different collective; set COLLECTIVES_TIMEOUT or timeout= to wait longer (sequence number "
            f"#{head.seq} on this communicator)",
            collective=head.collective, algorithm=head.choice.algorithm, seq=head.seq, round=rnd, op_index=index,
            peers=peers, last_completed=last, timeout=limit)


_live: weakref.WeakSet[Communicator] = weakref.WeakSet()
_failed = False  # a communicator failed (timeout or dead peer): skip MPI_Finalize at exit


@atexit.register
def _close_all() -> None:
    """At exit, finish and close live communicators (this also stops switch daemons).

    If a communicator failed (a peer timed out or died), MPI_Finalize would block forever on the dead peer
    (MPICH), so the process ends here without it: stdio is flushed and the exit status is 1
    (COLLECTIVES_EXIT_ON_FAILURE=0 keeps the normal MPI_Finalize).
    """
    for comm in list(_live):
        try:
            comm.close(timeout=min(comm.timeout or 10.0, 10.0))
        except Exception:  # noqa: BLE001 - exiting anyway; never hang or mask the real error
            pass
    if _failed and environment.get("COLLECTIVES_EXIT_ON_FAILURE"):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(1)


def init(mpi_comm: MPI.Comm | None = None, *, ranks_per_domain: int | None = None, topology=None,
         timeout: float | None = None, check: str | None = None, deterministic: bool | None = None,
         accumulate: str | None = None) -> Communicator:
    """Create a Communicator over `mpi_comm` (default: MPI_COMM_WORLD, minus any switch daemons).

    With mpi_comm=None every process of MPI_COMM_WORLD must take part: the app ranks here, switch daemons
    started with `mpiexec ... : -n D python -m collectives.switchd` in their own loop. The first such
    communicator owns the daemons; the app's own MPI traffic then belongs on `comm.mpi_comm` (or a Dup of it),
    not on MPI_COMM_WORLD, which includes the daemons.

    Reliability options (see docs/reliability.md): `timeout` bounds every wait (default COLLECTIVES_TIMEOUT,
    600 s); `check` is the call agreement ("metadata" default, "full", "off"; COLLECTIVES_CHECK);
    `deterministic=True` (COLLECTIVES_DETERMINISTIC=1) makes reductions use the fixed rank-order algorithm
    'direct'; `accumulate="float32"` (COLLECTIVES_ACCUMULATE) carries 16-bit float partial sums in float32.
    """
    world = None
    if mpi_comm is None:
        world = _daemon.split_world(_daemon.APP, timeout=_default_timeout() if timeout is None
                                    else check_timeout(timeout, "init(timeout=)"))
        mpi_comm = world.local
        if not world.serving or any(c._world is world for c in _live):
            world = None
    return Communicator(mpi_comm, ranks_per_domain=ranks_per_domain, topology=topology, timeout=timeout,
                        world=world, check=check, deterministic=deterministic, accumulate=accumulate)
