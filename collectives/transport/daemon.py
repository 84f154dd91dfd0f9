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
daemons. A daemon that fails calls MPI_Abort so the job never hangs.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

APP, DAEMON = 0, 1
ORDER_TAG = 7


@dataclass
class World:
    """This process's view of COMM_WORLD after the role handshake."""

    role: int
    roles: tuple[int, ...]
    local: MPI.Comm  # the processes of this role, in world order
    fabric: MPI.Comm | None  # COMM_WORLD dup for schedule messages (only when daemons exist)
    control: MPI.Comm | None  # COMM_WORLD dup for orders
    serving: bool  # daemons are up and not yet stopped

    @property
    def app_procs(self) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role == APP)

    @property
    def daemon_procs(self) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role == DAEMON)


_world: World | None = None


def split_world(role: int) -> World:
    """The role handshake (collective over COMM_WORLD; done once per process)."""
    global _world
    if _world is None:
        world = MPI.COMM_WORLD
        roles = tuple(world.allgather(role))
        local = world.Split(role, world.Get_rank())
        fabric = control = None
        if DAEMON in roles:
            fabric, control = world.Dup(), world.Dup()
        _world = World(role, roles, local, fabric, control, DAEMON in roles)
    elif _world.role != role:
        raise RuntimeError("this process already joined the world handshake in another role")
    return _world


def send_orders(world: World, order: tuple) -> list[MPI.Request]:
    """App rank 0: send one order to every daemon (nonblocking; the caller completes the requests)."""
    data = pickle.dumps(order, protocol=pickle.HIGHEST_PROTOCOL)
    return [world.control.isend(data, dest=d, tag=ORDER_TAG) for d in world.daemon_procs]


def stop_daemons(world: World) -> None:
    """App rank 0: order the daemons to exit (idempotent)."""
    if world.serving and world.control is not None:
        MPI.Request.Waitall(send_orders(world, ("stop",)))
    world.serving = False


def _next_order(world: World) -> tuple:
    """Wait for the next order from app rank 0, napping while idle (daemons share cores with ranks)."""
    req = world.control.irecv(source=world.app_procs[0], tag=ORDER_TAG)
    nap, idle_since = 0.0, time.monotonic()
    while True:
        done, data = req.test()
        if done:
            return pickle.loads(data)
        if time.monotonic() - idle_since > 0.002:
            nap = min(1e-3, nap * 2 or 2e-5)
            time.sleep(nap)


def serve(world: World, timeout: float | None = None) -> int:
    """Run orders until stopped; returns the number of collectives served."""
    from .. import algorithms  # noqa: F401  (registers the built-in algorithms)
    from ..kernels._dtypes import SUPPORTED_DTYPES, dtype_name
    from ..registry import build
    from .executor import Execution, ProcPlan, wait_until
    from .placement import daemon_placement

    dtypes = {dtype_name(d): d for d in SUPPORTED_DTYPES}
    me = world.fabric.Get_rank()
    tag_ub = world.fabric.Get_attr(MPI.TAG_UB)
    plans: OrderedDict = OrderedDict()
    served = 0
    if timeout is None:
        timeout = float(os.environ.get("COLLECTIVES_TIMEOUT", "600"))
    while True:
        order = _next_order(world)
        if order[0] == "stop":
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
        run = Execution(plan, world.fabric, works, kernel_op, seq, (seq % ((tag_ub + 1) // (L * L))) * L * L)
        deadline = time.monotonic() + timeout

        def describe(run=run, collective=collective, seq=seq, algorithm=algorithm):
            rnd, index, peers = run.stuck()
            return TimeoutError(f"switch daemon (world rank {me}): {collective} #{seq} ({algorithm}) did not "
                                f"complete within {timeout} s; round {rnd}, op {index}, awaiting nodes {peers}")

        wait_until(run, deadline, describe)
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
    modules = args.modules + [m for m in os.environ.get("COLLECTIVES_ALGORITHM_MODULES", "").split(",") if m]
    for name in modules:
        importlib.import_module(name)
    world = split_world(DAEMON)
    if APP not in world.roles:
        print("collectives.switchd: no application ranks in MPI_COMM_WORLD; launch as "
              "`mpiexec -n N python app.py : -n D python -m collectives.switchd`", file=sys.stderr)
        return 2
    try:
        served = serve(world)
    except BaseException as exc:  # a failed daemon must not leave the ranks hanging
        print(f"collectives.switchd: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
        return 1
    if os.environ.get("COLLECTIVES_DEBUG"):
        print(f"collectives.switchd: world rank {MPI.COMM_WORLD.Get_rank()} served {served} collectives",
              file=sys.stderr)
    return 0
