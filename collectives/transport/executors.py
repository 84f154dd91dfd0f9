"""The executors a plan can bind: one interface, four ways to run a call.

* `ShmExecutor`: the schedule over shared memory (shm/): the plan runner, the agreement folded into its waits;
* `MessageExecutor`: the schedule with point-to-point messages (messages.py), switch nodes included (run by
  switch daemons or emulated on the ranks);
* `NativeExecutor`: MPI's own collective (nonblocking), for what MPI does best;
* `LocalExecutor`: a world of one (the output is the input).

Schedule executors take `start(work, source, seq)` (the node's state and the lazy input, plans.Plan.bind;
the plan runner also the output it copies its result into, `out`);
the other two `launch(plan, x, out, seq)` and `finish_native(plan, res)`. All then answer `resume()` with DONE,
WAITING or MISMATCH, `events` (progress, for the waiter), `where()` (round, op, awaited peers, last completed
round: for a timeout report) and `cancel()`.
"""

from __future__ import annotations

import numpy as np

from ..reduction import finalize
from ..schedule.collective import REDUCING
from .messages import Execution, ProcPlan, tag_base
from .placement import daemon_placement, leader_placement
from .shm import executor as _shm
from .shm.program import DONE, MISMATCH, WAITING


class ShmExecutor:
    """A schedule over this host's shared memory (shm/executor.py), for one call signature."""

    folds_agreement = True

    def __init__(self, ctx, schedule, dtype: np.dtype, kernel_op: str, digest: int) -> None:
        # with check="off" the runner still compares what costs it nothing and catches the worst outcome of a
        # mismatch (reading or writing past a peer's range): the size of the call (plans.Plan.size_digest)
        self.inner = _shm.ShmExecutor(ctx.arena, schedule, dtype, kernel_op, digest, True, ctx.host.oversubscribed)
        self.need, self.want = self.inner.need, self.inner.want
        # (work, source, seq, polls, out) -> status: the hot path, without a Python layer
        self.start = self.inner.start
        self.resume = self.inner.resume
        self.place_io = self.inner.place_io

    @staticmethod
    def serves(schedule, arena) -> bool:
        return _shm.eligible(schedule, arena)

    @property
    def events(self) -> int:
        return self.inner.events

    def where(self) -> tuple:
        return self.inner.where()

    def cancel(self) -> None:
        pass


class MessageExecutor:
    """A schedule's programs for the nodes this process hosts, with point-to-point messages."""

    folds_agreement = False

    def __init__(self, ctx, schedule, dtype: np.dtype, kernel_op: str, choice, root, params: dict) -> None:
        self.ctx, self.schedule, self.dtype, self.kernel_op = ctx, schedule, dtype, kernel_op
        self.daemons = bool(ctx.daemons) and schedule.num_nodes > schedule.world_size
        p = schedule.world_size
        if self.daemons:
            w = ctx.world
            placement = daemon_placement(p, schedule.num_nodes, w.app_procs, w.daemon_procs)
            self.proc, self.carrier = w.fabric.rank, w.fabric
        else:
            placement, self.proc, self.carrier = leader_placement(p, schedule.num_nodes), ctx.rank, ctx.runtime
        self.plan = ProcPlan.build(schedule, placement, self.proc)
        self.tag_ub = self.carrier.tag_upper_bound
        self.order = ("run", schedule.collective, choice.algorithm, schedule.count, dtype, root, kernel_op, params,
                      ctx.topology if schedule.topology is not None else None, p)
        self.run: Execution | None = None

    def start(self, work: np.ndarray, source: np.ndarray | None, seq: int, polls: int = 0, out=None) -> int:
        """(`out` is for a plan runner's output range, which this executor never has: plans.Plan.io.)"""
        ctx, plan = self.ctx, self.plan
        if source is not None:
            work[...] = source
        works = [work if node == ctx.rank else np.zeros(self.schedule.work_size, dtype=self.dtype)
                 for node in plan.nodes]
        if self.daemons and ctx.rank == 0:
            _, coll, algo, count, dtype, root, op, params, topo, p = self.order
            from ..kernels._dtypes import dtype_name
            from .daemon import send_orders  # MPI: switch daemons exist
            ctx.pending_orders.extend(send_orders(
                ctx.world, ("run", seq, coll, algo, count, dtype_name(dtype), root, op, params, topo, p)))
        self.run = Execution(plan, self.carrier, works, self.kernel_op, seq,
                             tag_base(seq, plan.placement.slots, self.tag_ub))
        return self.resume()

    def resume(self, polls: int = 0) -> int:
        done = self.run.advance()
        ctx = self.ctx
        if ctx.pending_orders:
            ctx.pending_orders = [r for r in ctx.pending_orders if not r.Test()]
        return DONE if done else WAITING

    @property
    def events(self) -> int:
        return self.run.events if self.run is not None else 0

    def where(self) -> tuple:
        if self.run is None:
            return None, None, (), None
        rnd, index, peers = self.run.stuck()
        return rnd, index, peers, self.run.last_completed

    def cancel(self) -> None:
        if self.run is not None:
            self.run.cancel()


class NativeExecutor:
    """The runtime's own collective (MPI's), posted nonblocking on the call's buffers (MPI matches nonblocking
    collectives by order, so a rank whose call is queued behind an asynchronous one still matches its peers).

    A call that repeats the previous one on every rank (the same plan and buffers) starts a persistent request
    instead (MPI-4's MPI_Alltoall_init and kin: MPI skips the call's setup, 1.1-1.5x faster than its blocking call
    on one host). Whether it does must be the same on every rank, since initialising one is collective: each rank
    publishes "my plan and buffers are those of my previous such call" with its agreement (agreement.HostAgreement's
    flag), and every rank then reads the same answer. The communicator holds at most one such request
    (`ctx.native_request`): it exists on every rank or on none, bound on each rank to the buffers its flag
    compared, and every rank frees it at a call whose answer is no."""

    folds_agreement = False
    PERSISTABLE = ("allreduce", "reduce", "broadcast", "reduce_scatter", "allgather", "alltoall")

    def __init__(self, ctx, collective: str, kernel_op: str, root: int | None, count: int) -> None:
        self.native, self.collective, self.root, self.rank, self.p = ctx.runtime.native, collective, root, \
            ctx.rank, ctx.size
        self.ctx = ctx
        self.op = kernel_op
        self.req = self.req_done = None
        self.own = None  # a persistent allgather's (input, this rank's block of the output): _start_persistent
        self.completed = 0
        # a persistent request can serve this signature (the plan offers the flag only with a host agreement)
        self.persistable = collective in self.PERSISTABLE and count > 0 and hasattr(self.native, "persistent")

    def same_as_last(self, plan, x: np.ndarray, out) -> bool:
        """This rank's flag: the call repeats this rank's previous flagged call (plan, input and output arrays;
        a new output array each call never repeats)."""
        last = self.ctx.native_last
        return last is not None and last[0] is plan and last[1] is x and last[2] is out and \
            (out is not None or not plan.producing or self.collective == "broadcast") and \
            self.ctx.native_request is not False

    def _start_persistent(self, plan, x: np.ndarray, out, res, repeat: bool | None) -> bool:
        """Follow the ranks' common answer `repeat` (None: no flag was asked for): start the persistent request
        (initialising it first when there is none), or free it. True when it was started."""
        ctx = self.ctx
        if repeat is None:
            return False
        req = ctx.native_request
        ctx.native_last = (plan, x, out)
        if not repeat:
            if req:
                req.Free()  # inactive: its last start completed
                ctx.native_request = None
            return False
        if req is None:  # every rank initialises its own now: the same call on every rank
            req = ctx.native_request = self.native.persistent(self.collective, x, res, self.op, self.root)
            if req is None:  # this MPI has none (on every rank): no flag is set again
                ctx.native_request = False
                return False
        if self.collective == "allgather":  # its request runs in place (_MpiNative.persistent): this rank's block
            self.own = (x.reshape(-1), res.reshape(-1)[self.rank * x.size:(self.rank + 1) * x.size])
            self.own[1][...] = self.own[0]
        req.Start()
        self.req, self.req_done = req, req.Test
        return True

    def launch(self, plan, x: np.ndarray, out, seq: int, agreement=None):
        """Post the call; returns the array the call will return (None off a reduce's root). `agreement`: the
        call's, complete (its `all_flags` says whether every rank repeats its previous call)."""
        n, op, root, coll = self.native, self.op, self.root, self.collective
        res = plan.output(x, out)  # x is contiguous (plans.Plan.submit); out=x means in place
        if self._start_persistent(plan, x, out, res, getattr(agreement, "all_flags", None)):
            return res
        if coll == "allreduce":
            self.req = n.allreduce(n.IN_PLACE if res is x else x, res, op)
        elif coll == "reduce":
            if self.rank == root:
                self.req = n.reduce(n.IN_PLACE if res is x else x, res, op, root)
            else:
                self.req = n.reduce(x, None, op, root)
        elif coll == "broadcast":
            self.req = n.broadcast(x, root)
        elif coll == "reduce_scatter":
            self.req = n.reduce_scatter(x, res, op)
        elif coll == "allgather":
            self.req = n.allgather(x, res)
        elif coll == "alltoall":
            self.req = n.alltoall(x, res)
        elif coll == "alltoallv":
            counts, r = plan.counts, self.rank
            self.req = n.alltoallv(x, counts[r, :], res, counts[:, r])
        elif coll == "gather":
            self.req = n.gather(x, res, root)
        elif coll == "scatter":
            self.req = n.scatter(x if self.rank == root else None, res, root)
        elif coll == "barrier":
            self.req = n.barrier()
        else:
            raise ValueError(f"the runtime's own {coll} is not available here")
        self.req_done = self.req.Test  # polled by a blocking call's spin (plans.Plan._run_direct)
        return res

    def finish_native(self, plan, res):
        if self.own is not None:  # written again once complete: Intel MPI 2021.18's persistent allgather at 2 ranks
            self.own[1][...] = self.own[0]  # writes the previous start's block there even in place
            self.own = None
        if res is not None and self.collective in REDUCING:
            finalize(res, plan.op, self.p)
        return res

    def resume(self, polls: int = 0) -> int:
        if self.req.Test():
            self.completed += 1
            return DONE
        return WAITING

    @property
    def events(self) -> int:
        return self.completed

    def where(self) -> tuple:
        return None, None, (), None

    def cancel(self) -> None:
        pass


class LocalExecutor:
    """A world of one: the output is the input (copied unless in place)."""

    folds_agreement = True

    def __init__(self, collective: str) -> None:
        self.collective = collective

    def launch(self, plan, x: np.ndarray, out, seq: int, agreement=None):
        res = plan.output(x, out)
        if res is not None and res is not x and x.size:
            res.reshape(-1)[...] = x.reshape(-1)
        return res

    def finish_native(self, plan, res):
        if res is not None and self.collective in REDUCING:
            finalize(res, plan.op, 1)
        return res

    @staticmethod
    def req_done() -> bool:
        return True

    def resume(self, polls: int = 0) -> int:
        return DONE

    events = 0

    def where(self) -> tuple:
        return None, None, (), None

    def cancel(self) -> None:
        pass


__all__ = ["DONE", "LocalExecutor", "MISMATCH", "MessageExecutor", "NativeExecutor", "ShmExecutor", "WAITING"]
