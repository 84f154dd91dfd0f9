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

When the calibration timed rounds between core-mates (ranks bound r and r - s to one core: calibrate's item 8),
a copy round is split into a local copy (the mirror, and a landing from a core-mate) and a crossing (a landing
from another core): mates' round / 2 and the rest of a round across cores. A ring's landings all cross, so its
price is unchanged; Rabenseifner's first and last exchanges at p = 4 are between mates, and on a host whose
cores are far apart it runs at ~0.6x ring at 1-4 MiB, which the split prices.

A schedule that keeps every rank busy and moves one range per message (ring, Rabenseifner) is priced as the
simulation when no mates' round is known: its work is the simulator's bytes, and its waits do not block. The
same two bounds serve a run with more ranks than the calibration had (share 1, but ranks > cores in the run):
the processor time bound then charges the extra ranks to the cores they share.

Schedules with switch nodes (nvls, sharp, hierarchical: on this host's one domain their switch is emulated by a
rank over messages) are not run by the shared-memory executor, so they keep the links' version of the same two
bounds: the schedule simulated at full-core speed, and its received and reduced bytes over the cores
(`link_shared_core_time`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..schedule.ops import OpKind
from .shm_cost import critical_path, processor_seconds, rank_steps

UNLIMITED = 1e18  # bytes/s standing for "no bandwidth cost" (finite: topologies validate their numbers)


def core_share(calibration: dict | None) -> float:
    """Ranks per core on the calibrated host (1.0 when they fit, or when the file predates core counts)."""
    c = calibration or {}
    cores = c.get("cores")
    ranks = c.get("ranks_per_host", c.get("ranks", 1))
    if not cores:
        return 1.0
    return max(1.0, float(ranks) / float(cores))


def shm_shared_core_time(schedule, *, world_size: int, itemsize: int, bandwidth: float, reduce_rate: float,
                         latency: float, handoff: float, share: float, cores: int,
                         mates: tuple[int, float] | None = None) -> float:
    """Seconds for `schedule` when `share` ranks share each of `cores` cores (module docstring).

    `bandwidth` (bytes / copy round) and `reduce_rate` (the schedule's dtype) are the calibrated every-rank-busy
    rates; `latency` is a round's synchronisation (seconds), `handoff` the extra cost of a wait that blocks.
    `mates` = (shift, ratio): ranks r and r - k * shift share a core, and their copy round costs `ratio` (<= 1) of
    one across cores (calibrate's mates' round). A copy round is then a local copy (the mirror) and a landing:
    between mates both are local copies, ratio / 2 of a round each; across cores the landing is the rest,
    1 - ratio / 2, the price of the host's fabric (on a VM whose vCPUs sit on different chiplets 3-4 times a
    local copy at 1-4 MiB; the same on one chiplet). None: mirror and landing half a round each."""
    from ..transport.shm_plan import ShmPlan

    plans = [ShmPlan.build(schedule, rank) for rank in range(world_size)]
    round_s = 1.0 / (bandwidth * share)  # a copy round across cores, per byte, on a core of its own
    extra_s = 1.0 / (reduce_rate * share)
    if mates is None:
        # a copy round is one mirror and one landing: each copy is half of it
        steps = [rank_steps(plan, itemsize, round_s / 2.0, extra_s) for plan in plans]
    else:
        shift, ratio = mates
        local_s, crossing_s = round_s * ratio / 2.0, round_s * (1.0 - ratio / 2.0)
        steps = [rank_steps(plan, itemsize, local_s, extra_s,
                            lambda q, me=rank: local_s if (q - me) % shift == 0 else crossing_s)
                 for rank, plan in enumerate(plans)]
    alone = critical_path(plans, steps, latency, handoff)
    fixed = critical_path(plans, [rank_steps(plan, itemsize, 0.0, 0.0) for plan in plans], latency).seconds
    work = processor_seconds(steps) + alone.blocked_waits * handoff
    return max(alone.seconds, fixed + work / cores)


def scaled_rates(topology_dict: dict, factor: float | None) -> dict:
    """The loopback topology's parameters with link bandwidth and reduction rates x factor (None: unlimited)."""
    d = dict(topology_dict)
    d["nvlink_bandwidth"] = UNLIMITED if factor is None else d["nvlink_bandwidth"] * factor
    red = d["reduce_bandwidth"]
    if isinstance(red, dict):
        d["reduce_bandwidth"] = {k: UNLIMITED if factor is None else v * factor for k, v in red.items()}
    else:
        d["reduce_bandwidth"] = UNLIMITED if factor is None else red * factor
    return d


def cpu_work_seconds(schedule, world_size: int, itemsize: int, bandwidth: float, reduce_rate: float) -> float:
    """Processor seconds the ranks spend on a schedule's data: received bytes / bandwidth, plus reduced bytes /
    reduce_rate (a reduce-receive is a transfer and a reduction), summed over the ranks' programs."""
    moved = reduced = 0
    for rank in range(world_size):
        prog = schedule.program(rank)
        if not len(prog):
            continue
        nbytes = (prog.stop - prog.start) * itemsize
        reduced += int(nbytes[prog.kind == OpKind.RECV_REDUCE].sum())
        moved += int(nbytes[prog.kind != OpKind.SEND].sum())
    return moved / bandwidth + reduced / reduce_rate


def link_shared_core_time(simulate_on: Callable[[dict], float], topology_dict: dict, schedule, *, world_size: int,
                          itemsize: int, reduce_rate: float, share: float, cores: int) -> float:
    """Seconds for a schedule the shared-memory executor does not run (it has switch nodes: the message path runs
    it), when `share` ranks share each of `cores` cores: the larger of the schedule simulated at full-core
    speed (rates x share) and its fixed costs (simulated with unlimited rates) plus its received and reduced
    bytes at full-core rates over the cores.

    `simulate_on(params)` simulates the schedule on the loopback topology with those parameters;
    `topology_dict` holds the rates as calibrated (every rank busy), `reduce_rate` the one for the schedule's
    dtype."""
    alone = simulate_on(scaled_rates(topology_dict, share))
    fixed = simulate_on(scaled_rates(topology_dict, None))
    work = cpu_work_seconds(schedule, world_size, itemsize, topology_dict["nvlink_bandwidth"] * share,
                            reduce_rate * share)
    return max(alone, fixed + work / cores)


__all__ = ["core_share", "cpu_work_seconds", "link_shared_core_time", "scaled_rates", "shm_shared_core_time"]
