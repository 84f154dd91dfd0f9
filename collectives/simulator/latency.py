"""NCCL's per-call latency of a schedule: what a call pays once, beyond its messages' transfers.

NCCL's model (src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime) prices a call as
latency + bytes / bandwidth, with latency = the class's base latency (kernel launch, setup) + its per-step
latency x the algorithm's depth in steps (ring: 2(p-1) steps; tree: 2 x (chain + tree levels)), whatever the
pipelining: a pipelined chunk's step latency hides behind the previous chunk's transfer. The simulator prices
the transfers itself (every round pays its links' latency and bandwidth), and adds this per-call term:

    call_latency(class, protocol)                       (runtime.NcclRuntime.call_latency)
  + the critical path of the *unpipelined* schedule in which every rank-to-rank message costs what its
    step latency (runtime.NcclRuntime.step_latency: NVLink or network by the message's path) exceeds its
    path's latency by (NCCL's figure is a step's whole latency, and the transfer already pays the path's),
    messages to and from switch nodes nothing (their synchronisation is in call_latency). A huge pipeline's
    stages (bulk model) pay the full step latency of their slowest kind.

The critical path is the recurrence of recurrence.py with zero bytes and each message's step latency as its
latency, under the transfers' rule (a step waits for its sender's data and for a free slot of the receiver's
NCCL_STEPS-slot buffer, not for the receiver to reach it), a uniform round repeated R times applied R times;
above analytic.DATAFLOW_MAX_NODES nodes, as the analytic model costs rounds there: each round's slowest step,
plus R - 1 times its cycle rate for a repeated round.
"""

from __future__ import annotations

import numpy as np

from . import analytic
from .analytic import Structure, round_pairs
from .recurrence import advance_history, cycle_rows, iterate, rate_at


def step_depth(st: Structure, lam_nvlink: float, lam_net: float, world_size: int) -> float:
    """Seconds of step latency along `st`'s critical path (see the module docstring; kept on `st`)."""
    key = ("step_depth", lam_nvlink, lam_net, world_size)
    if key not in st.memo:
        st.memo[key] = _step_depth(st, lam_nvlink, lam_net, world_size)
    return st.memo[key]


def _step_depth(st: Structure, lam_nvlink: float, lam_net: float, world_size: int) -> float:
    # read at call time, as analytic.structure and the engine read it: the three must take the same model (a
    # structure of one domain's messages standing for all, replicas.py, is costed by the bulk rules only)
    dataflow = st.num_nodes <= analytic.DATAFLOW_MAX_NODES
    slots = max((rc.slots for rc in st.rounds), default=1)
    hist = [np.zeros(st.num_nodes)] * slots if dataflow else None
    total = 0.0
    for rc in st.rounds:
        if rc.src.size == 0:
            if dataflow:  # rounds without messages still count for the credit window
                hist = (hist + [hist[-1]] * min(rc.repeats, slots))[-slots:]
            continue
        if rc.step_kinds is not None:  # a set of a huge pipeline's stages (bulk only): which step kinds it holds
            nv, net = rc.step_kinds
            total += max(lam_net if net else 0.0, lam_nvlink if nv else 0.0) * rc.repeats
            continue
        p2p = (rc.src < world_size) & (rc.dst < world_size)
        # NCCL's step latency is a step's whole latency, wire included: the transfer model already pays the
        # path's latency, so a step adds only what NCCL's figure exceeds it by
        lam = np.where(p2p, np.maximum(np.where(rc.net, lam_net, lam_nvlink) - rc.lat, 0.0), 0.0)
        worst = float(lam.max())
        if not dataflow:
            rate = worst
            if rc.repeats > 1 and rc.slots > 1:
                n = int(max(rc.src.max(), rc.dst.max())) + 1
                pairs, _ = round_pairs(rc.src, rc.dst, n)
                rate = rate_at(cycle_rows(rc.src, rc.dst, lam, np.zeros(lam.size), 0.0, n, rc.slots,
                                          pairs=pairs, full=rc.replicas), 0.0)
            total += worst + (rc.repeats - 1) * rate
            continue
        sc = rc.scatter()
        zero = np.zeros(lam.size)
        back = np.full(lam.size, min(rc.slots, slots), np.int64)  # steps carry no bytes: the whole buffer

        def advance(X, sc=sc, lam=lam, zero=zero, back=back):
            return advance_history(X, sc, back, lam, zero, None, False)

        H = np.stack([h[sc.nodes] for h in hist])
        if rc.repeats > 1 and slots > 1:
            n = int(max(rc.src.max(), rc.dst.max())) + 1
            rate = rate_at(cycle_rows(rc.src, rc.dst, lam, np.zeros(lam.size), 0.0, n, int(back[0])), 0.0)
            fresh = iterate(H, rc.repeats, advance, rate, sc.src.size + sc.nodes.size)[-min(rc.repeats, slots):]
        else:
            new = advance(H)
            fresh = [new + (rc.repeats - 1) * worst] if rc.repeats > 1 else [new]
        out = []
        for x in fresh:
            full = hist[-1].copy()
            full[sc.nodes] = x
            out.append(full)
        hist = (hist + out)[-slots:]
    return float(hist[-1].max()) if dataflow else total


def latency_class(schedule) -> str:
    """The NCCL latency row a schedule is priced by: its builder's `latency_class` parameter, else ring's."""
    return str(schedule.params.get("latency_class", "ring"))


__all__ = ["latency_class", "step_depth"]
