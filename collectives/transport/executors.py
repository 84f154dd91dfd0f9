"""The executors a plan can bind: one interface, four ways to run a call.

* `ShmExecutor`: the schedule over shared memory (shm/): the plan runner, the agreement folded into its waits;
* `MessageExecutor`: the schedule with point-to-point messages (messages.py), switch nodes included (run by
  switch daemons or emulated on the ranks);
* `NativeExecutor`: MPI's own collective (nonblocking), for what MPI does best;
* `LocalExecutor`: a world of one (the output is the input).

Schedule executors take `start(work, source, seq)` (the node's state and the lazy input, plans.Plan.bind);
the other two `launch(plan, x, out, seq)` and `finish_native(plan, res)`. All then answer `resume()` with DONE,
WAITING or MISMATCH, `events` (progress, for the waiter), `where()` (round, op, awaited peers, last completed
round: for a timeout report) and `cancel()`.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..reduction import finalize
from ..schedule.collective import REDUCING
from . import daemon as _daemon
from .messages import Execution, ProcPlan, tag_base, tag_upper_bound
from .placement import daemon_placement, leader_placement
from .shm import executor as _shm
from .shm.program import DONE, MISMATCH, WAITING

_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "band": MPI.BAND, "bor": MPI.BOR,
            "bxor": MPI.BXOR}


class ShmExecutor:
    """A schedule over this host's shared memory (shm/executor.py), for one call signature."""

    folds_agreement = True

    def __init__(self, ctx, schedule, dtype: np.dtype, kernel_op: str, digest: int) -> None:
        self.inner = _shm.ShmExecutor(ctx.arena, schedule, dtype, kernel_op, digest, ctx.check != "off",
                                      ctx.host.oversubscribed)
        self.need = self.inner.need
        self.start = self.inner.start  # (work, source, seq) -> status: the hot path, without a Python layer
        self.resume = self.inner.resume

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
            self.proc, self.carrier = w.fabric.Get_rank(), w.fabric
        else:
            placement, self.proc, self.carrier = leader_placement(p, schedule.num_nodes), ctx.rank, ctx.comm
        self.plan = ProcPlan.build(schedule, placement, self.proc)
        self.tag_ub = tag_upper_bound()
        self.order = ("run", schedule.collective, choice.algorithm, schedule.count, dtype, root, kernel_op, params,
                      ctx.topology if schedule.topology is not None else None, p)
        self.run: Execution | None = None

    def start(self, work: np.ndarray, source: np.ndarray | None, seq: int, polls: int = 0) -> int:
        ctx, plan = self.ctx, self.plan
        if source is not None:
            work[...] = source
        works = [work if node == ctx.rank else np.zeros(self.schedule.work_size, dtype=self.dtype)
                 for node in plan.nodes]
        if self.daemons and ctx.rank == 0:
            _, coll, algo, count, dtype, root, op, params, topo, p = self.order
            from ..kernels._dtypes import dtype_name
            ctx.pending_orders.extend(_daemon.send_orders(
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
    """MPI's own collective, posted nonblocking on the call's buffers (MPI matches nonblocking collectives by
    order, so a rank whose call is queued behind an asynchronous one still matches its peers)."""

    folds_agreement = False

    def __init__(self, ctx, collective: str, kernel_op: str, root: int | None) -> None:
        self.comm, self.collective, self.root, self.rank, self.p = ctx.comm, collective, root, ctx.rank, ctx.size
        self.mpi_op = _MPI_OPS[kernel_op]
        self.req: MPI.Request | None = None
        self.completed = 0

    def launch(self, plan, x: np.ndarray, out, seq: int):
        """Post the call; returns the array the call will return (None off a reduce's root)."""
        c, op, root, coll = self.comm, self.mpi_op, self.root, self.collective
        res = plan.output(x, out)  # x is contiguous (plans.Plan.submit); out=x means in place
        if coll == "allreduce":
            self.req = c.Iallreduce(MPI.IN_PLACE if res is x else x, res, op)
        elif coll == "reduce":
            if self.rank == root:
                self.req = c.Ireduce(MPI.IN_PLACE if res is x else x, res, op, root)
            else:
                self.req = c.Ireduce(x, None, op, root)
        elif coll == "broadcast":
            self.req = c.Ibcast(x, root)
        elif coll == "reduce_scatter":
            self.req = c.Ireduce_scatter_block(x, res, op) if res.size else c.Ibarrier()
        elif coll == "allgather":
            self.req = c.Iallgather(x, res) if x.size else c.Ibarrier()
        elif coll == "alltoall":
            self.req = c.Ialltoall(x, res) if x.size else c.Ibarrier()
        elif coll == "alltoallv":
            counts, r = plan.counts, self.rank
            send, recv = counts[r, :], counts[:, r]
            sdispl = np.concatenate(([0], np.cumsum(send)[:-1]))
            rdispl = np.concatenate(([0], np.cumsum(recv)[:-1]))
            self.req = c.Ialltoallv([x, (send, sdispl)], [res, (recv, rdispl)])
        elif coll == "gather":
            self.req = c.Igather(x, res, root)
        elif coll == "scatter":
            self.req = c.Iscatter(x if self.rank == root else None, res, root)
        elif coll == "barrier":
            self.req = c.Ibarrier()
        else:
            raise ValueError(f"MPI's own {coll} is not available here")
        return res

    def finish_native(self, plan, res):
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

    def launch(self, plan, x: np.ndarray, out, seq: int):
        res = plan.output(x, out)
        if res is not None and res is not x and x.size:
            res.reshape(-1)[...] = x.reshape(-1)
        return res

    def finish_native(self, plan, res):
        if res is not None and self.collective in REDUCING:
            finalize(res, plan.op, 1)
        return res

    def resume(self, polls: int = 0) -> int:
        return DONE

    events = 0

    def where(self) -> tuple:
        return None, None, (), None

    def cancel(self) -> None:
        pass


__all__ = ["DONE", "LocalExecutor", "MISMATCH", "MessageExecutor", "NativeExecutor", "ShmExecutor", "WAITING"]
