"""NCCL's per-call latency of a schedule: what a call pays once, beyond its messages' transfers.

NCCL's model (src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime) prices a call as
latency + bytes / bandwidth, with latency = the class's base latency (kernel launch, setup) + its per-step
latency x the algorithm's depth in steps (ring: 2(p-1) steps; tree: 2 x (chain + tree levels)), whatever the
pipelining: a pipelined chunk's step latency hides behind the previous chunk's transfer. The simulator prices
the transfers itself (every round pays its links' latency and bandwidth), and adds this per-call term:

    call_latency(class, protocol)                       (runtime.NcclRuntime.call_latency)
  + the critical path of the *unpipelined* schedule in which every rank-to-rank message costs only its
    step latency (runtime.NcclRuntime.step_latency: NVLink or network by the message's path), messages to and
    from switch nodes nothing (their synchronisation is in call_latency).

The critical path is the recurrence of recurrence.py with zero bytes and each message's step latency as its
latency, sender-driven as NCCL's steps are (a step waits for its sender's data, not for the receiver to reach
it), a uniform round repeated R times applied R times; above analytic.DATAFLOW_MAX_NODES nodes, as the analytic
model costs rounds there: each round's slowest step, plus R - 1 times its cycle rate for a repeated round.
"""

from __future__ import annotations

import numpy as np

from .analytic import DATAFLOW_MAX_NODES, Structure
from .recurrence import cycle_rows, rate_at, repeat, scatter, step


def step_depth(st: Structure, lam_nvlink: float, lam_net: float, world_size: int) -> float:
    """Seconds of step latency along `st`'s critical path (see the module docstring; kept on `st`)."""
    key = ("step_depth", lam_nvlink, lam_net, world_size)
    if key not in st.memo:
        st.memo[key] = _step_depth(st, lam_nvlink, lam_net, world_size)
    return st.memo[key]


def _step_depth(st: Structure, lam_nvlink: float, lam_net: float, world_size: int) -> float:
    dataflow = st.num_nodes <= DATAFLOW_MAX_NODES
    T = np.zeros(st.num_nodes) if dataflow else None
    total = 0.0
    for rc in st.rounds:
        if rc.src.size == 0:
            continue
        if rc.step_kinds is not None:  # a set of a huge pipeline's stages (bulk only): which step kinds it holds
            nv, net = rc.step_kinds
            total += max(lam_net if net else 0.0, lam_nvlink if nv else 0.0) * rc.repeats
            continue
        p2p = (rc.src < world_size) & (rc.dst < world_size)
        lam = np.where(p2p, np.where(rc.net, lam_net, lam_nvlink), 0.0)
        worst = float(lam.max())
        rate = worst
        if rc.repeats > 1:
            n = int(max(rc.src.max(), rc.dst.max())) + 1
            rate = rate_at(cycle_rows(rc.src, rc.dst, lam, np.zeros(lam.size), 0.0, n), 0.0)
        if not dataflow:
            total += worst + (rc.repeats - 1) * rate
            continue
        sc = scatter(rc.src, rc.dst, np.zeros(0, np.int64))
        zero = np.zeros(lam.size)

        def advance(X, sc=sc, lam=lam, zero=zero):
            return step(X, sc, lam, zero, None, False, True)

        local = advance(T[sc.nodes])
        if rc.repeats > 1:
            local = repeat(local, rc.repeats - 1, advance, rate, sc.src.size + sc.nodes.size)
        T[sc.nodes] = local
    return float(T.max()) if dataflow else total


def latency_class(schedule) -> str:
    """The NCCL latency row a schedule is priced by: its builder's `latency_class` parameter, else ring's."""
    return str(schedule.params.get("latency_class", "ring"))


__all__ = ["latency_class", "step_depth"]
