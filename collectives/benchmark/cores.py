"""Ranks that share cores: how `bench --predict` prices a run with more ranks on a host than it has cores.

The simulator models links, not processors. On a loopback topology every "link" second is really CPU time (the
shared-memory executor copies and reduces with the rank's own core), and the calibration measured those rates
with every rank busy at once, i.e. with each rank getting cores / ranks of a core. That is exact for schedules
that keep every rank busy in every round (ring, Rabenseifner), and wrong for ones that leave ranks idle (a
double binary tree at p = 4 has at most two ranks reducing at a time): their busy ranks get a core each, so the
plain simulation over-predicts them (1.5-2x measured at p = 4 on 2 cores).

With share = ranks per core (> 1), the prediction is the larger of two bounds:

* *critical path*: the schedule simulated with each rank at full speed (the calibrated rates x share);
* *processor time*: the rounds' fixed costs (the schedule simulated with unlimited bandwidth and reduction
  rate: latency only) plus the whole job's CPU work spread over the cores: every rank's received bytes
  at the full-speed copy rate, and its reduced bytes at the full-speed reduction rate, summed, / cores.

A schedule that keeps every rank busy has processor time = the plain simulation, so ring and Rabenseifner are
priced as before; one that idles ranks is priced by whichever resource runs out first. The same two bounds
serve a run with more ranks than the calibration had (share 1, but ranks > cores in the run): the processor
time bound then charges the extra ranks to the cores they share.
"""

from __future__ import annotations

from collections.abc import Callable

from ..schedule.ops import OpKind

UNLIMITED = 1e18  # bytes/s standing for "no bandwidth cost" (finite: topologies validate their numbers)


def core_share(calibration: dict | None) -> float:
    """Ranks per core on the calibrated host (1.0 when they fit, or when the file predates core counts)."""
    c = calibration or {}
    cores = c.get("cores")
    ranks = c.get("ranks_per_host", c.get("ranks", 1))
    if not cores:
        return 1.0
    return max(1.0, float(ranks) / float(cores))


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


def shared_core_time(simulate_on: Callable[[dict], float], topology_dict: dict, schedule, *, world_size: int,
                     itemsize: int, reduce_rate: float, share: float, cores: int) -> float:
    """Seconds for `schedule` when `share` ranks share each of `cores` cores (module docstring).

    `simulate_on(params)` simulates the schedule on the loopback topology with those parameters;
    `topology_dict` holds the rates as calibrated (every rank busy), `reduce_rate` the one for the schedule's
    dtype."""
    alone = simulate_on(scaled_rates(topology_dict, share))
    fixed = simulate_on(scaled_rates(topology_dict, None))
    work = cpu_work_seconds(schedule, world_size, itemsize, topology_dict["nvlink_bandwidth"] * share,
                            reduce_rate * share)
    return max(alone, fixed + work / cores)


__all__ = ["core_share", "cpu_work_seconds", "scaled_rates", "shared_core_time"]
