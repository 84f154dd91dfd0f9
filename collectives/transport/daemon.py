"""Switch daemons: extra MPI processes that run the switch nodes of in-network-reduction schedules.

Launch: `mpiexec -n 8 python app.py : -n 3 python -m collectives.switchd`. The app must call
`collectives.init()` (mpi_comm=None) on every rank; the daemons run `serve()`.

Handshake (once per process, collective over MPI_COMM_WORLD, identical on both sides): every process
allgathers its role (app=0, daemon=1), splits COMM_WORLD by role (the app's ranks form the app communicator,
in world order), and, if any daemon exists, duplicates COMM_WORLD twice: `fabric` carries the schedules'
messages between ranks and switch nodes, `control` the daemons' orders.

Protocol: for every collective whose schedule has switch nodes (num_nodes > world_size), app rank 0 sends every
daemon one order `("run", seq, collective, algorithm, count, dtype, root, kernel_op, params, topology,
world_size)` when the collective starts; all ranks know the same call, so the daemons build the same schedule
and run the programs of the switch nodes placed on them (switch node s on daemon (s - p) % D). Orders arrive
and are served in issue order. `("stop",)`, sent when the owning communicator closes (or at exit), ends the
daemons.

Failures (docs/reliability.md): every wait is bounded. The handshake waits at most COLLECTIVES_TIMEOUT for every
process to arrive; a daemon serving a collective gives up after COLLECTIVES_TIMEOUT. An app rank whose
communicator fails (timeout, dead peer) sends every daemon `("abort", reason)` on ABORT_TAG from any app rank, so
idle daemons exit even when app rank 0 is the one that died. A daemon that fails prints the reason and exits
with status 1 without MPI_Finalize (which would block on a dead peer): under mpiexec's default the job then
ends; under `-disable-auto-cleanup` the ranks' own timeouts report the missing switch node.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .. import environment
from .mpi_library import MPI
from .mpi_runtime import MpiRuntime

APP, DAEMON = 0, 1
ORDER_TAG = 7
ABORT_TAG = 8


class DaemonAborted(RuntimeError):
    """An app rank told the daemons to stop because its communicator failed."""


@dataclass
class World:
    """This process's view of COMM_WORLD after the role handshake."""

    role: int
    roles: tuple[int, ...]
    local: MPI.Comm  # the processes of this role, in world order
    fabric: MpiRuntime | None  # over a COMM_WORLD dup: schedule messages (only when daemons exist)
    control: MPI.Comm | None  # COMM_WORLD dup for orders
    serving: bool  # daemons are up and not yet stopped

    @property
    def app_procs(self) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role == APP)

    @property
    def daemon_procs(self) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role == DAEMON)


_world: World | None = None


def _timeout_from_env() -> float | None:
    return environment.get("COLLECTIVES_TIMEOUT")


def _bounded_barrier(comm: MPI.Comm, timeout: float | None, what: str) -> None:
    """An Ibarrier polled until `timeout` s: makes the blocking collectives after it safe to enter."""
    req = comm.Ibarrier()
    deadline = None if timeout is None else time.monotonic() + timeout
    nap = 0.0
    while not req.Test():
        if deadline is not None and time.monotonic() > deadline:
            from ..errors import CollectiveTimeoutError
            raise CollectiveTimeoutError(
                f"world rank {comm.Get_rank()}: {what} did not complete within {timeout} s: not every process of "
                "MPI_COMM_WORLD arrived (app ranks must call collectives.init(); a process may be dead or stuck); "
                "set COLLECTIVES_TIMEOUT to wait longer", collective="init", algorithm="native", seq=0,
                timeout=timeout)
        nap = min(1e-3, nap * 2 or 1e-5)
        time.sleep(nap)


def split_world(role: int, timeout: float | None = None) -> World:
    """The role handshake (collective over COMM_WORLD; done once per process; bounded by `timeout`, default
    COLLECTIVES_TIMEOUT)."""
    global _world
    if _world is None:
        world = MPI.COMM_WORLD
        _bounded_barrier(world, _timeout_from_env() if timeout is None else timeout, "the switch daemon handshake")
        roles = tuple(world.allgather(role))
        local = world.Split(role, world.Get_rank())
        fabric = control = None
        if DAEMON in roles:
            fabric, control = MpiRuntime(world), world.Dup()
        _world = World(role, roles, local, fabric, control, DAEMON in roles)
    elif _world.role != role:
        raise RuntimeError("this process already joined the world handshake in another role")
    return _world


def send_orders(world: World, order: tuple) -> list[MPI.Request]:
    """App rank 0: send one order to every daemon (nonblocking; the caller completes the requests)."""
    data = pickle.dumps(order, protocol=pickle.HIGHEST_PROTOCOL)
    return [world.control.isend(data, dest=d, tag=ORDER_TAG) for d in world.daemon_procs]


def _complete(reqs: list[MPI.Request], timeout: float | None) -> bool:
    """Poll requests until all completed (True) or `timeout` s passed (False; the rest are left behind)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while reqs:
        reqs = [r for r in reqs if not r.Test()]
        if reqs and deadline is not None and time.monotonic() > deadline:
            return False
        if reqs:
            time.sleep(1e-4)
    return True


def stop_daemons(world: World, timeout: float | None = None) -> None:
    """App rank 0: order the daemons to exit (idempotent; bounded by `timeout`, default COLLECTIVES_TIMEOUT)."""
    if world.serving and world.control is not None:
        world.serving = False
        _complete(send_orders(world, ("stop",)), _timeout_from_env() if timeout is None else timeout)
    world.serving = False


def abort_daemons(world: World, reason: str, timeout: float = 1.0) -> None:
    """Any app rank whose communicator failed: tell every daemon to exit (best effort, at most `timeout` s)."""
    if world.control is None or not world.serving:
        return
    world.serving = False
    data = pickle.dumps(("abort", reason[:2000]), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        _complete([world.control.isend(data, dest=d, tag=ABORT_TAG) for d in world.daemon_procs], timeout)
    except MPI.Exception:  # a dead daemon: nothing more to do
        pass


def _next_order(world: World, aborts: MPI.Request | None = None) -> tuple:
    """Wait for the next order from app rank 0, napping while idle (daemons share cores with ranks); an abort
    from any app rank (`aborts`, an irecv on ABORT_TAG) raises DaemonAborted."""
    req = world.control.irecv(source=world.app_procs[0], tag=ORDER_TAG)
    nap, idle_since = 0.0, time.monotonic()
    while True:
        done, data = req.test()
        if done:
            return pickle.loads(data)
        if aborts is not None:
            got, why = aborts.test()
            if got:
                req.Cancel()
                raise DaemonAborted(f"aborted by the app: {pickle.loads(why)[1]}")
        if time.monotonic() - idle_since > 0.002:
            nap = min(1e-3, nap * 2 or 2e-5)
            time.sleep(nap)


def serve(world: World, timeout: float | None = None) -> int:
    """Run orders until stopped; returns the number of collectives served."""
    from .. import algorithms  # noqa: F401  (registers the built-in algorithms)
    from ..kernels._dtypes import SUPPORTED_DTYPES, dtype_name
    from ..registry import build
    from .messages import Execution, ProcPlan, tag_base
    from .placement import daemon_placement
    from .progress import wait_until

    dtypes = {dtype_name(d): d for d in SUPPORTED_DTYPES}
    me = world.fabric.rank
    tag_ub = world.fabric.tag_upper_bound
    plans: OrderedDict = OrderedDict()
    served = 0
    if timeout is None:
        timeout = _timeout_from_env()
    aborts = world.control.irecv(source=MPI.ANY_SOURCE, tag=ABORT_TAG)
    while True:
        order = _next_order(world, aborts)
        if order[0] == "stop":
            aborts.Cancel()
            return served
        _, seq, collective, algorithm, count, dtype, root, kernel_op, params, topology, p = order
        key = (collective, algorithm, p, count, root, repr(sorted(params.items())), pickle.dumps(topology))
        plan = plans.get(key)
        if plan is None:
            schedule = build(algorithm, collective=collective, world_size=p, count=count, root=root,
                             topology=topology, **params)
            placement = daemon_placement(p, schedule.num_nodes, world.app_procs, world.daemon_procs)
            plan = plans[key] = ProcPlan.build(schedule, placement, me)
            if len(plans) > 64:
                plans.popitem(last=False)
        plans.move_to_end(key)
        L = plan.placement.slots
        works = [np.zeros(plan.schedule.work_size, dtype=dtypes[dtype]) for _ in plan.nodes]
        run = Execution(plan, world.fabric, works, kernel_op, seq, tag_base(seq, L, tag_ub))
        deadline = None if timeout is None else time.monotonic() + timeout

        def describe(run=run, collective=collective, seq=seq, algorithm=algorithm):
            rnd, index, peers = run.stuck()
            return TimeoutError(f"switch daemon (world rank {me}): {collective} #{seq} ({algorithm}) did not "
                                f"complete within {timeout} s; round {rnd}, op {index}, awaiting nodes {peers}")

        wait_until(run.advance, lambda run=run: run.events, deadline, describe, oversubscribed=True)
        served += 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m collectives.switchd [--import MODULE ...] [--path DIR ...]`.

    Algorithms the app registers itself (not built in, not an entry point) must be registered in the daemons
    too: `--import MODULE` imports a module that registers them (`--path DIR` extends sys.path first);
    COLLECTIVES_ALGORITHM_MODULES (comma separated) does the same.
    """
    import argparse
    import importlib

    ap = argparse.ArgumentParser(prog="python -m collectives.switchd", description="switch daemon for "
                                 "in-network reduction; launch with mpiexec's MPMD syntax after the app")
    ap.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (registers the app's own algorithms)")
    ap.add_argument("--path", action="append", default=[], metavar="DIR", help="prepend DIR to sys.path")
    args = ap.parse_args(argv)
    sys.path[:0] = args.path
    modules = args.modules + [m for m in environment.get("COLLECTIVES_ALGORITHM_MODULES").split(",") if m]
    for name in modules:
        importlib.import_module(name)
    try:
        world = split_world(DAEMON)
    except Exception as exc:  # noqa: BLE001 - the handshake timed out: exit without MPI_Finalize
        print(f"collectives.switchd: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    if APP not in world.roles:
        print("collectives.switchd: no application ranks in MPI_COMM_WORLD; launch as "
              "`mpiexec -n N python app.py : -n D python -m collectives.switchd`", file=sys.stderr)
        return 2
    try:
        served = serve(world)
    except BaseException as exc:  # noqa: BLE001 - a failed daemon must not leave the job hanging
        # Exit without MPI_Finalize (it would block on a dead peer): under mpiexec's default cleanup the job
        # ends; under -disable-auto-cleanup the ranks' timeouts name this daemon's switch nodes.
        print(f"collectives.switchd (world rank {MPI.COMM_WORLD.Get_rank()}): {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    if environment.get("COLLECTIVES_DEBUG"):
        print(f"collectives.switchd: world rank {MPI.COMM_WORLD.Get_rank()} served {served} collectives",
              file=sys.stderr)
    return 0
