"""Ranks that share cores: how `bench --predict` prices a run with more ranks on a host than it has cores.

The simulator models links, not processors. On a loopback topology every "link" second is really CPU time (the
shared-memory executor copies and reduces with the rank's own core), and the calibration measured those rates
with every rank busy at once, i.e. with each rank getting cores / ranks of a core. That is exact for schedules
that keep every rank busy in every round (ring, Rabenseifner), and wrong for ones that leave ranks idle (a
double binary tree at p = 4 has at most two ranks reducing at a time): their busy ranks get a core each. And
where several messages carry one range in one round the executor does less than one copy round per message
(one fused reduce, one mirror for many readers: benchmark/shm_cost.py), which links cannot say either.

So with share = ranks per core (> 1) the prediction prices the executor's own plans (transport/shm_plan.py,
priced by shm_cost.py at the full-core rates: the calibrated rates x share) and takes the larger of two bounds:

* *critical path*: the ranks' plans played against each other, each rank on a core of its own; a wait that
  blocks (the rank got there before its peer published) costs a context switch, `handoff` (the calibration's
  synchronised empty round less its per-round cost: what a wait costs when every wait switches);
* *processor time*: the rounds' fixed costs (the same play with no data: latency only) plus the whole job's
  CPU work (every rank's copies and reductions, and a handoff per blocked wait) spread over the cores.

A schedule that keeps every rank busy and moves one range per message (ring, Rabenseifner) is priced as the
simulation: its work is the simulator's bytes, and its waits do not block. The same two bounds serve a run with
more ranks than the calibration had (share 1, but ranks > cores in the run): the processor time bound then
charges the extra ranks to the cores they share.
"""

from __future__ import annotations

from .shm_cost import critical_path, processor_seconds, rank_steps


def core_share(calibration: dict | None) -> float:
    """Ranks per core on the calibrated host (1.0 when they fit, or when the file predates core counts)."""
    c = calibration or {}
    cores = c.get("cores")
    ranks = c.get("ranks_per_host", c.get("ranks", 1))
    if not cores:
        return 1.0
    return max(1.0, float(ranks) / float(cores))


def shared_core_time(schedule, *, world_size: int, itemsize: int, bandwidth: float, reduce_rate: float,
                     latency: float, handoff: float, share: float, cores: int) -> float:
    """Seconds for `schedule` when `share` ranks share each of `cores` cores (module docstring).

    `bandwidth` (bytes / copy round) and `reduce_rate` (the schedule's dtype) are the calibrated every-rank-busy
    rates; `latency` is a round's synchronisation (seconds), `handoff` the extra cost of a wait that blocks."""
    from ..transport.shm_plan import ShmPlan

    plans = [ShmPlan.build(schedule, rank) for rank in range(world_size)]
    # a copy round is one mirror and one landing: each copy is half of it
    steps = [rank_steps(plan, itemsize, 1.0 / (2.0 * bandwidth * share), 1.0 / (reduce_rate * share))
             for plan in plans]
    alone = critical_path(plans, steps, latency, handoff)
    fixed = critical_path(plans, [rank_steps(plan, itemsize, 0.0, 0.0) for plan in plans], latency).seconds
    work = processor_seconds(steps) + alone.blocked_waits * handoff
    return max(alone.seconds, fixed + work / cores)


__all__ = ["core_share", "shared_core_time"]
