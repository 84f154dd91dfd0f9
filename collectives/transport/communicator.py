"""The Communicator: the public API of collectives on numpy arrays under mpiexec.

Every call is: look up the plan of the call's signature (plans.py; built once, with the one validator of
calls.py) -> `plan.run(x, out)`. The methods below only name the collective and pass the arguments on; a
call with the common arguments (a numpy array, no parameters, blocking) finds its plan with one dictionary
lookup, and one that repeats the collective's last call on the same arrays by identity checks (`_again_*`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from .. import algorithms as _builtins  # noqa: F401  (registers the built-in algorithms)
from .. import environment
from ..emulator import check_accumulate, widens
from ..kernels._dtypes import dtype_name
from ..schedule.collective import REDUCING
from . import calls, choose, context, p2p
from .agreement import check_mode
from .calls import check_timeout
from .counts import exchange_counts
from .domains import DomainSpec, find_domains, topology_for
from .errors import CollectiveTimeoutError
from .host import discover, share_kernel_threads, warn_if_alone
from .persistent import PersistentCall
from .plans import Plan
from .progress import poll_until
from .runtime import Runtime
from .shm import arena as _arena

if TYPE_CHECKING:  # MPI only where a communicator runs on it: torch's runtime never initialises MPI
    from mpi4py import MPI

    from . import daemon

PLANS = 128  # plans kept per communicator (least recently used dropped)
_NO_CALL = (None,) * 8  # an `_again_*` record that no call matches (x is never None)


class Communicator:
    """Collectives over an MPI communicator (duplicated: the library's messages never meet the user's).

    Create with `collectives.init(...)`. `stats` counts calls and the bytes this rank's node sent and received
    through the library's schedules (switch nodes it hosts under leader emulation are counted apart), so `ring`
    (~2(p-1)/p·D per rank) and in-network reduction (~D) can be compared; calls of MPI's own collectives are
    counted in `stats["native_calls"]`.
    """

    def __init__(self, comm: MPI.Comm | Runtime, *, ranks_per_domain: DomainSpec | None = None, topology=None,
                 timeout: float | None = None, world: daemon.World | None = None, check: str | None = None,
                 deterministic: bool | None = None, accumulate: str | None = None) -> None:
        timeout = environment.get("COLLECTIVES_TIMEOUT") if timeout is None else check_timeout(timeout,
                                                                                                "init(timeout=)")
        check = check_mode(check)
        deterministic = environment.get("COLLECTIVES_DETERMINISTIC") if deterministic is None else bool(deterministic)
        accumulate = check_accumulate(environment.get("COLLECTIVES_ACCUMULATE") if accumulate is None else accumulate)
        if isinstance(comm, Runtime):  # a runtime of another kind (collectives.torch: no MPI launcher)
            runtime = comm
        else:
            from .mpi_library import MPI
            from .mpi_runtime import MpiRuntime

            # Bound the setup: Dup, Split_type and the exchanges below are blocking collectives; an entry barrier
            # with a deadline first makes sure every rank has entered init (else CollectiveTimeoutError).
            deadline = None if timeout is None else time.monotonic() + timeout
            if not poll_until(comm.Ibarrier(), deadline):
                raise CollectiveTimeoutError(
                    f"rank {comm.Get_rank()}: collectives.init did not complete within {timeout} s: not every rank "
                    "of the communicator called collectives.init (a peer may be dead, stuck or late); set "
                    "COLLECTIVES_TIMEOUT or timeout= to wait longer", collective="init", algorithm="native", seq=0,
                    timeout=timeout)
            runtime = MpiRuntime(comm)  # its own duplicate: the library's messages never meet the caller's
            if MPI.COMM_WORLD.Get_size() == 1:
                warn_if_alone(1)
        host, hosts = discover(runtime)
        self.domains = find_domains(runtime.size, hosts, ranks_per_domain)
        share_kernel_threads(host)
        arena = _arena.create(runtime, host.one_host)
        self._ctx = ctx = context.Context(runtime, host, arena, world, check=check, timeout=timeout,
                                          deterministic=deterministic, accumulate=accumulate, domains=self.domains,
                                          topology=topology)
        self.rank, self.size = ctx.rank, ctx.size
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._hot: dict[tuple, Plan] = {}  # plans of calls with the common arguments, by their short key
        self._retired = dict(ctx.stats)  # statistics of dropped plans
        self._last: Plan | None = None  # the plan of the last call
        self._forget_again()
        self.generation = 0  # counts plan drops: a persistent call made before one re-validates its plan
        context.live.add(self)

    # -- properties -----------------------------------------------------------------------------------------
    @property
    def mpi_comm(self) -> MPI.Comm:
        """The library's duplicate of the MPI communicator (ranks in the same order as the one passed in)."""
        comm = getattr(self._ctx.runtime, "comm", None)
        if comm is None:
            raise AttributeError(f"this communicator runs on {self._ctx.runtime.name}, not on an MPI communicator")
        return comm

    @property
    def runtime(self) -> Runtime:
        """What the communicator runs on (transport.runtime: MPI, or torch's store and gloo)."""
        return self._ctx.runtime

    @property
    def host(self):
        """Where the ranks run (transport.host.Host: ranks per host, cores, one host or several)."""
        return self._ctx.host

    @property
    def last_choice(self) -> choose.Choice | None:
        """What the last call ran (algorithm, parameters) and why."""
        return self._last.choice if self._last is not None else None

    @property
    def last_schedule(self):
        """The schedule the last call ran (None for MPI's own collective or a world of one)."""
        return self._last.schedule if self._last is not None else None

    @property
    def shared_memory(self) -> bool:
        """Every rank shares this host and the schedules run over shared memory (the arena exists)."""
        return self._ctx.arena is not None

    @property
    def daemons(self) -> int:
        """Number of switch daemons serving this communicator (0: switch nodes run on the ranks)."""
        return self._ctx.daemons

    @property
    def topology(self):
        """The topology hierarchical algorithms get: the one passed to init, else built from the domains."""
        return self._ctx.topology

    @property
    def timeout(self) -> float | None:
        return self._ctx.timeout

    @property
    def deterministic(self) -> bool:
        return self._ctx.deterministic

    @property
    def accumulate(self) -> str | None:
        return self._ctx.accumulate

    @property
    def check(self) -> str:
        """The call agreement: "metadata", "full" or "off" (settable; every rank must set the same)."""
        return self._ctx.check

    @check.setter
    def check(self, mode: str) -> None:
        self._ctx.check = check_mode(mode)
        self._drop_plans()  # plans fixed how they agree

    @property
    def stats(self) -> dict[str, int]:
        """Calls made (of them, by MPI's own collective) and bytes this rank sent/received, its switch nodes'
        apart; a snapshot (reset with `reset_stats`)."""
        out = dict(self._retired)
        for plan in self._plans.values():
            self._add_stats(out, plan)
        return out

    def reset_stats(self) -> None:
        self._retired = {k: 0 for k in self._retired}
        for plan in self._plans.values():
            plan.calls = 0

    @staticmethod
    def _add_stats(out: dict, plan: Plan) -> None:
        n = plan.calls
        out["calls"] += n
        if plan.choice.algorithm == "native":
            out["native_calls"] += n
        out["bytes_sent"] += n * plan.sent
        out["bytes_received"] += n * plan.received
        out["switch_bytes_sent"] += n * plan.switch_sent
        out["switch_bytes_received"] += n * plan.switch_received

    # -- the collectives -----------------------------------------------------------------------------------
    def allreduce(self, x, out=None, op: str = "sum", algorithm: str = "auto", *, async_op: bool = False,
                  timeout: float | None = None, deterministic: bool | None = None, accumulate: str | None = None,
                  **params):
        """Reduce `x` over all ranks into `out` (new array of x's shape if None; `out=x` in place).

        `deterministic=True` (default: the communicator's) uses the fixed rank-order reduction of algorithm
        'direct'; `accumulate="float32"` carries float16/bfloat16 partial sums in float32 and rounds once.
        """
        a = self._again_allreduce
        if x is a[0] and out is a[1] and op == a[2] and algorithm == a[3] and x.dtype is a[4] and \
                timeout is None and not (async_op or params) and deterministic is None and accumulate is None and \
                (out is not None or x.shape == a[5]):
            self._last = plan = a[7]
            return plan.run(x, out, None)
        if type(x) is np.ndarray and not async_op and not params and deterministic is None and accumulate is None:
            plan = self._hot.get(("allreduce", x.dtype, x.shape, op, None, algorithm,
                                  0 if out is None else 1 if out is x else 2))
            if plan is not None:
                self._last = plan
                if timeout is None:
                    self._again_allreduce = (x, out, op, algorithm, x.dtype, x.shape, None, plan)
                    return plan.run(x, out, None)
                return plan.run(x, out, check_timeout(timeout))
        return self._call("allreduce", x, out, op, None, algorithm, async_op, timeout, params, deterministic,
                          accumulate)

    def reduce_scatter(self, x, out=None, op: str = "sum", algorithm: str = "auto", *, async_op: bool = False,
                       timeout: float | None = None, deterministic: bool | None = None,
                       accumulate: str | None = None, **params):
        """Reduce `x` (p·k elements) over all ranks; rank r gets elements [r·k, (r+1)·k) of the result."""
        a = self._again_reduce_scatter
        if x is a[0] and out is a[1] and op == a[2] and algorithm == a[3] and x.dtype is a[4] and \
                timeout is None and not (async_op or params) and deterministic is None and accumulate is None and \
                (out is not None or x.shape == a[5]):
            self._last = plan = a[7]
            return plan.run(x, out, None)
        if type(x) is np.ndarray and not async_op and not params and deterministic is None and accumulate is None:
            plan = self._hot.get(("reduce_scatter", x.dtype, x.shape, op, None, algorithm,
                                  0 if out is None else 1 if out is x else 2))
            if plan is not None:
                self._last = plan
                if timeout is None:
                    self._again_reduce_scatter = (x, out, op, algorithm, x.dtype, x.shape, None, plan)
                    return plan.run(x, out, None)
                return plan.run(x, out, check_timeout(timeout))
        return self._call("reduce_scatter", x, out, op, None, algorithm, async_op, timeout, params, deterministic,
                          accumulate)

    def allgather(self, x, out=None, algorithm: str = "auto", *, async_op: bool = False,
                  timeout: float | None = None, **params):
        """Concatenate every rank's `x` (k elements) in rank order: p·k elements on every rank."""
        a = self._again_allgather
        if x is a[0] and out is a[1] and algorithm == a[3] and x.dtype is a[4] and timeout is None and \
                not (async_op or params) and (out is not None or x.shape == a[5]):
            self._last = plan = a[7]
            return plan.run(x, out, None)
        if type(x) is np.ndarray and not async_op and not params:
            plan = self._hot.get(("allgather", x.dtype, x.shape, "sum", None, algorithm,
                                  0 if out is None else 1 if out is x else 2))
            if plan is not None:
                self._last = plan
                if timeout is None:
                    self._again_allgather = (x, out, "sum", algorithm, x.dtype, x.shape, None, plan)
                    return plan.run(x, out, None)
                return plan.run(x, out, check_timeout(timeout))
        return self._call("allgather", x, out, "sum", None, algorithm, async_op, timeout, params)

    def broadcast(self, x, root: int = 0, algorithm: str = "auto", *, async_op: bool = False,
                  timeout: float | None = None, **params):
        """Copy root's `x` into every rank's `x` (in place) and return it."""
        a = self._again_broadcast
        if x is a[0] and root == a[6] and algorithm == a[3] and x.dtype is a[4] and timeout is None and \
                not (async_op or params):
            self._last = plan = a[7]
            return plan.run(x, x, None)
        if type(x) is np.ndarray and not async_op and not params:
            plan = self._hot.get(("broadcast", x.dtype, x.shape, "sum", root, algorithm, 1))
            if plan is not None:
                self._last = plan
                if timeout is None:
                    self._again_broadcast = (x, x, "sum", algorithm, x.dtype, x.shape, root, plan)
                    return plan.run(x, x, None)
                return plan.run(x, x, check_timeout(timeout))
        return self._call("broadcast", x, x, "sum", root, algorithm, async_op, timeout, params)

    def reduce(self, x, out=None, root: int = 0, op: str = "sum", algorithm: str = "auto", *,
               async_op: bool = False, timeout: float | None = None, deterministic: bool | None = None,
               accumulate: str | None = None, **params):
        """Reduce `x` over all ranks onto `root` (returns the result there, None elsewhere)."""
        a = self._again_reduce
        if x is a[0] and out is a[1] and op == a[2] and algorithm == a[3] and x.dtype is a[4] and root == a[6] and \
                timeout is None and not (async_op or params) and deterministic is None and accumulate is None and \
                (out is not None or x.shape == a[5]):
            self._last = plan = a[7]
            return plan.run(x, out, None)
        if type(x) is np.ndarray and not async_op and not params and deterministic is None and accumulate is None:
            plan = self._hot.get(("reduce", x.dtype, x.shape, op, root, algorithm,
                                  0 if out is None else 1 if out is x else 2))
            if plan is not None:
                self._last = plan
                if timeout is None:
                    self._again_reduce = (x, out, op, algorithm, x.dtype, x.shape, root, plan)
                    return plan.run(x, out, None)
                return plan.run(x, out, check_timeout(timeout))
        return self._call("reduce", x, out, op, root, algorithm, async_op, timeout, params, deterministic,
                          accumulate)

    def alltoall(self, x, out=None, algorithm: str = "auto", *, async_op: bool = False,
                 timeout: float | None = None, **params):
        """Exchange blocks: rank r's `x` is p blocks of k elements, block d for rank d; it gets p blocks, block s
        from rank s (MPI_Alltoall; torch's all_to_all_single with even splits)."""
        a = self._again_alltoall
        if x is a[0] and out is a[1] and algorithm == a[3] and x.dtype is a[4] and timeout is None and \
                not (async_op or params) and (out is not None or x.shape == a[5]):
            self._last = plan = a[7]
            return plan.run(x, out, None)
        if type(x) is np.ndarray and not async_op and not params:
            plan = self._hot.get(("alltoall", x.dtype, x.shape, "sum", None, algorithm,
                                  0 if out is None else 1 if out is x else 2))
            if plan is not None:
                self._last = plan
                if timeout is None:
                    self._again_alltoall = (x, out, "sum", algorithm, x.dtype, x.shape, None, plan)
                    return plan.run(x, out, None)
                return plan.run(x, out, check_timeout(timeout))
        return self._call("alltoall", x, out, "sum", None, algorithm, async_op, timeout, params)

    def alltoallv(self, x, send_counts, recv_counts, out=None, algorithm: str = "auto", *,
                  async_op: bool = False, timeout: float | None = None, **params):
        """Exchange blocks of any size: rank r sends send_counts[d] elements of `x` (in rank order d = 0..p-1) to
        rank d and receives recv_counts[s] elements from rank s, in rank order (MPI_Alltoallv; torch's
        all_to_all_single with uneven splits). The ranks' counts are exchanged first (one small allgather) and
        checked against each other on every rank, so inconsistent counts raise ValueError everywhere instead of
        corrupting a buffer; a schedule algorithm is then built for the whole matrix."""
        ctx = self._ctx
        ctx.check_open()
        if timeout is not None:
            timeout = check_timeout(timeout)
        x = calls.check_input("alltoallv", x)
        p = self.size
        sends = calls.check_split(send_counts, p, "send_counts")
        recvs = calls.check_split(recv_counts, p, "recv_counts")
        if sum(sends) != x.size:
            raise ValueError(f"alltoallv send_counts add up to {sum(sends)} elements but x has {x.size}")
        if out is not None:
            calls.check_v_out(x, out, sum(recvs), p)
        if ctx.queue:  # the exchange is an MPI collective: every earlier call goes first on every rank
            ctx.queue.wait(ctx.queue.launches[-1], timeout)
        counts = exchange_counts(ctx, sends, recvs, x.dtype, algorithm, params, timeout)
        mode = calls.output_mode(x, out)
        key = ("alltoallv", x.dtype, counts.tobytes(), algorithm, mode, tuple(sorted(params.items())))
        plan = self._plans.get(key)
        if plan is None:
            if algorithm == "auto":
                if params:
                    raise ValueError(f"parameters {sorted(params)} need an explicit algorithm, not 'auto'")
                choice = choose.auto("alltoallv", x.nbytes, x.dtype, p, ctx.host, ctx.arena is not None,
                                     ctx.runtime)
            else:
                choice = choose.requested("alltoallv", algorithm, x.dtype, params, ctx.runtime)
            plan = Plan(ctx, "alltoallv", x, mode, "sum", "sum", None, algorithm, choice, None, False, False,
                        timeout, counts=counts)
            self._plans[key] = plan
            if len(self._plans) > PLANS:
                self._retire(self._plans.popitem(last=False)[1])
        self._last = plan
        x = np.ascontiguousarray(x).reshape(-1)
        if not async_op:
            return plan.run(x, out, timeout)
        return plan.submit(x, out, True, timeout)

    def gather(self, x, out=None, root: int = 0, *, async_op: bool = False, timeout: float | None = None):
        """Concatenate every rank's `x` (k elements) in rank order on `root` (p·k elements there; None
        elsewhere). MPI's own gather."""
        return self._call("gather", x, out if self.rank == root else None, "sum", root, "native", async_op, timeout,
                          {})

    def scatter(self, x, out, root: int = 0, *, async_op: bool = False, timeout: float | None = None):
        """Split root's `x` (p·k elements) into p blocks; rank r gets block r in `out` (k elements, every rank;
        `x` is read on the root only). MPI's own scatter."""
        if not isinstance(out, np.ndarray):
            raise TypeError(f"scatter needs out= (a numpy.ndarray of each rank's k elements), got {type(out).__name__}")
        if self.rank == root:
            x = calls.check_input("scatter", x)
            if x.dtype != out.dtype or x.size != out.size * self.size:
                raise ValueError(f"scatter: the root's x must have p·k = {out.size * self.size} elements of "
                                 f"{dtype_name(out.dtype)} for an out of {out.size}; got {x.size} of {x.dtype}")
        source = x if self.rank == root else np.empty(0, out.dtype)  # read on the root only
        return self._call("scatter", source, out, "sum", root, "native", async_op, timeout, {})

    def persistent(self, collective: str, x, out=None, *, op: str = "sum", root: int = 0, algorithm: str = "auto",
                   timeout: float | None = None, deterministic: bool | None = None, accumulate: str | None = None,
                   **params) -> PersistentCall:
        """A persistent call (MPI-4's MPI_Allreduce_init and kin): the call of `collective` on these buffers,
        validated and planned once; each `run()` is the call, without the per-call look-ups. Arguments as the
        collective's own method takes them (`op` for the reducing ones, `root` for broadcast and reduce); every
        rank runs its persistent calls in the same order as any other call. The buffers stay bound: keep them
        alive, writeable and unresized while the call is in use."""
        if collective not in PersistentCall.COLLECTIVES:
            raise ValueError(f"persistent calls serve {', '.join(PersistentCall.COLLECTIVES)}; got {collective!r}")
        if collective not in REDUCING and op != "sum":
            raise ValueError(f"{collective} takes no op (got op={op!r})")
        if collective not in ("broadcast", "reduce"):
            root = None
        if collective == "broadcast":
            out = x

        def prepare():
            return self._prepare(collective, x, out, op, root, algorithm, timeout, dict(params), deterministic,
                                 accumulate)

        return PersistentCall(self, collective, prepare)

    # -- point to point ------------------------------------------------------------------------------------
    def isend(self, x: np.ndarray, dest: int, tag: int = 0) -> p2p.PointToPoint:
        """Send `x` to rank `dest` (nonblocking): a handle with wait(timeout) and test()."""
        return p2p.isend(self._ctx, x, dest, tag)

    def irecv(self, out: np.ndarray, source: int | None = None, tag: int | None = None) -> p2p.PointToPoint:
        """Receive into `out` from rank `source` (None: any) with `tag` (None: any), nonblocking; the handle's
        `source` and `tag` say what arrived."""
        return p2p.irecv(self._ctx, out, source, tag)

    def send(self, x: np.ndarray, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        p2p.isend(self._ctx, x, dest, tag).wait(timeout)

    def recv(self, out: np.ndarray, source: int | None = None, tag: int | None = None, *,
             timeout: float | None = None) -> int:
        """Receive into `out`; returns the rank it came from."""
        handle = p2p.irecv(self._ctx, out, source, tag)
        handle.wait(timeout)
        return handle.source

    def barrier(self, *, async_op: bool = False, timeout: float | None = None):
        """Wait until every rank has entered the barrier (after this rank's earlier calls completed)."""
        return self._call("barrier", np.empty(0, np.uint8), None, "sum", None, "native", async_op, timeout, {})

    # -- the general path: validate, choose, build (once per signature), run ----------------------------------
    def _call(self, collective: str, x, out, op: str, root, algorithm: str, async_op: bool, timeout, params: dict,
              deterministic=None, accumulate=None):
        plan, x, out, timeout = self._prepare(collective, x, out, op, root, algorithm, timeout, params, deterministic,
                                              accumulate)
        if not async_op:
            return plan.run(x, out, timeout)
        return plan.submit(x, out, True, timeout)

    def _prepare(self, collective: str, x, out, op: str, root, algorithm: str, timeout, params: dict,
                 deterministic=None, accumulate=None) -> tuple[Plan, np.ndarray, np.ndarray | None, float | None]:
        """Validate a call (raising before any communication) and find or build its plan: (plan, x, out,
        timeout) as the plan takes them."""
        ctx = self._ctx
        ctx.check_open()
        if timeout is not None:
            timeout = check_timeout(timeout)
        x = calls.check_input(collective if collective != "barrier" else "allreduce", x)
        if collective == "broadcast":
            out = x
        if collective == "scatter":  # out: this rank's block (k elements); x: the root's p blocks, or nothing
            calls.check_buffers("allreduce", out, None, self.size)
            if not out.flags.writeable or not out.flags.c_contiguous:
                raise ValueError("scatter out must be writeable and C-contiguous")
        else:
            calls.check_buffers(collective, x, out, self.size)
        mode = calls.output_mode(x, out)
        explicit = deterministic is not None
        deterministic = ctx.deterministic if deterministic is None else bool(deterministic)
        accumulate = ctx.accumulate if accumulate is None else check_accumulate(accumulate)
        shape = out.shape if collective == "scatter" else x.shape
        key = (collective, x.dtype, shape, op, root, algorithm, mode, tuple(sorted(params.items())),
               deterministic, accumulate)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(key, collective, x, mode, op, root, algorithm, params, deterministic, explicit,
                               accumulate, timeout)
        else:
            self._plans.move_to_end(key)
        self._last = plan
        return plan, x, out, timeout

    def _build(self, key, collective, x, mode, op, root, algorithm, params, deterministic, explicit, accumulate,
               timeout):
        ctx, p = self._ctx, self.size
        if collective in ("barrier", "gather", "scatter"):
            kernel_op, root = calls.check_call(collective, x, op, root, p, accumulate)
            choice = choose.Choice("native" if p > 1 else "copy", {}, f"{collective}: MPI's own")
            wide = False
        else:
            kernel_op, root = calls.check_call(collective, x, op, root, p, accumulate)
            wide = widens(accumulate, x.dtype, collective)
            wdtype = np.dtype(np.float32) if wide else x.dtype
            if deterministic and collective in REDUCING and p > 1:
                choice = choose.deterministic(collective, algorithm, params, explicit)
            elif algorithm == "auto":
                if params:
                    raise ValueError(f"parameters {sorted(params)} need an explicit algorithm, not 'auto'")
                choice = choose.auto(collective, x.size * wdtype.itemsize, wdtype, p, ctx.host,
                                     ctx.arena is not None, ctx.runtime)
            else:
                choice = choose.requested(collective, algorithm, wdtype, params, ctx.runtime)  # validated at any world size
                if p == 1:
                    choice = choose.Choice("copy", {}, f"world size 1: the output is the input ({algorithm} "
                                                       "needs no communication)")
        plan = Plan(ctx, collective, x, mode, op, kernel_op, root, algorithm, choice, accumulate,
                    deterministic, wide, timeout, shape=key[2])
        self._plans[key] = plan
        if not params and not explicit and accumulate == ctx.accumulate and deterministic == ctx.deterministic:
            self._hot[(collective, x.dtype, x.shape, op, root, algorithm, mode)] = plan
        if len(self._plans) > PLANS:
            self._retire(self._plans.popitem(last=False)[1])
        return plan

    def _forget_again(self) -> None:
        """Drop the records of the last call per collective (`_again_*`): a call with the same arguments on the
        same arrays finds its plan by identity checks instead of the short key's hash. A record is (x, out, op,
        algorithm, x.dtype, x.shape, root, plan): the dtype by identity and, for a new output, the shape, since
        an array's own can be reassigned in place; nothing else about the call can differ for the same objects."""
        self._again_allreduce = self._again_reduce_scatter = self._again_allgather = _NO_CALL
        self._again_broadcast = self._again_reduce = self._again_alltoall = _NO_CALL

    def _retire(self, plan: Plan) -> None:
        self._forget_again()
        self.generation += 1
        self._add_stats(self._retired, plan)
        for k, v in list(self._hot.items()):
            if v is plan:
                del self._hot[k]

    def _drop_plans(self) -> None:
        self._forget_again()
        self.generation += 1
        for plan in self._plans.values():
            self._add_stats(self._retired, plan)
        self._plans.clear()
        self._hot.clear()

    # -- closing -------------------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """Finish pending calls, stop the switch daemons this communicator owns, free the MPI communicator."""
        ctx = self._ctx
        if ctx.closed:
            return
        try:
            if ctx.queue and ctx.failure is None:
                ctx.queue.wait(ctx.queue.launches[-1], timeout)
        finally:
            ctx.closed = True
            ctx.ok = ctx.fast = False
            if ctx.native_request and ctx.failure is None:
                ctx.native_request.Free()  # inactive: the queue is empty
            ctx.native_request = ctx.native_last = None
            self._drop_plans()
            ctx.scratch.clear()
            if ctx.world is not None and self.rank == 0 and ctx.failure is None:
                from .daemon import stop_daemons

                stop_daemons(ctx.world, timeout=ctx.timeout)
            elif ctx.world is not None:
                ctx.world.serving = False
            context.live.discard(self)
            if ctx.failure is None:
                # freeing windows and the communicator is collective: only when every rank is here to do it (a
                # peer that died after its last call would leave this rank blocked in MPI_Win_free)
                limit = min(ctx.timeout or 10.0, 10.0) if timeout is None else timeout
                if poll_until(ctx.runtime.ibarrier(), time.monotonic() + limit):
                    if ctx.arena is not None:
                        ctx.arena.free()
                    ctx.p2p.free()
                    ctx.runtime.free()
                else:
                    ctx.fail(CollectiveTimeoutError(
                        f"rank {self.rank}: not every rank closed the communicator within {limit} s (a peer may have "
                        "died); its resources are left to the process's exit", collective="close", timeout=limit))

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<collectives.Communicator rank {self.rank}/{self.size}, {len(self.domains)} domain(s), "
                f"{self.daemons} switch daemon(s)>")


def init(mpi_comm: MPI.Comm | Runtime | None = None, *, ranks_per_domain: DomainSpec | None = None, topology=None,
         timeout: float | None = None, check: str | None = None, deterministic: bool | None = None,
         accumulate: str | None = None) -> Communicator:
    """Create a Communicator over `mpi_comm` (default: MPI_COMM_WORLD, minus any switch daemons), or over a
    `transport.runtime.Runtime` of another kind (collectives.torch.runtime.StoreRuntime: no MPI launcher).

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
        from . import daemon

        world = daemon.split_world(daemon.APP, timeout=environment.get("COLLECTIVES_TIMEOUT") if timeout is None
                                    else check_timeout(timeout, "init(timeout=)"))
        mpi_comm = world.local
        if not world.serving or any(c._ctx.world is world for c in context.live):
            world = None
    return Communicator(mpi_comm, ranks_per_domain=ranks_per_domain, topology=topology, timeout=timeout,
                        world=world, check=check, deterministic=deterministic, accumulate=accumulate)


__all__ = ["Communicator", "init", "topology_for"]
