"""Is this host quiet enough to measure? The CPU share each rank gets, and how well repeated trials agree.

A measurement on a host where other processes take the CPU is a measurement of that moment, not of the host:
`collectives calibrate` once caught such a moment and priced every transport round at 1.4 ms, 10-90x the
calls it then predicted. Two checks catch it, both cheap:

- `cpu_share`: every rank spins for a few milliseconds of wall time at once and counts the CPU time it got
  (`time.thread_time`). Alone on its cores a rank gets all of it; with r ranks on c < r cores, c / r of it. A
  rank that gets much less than that shares its cores with other processes (or, on a VM, with the hypervisor:
  steal time is not CPU time of the guest's process either). The verdict is the worst rank's.
- `Trials`: a quantity measured in several independent trials (the other parts of the measurement between
  them) keeps the trials within `OUTLIER` of the fastest and takes their median: noise on a shared host only
  ever adds time, so a slow trial is the outlier (a median over three trials of which two caught a busy moment
  priced a transport round at 1.4 ms). A quantity with a single trial kept, or whose kept trials still spread by
  more than `UNSTABLE`, is unstable.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

# a rank getting under this fraction of the CPU share it should get is competing with other processes
BUSY_SHARE = 0.7
OUTLIER = 1.5  # a trial more than 1.5x the fastest of its quantity's trials is rejected
UNSTABLE = 1.35  # kept trials of one quantity spreading by more than this: the host changed while measuring


def cpu_share(mpi_comm, seconds: float = 0.03) -> float:
    """The smallest fraction, over ranks, of wall time a rank got on a CPU while every rank spun for
    `seconds` at once (collective over `mpi_comm`)."""
    from ..transport.mpi_library import MPI

    mpi_comm.Barrier()
    w0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - w0 < seconds:
        pass
    share = (time.thread_time() - c0) / max(time.perf_counter() - w0, 1e-9)
    return float(mpi_comm.allreduce(min(share, 1.0), MPI.MIN))


def expected_share(ranks_per_host: int, cores: int) -> float:
    """What a rank gets on a quiet host: all of a core, or its share when ranks outnumber cores."""
    return min(1.0, cores / max(ranks_per_host, 1))


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not available on this platform
        return None


@dataclass
class HostLoad:
    """CPU shares probed during one measurement (each the worst rank's) against what a quiet host gives."""

    expected: float
    cores: int
    ranks_per_host: int
    shares: list[float] = field(default_factory=list)
    load: float | None = None  # the 1-minute load average when last probed

    def probe(self, mpi_comm) -> float:
        share = cpu_share(mpi_comm)
        self.shares.append(share)
        self.load = load_average()
        return share

    @property
    def worst(self) -> float:
        return min(self.shares) if self.shares else self.expected

    @property
    def busy(self) -> bool:
        return self.worst < BUSY_SHARE * self.expected

    def describe(self) -> str:
        load = f"; load average {self.load:.1f} on {self.cores} cores" if self.load is not None else ""
        return (f"ranks got as little as {self.worst:.0%} of a core while measuring, where {self.ranks_per_host} "
                f"ranks on {self.cores} cores should get {self.expected:.0%}{load}")

    def to_dict(self) -> dict:
        return {"cpu_shares": self.shares, "expected_share": self.expected, "busy": self.busy,
                "load_average": self.load}


@dataclass
class Trials:
    """Repeated trials of named quantities: the median of each, outliers rejected, the spread reported."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(float(value))

    def kept(self, name: str) -> list[float]:
        vals = self.values[name]
        fastest = min(vals)
        if fastest <= 0:
            return vals
        return [v for v in vals if v <= fastest * OUTLIER]

    def median(self, name: str) -> float:
        return float(statistics.median(self.kept(name)))

    def spread(self, name: str) -> float:
        """max / min of the kept trials (1.0: they agree)."""
        kept = self.kept(name)
        lo = min(kept)
        return max(kept) / lo if lo > 0 else 1.0

    def rejected(self, name: str) -> int:
        return len(self.values[name]) - len(self.kept(name))

    def unstable(self) -> list[tuple[str, float]]:
        """(name, spread) of the quantities whose kept trials disagree, worst first."""
        out = []
        for n, vals in self.values.items():
            if len(vals) > 1 and (len(self.kept(n)) < 2 or self.spread(n) > UNSTABLE):
                out.append((n, max(vals) / min(vals) if min(vals) > 0 else float("inf")))
        return sorted(out, key=lambda t: -t[1])

    def summary(self) -> dict:
        return {n: {"trials": v, "median": self.median(n), "rejected": self.rejected(n)}
                for n, v in self.values.items()}


def verdict(load: HostLoad, trials: Trials | None = None) -> list[str]:
    """Why this measurement should not be trusted (empty: it can be)."""
    why = []
    if load.busy:
        why.append(f"other processes took the CPU: {load.describe()}")
    unstable = trials.unstable() if trials is not None else []
    if unstable:
        worst = ", ".join(f"{n} {s:.1f}x" for n, s in unstable[:3])
        why.append(f"repeated trials disagreed ({worst}{', ...' if len(unstable) > 3 else ''}: slowest / fastest "
                   "trial)")
    return why


WHAT_TO_DO = ("rerun when the host is quiet (`uptime` shows the load; stop other jobs), or measure and calibrate "
              "in one launch with `collectives bench ... --calibrate --predict FILE`")


__all__ = ["BUSY_SHARE", "HostLoad", "OUTLIER", "Trials", "UNSTABLE", "WHAT_TO_DO", "cpu_share", "expected_share",
           "load_average", "verdict"]
