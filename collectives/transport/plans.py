"""Call plans: one per call signature (calls.py), built once and cached; every call is `plan.run(x, out)`.

A plan holds what does not change from call to call: the choice (algorithm and parameters, and why), the
schedule, the executor bound to it, the buffers the collective's contract needs, and the call's signature for
the agreement. Four executors behind one interface (executors.py): the shared-memory plan runner (all ranks on
one host; the agreement rides on its waits), point-to-point messages (across hosts, or schedules with switch
nodes), MPI's own collective, and the local copy of a world of one.

A call: the communicator looks the plan up by the call's key (collective, dtype, shape, op, root, output mode,
algorithm and parameters, deterministic, accumulate) -> `plan.run(x, out, timeout)`: a quick check of the
buffers (calls.buffers_fit; anything unusual goes to the full validator, which raises the precise error) ->
the agreement when the executor does not fold it -> the executor -> the result. Asynchronous calls queue a
`Launch` of the same plan (progress.py).
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from .. import registry
from ..errors import CallMismatchError, CollectivesError, CollectiveTimeoutError
from ..kernels import round_into
from ..kernels._dtypes import dtype_name
from ..reduction import finalize
from ..schedule.collective import ALLTOALL, REDUCING
from . import calls
from .agreement import Agreement, CallMeta, HostAgreement, MismatchReport, ResultCheck
from .choose import Choice
from .executors import DONE, MISMATCH, LocalExecutor, MessageExecutor, NativeExecutor, ShmExecutor
from .progress import advance_others
from .shm.executor import POLLS
from .shm.program import Runner, lib

_run_plan = lib.coll_plan_run if lib is not None else None  # (a Runner exists only with the C extension)

_IN_WORK, _IN_SCRATCH, _BROADCAST, _GATHER, _GENERAL = range(5)  # how run() binds a call's buffers
# a blocking call of MPI's own collective polls this often before joining the queue (yielding the CPU between
# polls when ranks share cores: a flat-out spin keeps the core from the peer it waits for)
SPIN_POLLS = 1024
_SPIN = range(SPIN_POLLS)


class Plan:
    """One call signature's plan (see the module docstring)."""

    def __init__(self, ctx, collective: str, x: np.ndarray, mode: int, op: str, kernel_op: str, root: int | None,
                 algorithm: str, choice: Choice, accumulate: str | None, deterministic: bool,
                 wide: bool, timeout: float | None = None, counts: np.ndarray | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        """`timeout`: the first call's own (it bounds a collective growth of the shared windows, see _grow);
        `counts`: an alltoallv's p x p matrix (counts[s, d] elements from rank s to rank d)."""
        self.ctx = ctx
        self.collective = collective
        self.dtype = x.dtype  # the caller's dtype
        self.work_dtype = np.dtype(np.float32) if wide else x.dtype  # accumulate="float32": float32 work
        self.wide = wide
        self.shape = x.shape if shape is None else shape  # scatter: the output block's, on every rank
        self.count = x.size if shape is None else int(np.prod(shape, dtype=np.int64))
        self.mode = mode
        self.op = op
        self.kernel_op = kernel_op
        self.root = root
        self.choice = choice
        p, r = ctx.size, ctx.rank
        self.p, self.rank = p, r
        self.counts = counts
        if counts is not None:  # alltoallv: this rank's output is its column of the matrix
            self.out_count = int(counts[:, r].sum())
            self.out_shape = (self.out_count,)
        else:
            self.out_shape = calls.output_shape(collective, self.shape, p)
            self.out_count = calls.output_count(collective, self.count, p)
        self.producing = collective != "barrier" and (collective not in ("reduce", "gather") or r == root)
        size = self.count if counts is None else int(hashlib.blake2b(counts.tobytes(), digest_size=7).hexdigest(), 16)
        self.signature = calls.Signature(collective, size, dtype_name(x.dtype), op if collective in REDUCING else "-",
                                         root, algorithm, f"{choice.algorithm} {sorted(choice.params.items())!r}",
                                         accumulate or "input", bool(deterministic and collective in REDUCING))
        # what the agreement compares: the whole signature, or with check="off" only the call's size (collective,
        # element count, dtype), which the plan runner compares at no cost (see executors.ShmExecutor)
        self.digest = self.signature.digest() if ctx.check != "off" else \
            calls.Signature(collective, size, dtype_name(x.dtype), "-", None, "-", "-", "-", False).digest()
        # with check="off" a call of zero elements (no per-rank counts) is complete where it is issued: there is
        # nothing to move and nothing checked to agree on (a rank whose count is not zero then times out waiting
        # for this one, where the plan runner's size check would have raised CallMismatchError)
        self.moves_nothing = (ctx.check == "off" and collective != "barrier" and counts is None and self.count == 0
                              and p > 1)
        self.calls = 0
        self.sent = self.received = self.switch_sent = self.switch_received = 0  # bytes per call
        self.schedule = None
        self.general = False
        self.scratch: np.ndarray | None = None  # work buffer of calls whose partial results the caller never sees
        self.executor = self._executor(timeout)
        # the plan runner: one C call runs the call, and its agreement when checking (folded into its waits)
        self.inline = isinstance(self.executor, ShmExecutor) and not wide
        self.explicit_agreement = ctx.check != "off" and not self.executor.folds_agreement and p > 1
        # check="off": the first call of each signature still agrees on the call's size (collective, count,
        # dtype: self.digest) where the executor does not fold that in (MPI's own collective, messages), when
        # the ranks share a host: through their control blocks, never an MPI collective that could meet a peer's
        # data. MPI's allreduce of 3 elements against a peer's 2 returns a wrong result without an error. Later
        # calls of the signature run unchecked, so the steady state costs nothing (docs/reliability.md).
        self.size_check_pending = (ctx.check == "off" and not self.executor.folds_agreement and p > 1
                                   and ctx.arena is not None)
        self.full_check = ctx.check == "full" and collective in ("allreduce", "allgather", "broadcast") and p > 1
        # MPI's own collective may run as a persistent request: its agreement carries each rank's flag
        self.repeatable = isinstance(self.executor, NativeExecutor) and self.executor.persistable and \
            self.explicit_agreement and ctx.arena is not None and not wide
        self.finalizing = op == "avg" and collective in REDUCING and self.producing
        self._kind = _GENERAL if self.general else _IN_SCRATCH if self.scratch is not None else \
            _BROADCAST if collective == "broadcast" else _GATHER if collective == "allgather" else _IN_WORK
        # the plan runner reads the input where it lies and copies its result into the caller's output itself,
        # so binding a call copies nothing in Python (an allgather's own block, alltoall's regions, the block of
        # a reduce_scatter): `io`
        self.io = self.inline and self._place_io()
        # the buffers of the last call through run(), accepted by the quick check (held: a caller's array stays
        # alive until the next call of this signature, or until the plan is dropped)
        self._x = self._out = self._binding = self._quick = None
        self.direct = isinstance(self.executor, (NativeExecutor, LocalExecutor))  # run() without the queue

    # -- building ------------------------------------------------------------------------------------------
    def _executor(self, timeout: float | None):
        ctx, choice = self.ctx, self.choice
        if choice.algorithm == "copy" or self.p == 1 or self.moves_nothing:
            return LocalExecutor(self.collective)
        if choice.algorithm == "native":
            return NativeExecutor(ctx, self.collective, self.kernel_op, self.root, self.count)
        schedule = self.schedule = self._build_schedule()
        if schedule.notes:  # a fallback inside the schedule (SHARP or NVLS refused) is part of the reason
            self.choice = Choice(choice.algorithm, choice.params, "; ".join([choice.reason, *schedule.notes]))
        # a layout of its own (alltoall's input and output regions, an imported schedule's scratch): the work
        # buffer is the plan's, the input copied into its input range and the output read from its output range
        self.general = schedule.regions is not None or self.collective in ALLTOALL
        if self.general or self.collective == "reduce_scatter" or \
                (self.collective == "reduce" and self.rank != self.root):
            self.scratch = np.empty(schedule.work_size, self.work_dtype)
        self._count_bytes(schedule)
        if ShmExecutor.serves(schedule, ctx.arena):
            executor = ShmExecutor(ctx, schedule, self.work_dtype, self.kernel_op, self.digest)
            if executor.want > ctx.arena.capacity:  # the same on every rank: a collective growth
                self._grow(executor.want, timeout)
            return executor
        return MessageExecutor(ctx, schedule, self.work_dtype, self.kernel_op, self.choice, self.root, self.params)

    def _place_io(self) -> bool:
        """Tell the plan runner where this rank's input lies in its node state and which part of that state is
        its output (ShmExecutor.place_io); False where the binding keeps copying (nothing to place, or a schedule
        that reads outside its input before writing it)."""
        kind, r, ex = self._kind, self.rank, self.executor
        # the output range lives in the caller's output throughout, unless that is the input (in place)
        direct = self.mode != calls.IN_PLACE
        if kind == _GATHER:
            n = self.count
            return ex.place_io((r * n, (r + 1) * n), None, False)
        if kind == _IN_SCRATCH:  # reduce_scatter: this rank's block of the reduced vector; reduce off the root
            k = self.count // self.p
            return ex.place_io(None, (r * k, (r + 1) * k) if self.producing else (0, 0), direct)
        if kind == _GENERAL:
            src = self.schedule.input_range(r)
            dst = self.schedule.output_range(r) if self.producing else None
            return src is not None and ex.place_io(tuple(src), (0, 0) if dst is None else tuple(dst), direct)
        return False

    @property
    def params(self) -> dict:
        """The choice's parameters, plus dtype and op for builders that take them: in-network builders decide
        from these what the switches can offload (switch daemons build with the same parameters)."""
        takes = registry.parameters(self.choice.algorithm)
        extra = {k: v for k, v in (("dtype", dtype_name(self.work_dtype)), ("op", self.kernel_op))
                 if k in takes and k not in self.choice.params}
        return {**self.choice.params, **extra}

    def _build_schedule(self):
        info = registry.info(self.choice.algorithm)
        topology = self.ctx.topology if info.needs_topology else None
        if self.counts is not None:
            return registry.build(self.choice.algorithm, collective=self.collective, world_size=self.p, count=None,
                                  counts=self.counts, topology=topology, **self.params)
        return registry.build(self.choice.algorithm, collective=self.collective, world_size=self.p, count=self.count,
                              root=self.root, topology=topology, **self.params)

    def _count_bytes(self, schedule) -> None:
        isz = self.work_dtype.itemsize
        for node in (self.rank, *range(schedule.world_size, schedule.num_nodes)):
            if node >= schedule.world_size and (self.ctx.daemons or (node - self.p) % self.p != self.rank):
                continue  # switch nodes run on daemons, or on another rank (leader emulation)
            prog = schedule.program(node)
            length = prog.stop - prog.start
            sent = int(length[prog.kind == 0].sum()) * isz
            received = int(length[prog.kind != 0].sum()) * isz
            if node < schedule.world_size:
                self.sent, self.received = sent, received
            else:
                self.switch_sent += sent
                self.switch_received += received

    def _grow(self, need: int, timeout: float | None) -> None:
        """The arena's windows must grow before this plan's first call: collective over the host, so every rank
        first finishes its calls in flight (they run on the windows being replaced) and agrees this call (the
        same signature means the same need on every rank)."""
        ctx = self.ctx
        queue = ctx.queue
        if queue:  # calls in flight (asynchronous ones) still use the windows: they finish first, in order
            last = queue.launches[-1]
            try:
                queue.wait(last, timeout)
            except CollectivesError as exc:
                if exc is not last.error:  # not that call's own error (its handle raises that): a failure
                    raise
        seq = ctx.seq + 1  # the call this plan is built for (it is issued next)
        agreement = HostAgreement(ctx.runtime, ctx.arena, CallMeta.of(seq, self.signature), self.digest)
        limit = ctx.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        nap = 0.0
        while True:
            try:
                if agreement.test():
                    break
            except CallMismatchError:
                ctx.seq = seq  # the call is over on every rank (each found the mismatch): its number is spent
                raise
            if deadline is not None and time.monotonic() > deadline:
                ctx.seq = seq
                peers = agreement.waiting
                err = CollectiveTimeoutError(
                    f"rank {self.rank}: {self.collective} #{seq} (algorithm {self.choice.algorithm}) did not complete "
                    f"within {limit} s in its agreement (before any data moved: the shared windows grow for it, "
                    f"collectively); awaiting {ctx.peer_labels(peers)}. A peer may be dead, stuck, or have called a "
                    "different collective; set COLLECTIVES_TIMEOUT or timeout= to wait longer",
                    collective=self.collective, algorithm=self.choice.algorithm, seq=seq, peers=peers, timeout=limit)
                ctx.fail(err)
                raise err
            advance_others(ctx.queue)  # a peer may wait for this thread's call in flight on another communicator
            nap = min(1e-3, nap * 2 or 1e-6)
            time.sleep(nap)
        ctx.arena.grow(need)

    # -- binding a call's buffers ---------------------------------------------------------------------------
    def output(self, x: np.ndarray, out):
        """The array the call returns (None: no output on this rank)."""
        if not self.producing:
            return None
        if self.collective == "broadcast":
            return x
        return out if out is not None else np.empty(self.out_shape, self.dtype)

    def bind(self, x: np.ndarray, res):
        """(work, source) of a schedule executor: the node's state per the collective's contract, and the input
        still to be read where it lies (None: already in work)."""
        flat = x.reshape(-1)
        c = self.collective
        if self.general:
            return (self.scratch, flat) if self.io else (self.place(flat), None)
        if self.scratch is not None:  # reduce_scatter; reduce off the root
            return self.scratch, flat
        if c == "broadcast":
            return flat, None
        work = res.reshape(-1)
        if c == "allgather":
            if self.io:
                return work, flat
            n = x.size
            work[self.rank * n:(self.rank + 1) * n] = flat
            return work, None
        return work, (None if res is x else flat)

    def place(self, flat: np.ndarray) -> np.ndarray:
        """A schedule with its own layout: this rank's input copied into its input range of the plan's work."""
        rng = self.schedule.input_range(self.rank)
        if rng is not None:
            self.scratch[rng[0]:rng[1]] = flat
        return self.scratch

    def take(self, res) -> None:
        """... and its output read from its output range."""
        rng = self.schedule.output_range(self.rank)
        if rng is not None and res is not None:
            res.reshape(-1)[...] = self.scratch[rng[0]:rng[1]]

    def finish(self, res):
        """A schedule's call after its executor completed: the output read out of the work buffer where the plan
        runner did not write it (`io`), then avg's division."""
        if not self.io:
            if self.general:
                self.take(res)
            elif self._kind == _IN_SCRATCH and res is not None:  # reduce_scatter's block
                k = self.count // self.p
                res.reshape(-1)[...] = self.scratch[self.rank * k:(self.rank + 1) * k]
        if self.finalizing:
            finalize(res, self.op, self.p)
        return res

    # -- running ------------------------------------------------------------------------------------------------
    def run(self, x: np.ndarray, out, timeout: float | None):
        """One blocking call (the communicator checked the key). The plan runner's calls are bound and started
        here, without a queue entry, unless something needs the general path (a call in flight, a buffer the
        quick check does not accept: the validator then raises the precise error, or copies a strided input).
        A call on the buffers of the last one, whose binding is fixed, restarts the C runner on the pointers it
        holds (`_quick`: start_inline's work without its look-ups) while those pointers are still this plan's
        (`owner`: Runner.start clears it) over the same windows; anything else takes the general path."""
        quick = self._quick
        if quick is not None and x is self._x and out is self._out:
            engine = quick[0]
            ctx = self.ctx
            if ctx.fast and (quick[4] or out.flags.writeable) and engine.owner is self and \
                    engine.generation == quick[2].generation:
                # restart(quick, x, out, timeout) written out: the hottest path of small calls
                call = engine.call
                call.seq = ctx.seq = ctx.seq + 1
                self.calls += 1
                quick[1].engine = engine
                rc = _run_plan(call, POLLS, quick[1].yield_cpu, 1)
                return quick[3] if rc == DONE and not self.finalizing else self.restarted(quick, rc, x, out, timeout)
            self._quick = None
        ctx = self.ctx
        if not (self.inline and ctx.fast):
            if self.direct and ctx.fast and not self.wide and calls.buffers_fit(x, out, self.mode, self.out_count):
                return self._run_direct(x, out, timeout)
            return self.submit(x, out, False, timeout)
        if x is not self._x or out is not self._out:  # buffers already accepted are not checked again
            if not calls.buffers_fit(x, out, self.mode, self.out_count):
                return self.submit(x, out, False, timeout)
            self._x, self._out = x, out
            # the binding, where it is the same call after call on these buffers (it copies nothing then)
            self._binding = self.bind_inline(x, out) if self.fixed_binding(out) else None
            self._quick = None
        elif self.mode != calls.NEW and not out.flags.writeable:  # the one flag a caller can change
            return self.submit(x, out, False, timeout)
        res, work, source = self._binding or self.bind_inline(x, out)
        result = self.start_inline(x, out, res, work, source, timeout)
        if self._binding is not None:  # the next call on these buffers restarts the runner directly
            self._quick = self.quick_state(self, res)
        return result

    def quick_state(self, owner, res) -> tuple | None:
        """After a call started on the plan runner with a fixed binding: what `restart` needs to run the next one
        on the same pointers (the engine, marked as `owner`'s until anything else starts it), or None where the
        engine is the Python interpreter."""
        inner = self.executor.inner
        engine = inner.engine
        if not isinstance(engine, Runner):
            return None
        engine.owner = owner
        return engine, inner, inner.arena, res, self.mode == calls.NEW

    def restart(self, quick: tuple, x: np.ndarray, out, timeout: float | None):
        """The call again on the pointers the C runner holds (quick_state's; the caller checked that they are
        still its owner's, over the same windows, with nothing in flight)."""
        engine, inner = quick[0], quick[1]
        ctx = self.ctx
        call = engine.call
        call.seq = ctx.seq = ctx.seq + 1
        self.calls += 1
        inner.engine = engine  # the call in flight (resume() and a timeout report read it)
        rc = _run_plan(call, POLLS, inner.yield_cpu, 1)
        return quick[3] if rc == DONE and not self.finalizing else self.restarted(quick, rc, x, out, timeout)

    def restarted(self, quick: tuple, rc: int, x: np.ndarray, out, timeout: float | None):
        """The result of a restarted call whose runner returned `rc`."""
        res = quick[3]
        if rc != DONE:  # a late peer or a mismatch: the bounded wait (or the runner's error)
            quick[0].status(rc)
            launch = Launch(self, self.ctx.seq, x, out, res, started=True)
            self.ctx.queue.submit(launch, False, timeout)
            return launch.result
        if self.finalizing:  # (a fixed binding needs nothing else after the runner: fixed_binding)
            finalize(res, self.op, self.p)
        return res

    # a call on the shared-memory plan runner, started on the caller's thread (bind_inline, then start_inline):
    # only when the buffers fit the plan (calls.buffers_fit) and nothing is in flight (`self.inline and
    # ctx.fast`), which run() and a persistent call (persistent.py) check first
    def bind_inline(self, x: np.ndarray, out) -> tuple:
        """(result, work, source) of a call on the plan runner: the work buffer per the collective's contract and
        the input still to be read where it lies (None: already in work). For allreduce, reduce and broadcast
        with a given output these depend only on the buffers (`fixed_binding`); the others copy this call's input
        into place here."""
        kind = self._kind
        if kind == _GENERAL:  # alltoall; a schedule with its own layout
            res = (out if out is not None else np.empty(self.out_shape, self.dtype)) if self.producing else None
            return (res, self.scratch, x) if self.io else (res, self.place(x.reshape(-1)), None)
        if kind == _IN_WORK:  # allreduce; reduce on the root
            res = out if out is not None else np.empty(self.out_shape, self.dtype)
            return res, res, (None if res is x else x)
        if kind == _IN_SCRATCH:  # reduce_scatter; reduce off the root
            res = (out if out is not None else np.empty(self.out_shape, self.dtype)) if self.producing else None
            return res, self.scratch, x
        if kind == _BROADCAST:
            return x, x, None
        # allgather: this rank's block read where it lies, or copied in place first
        res = out if out is not None else np.empty(self.out_shape, self.dtype)
        if self.io:
            return res, res, x
        n = self.count
        res.reshape(-1)[self.rank * n:(self.rank + 1) * n] = x.reshape(-1)
        return res, res, None

    def fixed_binding(self, out) -> bool:
        """bind_inline(x, out) returns the same buffers call after call and copies nothing."""
        return self._kind == _BROADCAST or (self._kind == _IN_WORK and out is not None) or \
            (self.io and (out is not None or not self.producing))

    def start_inline(self, x: np.ndarray, out, res, work, source, timeout: float | None):
        """Start the bound call (bind_inline's buffers) and finish it, or hand it to the queue's bounded wait
        when a peer is late or the calls differ."""
        ctx = self.ctx
        seq = ctx.seq = ctx.seq + 1
        self.calls += 1
        if self.executor.start(work, source, seq, POLLS, res if self.io else None) != DONE:
            launch = Launch(self, seq, x, out, res, started=True)  # a late peer or a mismatch: the bounded wait
            ctx.queue.submit(launch, False, timeout)
            return launch.result
        return self.finish(res)

    def _run_direct(self, x: np.ndarray, out, timeout: float | None):
        """A blocking call of MPI's own collective (or a world of one) on the caller's thread, without a queue
        entry when it completes within a short spin: the agreement (when checking), the call, the result. A call
        still waiting after the spin joins the queue's bounded wait where it stands (agreeing or running), with
        the full timeout report."""
        ctx = self.ctx
        seq = ctx.seq = ctx.seq + 1
        self.calls += 1
        if self.full_check:  # a result check to post: the queue's stages
            launch = Launch(self, seq, x, out, None, started=False)
            ctx.queue.submit(launch, False, timeout)
            return launch.result
        ex = self.executor
        launch = None
        # with ranks sharing cores every poll yields the CPU (the peer awaited may be waiting for this core); the
        # loops are inline either way: a call of a helper per call costs ~0.1 us
        shared = ctx.host.oversubscribed
        try:
            agreement = self.agreement(seq, x, out)
            agreed = agreement is None
            if not agreed:
                test = agreement.test
                for _ in _SPIN:
                    if test():
                        agreed = True
                        break
                    if shared:
                        os.sched_yield()
            if not agreed:
                launch = Launch(self, seq, x, out, None, started=False)
                launch._agreement = agreement  # its test() goes on in the queue (a mismatch report included)
            else:
                res = ex.launch(self, x, out, seq, agreement)
                done = ex.req_done
                for _ in _SPIN:
                    if done():
                        return ex.finish_native(self, res)
                    if shared:
                        os.sched_yield()
                launch = Launch(self, seq, x, out, res, started=True)
        except CallMismatchError as exc:
            ctx.note_mismatch(exc)
            raise
        except ctx.runtime.failure as exc:
            raise ctx.queue.peer_failed(launch or Launch(self, seq, x, out, None, started=False), exc) from exc
        except Exception as exc:  # a local error once issued: the communicator cannot go on (progress.py)
            ctx.fail(exc)
            raise
        ctx.queue.submit(launch, False, timeout)
        return launch.result

    def submit(self, x, out, async_op: bool, timeout: float | None):
        """The general path: validate the buffers, then queue a launch (waited for unless async)."""
        ctx = self.ctx
        ctx.check_open()
        if not calls.buffers_fit(x, out, self.mode, self.out_count):
            calls.check_buffers(self.collective, x, out, self.p)  # raises the precise error, if any
            x = np.ascontiguousarray(x)  # a strided input is read through a copy
        seq = ctx.seq = ctx.seq + 1
        self.calls += 1
        launch = Launch(self, seq, x, out, None, started=False)
        return ctx.queue.submit(launch, async_op, timeout)

    def agreement(self, seq: int, x=None, out=None):
        """The explicit agreement of call `seq` on buffers x and out, posted now (None when the executor folds it,
        or with check=off after the signature's first call)."""
        if not self.explicit_agreement:
            # the first call of the signature on this communicator, not of this plan: a rank may hold two plans of
            # one signature (in place here, a separate output there) where its peers hold one
            checked = self.ctx.size_checked
            if not self.size_check_pending or self.digest in checked:
                return None
            self.size_check_pending = False
            checked.add(self.digest)
            return HostAgreement(self.ctx.runtime, self.ctx.arena, (seq, self.signature), self.digest)
        ctx = self.ctx
        if ctx.arena is not None:
            flag = self.executor.same_as_last(self, x, out) if self.repeatable else None
            return HostAgreement(ctx.runtime, ctx.arena, (seq, self.signature), self.digest, flag)
        return Agreement(ctx.runtime, CallMeta.of(seq, self.signature), self.rank)


class Launch:
    """One issued call of a plan in the queue: agreement (if explicit) -> start -> progress -> finish ->
    (check="full") result check."""

    __slots__ = ("plan", "seq", "x", "out", "res", "done", "error", "result", "stage", "_agreement", "_state",
                 "_report", "_post", "_wide_out")

    def __init__(self, plan: Plan, seq: int, x, out, res, started: bool) -> None:
        self.plan, self.seq, self.x, self.out = plan, seq, x, out
        self.res = res
        self.done = False
        self.error: BaseException | None = None
        self.result = None
        self._agreement = None
        self._report: MismatchReport | None = None
        self._post: ResultCheck | None = None
        self._wide_out = None
        self._state = "run" if started else "agree"
        self.stage = "running" if started else "agreement"

    @property
    def events(self) -> int:
        return self.plan.executor.events if self._state == "run" else 0

    def where(self) -> tuple:
        if self._state == "agree" and self._agreement is not None and hasattr(self._agreement, "waiting"):
            return None, None, self._agreement.waiting, None
        if self._state == "run":
            return self.plan.executor.where()
        return None, None, (), None

    def cancel(self) -> None:
        if self._state == "run":
            self.plan.executor.cancel()

    def advance(self, blocking: bool = True) -> bool:
        """Progress without blocking for long: a blocking waiter lets the plan runner poll a wait POLLS times, a
        test() returns at the first wait that has not passed."""
        plan = self.plan
        polls = POLLS if blocking else 0
        if self._report is not None:
            return self._report.test()  # raises the mismatch once every rank's record is in
        if self._state == "agree":
            if self._agreement is None:
                self._agreement = plan.agreement(self.seq, self.x, self.out)
            if self._agreement is not None and not self._agreement.test():
                return False
            self._start(polls)
            if self._report is not None:  # the plan runner found a mismatch as the call started
                return self._report.test()
        if self._state == "run":
            status = plan.executor.resume(polls)
            if status == MISMATCH:
                return self._mismatch()
            if status != DONE:
                return False
            self.result = self._finish()
            if plan.full_check and isinstance(self.result, np.ndarray):
                self._post = ResultCheck(plan.ctx.runtime, self.result, self.seq, plan.collective, plan.rank)
            self._state, self.stage = "post", "result check"
        if self._post is not None:
            return self._post.test()
        return True

    def _start(self, polls: int) -> None:
        plan = self.plan
        self._state, self.stage = "run", "running"
        x, out = self.x, self.out
        if plan.wide:  # accumulate="float32": run on float32, round once into the caller's dtype at the end
            self._wide_out = plan.output(x, out)
            x, out = x.astype(np.float32), None
        ex = plan.executor
        if isinstance(ex, (LocalExecutor, NativeExecutor)):
            self.res = ex.launch(plan, x, out, self.seq, self._agreement)
            return
        res = self.res = plan.output(x, out) if not plan.wide else \
            (np.empty(plan.out_shape, np.float32) if plan.producing else None)
        if plan.wide and plan.collective == "broadcast":
            res = self.res = x
        work, source = plan.bind(x, res)
        if ex.start(work, source, self.seq, polls, res if plan.io else None) == MISMATCH:
            self._mismatch()

    def _finish(self):
        plan = self.plan
        ex = plan.executor
        res = ex.finish_native(plan, self.res) if isinstance(ex, (LocalExecutor, NativeExecutor)) \
            else plan.finish(self.res)
        if plan.wide and res is not None:
            target = self._wide_out if self._wide_out is not None else np.empty(plan.out_shape, plan.dtype)
            round_into(target.reshape(-1), np.ascontiguousarray(res).reshape(-1))
            res = target
        return res

    def _mismatch(self) -> bool:
        plan = self.plan
        ctx = plan.ctx
        self._report = MismatchReport(ctx.runtime, CallMeta.of(self.seq, plan.signature), plan.rank, ctx.arena)
        return self._report.test()


__all__ = ["Launch", "Plan"]
